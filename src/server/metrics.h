// Prometheus text exposition of the server's metrics (names like vLLM's, prefix "oasis:"):
// engine gauges and counters from EngineStats (running/waiting requests, KV usage, prompt
// and generation tokens, finished requests by reason, TTFT/ITL/e2e histograms, lookahead
// decoding's spec_decode counters, sparse KV's oasis:sparse_* and host KV store gauges), a
// prefill instance's staging pool, plus the HTTP front end's own request counters
// (HttpMetrics). The engine's and the staging pool's are rendered from tables of rows, one per
// metric (engine_metrics.cpp, metrics.cpp; metric_table.h).
//
// HttpMetrics is thread-safe (one mutex); the render functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <tuple>
#include "common/http_front.h"

#include "common/http_util.h"
#include "engine/engine.h"

namespace oasis::server {

class HttpMetrics {
 public:
  // Counts one answered request; `route` is the matched pattern ("/v1/completions") or
  // "other" for unknown paths, so the label set stays bounded.
  void Count(const std::string& method, const std::string& route, int status);
  // Requests whose client went away before they finished (aborted in the engine).
  void CountClientDisconnect() {
    std::lock_guard<std::mutex> lock(mu_);
    ++client_disconnects_;
  }
  std::string Render(const std::string& model_label) const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, int64_t> requests_;
  int64_t client_disconnects_ = 0;
};

// `model_name` becomes the model_name label. `ready` is 0 while loading.
std::string RenderEngineMetrics(const EngineStats& stats, const std::string& model_name);
// A prefill instance's staging pool and server (docs/disaggregation.md §7).
struct StagingMetrics {
  uint64_t bytes_total = 0, bytes_held = 0, requests_held = 0;
  uint64_t completed = 0, aborted = 0, expired = 0, acquire_failures = 0;
  uint64_t connections_open = 0;
};
// The HTTP front's connection counters (common/http_front.h).
std::string RenderFrontMetrics(const HttpFrontStats& s, const std::string& model_name);

std::string RenderStagingMetrics(const StagingMetrics& m, const std::string& model_name);

}  // namespace oasis::server

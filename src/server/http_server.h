// HttpFrontend: the OpenAI-compatible HTTP API on the event-driven HttpFront
// (common/http_front.h) — /v1/completions, /v1/chat/completions (JSON or SSE streams ending in
// `data: [DONE]`), /v1/models, /health, /tokenize, /detokenize, /metrics, /version. Every error
// is OpenAI error JSON; every handler catches everything (the server never dies on a request);
// a client that disconnects, at any moment, has its engine requests aborted.
//
// No thread waits on a generation: a job's streams wake a pump (RequestStream::SetWakeup) that
// formats what arrived on the front's worker pool and queues it on the connection. /health,
// /metrics and /version run on the I/O threads, so they answer while every worker, connection
// slot of the engine and KV block is busy. Limits and timeouts: docs/server.md.
//
// Bind(), Start(), then Stop(deadline) from the same control thread; handlers only use the
// thread-safe Service.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "oasis/status.h"
#include "server/serving.h"

namespace oasis {
class HttpFront;
struct HttpFrontStats;
}  // namespace oasis

namespace oasis::server {

class HttpFrontend {
 public:
  explicit HttpFrontend(Service& service);
  ~HttpFrontend();

  // Binds host:port (port 0: any free port); returns the bound port.
  StatusOr<int> Bind(const std::string& host, int port);
  // Starts serving on background threads; returns at once.
  void Start();
  // Stops accepting and closes idle connections; responses in progress (streams ended by the
  // engine's stop) get until `deadline`, then every connection is cut. Idempotent.
  void Stop(std::chrono::milliseconds deadline);
  HttpFrontStats Stats() const;

 private:
  void Routes();
  Service& service_;
  std::unique_ptr<HttpFront> front_;
};

}  // namespace oasis::server

// RouterMetrics: oasis-router's own counters and histograms for GET /metrics (Prometheus text,
// prefix oasis:router_): requests by route and status, handoffs, requests finished on their
// prefill instance, clients gone, upstream failures by role and reason, retries, requests
// refused for want of a healthy instance or a free request thread, the HTTP front's
// connections, streams ended with an error event, time to first
// token, prefill time. Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common/histogram.h"
#include "common/http_front.h"

namespace oasis::router {

class RouterMetrics {
 public:
  RouterMetrics();

  // `route`: the path of a known route, or "other" (RouteLabel).
  void CountRequest(const std::string& route, int status);
  void CountHandoff();
  // A prefill instance's handoff ticket that could not be parsed.
  void CountBadTicket();
  void CountFinishedAtPrefill();
  void CountClientDisconnect();
  // `role`: "prefill" or "decode"; `reason`: one of kUpstreamFailureReasons.
  void CountUpstreamFailure(const std::string& role, const std::string& reason);
  void CountRetry(const std::string& role);
  void CountNoHealthyInstance(const std::string& role);
  void CountStreamError();
  // A request answered 503 at once: --http-threads requests were in flight already.
  void CountBusy();
  void ObserveTtft(double seconds);
  void ObservePrefill(double seconds);

  // The exposition, with `instance_metrics` (UpstreamPool's) after the counters and the HTTP
  // front's connection counters (oasis:router_http_*), and the LeaseAborter's counts.
  std::string Render(const std::string& instance_metrics, const HttpFrontStats& front,
                     uint64_t leases_aborted = 0, uint64_t lease_abort_failures = 0) const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, int>, int64_t> requests_;
  int64_t handoffs_ = 0;
  int64_t bad_tickets_ = 0;
  int64_t finished_at_prefill_ = 0;
  int64_t client_disconnects_ = 0;
  std::map<std::tuple<std::string, std::string>, int64_t> upstream_failures_;
  std::map<std::string, int64_t> retries_;
  std::map<std::string, int64_t> no_healthy_;
  int64_t stream_errors_ = 0;
  int64_t busy_ = 0;
  Histogram ttft_;
  Histogram prefill_seconds_;
};

// The reasons of oasis:router_upstream_failures_total: UpstreamFailureLabel's (connect,
// closed, first_byte_timeout, idle_timeout), "busy" (429 or 503) and "unhealthy" (a call given
// up while waiting because the health check marked its instance unhealthy).
inline constexpr const char* kUpstreamFailureReasons[] = {
    "connect", "closed", "first_byte_timeout", "idle_timeout", "busy", "unhealthy"};

// The route label of a request path: the path of a known route, else "other" (a bounded
// label set).
std::string RouteLabel(const std::string& path);

}  // namespace oasis::router

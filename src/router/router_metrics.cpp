#include "router/router_metrics.h"

#include <sstream>
#include <vector>

#include "common/http_util.h"

namespace oasis::router {
namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                            0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                            7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 640.0};

}  // namespace

std::string RouteLabel(const std::string& path) {
  static const char* const kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                        "/health", "/metrics"};
  for (const char* r : kRoutes) {
    if (path == r) return r;
  }
  return "other";
}

RouterMetrics::RouterMetrics()
    : ttft_(Histogram::WithBounds(kLatencyBounds)),
      prefill_seconds_(Histogram::WithBounds(kLatencyBounds)) {
  // Every series from the start (at 0), so that rates and alerts see them before a failure.
  for (const char* role : {"prefill", "decode"}) {
    for (const char* reason : kUpstreamFailureReasons) upstream_failures_[{role, reason}] = 0;
    retries_[role] = 0;
    no_healthy_[role] = 0;
  }
}

void RouterMetrics::CountUpstreamFailure(const std::string& role, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++upstream_failures_[{role, reason}];
}

void RouterMetrics::CountRetry(const std::string& role) {
  std::lock_guard<std::mutex> lock(mu_);
  ++retries_[role];
}

void RouterMetrics::CountNoHealthyInstance(const std::string& role) {
  std::lock_guard<std::mutex> lock(mu_);
  ++no_healthy_[role];
}

void RouterMetrics::CountStreamError() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stream_errors_;
}

void RouterMetrics::CountRequest(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void RouterMetrics::CountHandoff() {
  std::lock_guard<std::mutex> lock(mu_);
  ++handoffs_;
}

void RouterMetrics::CountBadTicket() {
  std::lock_guard<std::mutex> lock(mu_);
  ++bad_tickets_;
}

void RouterMetrics::CountFinishedAtPrefill() {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_at_prefill_;
}

void RouterMetrics::CountClientDisconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  ++client_disconnects_;
}

void RouterMetrics::ObserveTtft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void RouterMetrics::ObservePrefill(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_seconds_.Observe(seconds);
}

void RouterMetrics::CountBusy() {
  std::lock_guard<std::mutex> lock(mu_);
  ++busy_;
}

std::string RouterMetrics::Render(const std::string& instance_metrics, const HttpFrontStats& front,
                                  uint64_t leases_aborted, uint64_t lease_abort_failures) const {
  std::ostringstream s;
  std::lock_guard<std::mutex> lock(mu_);
  s << "# HELP oasis:router_requests_total Requests answered by the router, by route and status.\n"
       "# TYPE oasis:router_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    s << "oasis:router_requests_total{route=\"" << EscapeLabel(std::get<0>(key)) << "\",status=\""
      << std::get<1>(key) << "\"} " << count << "\n";
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    s << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n"
      << name << " " << v << "\n";
  };
  counter("oasis:router_handoffs_total",
          "Requests handed from a prefill instance to a decode instance.", handoffs_);
  counter("oasis:router_bad_tickets_total",
          "Handoff tickets from a prefill instance that could not be parsed (502).", bad_tickets_);
  counter("oasis:router_leases_aborted_total",
          "Staged leases the router aborted because their decode leg failed.",
          static_cast<int64_t>(leases_aborted));
  counter("oasis:router_lease_abort_failures_total",
          "Staged leases the router could not abort (they end at their TTL).",
          static_cast<int64_t>(lease_abort_failures));
  counter("oasis:router_finished_at_prefill_total",
          "Requests that finished on the prefill instance (no handoff).", finished_at_prefill_);
  counter("oasis:router_client_disconnects_total",
          "Relayed answers whose client went away before the end.", client_disconnects_);
  counter("oasis:router_stream_errors_total",
          "Streams that ended with an error event and [DONE] (their instance failed or stalled, "
          "or the router stopped).",
          stream_errors_);
  s << "# HELP oasis:router_upstream_failures_total Upstream calls that failed, by role and "
       "reason (connect, closed, first_byte_timeout, idle_timeout, busy, unhealthy).\n"
       "# TYPE oasis:router_upstream_failures_total counter\n";
  for (const auto& [key, count] : upstream_failures_) {
    s << "oasis:router_upstream_failures_total{role=\"" << EscapeLabel(std::get<0>(key))
      << "\",reason=\"" << EscapeLabel(std::get<1>(key)) << "\"} " << count << "\n";
  }
  auto by_role = [&](const char* name, const char* help, const std::map<std::string, int64_t>& m) {
    s << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n";
    for (const auto& [role, count] : m)
      s << name << "{role=\"" << EscapeLabel(role) << "\"} " << count << "\n";
  };
  by_role("oasis:router_upstream_retries_total",
          "Requests sent on to another instance after one failed before answering.", retries_);
  by_role("oasis:router_no_healthy_instance_total",
          "Requests answered 503 at once: no instance of the role was healthy.", no_healthy_);
  counter("oasis:router_busy_total",
          "Requests answered 503 at once: --http-threads requests were in flight already.", busy_);
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    s << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
      << name << " " << v << "\n";
  };
  gauge("oasis:router_http_connections_open", "Open client connections.", front.connections_open);
  auto front_counter = [&](const char* name, const char* help, uint64_t v) {
    counter(name, help, static_cast<int64_t>(v));
  };
  front_counter("oasis:router_http_connections_total", "Client connections accepted.",
                front.connections_accepted);
  front_counter("oasis:router_http_connections_refused_total",
                "Connections answered 503 at --max-connections.", front.refused_over_limit);
  front_counter("oasis:router_http_idle_connections_closed_total",
                "Idle keep-alive connections closed to make room.", front.idle_evicted);
  front_counter("oasis:router_http_slow_connections_closed_total",
                "Connections still sending their request after 1 s, closed to make room (none "
                "idle).",
                front.slow_evicted);
  front_counter("oasis:router_http_timeouts_total",
                "Requests or responses cut by a header, body or write timeout.", front.timeouts);
  front_counter("oasis:router_http_bad_requests_total",
                "Requests refused for framing or size (400, 413, 431) before routing.",
                front.bad_requests);
  s << instance_metrics;
  s << RenderHistogram("oasis:router_time_to_first_token_seconds",
                       "Streaming requests: arrival to the first byte relayed to the client.",
                       ttft_, "");
  s << RenderHistogram("oasis:router_prefill_seconds",
                       "Arrival to the prefill instance's 200 answer (retries included).",
                       prefill_seconds_, "");
  return s.str();
}

}  // namespace oasis::router

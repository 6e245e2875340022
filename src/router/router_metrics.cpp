#include "router/router_metrics.h"

#include <sstream>
#include <vector>

#include "common/http_util.h"

namespace oasis::router {
namespace {

const std::vector<double> kLatencyBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                            0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                            7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 640.0};
// The router's `le` labels: 15 significant digits ("0.1", not "0.10000000000000001").
constexpr int kBoundDigits = 15;

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
      prefill_seconds_(Histogram::WithBounds(kLatencyBounds)) {}

void RouterMetrics::CountRequest(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void RouterMetrics::CountHandoff() {
  std::lock_guard<std::mutex> lock(mu_);
  ++handoffs_;
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

std::string RouterMetrics::Render(const std::string& instance_metrics) const {
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
  counter("oasis:router_finished_at_prefill_total",
          "Requests that finished on the prefill instance (no handoff).", finished_at_prefill_);
  counter("oasis:router_client_disconnects_total",
          "Relayed answers whose client went away before the end.", client_disconnects_);
  s << instance_metrics;
  s << RenderHistogram("oasis:router_time_to_first_token_seconds",
                       "Streaming requests: arrival to the first byte relayed to the client.",
                       ttft_, "", kBoundDigits);
  s << RenderHistogram("oasis:router_prefill_seconds",
                       "Arrival to the prefill instance's 200 answer (retries included).",
                       prefill_seconds_, "", kBoundDigits);
  return s.str();
}

}  // namespace oasis::router

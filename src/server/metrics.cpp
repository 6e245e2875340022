// The staging pool's rows and the HTTP front end's counters (engine_metrics.cpp has EngineStats').
#include "server/metrics.h"

#include <sstream>
#include <tuple>

#include "server/metric_table.h"

namespace oasis::server {
namespace {

using StagingRow = MetricRow<StagingMetrics>;

std::vector<MetricSample> LeasesByEnd(const StagingMetrics& m) {
  return {{"end=\"completed\"", static_cast<double>(m.completed)},
          {"end=\"aborted\"", static_cast<double>(m.aborted)},
          {"end=\"expired\"", static_cast<double>(m.expired)}};
}

// clang-format off
constexpr StagingRow kStagingMetrics[] = {
    {"oasis:staging_pool_bytes", MetricType::kGauge, "Staging pool size.",
     [](const StagingMetrics& m) -> double { return m.bytes_total; }},
    {"oasis:staging_pool_bytes_held", MetricType::kGauge, "Staging pool bytes held by handed-off requests.",
     [](const StagingMetrics& m) -> double { return m.bytes_held; }},
    {"oasis:staging_pool_requests_held", MetricType::kGauge, "Handed-off requests whose KV is staged here.",
     [](const StagingMetrics& m) -> double { return m.requests_held; }},
    {"oasis:staging_pool_leases_total", MetricType::kCounter, "Staging leases ended, by how.", LeasesByEnd},
    {"oasis:staging_pool_acquire_failures_total", MetricType::kCounter, "Handoffs refused for lack of staging room.",
     [](const StagingMetrics& m) -> double { return m.acquire_failures; }},
    {"oasis:staging_connections_open", MetricType::kGauge, "Decode instances connected to the staging server.",
     [](const StagingMetrics& m) -> double { return m.connections_open; }},
};
using FrontRow = MetricRow<HttpFrontStats>;
constexpr FrontRow kFrontMetrics[] = {
    {"oasis:http_connections_open", MetricType::kGauge, "Open HTTP connections.",
     [](const HttpFrontStats& s) -> double { return s.connections_open; }},
    {"oasis:http_connections_total", MetricType::kCounter, "HTTP connections accepted.",
     [](const HttpFrontStats& s) -> double { return s.connections_accepted; }},
    {"oasis:http_connections_refused_total", MetricType::kCounter, "Connections answered 503 at --max-connections.",
     [](const HttpFrontStats& s) -> double { return s.refused_over_limit; }},
    {"oasis:http_idle_connections_closed_total", MetricType::kCounter, "Idle keep-alive connections closed to make room.",
     [](const HttpFrontStats& s) -> double { return s.idle_evicted; }},
    {"oasis:http_slow_connections_closed_total", MetricType::kCounter, "Connections still sending their request after 1 s, closed to make room (none idle).",
     [](const HttpFrontStats& s) -> double { return s.slow_evicted; }},
    {"oasis:http_timeouts_total", MetricType::kCounter, "Requests or responses cut by a header, body or write timeout.",
     [](const HttpFrontStats& s) -> double { return s.timeouts; }},
    {"oasis:http_bad_requests_total", MetricType::kCounter, "Requests refused for framing or size (400, 413, 431) before routing.",
     [](const HttpFrontStats& s) -> double { return s.bad_requests; }},
};
// clang-format on

}  // namespace

std::string RenderFrontMetrics(const HttpFrontStats& s, const std::string& model_name) {
  return RenderMetricTable<HttpFrontStats>(kFrontMetrics, s,
                                           "model_name=\"" + EscapeLabel(model_name) + "\"");
}

std::string RenderStagingMetrics(const StagingMetrics& m, const std::string& model_name) {
  return RenderMetricTable<StagingMetrics>(kStagingMetrics, m,
                                           "model_name=\"" + EscapeLabel(model_name) + "\"");
}

void HttpMetrics::Count(const std::string& method, const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{method, route, status}];
}

std::string HttpMetrics::Render(const std::string& model_label) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream s;
  s << "# HELP oasis:http_requests_total HTTP requests answered, by method, route and status.\n"
       "# TYPE oasis:http_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    const auto& [method, route, status] = key;
    s << "oasis:http_requests_total{method=\"" << EscapeLabel(method) << "\",handler=\""
      << EscapeLabel(route) << "\",status=\"" << status << "\"} " << count << "\n";
  }
  RenderMetric(s, "oasis:client_disconnects_total", MetricType::kCounter,
               "Requests aborted because their client disconnected before they finished.",
               "model_name=\"" + EscapeLabel(model_label) + "\"",
               {{"", static_cast<double>(client_disconnects_)}});
  return s.str();
}

}  // namespace oasis::server

#include "server/metrics.h"

#include <cstdio>
#include <sstream>

namespace oasis::server {
namespace {

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void Metric(std::ostringstream& s, const char* type, const std::string& name, const std::string& help,
            const std::string& labels, double value) {
  s << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  s << name << "{" << labels << "} " << Number(value) << "\n";
}

}  // namespace

std::string EscapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
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
    s << "oasis:http_requests_total{method=\"" << EscapeLabel(method) << "\",handler=\"" << EscapeLabel(route)
      << "\",status=\"" << status << "\"} " << count << "\n";
  }
  Metric(s, "counter", "oasis:client_disconnects_total",
         "Requests aborted because their client disconnected before they finished.",
         "model_name=\"" + EscapeLabel(model_label) + "\"", static_cast<double>(client_disconnects_));
  return s.str();
}

std::string RenderHistogram(const std::string& name, const std::string& help, const LatencyHistogram& h,
                            const std::string& labels) {
  std::ostringstream s;
  s << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le = i < h.bounds.size() ? Number(h.bounds[i]) : "+Inf";
    s << name << "_bucket{" << labels << ",le=\"" << le << "\"} " << cumulative << "\n";
  }
  if (h.counts.empty()) s << name << "_bucket{" << labels << ",le=\"+Inf\"} " << h.count << "\n";
  s << name << "_sum{" << labels << "} " << Number(h.sum) << "\n";
  s << name << "_count{" << labels << "} " << h.count << "\n";
  return s.str();
}

std::string RenderEngineMetrics(const EngineStats& st, const std::string& model_name) {
  const std::string labels = "model_name=\"" + EscapeLabel(model_name) + "\"";
  std::ostringstream s;
  Metric(s, "gauge", "oasis:num_requests_running", "Requests in the running batch.", labels,
         static_cast<double>(st.num_running));
  Metric(s, "gauge", "oasis:num_requests_waiting", "Requests waiting to be scheduled.", labels,
         static_cast<double>(st.num_waiting));
  Metric(s, "gauge", "oasis:kv_cache_usage_perc", "Fraction of KV cache head-blocks in use (1 = 100%).", labels,
         st.kv_usage);
  Metric(s, "gauge", "oasis:num_kv_blocks", "KV cache head-blocks per layer.", labels,
         static_cast<double>(st.num_kv_slots));
  Metric(s, "gauge", "oasis:num_free_kv_blocks", "Free KV cache head-blocks per layer.", labels,
         static_cast<double>(st.num_free_kv_slots));
  Metric(s, "counter", "oasis:prompt_tokens_total", "Prefilled prompt tokens.", labels,
         static_cast<double>(st.prompt_tokens_total));
  Metric(s, "counter", "oasis:generation_tokens_total", "Generated tokens.", labels,
         static_cast<double>(st.generation_tokens_total));
  Metric(s, "counter", "oasis:num_preemptions_total", "Requests preempted (recomputed later).", labels,
         static_cast<double>(st.preemptions_total));
  Metric(s, "counter", "oasis:engine_steps_total", "Engine steps executed.", labels,
         static_cast<double>(st.steps_total));
  // Lookahead decoding (EAGLE-3 drafts); zero when it is off.
  Metric(s, "gauge", "oasis:num_draft_kv_blocks", "Draft head KV cache head-blocks.", labels,
         static_cast<double>(st.num_draft_kv_slots));
  Metric(s, "gauge", "oasis:num_free_draft_kv_blocks", "Free draft head KV cache head-blocks.", labels,
         static_cast<double>(st.num_free_draft_kv_slots));
  Metric(s, "counter", "oasis:spec_decode_num_proposed_tokens_total", "Draft tokens the draft head proposed.",
         labels, static_cast<double>(st.draft_tokens_proposed_total));
  Metric(s, "counter", "oasis:spec_decode_num_draft_tokens_total", "Draft tokens verified by the model.", labels,
         static_cast<double>(st.draft_tokens_total));
  Metric(s, "counter", "oasis:spec_decode_num_accepted_tokens_total",
         "Verified draft tokens equal to the sampled token (emitted with --lookahead speculate).", labels,
         static_cast<double>(st.draft_accepted_total));
  Metric(s, "gauge", "oasis:spec_decode_draft_acceptance_rate", "Accepted / verified draft tokens.", labels,
         st.draft_acceptance_rate());
  Metric(s, "counter", "oasis:spec_decode_num_steps_total", "Request decode steps that verified a draft.", labels,
         static_cast<double>(st.lookahead_steps_total));
  Metric(s, "counter", "oasis:spec_decode_num_emitted_tokens_total",
         "Tokens emitted by request decode steps that verified a draft.", labels,
         static_cast<double>(st.lookahead_tokens_total));
  Metric(s, "gauge", "oasis:spec_decode_tokens_per_step",
         "Mean tokens emitted per request decode step that verified a draft.", labels,
         st.tokens_per_lookahead_step());
  s << "# HELP oasis:request_success_total Finished requests, by finish reason.\n"
       "# TYPE oasis:request_success_total counter\n";
  const std::pair<const char*, int64_t> reasons[] = {{"stop", st.requests_stop_total},
                                                    {"length", st.requests_length_total},
                                                    {"abort", st.requests_abort_total},
                                                    {"error", st.requests_error_total}};
  for (const auto& [reason, count] : reasons) {
    s << "oasis:request_success_total{" << labels << ",finished_reason=\"" << reason << "\"} " << count << "\n";
  }
  s << RenderHistogram("oasis:time_to_first_token_seconds", "Time to first token.", st.ttft, labels);
  s << RenderHistogram("oasis:inter_token_latency_seconds", "Time between consecutive tokens.", st.itl, labels);
  s << RenderHistogram("oasis:e2e_request_latency_seconds", "End-to-end request latency.", st.e2e, labels);
  return s.str();
}

}  // namespace oasis::server

// Benchmark reports: see report.h.
#include "tools/loadgen/report.h"

#include <cmath>
#include <sstream>

namespace oasis::loadgen {

using nlohmann::ordered_json;

std::string PercentileKey(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", p);
  return buf;
}

namespace {

void Line(std::string* out, const std::string& name, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-40s %-10s\n", name.c_str(), value.c_str());
  *out += buf;
}
std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}
// "-----Title-----" centred in 50 columns, like vllm's f"{s_:{c}^50}".
std::string Banner(const std::string& title, char fill) {
  const size_t width = 50;
  if (title.size() >= width) return title + "\n";
  const size_t left = (width - title.size()) / 2;
  return std::string(left, fill) + title + std::string(width - title.size() - left, fill) + "\n";
}
void Metric(std::string* out, const std::string& title, const std::string& short_name,
            const Distribution& d) {
  *out += Banner(title, '-');
  Line(out, "Mean " + short_name + " (ms):", Fixed(d.mean, 2));
  Line(out, "Median " + short_name + " (ms):", Fixed(d.median, 2));
  for (const auto& [p, v] : d.percentiles) {
    Line(out, "P" + PercentileKey(p) + " " + short_name + " (ms):", Fixed(v, 2));
  }
}
void MetricJson(ordered_json* out, const std::string& name, const Distribution& d) {
  (*out)["mean_" + name + "_ms"] = d.mean;
  (*out)["median_" + name + "_ms"] = d.median;
  (*out)["std_" + name + "_ms"] = d.stddev;
  for (const auto& [p, v] : d.percentiles) (*out)["p" + PercentileKey(p) + "_" + name + "_ms"] = v;
}
std::string ConfigText(const ordered_json& config, const char* key, const std::string& none) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return none;
  if (it->is_number_float()) {
    const double v = it->get<double>();
    return std::isfinite(v) ? Fixed(v, 2) : "inf";
  }
  return it->is_string() ? it->get<std::string>() : it->dump();
}

}  // namespace

std::string FormatSummary(const Summary& s, const ordered_json& config) {
  std::string out;
  out += Banner(" Serving Benchmark Result ", '=');
  Line(&out, "Successful requests:", std::to_string(s.completed));
  Line(&out, "Failed requests:", std::to_string(s.failed));
  Line(&out, "Maximum request concurrency:", ConfigText(config, "max_concurrency", "None"));
  Line(&out, "Request rate configured (RPS):", ConfigText(config, "request_rate", "inf"));
  Line(&out, "Benchmark duration (s):", Fixed(s.duration_s, 2));
  Line(&out, "Total input tokens:", std::to_string(s.total_input_tokens));
  Line(&out, "Total generated tokens:", std::to_string(s.total_output_tokens));
  Line(&out, "Total cached prompt tokens:", std::to_string(s.total_cached_tokens));
  Line(&out, "Cached / total prompt tokens:", Fixed(s.cached_token_ratio, 4));
  Line(&out, "Request throughput (req/s):", Fixed(s.request_throughput, 2));
  if (s.request_goodput) Line(&out, "Request goodput (req/s):", Fixed(*s.request_goodput, 2));
  Line(&out, "Output token throughput (tok/s):", Fixed(s.output_throughput, 2));
  Line(&out, "Peak output token throughput (tok/s):", Fixed(s.peak_output_throughput, 2));
  Line(&out, "Peak concurrent requests:", std::to_string(s.peak_concurrency));
  Line(&out, "Total Token throughput (tok/s):", Fixed(s.total_token_throughput, 2));
  for (const std::string& m : s.reported_metrics) {
    if (m == "ttft") Metric(&out, "Time to First Token", "TTFT", s.ttft_ms);
    if (m == "tpot") Metric(&out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
    if (m == "itl") Metric(&out, "Inter-token Latency", "ITL", s.itl_ms);
    if (m == "e2el") Metric(&out, "End-to-end Latency", "E2EL", s.e2el_ms);
  }
  if (!s.per_turn.empty()) {
    out += Banner("Per Turn (TTFT, cached prompt tokens)", '-');
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-5s %6s %6s %12s %12s %12s %12s\n", "Turn", "OK", "Failed",
                  "Median TTFT", "P90 TTFT", "Mean cached", "Mean prompt");
    out += buf;
    std::snprintf(buf, sizeof(buf), "%-5s %6s %6s %12s %12s %12s %12s\n", "", "", "", "(ms)",
                  "(ms)", "tokens", "tokens");
    out += buf;
    for (const TurnSummary& t : s.per_turn) {
      std::snprintf(buf, sizeof(buf), "%-5lld %6lld %6lld %12.2f %12.2f %12.1f %12.1f\n",
                    static_cast<long long>(t.turn), static_cast<long long>(t.completed),
                    static_cast<long long>(t.failed), t.median_ttft_ms, t.p90_ttft_ms,
                    t.mean_cached_tokens, t.mean_prompt_tokens);
      out += buf;
    }
  }
  if (!s.failure_reasons.empty()) {
    out += Banner("Failure reasons", '-');
    for (const auto& [key, group] : s.failure_reasons) {
      out += "  " + std::to_string(group.count) + " x " + group.example;
      if (group.count > 1 && key != group.example) out += "  (and the like)";
      out += "\n";
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

ordered_json SummaryJson(const Summary& s) {
  ordered_json j;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["duration"] = s.duration_s;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["total_cached_tokens"] = s.total_cached_tokens;
  j["cached_token_ratio"] = s.cached_token_ratio;
  j["request_throughput"] = s.request_throughput;
  if (s.request_goodput) {
    j["request_goodput"] = *s.request_goodput;
    j["good_completed"] = s.good_completed;
  } else {
    j["request_goodput"] = nullptr;
  }
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  j["max_output_tokens_per_s"] = s.peak_output_throughput;
  j["max_concurrent_requests"] = s.peak_concurrency;
  for (const std::string& m : s.reported_metrics) {
    if (m == "ttft") MetricJson(&j, "ttft", s.ttft_ms);
    if (m == "tpot") MetricJson(&j, "tpot", s.tpot_ms);
    if (m == "itl") MetricJson(&j, "itl", s.itl_ms);
    if (m == "e2el") MetricJson(&j, "e2el", s.e2el_ms);
  }
  if (!s.per_turn.empty()) {
    ordered_json turns = ordered_json::array();
    for (const TurnSummary& t : s.per_turn) {
      turns.push_back({{"turn", t.turn},
                       {"completed", t.completed},
                       {"failed", t.failed},
                       {"mean_ttft_ms", t.mean_ttft_ms},
                       {"median_ttft_ms", t.median_ttft_ms},
                       {"p90_ttft_ms", t.p90_ttft_ms},
                       {"mean_prompt_tokens", t.mean_prompt_tokens},
                       {"mean_cached_tokens", t.mean_cached_tokens}});
    }
    j["per_turn"] = std::move(turns);
  }
  return j;
}

ordered_json RecordJson(const RequestRecord& r) {
  ordered_json j;
  j["index"] = r.index;
  if (r.turn > 0) {
    j["conversation"] = r.conversation;
    j["turn"] = r.turn;
  }
  j["success"] = r.success;
  j["start_s"] = r.start_s;
  j["prompt_tokens"] = r.prompt_tokens;
  j["output_tokens"] = r.output_tokens;
  j["expected_output_tokens"] = r.expected_output_tokens;
  j["usage_reported"] = r.usage_reported;
  j["cached_tokens"] = r.cached_tokens;
  j["ttft_ms"] = r.ttft_s * 1e3;
  j["e2el_ms"] = r.e2el_s * 1e3;
  if (r.output_tokens > 1 && r.success) {
    j["tpot_ms"] = (r.e2el_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1);
  } else {
    j["tpot_ms"] = nullptr;
  }
  ordered_json itl = ordered_json::array();
  for (double gap : r.itl_s) itl.push_back(gap * 1e3);
  j["itl_ms"] = std::move(itl);
  j["finish_reason"] = r.finish_reason;
  j["http_status"] = r.http_status;
  if (!r.success) {
    j["failure"] = FailureKindName(r.failure);
    j["error"] = r.error;
  }
  if (!r.generated_text.empty()) j["generated_text"] = r.generated_text;
  return j;
}

ordered_json ResultJson(const ordered_json& config, const Summary& summary,
                        const std::vector<RequestRecord>& records,
                        const std::vector<RequestRecord>& warmup_records) {
  ordered_json j;
  j["config"] = config;
  j["summary"] = SummaryJson(summary);
  ordered_json failures = ordered_json::array();
  for (const auto& [key, group] : summary.failure_reasons) {
    failures.push_back({{"reason", key}, {"count", group.count}, {"example", group.example}});
  }
  j["failures"] = std::move(failures);
  // Warm-up requests hit the server too (its counters include them), so their totals are kept.
  ordered_json warmup;
  int64_t ok = 0, prompt = 0, output = 0;
  for (const RequestRecord& r : warmup_records) {
    if (!r.success) continue;
    ++ok;
    prompt += r.prompt_tokens;
    output += r.output_tokens;
  }
  warmup["requests"] = warmup_records.size();
  warmup["completed"] = ok;
  warmup["failed"] = static_cast<int64_t>(warmup_records.size()) - ok;
  warmup["prompt_tokens"] = prompt;
  warmup["output_tokens"] = output;
  j["warmup"] = std::move(warmup);
  ordered_json requests = ordered_json::array();
  for (const RequestRecord& r : records) requests.push_back(RecordJson(r));
  j["requests"] = std::move(requests);
  return j;
}

}  // namespace oasis::loadgen

// Benchmark statistics: see stats.h.
#include "tools/loadgen/stats.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

namespace oasis::loadgen {

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone:
      return "none";
    case FailureKind::kHttpStatus:
      return "http_status";
    case FailureKind::kConnection:
      return "connection";
    case FailureKind::kTimeout:
      return "timeout";
    case FailureKind::kStreamError:
      return "stream_error";
  }
  return "unknown";
}

std::string FailureReason(const RequestRecord& record) {
  switch (record.failure) {
    case FailureKind::kNone:
      return "";
    case FailureKind::kHttpStatus:
      return "HTTP " + std::to_string(record.http_status) + ": " + record.error;
    case FailureKind::kConnection:
      return "connection error: " + record.error;
    case FailureKind::kTimeout:
      return "timeout: " + record.error;
    case FailureKind::kStreamError:
      return "stream error: " + record.error;
  }
  return record.error;
}

std::string FailureGroupKey(const RequestRecord& record) {
  const std::string reason = FailureReason(record);
  // Keep "HTTP 400: " as is; normalise the message after it.
  const size_t message_start =
      record.failure == FailureKind::kHttpStatus ? reason.find(": ") : std::string::npos;
  std::string key = message_start == std::string::npos ? "" : reason.substr(0, message_start + 2);
  const size_t from = message_start == std::string::npos ? 0 : message_start + 2;
  for (size_t i = from; i < reason.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(reason[i]))) {
      while (i + 1 < reason.size() && std::isdigit(static_cast<unsigned char>(reason[i + 1]))) ++i;
      key += 'N';
    } else {
      key += reason[i];
    }
  }
  return key;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Distribution Describe(const std::vector<double>& values, const std::vector<double>& percentiles) {
  Distribution d;
  d.count = values.size();
  for (double p : percentiles) d.percentiles.emplace_back(p, 0.0);
  if (values.empty()) return d;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const double n = static_cast<double>(sorted.size());
  d.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  double sq = 0;
  for (double v : sorted) sq += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(sq / n);  // population standard deviation (numpy's np.std)
  d.min = sorted.front();
  d.max = sorted.back();
  d.median = Percentile(sorted, 50);
  for (auto& [p, v] : d.percentiles) v = Percentile(sorted, p);
  return d;
}

namespace {

// Max number of token events inside any 1-second bucket [k, k+1) of the run.
double PeakOutputThroughput(const std::vector<RequestRecord>& records) {
  std::map<int64_t, int64_t> per_second;
  for (const RequestRecord& r : records) {
    if (!r.success || r.output_tokens == 0) continue;
    double t = r.start_s + r.ttft_s;
    ++per_second[static_cast<int64_t>(std::floor(t))];
    for (double gap : r.itl_s) {
      t += gap;
      ++per_second[static_cast<int64_t>(std::floor(t))];
    }
  }
  int64_t peak = 0;
  for (const auto& [second, n] : per_second) peak = std::max(peak, n);
  return static_cast<double>(peak);
}

// Max number of requests in flight at one instant (every request, failed ones too).
int64_t PeakConcurrency(const std::vector<RequestRecord>& records) {
  std::vector<std::pair<double, int>> edges;  // (time, +1 start / -1 end); ends sort first
  for (const RequestRecord& r : records) {
    edges.emplace_back(r.start_s, +1);
    edges.emplace_back(r.start_s + r.e2el_s, -1);
  }
  std::sort(edges.begin(), edges.end());
  int64_t now = 0, peak = 0;
  for (const auto& [t, delta] : edges) {
    now += delta;
    peak = std::max(peak, now);
  }
  return peak;
}

std::vector<TurnSummary> PerTurn(const std::vector<RequestRecord>& records) {
  int64_t turns = 0;
  for (const RequestRecord& r : records) turns = std::max(turns, r.turn);
  std::vector<TurnSummary> out(static_cast<size_t>(turns));
  std::vector<std::vector<double>> ttft(out.size());
  std::vector<double> prompt(out.size(), 0.0), cached(out.size(), 0.0);
  for (const RequestRecord& r : records) {
    if (r.turn <= 0) continue;
    const auto t = static_cast<size_t>(r.turn - 1);
    if (!r.success) {
      ++out[t].failed;
      continue;
    }
    ++out[t].completed;
    ttft[t].push_back(r.ttft_s * 1e3);
    prompt[t] += static_cast<double>(r.prompt_tokens);
    cached[t] += static_cast<double>(r.cached_tokens);
  }
  for (size_t t = 0; t < out.size(); ++t) {
    TurnSummary& ts = out[t];
    ts.turn = static_cast<int64_t>(t) + 1;
    if (ts.completed == 0) continue;
    const double n = static_cast<double>(ts.completed);
    ts.mean_ttft_ms = std::accumulate(ttft[t].begin(), ttft[t].end(), 0.0) / n;
    ts.median_ttft_ms = Percentile(ttft[t], 50);
    ts.p90_ttft_ms = Percentile(ttft[t], 90);
    ts.mean_prompt_tokens = prompt[t] / n;
    ts.mean_cached_tokens = cached[t] / n;
  }
  return out;
}

}  // namespace

Summary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                  const std::vector<double>& percentiles) {
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.failed;
      Summary::FailureGroup& group = s.failure_reasons[FailureGroupKey(r)];
      if (group.count++ == 0) group.example = FailureReason(r);
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    s.total_cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2el_s * 1e3);
    if (r.output_tokens > 1) {
      tpot.push_back((r.e2el_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1));
    }
    for (double gap : r.itl_s) itl.push_back(gap * 1e3);
  }
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
  }
  if (s.total_input_tokens > 0) {
    s.cached_token_ratio =
        static_cast<double>(s.total_cached_tokens) / static_cast<double>(s.total_input_tokens);
  }
  s.per_turn = PerTurn(records);
  s.peak_output_throughput = PeakOutputThroughput(records);
  s.peak_concurrency = PeakConcurrency(records);
  s.ttft_ms = Describe(ttft, percentiles);
  s.tpot_ms = Describe(tpot, percentiles);
  s.itl_ms = Describe(itl, percentiles);
  s.e2el_ms = Describe(e2el, percentiles);
  return s;
}

StatusOr<std::vector<double>> ParsePercentiles(const std::string& text, const std::string& flag) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t pos = 0;
    double v = -1;
    try {
      v = std::stod(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != item.size() || !(v >= 0 && v <= 100)) {
      return InvalidArgument(flag + ": '" + item + "' is not a percentile in [0, 100]");
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument(flag + " is empty");
  return out;
}

StatusOr<std::vector<std::string>> ParsePercentileMetrics(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item != "ttft" && item != "tpot" && item != "itl" && item != "e2el") {
      return InvalidArgument("--percentile-metrics: '" + item +
                             "' is not one of ttft, tpot, itl, e2el (vLLM's client_queue_time "
                             "and e2el_including_client_queue are not implemented)");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty() || text.back() == ',') {
    return InvalidArgument("--percentile-metrics '" + text + "' has an empty metric name");
  }
  return out;
}

StatusOr<GoodputSlos> ParseGoodput(const std::string& text) {
  GoodputSlos slos;
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::stringstream in(spaced);
  std::string item;
  int n = 0;
  while (in >> item) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos || item.find(':', colon + 1) != std::string::npos) {
      return InvalidArgument("--goodput: '" + item +
                             "' is not KEY:VALUE (e.g. --goodput ttft:100 tpot:50 e2el:1000, "
                             "values in milliseconds)");
    }
    const std::string key = item.substr(0, colon), value = item.substr(colon + 1);
    std::optional<double>* slot = key == "ttft"   ? &slos.ttft_ms
                                  : key == "tpot" ? &slos.tpot_ms
                                  : key == "e2el" ? &slos.e2el_ms
                                                  : nullptr;
    if (slot == nullptr) {
      return InvalidArgument("--goodput: unknown metric '" + key +
                             "' (the SLO names are ttft, tpot and e2el)");
    }
    size_t pos = 0;
    double v = -1;
    try {
      v = std::stod(value, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != value.size() || !std::isfinite(v) || v < 0) {
      return InvalidArgument("--goodput: the " + key + " SLO '" + value +
                             "' is not a non-negative number of milliseconds");
    }
    if (slot->has_value()) return InvalidArgument("--goodput: " + key + " is given twice");
    *slot = v;
    ++n;
  }
  if (n == 0) return InvalidArgument("--goodput needs at least one KEY:VALUE pair");
  return slos;
}

int64_t CountGoodRequests(const std::vector<RequestRecord>& records, const GoodputSlos& slos) {
  int64_t good = 0;
  for (const RequestRecord& r : records) {
    if (!r.success) continue;
    const double ttft = r.ttft_s * 1e3, e2el = r.e2el_s * 1e3;
    const double tpot = r.output_tokens > 1
                            ? (r.e2el_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1)
                            : 0.0;
    if (slos.ttft_ms && ttft > *slos.ttft_ms) continue;
    if (slos.tpot_ms && tpot > *slos.tpot_ms) continue;
    if (slos.e2el_ms && e2el > *slos.e2el_ms) continue;
    ++good;
  }
  return good;
}

void AddGoodput(const std::vector<RequestRecord>& records, const GoodputSlos& slos,
                Summary* summary) {
  summary->good_completed = CountGoodRequests(records, slos);
  summary->request_goodput =
      summary->duration_s > 0 ? static_cast<double>(summary->good_completed) / summary->duration_s
                              : 0.0;
}

}  // namespace oasis::loadgen

// Benchmark statistics: percentiles (linear interpolation between closest ranks, numpy's
// default, so numbers agree with vllm bench serve), per-metric distributions and the run
// summary computed from request records. Pure functions over values; thread-compatible.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "oasis/status.h"
#include "tools/loadgen/request_record.h"

namespace oasis::loadgen {

// The p-th percentile (0 <= p <= 100) of `values` (any order); 0 for an empty input.
double Percentile(std::vector<double> values, double p);

struct Distribution {
  double mean = 0, median = 0, stddev = 0, min = 0, max = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value), in the order asked
  size_t count = 0;
};
Distribution Describe(const std::vector<double>& values, const std::vector<double>& percentiles);

// One turn index of a multi-turn run, over the requests of that turn in every conversation.
struct TurnSummary {
  int64_t turn = 0;  // 1-based
  int64_t completed = 0, failed = 0;
  double mean_ttft_ms = 0, median_ttft_ms = 0, p90_ttft_ms = 0;  // successful requests
  double mean_prompt_tokens = 0, mean_cached_tokens = 0;         // successful requests
};

struct Summary {
  int64_t completed = 0;
  int64_t failed = 0;
  struct FailureGroup {
    int64_t count = 0;
    std::string example;  // the first failure's full reason
  };
  std::map<std::string, FailureGroup> failure_reasons;  // FailureGroupKey -> group
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  // Prompt tokens the server served from its prefix cache (usage.prompt_tokens_details.
  // cached_tokens), and their share of total_input_tokens (0 when there are none).
  int64_t total_cached_tokens = 0;
  double cached_token_ratio = 0;
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output) tokens / s
  double peak_output_throughput = 0;  // max over 1-second windows of token events
  int64_t peak_concurrency = 0;       // max requests in flight at once
  // In milliseconds.
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  // The metrics the report shows (--percentile-metrics): "ttft", "tpot", "itl", "e2el".
  std::vector<std::string> reported_metrics = {"ttft", "tpot", "itl", "e2el"};
  // Multi-turn runs (records with a turn): one entry per turn index, turn 1 first.
  std::vector<TurnSummary> per_turn;
  // With --goodput: successful requests meeting every SLO, and those per second.
  std::optional<double> request_goodput;
  int64_t good_completed = 0;
};

// Successful requests feed the latency distributions and token totals; failures are only
// counted (with their reasons). TPOT of a request = (e2el - ttft) / (output_tokens - 1),
// defined for output_tokens > 1. ITL pools every gap of every successful request. Records
// with a turn (multi-turn) are also summarised per turn index.
Summary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                  const std::vector<double>& percentiles);

// "50,90,99.9" -> {50, 90, 99.9}; each in [0, 100]. `flag` names the flag in errors.
StatusOr<std::vector<double>> ParsePercentiles(const std::string& text,
                                               const std::string& flag = "--percentiles");

// "ttft,tpot,itl,e2el" (vLLM's --percentile-metrics): each once, in the given order.
StatusOr<std::vector<std::string>> ParsePercentileMetrics(const std::string& text);

// vLLM's --goodput: service level objectives in milliseconds; a request is good when it
// succeeded and each given metric is <= its SLO. TPOT of a one-token request counts as 0.
struct GoodputSlos {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// "ttft:100 tpot:50 e2el:1000" (space- or comma-separated KEY:VALUE pairs).
StatusOr<GoodputSlos> ParseGoodput(const std::string& text);
int64_t CountGoodRequests(const std::vector<RequestRecord>& records, const GoodputSlos& slos);
// Sets summary->good_completed and request_goodput (good requests / duration).
void AddGoodput(const std::vector<RequestRecord>& records, const GoodputSlos& slos,
                Summary* summary);

}  // namespace oasis::loadgen

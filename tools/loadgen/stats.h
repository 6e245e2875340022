// Benchmark statistics: percentiles (linear interpolation between closest ranks, numpy's
// default, so numbers agree with vllm bench serve), per-metric distributions and the run
// summary computed from request records. Pure functions over values; thread-compatible.
#pragma once

#include <map>
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
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output) tokens / s
  double peak_output_throughput = 0;  // max over 1-second windows of token events
  int64_t peak_concurrency = 0;       // max requests in flight at once
  // In milliseconds.
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

// Successful requests feed the latency distributions and token totals; failures are only
// counted (with their reasons). TPOT of a request = (e2el - ttft) / (output_tokens - 1),
// defined for output_tokens > 1. ITL pools every gap of every successful request.
Summary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                  const std::vector<double>& percentiles);

// "50,90,99.9" -> {50, 90, 99.9}; each in [0, 100].
StatusOr<std::vector<double>> ParsePercentiles(const std::string& text);

}  // namespace oasis::loadgen

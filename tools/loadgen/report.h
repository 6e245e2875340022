// Benchmark reports: the console summary in vllm bench serve's layout, and the result JSON
// (the run's configuration, the summary with flat vLLM-style keys, the failure reasons,
// the warm-up totals and every per-request record). Pure functions; thread-compatible.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/loadgen/request_record.h"
#include "tools/loadgen/stats.h"

namespace oasis::loadgen {

// The summary as text. `config` supplies the header lines (request rate, concurrency).
std::string FormatSummary(const Summary& summary, const nlohmann::ordered_json& config);

// Flat keys like vllm's result file: completed, failed, duration, total_input_tokens,
// total_output_tokens, total_cached_tokens, cached_token_ratio, request_throughput,
// output_throughput, total_token_throughput, mean_ttft_ms, median_ttft_ms, std_ttft_ms,
// p99_ttft_ms (one pNN per percentile), ...; multi-turn runs add "per_turn": [{"turn",
// "completed", "failed", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms",
// "mean_prompt_tokens", "mean_cached_tokens"}].
nlohmann::ordered_json SummaryJson(const Summary& summary);

nlohmann::ordered_json RecordJson(const RequestRecord& record);

// {"config", "summary", "failures": [{"reason", "count", "example"}], "warmup", "requests"}.
nlohmann::ordered_json ResultJson(const nlohmann::ordered_json& config, const Summary& summary,
                                  const std::vector<RequestRecord>& records,
                                  const std::vector<RequestRecord>& warmup_records);

// "99" for 99, "99.9" for 99.9 (the pNN key suffix, as vllm writes it).
std::string PercentileKey(double p);

}  // namespace oasis::loadgen

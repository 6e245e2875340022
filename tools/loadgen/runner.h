// RunBenchmark: drives one phase of a benchmark (warm-up or measured run) against a server.
//
// A dispatcher (the calling thread) releases the prompts in order at their arrival times —
// all at once for an infinite request rate, else with gamma-distributed gaps of mean
// 1/rate (shape = burstiness; 1 is a Poisson process) drawn from the seed — into a queue.
// `workers` threads (max_concurrency, or one per prompt when unlimited) each own a
// BenchClient and send one request at a time, so at most max_concurrency are in flight;
// a request that arrives while all are busy waits its turn (its latency is counted from
// when it is sent, as vllm bench serve does).
//
// RunConversations (multi-turn): the units released are conversations instead of prompts. A
// worker sends a conversation's turns in order, turn t+1 only after turn t's response ended
// (and `think_time_s` more), so at most max_concurrency conversations — and so requests — are
// in flight, and a finite request rate paces the conversation starts. A failed turn does not
// stop its conversation: the next turn's prompt does not depend on the response.
//
// Owns its threads for the duration of the call. Thread-safe in the sense that it is one
// blocking call; the options and prompts are read-only during it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tools/loadgen/http_client.h"
#include "tools/loadgen/openai_stream.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/request_record.h"
#include "tools/loadgen/workload.h"

namespace oasis::loadgen {

struct RunOptions {
  ServerAddress address;
  std::string api_key;
  std::string path = "/v1/completions";
  RequestOptions request;
  double request_rate = std::numeric_limits<double>::infinity();  // requests / s
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0 = unlimited
  uint64_t seed = 0;
  double timeout_s = 600;
  bool save_text = false;
  double think_time_s = 0;  // RunConversations: pause between a response and the next turn
};

struct RunResult {
  std::vector<RequestRecord> records;  // records[i] is prompts[i]
  double duration_s = 0;               // first send to last completion
};

RunResult RunBenchmark(const RunOptions& options, const std::vector<Prompt>& prompts,
                       Progress* progress);

// records[] holds conversation 0's turns in order, then conversation 1's, ...; each record has
// its conversation (0-based) and turn (1-based).
RunResult RunConversations(const RunOptions& options,
                           const std::vector<MultiTurnConversation>& conversations,
                           Progress* progress);

// The arrival times (seconds from the start) of `n` requests; all 0 for an infinite rate.
std::vector<double> ArrivalTimes(int64_t n, double request_rate, double burstiness, uint64_t seed);

// The longest wait the runner schedules: 100 years (int64 nanoseconds hold 292).
inline constexpr double kMaxBenchSeconds = 100.0 * 365.25 * 24 * 3600;
// `seconds` as a clock duration, saturating at kMaxBenchSeconds (0 for <= 0 or nan): never the
// overflow of a plain duration_cast.
BenchClock::duration SecondsToDuration(double seconds);

}  // namespace oasis::loadgen

// Token sampling from one row of logits: greedy, temperature, top-k, top-p, min-p, with
// counter-based per-request randomness; log-probabilities of the chosen and top tokens.
//
// The exact rule (the CUDA sampling kernel implements the same one, so a seeded request
// draws the same tokens on both backends up to floating-point near-ties):
//   order the vocabulary by (logit desc, id asc); keep the first top_k; with
//   q_i = exp((l_i - l_max) / T), keep the shortest prefix whose mass reaches top_p of the
//   kept mass; drop tokens with q_i < min_p; the token is the argmax over the kept set of
//   (l_i - l_max) / T + Gumbel(seed, counter, i) (lowest id on ties) — an exact sample
//   from the truncated, temperature-scaled distribution.
// Greedy (temperature 0 or top_k 1) is the first maximum, like torch.argmax.
// A row with logits processing (SampleRow::processing: penalties, logit_bias, masks;
// runner/logits_processing.h) is drawn — greedy included — from its processed logits.
// Log-probabilities are those of the model's raw distribution (before processing,
// temperature and truncation), as vLLM reports them. Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "oasis/sampling.h"
#include "runner/logits_processing.h"

namespace oasis {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                    // of `token`
  std::vector<TokenLogprob> top_logprobs;  // the num_top most likely tokens, best first
  // SampleRow::want_rank: vLLM's rank of `token` in the raw distribution, the number of tokens
  // whose logit is >= its logit (1 = the most likely); 0 when not asked for.
  int64_t rank = 0;
};

// What to sample from one logits row: the request's parameters, its resolved seed (the
// request's, or one the engine drew for it) and the step counter (number of tokens the
// request generated before this one).
struct SampleRow {
  SamplingParams params;
  uint64_t seed = 0;
  uint64_t counter = 0;
  int num_top_logprobs = 0;
  bool needed = true;  // false: this row's token is not used (a prompt chunk mid-prefill)
  // Teacher forcing (EngineRequest::forced_output): >= 0 makes this the row's token instead of
  // a draw; its log-probability and the top log-probabilities are the model's as usual.
  int32_t forced_token = -1;
  // Also compute SampleResult::rank (prompt logprobs; ModelRunner::Run fills it from the
  // row's logits on the host, on every backend).
  bool want_rank = false;
  // Logits processing (LogitsProcessing::For of the request; null: none) and the tokens it
  // reads: the request's prompt, its committed generated tokens, and on a speculative row
  // the draft tokens stacked before this row (they count as generated: the row's token is
  // plain decoding's next one only once they are accepted). The spans outlive the step.
  std::shared_ptr<const LogitsProcessing> processing;
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
  std::vector<int32_t> draft_tokens;
};

// RowEntries of every needed row with processing (empty for the others). Rows with a
// constraint build their masks on up to `max_threads` threads (this one among them) when there
// are two or more: a structured row's mask is 0.2-3 ms of host time (the vocabulary walked, or
// a cached set turned into masked ids). Each constraint locks itself (siblings share one lock).
std::vector<std::vector<LogitsEntry>> RowEntriesOf(const std::vector<SampleRow>& rows,
                                                   size_t max_threads);

// Largest num_top_logprobs supported (OpenAI allows 20).
inline constexpr int kMaxTopLogprobs = 20;

SampleResult SampleToken(const float* logits,  // [vocab]
                         int64_t vocab, const SamplingParams& params, uint64_t seed,
                         uint64_t counter, int num_top_logprobs = 0, int32_t forced_token = -1);

// The same with the draw taken from `sample_logits` (processed logits) and the
// log-probabilities from the raw `logits`.
SampleResult SampleToken(const float* logits, const float* sample_logits,  // [vocab] each
                         int64_t vocab, const SamplingParams& params, uint64_t seed,
                         uint64_t counter, int num_top_logprobs, int32_t forced_token);

// One row, its logits processing applied first when it has any.
SampleResult SampleToken(const float* logits, int64_t vocab, const SampleRow& row);

}  // namespace oasis

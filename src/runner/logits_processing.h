// Logits processing before sampling: allowed_token_ids, bad words, logit_bias, min_tokens and
// the presence / frequency / repetition penalties (SamplingParams), in vLLM's order
// (vllm/v1/sample/sampler.py apply_logits_processors, then apply_penalties):
//   1. allowed_token_ids: every other token → -inf;
//   2. bad words: a bad word's last token → -inf when the generated tokens end with the rest
//      of it (single-token words: always);
//   3. logit_bias added; min_tokens: while fewer than min_tokens tokens are generated, the
//      stop tokens (EOS unless ignore_eos, stop_token_ids) → -inf;
//   4. penalties (oasis/logits_penalty.h): repetition over prompt + generated tokens, then
//      frequency and presence over the generated tokens.
// The sampler then draws from the processed logits; log-probabilities stay the raw ones.
//
// "Generated tokens" of a logits row are the request's committed output plus, on a
// speculative row (lookahead's stacked draft, docs/lookahead.md), the draft tokens before
// it: the row's token is accepted only as plain decoding's next token, so it must be drawn
// from the logits plain decoding would have processed (vLLM combines output and spec tokens
// the same way).
//
// Value types and stateless functions; thread-safe. The CUDA sampler keeps the per-request
// token counts on the device instead (runner/cuda/cuda_logits_processor.h) and uses
// RowEntries for the per-step part.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "oasis/sampling.h"

namespace oasis {

// What one request's logits go through: made once per request (For) and shared by its
// sample rows; immutable. The device sampler keys its per-request state by it.
struct LogitsProcessing {
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // sorted by id, unique
  std::vector<int32_t> allowed_token_ids;             // sorted, unique; empty: every token
  std::vector<std::vector<int32_t>> bad_words;        // non-empty token sequences
  int64_t min_tokens = 0;
  std::vector<int32_t> min_tokens_stop_ids;           // sorted, unique: masked before min_tokens
  std::shared_ptr<const TokenConstraint> constraint;  // structured output; null: none

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  // The processing a request asks for, or null when it asks for none (the cost of a request
  // without any is then nothing). `stop_ids`: the ids min_tokens keeps from being generated
  // (the model's EOS unless ignore_eos, and the request's stop_token_ids).
  static std::shared_ptr<const LogitsProcessing> For(const SamplingParams& params,
                                                     int64_t min_tokens,
                                                     std::vector<int32_t> stop_ids);
};

// One token's per-step edit: masked (a bad word's token, a stop token before min_tokens) and
// a bias. Tokens without an entry have neither.
struct LogitsEntry {
  int32_t token = 0;
  float bias = 0.0f;
  bool masked = false;
};

// The edits of one logits row, sorted by token, one per token: the bias of logit_bias, the
// bad-word tokens that the row's generated tokens (`output` then `draft`, oldest first)
// complete, the stop tokens while fewer than min_tokens are generated.
std::vector<LogitsEntry> RowEntries(const LogitsProcessing& p, std::span<const int32_t> output,
                                    std::span<const int32_t> draft);

// `out` = processed `logits` of one row ([vocab] each; may not alias). `prompt`: the request's
// prompt tokens; `output` then `draft`: the row's generated tokens (committed output, draft
// tokens stacked before the row). Tokens outside [0, vocab) in the lists are ignored.
void ApplyLogitsProcessing(const float* logits, int64_t vocab, const LogitsProcessing& p,
                           std::span<const int32_t> prompt, std::span<const int32_t> output,
                           std::span<const int32_t> draft, float* out);

}  // namespace oasis

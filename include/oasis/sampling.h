// Sampling parameters of one request (OpenAI / vLLM semantics). Value type.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "oasis/status.h"
#include "oasis/token_constraint.h"

namespace oasis {

struct SamplingParams {
  float temperature = 1.0f;      // 0 = greedy
  float top_p = 1.0f;            // (0, 1]
  int32_t top_k = -1;            // -1 or 0 = disabled
  float min_p = 0.0f;            // [0, 1]
  std::optional<uint64_t> seed;  // per-request RNG seed; unseeded requests draw from the engine

  // Logits processing before the draw (runner/logits_processing.h has the exact rule, in
  // vLLM's order): allowed_token_ids, bad words, logit_bias, then the penalties. They change
  // greedy decoding too; reported log-probabilities stay those of the raw logits (vLLM's
  // default logprobs mode).
  float presence_penalty = 0.0f;    // [-2, 2]: subtracted once from every generated token
  float frequency_penalty = 0.0f;   // [-2, 2]: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;  // (0, 2]: tokens of the prompt or the output: a logit > 0
                                    // is divided by it, any other multiplied (vLLM / HF)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]) added
  std::vector<int32_t> allowed_token_ids;             // non-empty: every other token masked
  // Token sequences never generated (vLLM's tokenization of bad_words, done by the server):
  // a sequence's last token is masked when the generated tokens end with the rest of it.
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Structured output (the server's response_format / guided_json / guided_choice): the
  // tokens the constraint refuses after the generated ones are masked, first of all.
  std::shared_ptr<const TokenConstraint> constraint;

  bool greedy() const { return temperature == 0.0f || top_k == 1; }
  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  // Whether any of the logits processing above is asked for.
  bool processes_logits() const {
    return has_penalties() || !logit_bias.empty() || !allowed_token_ids.empty() ||
           !bad_words_token_ids.empty() || constraint != nullptr;
  }
  // InvalidArgument naming the parameter when a value is out of range; `vocab_size` > 0 also
  // checks the token ids of logit_bias, allowed_token_ids and bad words against it.
  Status Validate(int64_t vocab_size = 0) const;
};

}  // namespace oasis

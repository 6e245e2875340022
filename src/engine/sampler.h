// Host-side token sampling from one row of logits: greedy, temperature, top-k, top-p,
// min-p, with per-request seeded RNG; log-probabilities of the chosen and top tokens.
// Log-probabilities are those of the model's raw distribution (before temperature and
// truncation), as vLLM reports them. Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "oasis/sampling.h"

namespace oasis {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                   // of `token`
  std::vector<TokenLogprob> top_logprobs;  // the num_top most likely tokens, best first
};

// `rng` is the request's generator (seeded from SamplingParams::seed when given).
SampleResult SampleToken(const float* logits,  // [vocab]
                         int64_t vocab, const SamplingParams& params, std::mt19937_64& rng,
                         int num_top_logprobs = 0);

}  // namespace oasis

// Token sampling on the GPU, one CTA per logits row: greedy, temperature, top-k, top-p,
// min-p with counter-based Gumbel noise (oasis/sampling_noise.h), and the log-probabilities
// of the chosen and the top tokens. It implements exactly the rule of the CPU sampler
// (src/engine/sampler.h), so both backends draw the same token for the same logits, seed
// and counter, up to floating-point near-ties of the top-p mass boundary.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

inline constexpr int kSampleMaxTop = 20;

struct SampleParamsDevice {
  float temperature;  // 0 = greedy
  float top_p;        // (0, 1]
  float min_p;        // [0, 1]
  int32_t top_k;      // <= 0: disabled
  uint64_t seed;
  uint64_t counter;
  int32_t num_top;    // top log-probabilities wanted, 0..kSampleMaxTop
  int32_t needed;     // 0: skip the row (outputs untouched)
};

struct SampleOutputDevice {
  int32_t token;
  float logprob;
  int32_t top_tokens[kSampleMaxTop];
  float top_logprobs[kSampleMaxTop];
};

// logits: [rows, vocab] f32 (row stride `stride` floats); params/out: [rows] device arrays.
cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                         const SampleParamsDevice* params, SampleOutputDevice* out, cudaStream_t stream);

}  // namespace oasis::kernels

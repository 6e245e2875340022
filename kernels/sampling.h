// Token sampling on the GPU, several CTAs per logits row: greedy, temperature, top-k, top-p,
// min-p with counter-based Gumbel noise (oasis/sampling_noise.h), and the log-probabilities
// of the chosen and the top tokens. It implements exactly the rule of the CPU sampler
// (src/runner/sampler.h), so both backends draw the same token for the same logits, seed
// and counter, up to floating-point near-ties of the top-p mass boundary. Rows with logits
// processing (kernels/logits_processing.h) draw from their processed logits and report the
// raw logits' log-probabilities.
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
  int32_t num_top;  // top log-probabilities wanted, 0..kSampleMaxTop
  int32_t needed;   // 0: skip the row (outputs untouched)
  int32_t forced =
      -1;  // >= 0: the row's token is this one (teacher forcing), its log-probs the model's
  int32_t processed = -1;  // >= 0: the draw (greedy included) reads this row of `processed`
};

struct SampleOutputDevice {
  int32_t token;
  float logprob;
  int32_t top_tokens[kSampleMaxTop];
  float top_logprobs[kSampleMaxTop];
};

// Which phases a batch needs (the kernel's control flow is uniform over its grid), from the
// host copy of the parameters.
enum SampleStage : uint32_t {
  kStageSample = 1,  // some row samples (temperature > 0 and top_k != 1)
  kStageTopK = 2,    // some sampled row has 0 < top_k < vocab
  kStageTopP = 4,    // some sampled row has top_p < 1
  kStageTopN = 8,    // some row wants top log-probabilities
};
uint32_t SampleStagesFor(const SampleParamsDevice* host_params, int64_t rows, int64_t vocab);

// Device scratch LaunchSample needs for `rows` rows.
size_t SampleWorkspaceBytes(int64_t rows);

// logits: [rows, vocab] f32 (row stride `stride` floats); params/out: [rows] device arrays;
// `stages` from SampleStagesFor. processed: [*, vocab] f32 (row stride `processed_stride`),
// the processed logits rows that params[r].processed points at (null when none does). Several
// CTAs share each row (a cooperative launch: they synchronise between the phases), so that
// one row uses many SMs.
cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                         const SampleParamsDevice* params, SampleOutputDevice* out, uint32_t stages,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const float* processed = nullptr, int64_t processed_stride = 0);

// ids[pairs[2i + 1]] = out[pairs[2i]].token for i < n: a step's sampled tokens written into the
// token ids of work queued behind it on the device (the draft head's next batch), before the
// host has seen them.
cudaError_t LaunchScatterSampledTokens(const SampleOutputDevice* out, const int32_t* pairs,
                                       int64_t n, int32_t* ids, cudaStream_t stream);

}  // namespace oasis::kernels

// Generator: offline batched generation over a DecoderLM (the engine loop of the server
// issue builds on the same pieces). All requests are prefilled — in chunks of at most
// `max_step_tokens` tokens per step, so later chunks attend to cached KV — then decoded
// together; a sequence leaves the batch when it stops. Owns the block allocator; the KV
// pools belong to the ModelRunner. Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"
#include "models/decoder_lm.h"
#include "runner/model_runner.h"
#include "runner/sampler.h"

namespace oasis {

enum class FinishReason { kLength, kStop };

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS unless ignore_eos
  bool ignore_eos = false;
  int num_top_logprobs = 0;
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;  // one per generated token (logprobs)
  FinishReason finish_reason = FinishReason::kLength;
};

struct GeneratorOptions {
  int64_t num_kv_slots = 4096;    // head-blocks per layer
  int64_t max_step_tokens = 512;  // prefill chunk budget per step
};

class Generator {
 public:
  // Runs `model` eagerly with its own KV pools of options.num_kv_slots head-blocks.
  Generator(DecoderLM& model, Backend& backend, GeneratorOptions options);
  // Runs through `runner` (which must outlive the generator); options.num_kv_slots is
  // taken from the runner.
  Generator(ModelRunner& runner, GeneratorOptions options);

  // Validates every request first (empty prompt, ids outside the vocabulary, prompt +
  // max_tokens beyond the context, bad sampling values) and fails without generating.
  StatusOr<std::vector<GenerationResult>> Generate(const std::vector<GenerationRequest>& requests);

  // Logits at every position of `prompt` ([n, vocab], host f32), prefilled in chunks.
  StatusOr<Tensor> PromptLogits(const std::vector<int32_t>& prompt);

 private:
  Status Validate(const GenerationRequest& r) const;

  std::unique_ptr<ModelRunner> owned_runner_;
  ModelRunner& runner_;
  DecoderLM& model_;
  GeneratorOptions options_;
  BlockAllocator allocator_;
  std::mt19937_64 engine_rng_{0x0a515c5eULL};
};

}  // namespace oasis

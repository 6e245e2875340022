// Validation of the engine's inputs, on the caller's thread: one request at Submit
// (ValidateRequest) and the engine's options with its runners (Engine::CheckOptions,
// defined in request_validation.cpp). Stateless functions; thread-safe.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "oasis/model_config.h"
#include "oasis/status.h"

namespace oasis {

// Empty id or prompt, ids outside the vocabulary, bad max/min_tokens, top_logprobs, sampling
// values, text options without a tokenizer, more KV than the whole pool of `num_kv_slots`
// head-blocks (it could never run) → InvalidArgument; context overflow → OutOfRange.
Status ValidateRequest(const EngineRequest& r, const ModelConfig& config, bool has_tokenizer,
                       int64_t num_kv_slots, int32_t num_kv_heads);

}  // namespace oasis

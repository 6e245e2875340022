// KvMemoryPlan: how many head-blocks of KV cache fit on a device (vLLM's
// --gpu-memory-utilization): the pool gets `utilization` × total device memory, minus what is
// already in use (weights, runtime, other processes) and a reserve for activations.
// Pure arithmetic (no CUDA); thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "oasis/model_config.h"
#include "oasis/status.h"

namespace oasis {

struct KvMemoryPlan {
  int64_t num_slots = 0;      // head-blocks per layer (each slot exists in every layer's pool)
  size_t bytes_per_slot = 0;  // K and V of one head-block in every layer
  size_t budget_bytes = 0;    // what the pools may use
  int64_t max_tokens_per_kv_head_group = 0;  // num_slots / num_kv_heads × 16: dense tokens that fit
};

// `total` and `free` are the device's memory now (cudaMemGetInfo), after the weights are
// loaded. ResourceExhausted (naming the numbers) when not even one block per KV head fits.
StatusOr<KvMemoryPlan> PlanKvCache(const ModelConfig& config, size_t kv_dtype_bytes,
                                   double utilization, size_t total, size_t free,
                                   size_t activation_reserve);

}  // namespace oasis

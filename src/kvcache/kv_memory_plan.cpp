#include "kvcache/kv_memory_plan.h"

#include <string>

namespace oasis {

StatusOr<KvMemoryPlan> PlanKvCache(const ModelConfig& c, size_t kv_dtype_bytes, double utilization,
                                   size_t total, size_t free, size_t activation_reserve) {
  if (!(utilization > 0.0 && utilization <= 1.0)) {
    return InvalidArgument("gpu memory utilization must be in (0, 1], got " +
                           std::to_string(utilization));
  }
  if (free > total) return InvalidArgument("free device memory exceeds the total");
  KvMemoryPlan plan;
  plan.bytes_per_slot =
      static_cast<size_t>(2 * 16 * c.head_dim * c.num_hidden_layers) * kv_dtype_bytes;
  const double allowed = utilization * static_cast<double>(total);
  const double used = static_cast<double>(total - free);
  const double budget = allowed - used - static_cast<double>(activation_reserve);
  const auto gib = [](double b) {
    return std::to_string(b / (1024.0 * 1024.0 * 1024.0)).substr(0, 6) + " GiB";
  };
  if (budget <
      static_cast<double>(plan.bytes_per_slot * static_cast<size_t>(c.num_key_value_heads))) {
    return ResourceExhausted(
        "no room for the KV cache: " + gib(allowed) + " allowed (utilization " +
        std::to_string(utilization) + " of " + gib(static_cast<double>(total)) + "), " + gib(used) +
        " already in use, " + gib(static_cast<double>(activation_reserve)) +
        " reserved for activations; raise --gpu-memory-utilization, lower --max-num-batched-tokens "
        "or use a smaller model");
  }
  plan.budget_bytes = static_cast<size_t>(budget);
  plan.num_slots = static_cast<int64_t>(plan.budget_bytes / plan.bytes_per_slot);
  plan.max_tokens_per_kv_head_group = plan.num_slots / c.num_key_value_heads * 16;
  return plan;
}

}  // namespace oasis

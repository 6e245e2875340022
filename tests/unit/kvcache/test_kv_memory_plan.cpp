#include <catch2/catch.hpp>

#include "kvcache/kv_memory_plan.h"

using namespace oasis;

TEST_CASE("KV cache sizing from device memory", "[kvcache]") {
  ModelConfig c;  // Qwen3-8B: 36 layers, 8 KV heads, head_dim 128 -> 144 KiB per token
  c.num_hidden_layers = 36;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  const size_t gib = size_t{1} << 30;
  // 141 GiB card, 16 GiB in use after weights, 90 %, 2 GiB reserve.
  auto plan = PlanKvCache(c, 2, 0.9, 141 * gib, 125 * gib, 2 * gib);
  REQUIRE(plan.ok());
  CHECK(plan->bytes_per_slot == 2 * 16 * 128 * 36 * 2);
  const double budget = 0.9 * 141 * gib - 16.0 * gib - 2.0 * gib;
  CHECK(plan->num_slots == static_cast<int64_t>(static_cast<size_t>(budget) / plan->bytes_per_slot));
  // Per token across the 8 KV heads: 144 KiB; ~108.9 GiB fits ~793K tokens.
  CHECK(plan->max_tokens_per_kv_head_group > 790000);
  CHECK(plan->max_tokens_per_kv_head_group < 800000);

  auto full = PlanKvCache(c, 2, 0.5, 141 * gib, 60 * gib, 2 * gib);
  REQUIRE_FALSE(full.ok());
  CHECK(full.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.status().message(), Catch::Contains("--gpu-memory-utilization"));
  CHECK(PlanKvCache(c, 2, 1.5, 141 * gib, 60 * gib, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(PlanKvCache(c, 2, 0.0, 141 * gib, 60 * gib, 0).status().code() == StatusCode::kInvalidArgument);
}

// StagedKvLayout: slot ordinals of staged KV, summaries and draft KV inside a lease.
#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "disagg/staged_layout.h"

using namespace oasis;
using namespace oasis::disagg;

TEST_CASE("staged layout of a Qwen3-8B request at 32K", "[disagg][layout]") {
  // 36 layers, 8 KV heads, head_dim 128, bf16, 32,768 tokens; an EAGLE-3 head with 8 KV heads.
  auto layout = StagedKvLayout::Create({36, 8, 128, 2, 2048, 8, 128});
  REQUIRE(layout.ok());
  CHECK(layout->slot_bytes() == 4096);
  CHECK(layout->summaries_per_slot() == 8);
  CHECK(layout->num_kv_slots() == 36ull * 8 * 2 * 2048);
  // The full KV: 4.5 GiB (the paper's full-transfer admission at 32K).
  CHECK(layout->num_kv_slots() * layout->slot_bytes() == 4608ull << 20);
  // Summaries are 1/16 of it.
  CHECK(layout->num_summary_slots() * 16 == layout->num_kv_slots());
  CHECK(layout->num_draft_slots() == 8ull * 2 * 2048);
  CHECK(layout->num_slots() ==
        layout->num_kv_slots() + layout->num_summary_slots() + layout->num_draft_slots());
  // Consecutive blocks of one (layer, head, K/V) are consecutive slots.
  CHECK(layout->KvSlot(3, 5, 101, 1) == layout->KvSlot(3, 5, 100, 1) + 1);
  CHECK(layout->KvSlot(0, 0, 0, 1) == 2048);
  CHECK(layout->KvSlot(35, 7, 2047, 1) == layout->num_kv_slots() - 1);
  const SummarySlot s = layout->Summary(0, 1, 9);
  CHECK(s.ordinal == layout->num_kv_slots() + 256 + 1);
  CHECK(s.offset == 512);
  CHECK(layout->DraftKvSlot(7, 2047, 1) == layout->num_slots() - 1);
}

TEST_CASE("staged layout ordinals are distinct and dense", "[disagg][layout]") {
  const StagedKvGeometry g{3, 2, 8, 2, 13, 1, 8};  // 13 blocks: summaries fill 2 slots per head
  auto layout = StagedKvLayout::Create(g);
  REQUIRE(layout.ok());
  std::set<uint64_t> kv;
  std::set<std::pair<uint64_t, uint64_t>> summaries;
  std::set<uint64_t> summary_slots;
  std::set<uint64_t> draft;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      for (uint32_t b = 0; b < g.num_blocks; ++b) {
        for (uint32_t v = 0; v < 2; ++v) kv.insert(layout->KvSlot(l, h, b, v));
        const SummarySlot s = layout->Summary(l, h, b);
        CHECK(s.offset + layout->summary_bytes() <= layout->slot_bytes());
        summaries.insert({s.ordinal, s.offset});
        summary_slots.insert(s.ordinal);
      }
    }
  }
  for (uint32_t h = 0; h < g.draft_kv_heads; ++h) {
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      for (uint32_t v = 0; v < 2; ++v) draft.insert(layout->DraftKvSlot(h, b, v));
    }
  }
  CHECK(kv.size() == layout->num_kv_slots());
  CHECK(*kv.begin() == 0);
  CHECK(*kv.rbegin() == layout->num_kv_slots() - 1);
  CHECK(summaries.size() == 3u * 2 * 13);
  CHECK(summary_slots.size() == layout->num_summary_slots());
  CHECK(layout->num_summary_slots() == 3u * 2 * 2);
  CHECK(*summary_slots.begin() == layout->num_kv_slots());
  CHECK(*summary_slots.rbegin() == layout->num_kv_slots() + layout->num_summary_slots() - 1);
  CHECK(draft.size() == layout->num_draft_slots());
  CHECK(*draft.begin() == layout->num_kv_slots() + layout->num_summary_slots());
  CHECK(*draft.rbegin() == layout->num_slots() - 1);
}

TEST_CASE("staged layout rejects impossible geometries", "[disagg][layout]") {
  CHECK(StagedKvLayout::Create({0, 8, 128, 2, 10, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 0, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 8, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 64, 2, 10, 8, 128}).status().code() ==
        StatusCode::kInvalidArgument);
  // 2^31 slots is the most a pool addresses.
  CHECK(StagedKvLayout::Create({1024, 64, 128, 2, 1 << 16, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 0, 0}).ok());
}

TEST_CASE("staged layout refuses sizes whose slot arithmetic would wrap", "[disagg][layout]") {
  // Found by fuzz_disagg_ticket: head_dim and dtype near 2^32 wrapped 16 · D · B so that a
  // slot held no summary and the packing divided by zero.
  const uint32_t big = 0xFFFFFFFFu;
  CHECK(StagedKvLayout::Create({2, 2, big, big, 64, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({2, 2, 128, 3, 64, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({2, 2, kMaxStagedHeadDim + 1, 2, 64, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({kMaxStagedLayers + 1, 2, 128, 2, 64, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({2, big, 128, 2, 64, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({2, 2, 128, 2, 64, big, 64}).status().code() ==
        StatusCode::kInvalidArgument);
  for (uint32_t dtype : {1u, 2u, 4u}) {
    auto layout = StagedKvLayout::Create({2, 2, kMaxStagedHeadDim, dtype, 64, 0, 0});
    REQUIRE(layout.ok());
    CHECK(layout->summaries_per_slot() == 8);
  }
}

// StagedKvLayout: slot ordinals of staged KV, summaries and draft KV inside a lease.
#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "disagg/staged_layout.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {
constexpr auto kF32 = static_cast<uint32_t>(StagedKvDtype::kF32);
constexpr auto kBf16 = static_cast<uint32_t>(StagedKvDtype::kBF16);
constexpr auto kFp8 = static_cast<uint32_t>(StagedKvDtype::kF8E4M3);
}  // namespace

TEST_CASE("staged layout of a Qwen3-8B request at 32K", "[disagg][layout]") {
  // 36 layers, 8 KV heads, head_dim 128, bf16, 32,768 tokens; an EAGLE-3 head with 8 KV heads.
  auto layout = StagedKvLayout::Create({36, 8, 128, 2, 2048, 8, 128, kBf16, 2});
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

TEST_CASE("staged layout of a Qwen3-8B request at 32K with an FP8 KV cache", "[disagg][layout]") {
  // e4m3 KV and summaries (1 byte), the EAGLE-3 head's KV in bf16: two slots per draft block.
  auto layout = StagedKvLayout::Create({36, 8, 128, 1, 2048, 8, 128, kFp8, 2});
  REQUIRE(layout.ok());
  CHECK(layout->slot_bytes() == 2048);
  CHECK(layout->summary_bytes() == 256);
  CHECK(layout->summaries_per_slot() == 8);
  CHECK(layout->num_kv_slots() == 36ull * 8 * 2 * 2048);
  // The full KV: 2.25 GiB, half of bf16's; summaries 1/16 of it, as with bf16.
  CHECK(layout->num_kv_slots() * layout->slot_bytes() == 2304ull << 20);
  CHECK(layout->num_summary_slots() * 16 == layout->num_kv_slots());
  CHECK(layout->draft_block_bytes() == 4096);
  CHECK(layout->draft_slots_per_block() == 2);
  CHECK(layout->num_draft_slots() == 8ull * 2 * 2048 * 2);
  // The draft KV's bytes equal bf16's (128 MiB).
  CHECK(layout->num_draft_slots() * layout->slot_bytes() == 128ull << 20);
  CHECK(layout->DraftKvSlot(0, 0, 0) == layout->num_kv_slots() + layout->num_summary_slots());
  CHECK(layout->DraftKvSlot(0, 1, 0) == layout->DraftKvSlot(0, 0, 0) + 2);
  CHECK(layout->DraftKvSlot(7, 2047, 1) + 2 == layout->num_slots());
  // The same geometry with bf16 KV stages twice the KV bytes.
  auto bf16 = StagedKvLayout::Create({36, 8, 128, 2, 2048, 8, 128, kBf16, 2});
  REQUIRE(bf16.ok());
  CHECK(bf16->num_kv_slots() * bf16->slot_bytes() ==
        2 * layout->num_kv_slots() * layout->slot_bytes());
  CHECK(bf16->draft_slots_per_block() == 1);
  // f32 draft KV (the CPU reference) of head_dim 8 over 1-byte KV slots: 4 slots a block.
  auto cpu = StagedKvLayout::Create({2, 2, 8, 1, 5, 1, 8, kFp8, 4});
  REQUIRE(cpu.ok());
  CHECK(cpu->draft_slots_per_block() == 4);
  CHECK(cpu->num_draft_slots() == 1u * 2 * 5 * 4);
}

TEST_CASE("staged KV dtype names and sizes", "[disagg][layout]") {
  CHECK(StagedKvDtypeBytes(kF32) == 4);
  CHECK(StagedKvDtypeBytes(kBf16) == 2);
  CHECK(StagedKvDtypeBytes(static_cast<uint32_t>(StagedKvDtype::kF16)) == 2);
  CHECK(StagedKvDtypeBytes(kFp8) == 1);
  CHECK(StagedKvDtypeBytes(0) == 0);
  CHECK(StagedKvDtypeBytes(5) == 0);
  CHECK(StagedKvDtypeName(kFp8) == "fp8_e4m3");
  CHECK(StagedKvDtypeName(kBf16) == "bf16");
  CHECK(StagedKvDtypeName(7) == "unknown (7)");
}

TEST_CASE("staged layout ordinals are distinct and dense", "[disagg][layout]") {
  const StagedKvGeometry g{3, 2, 8,     2, 13,
                           1, 8, kBf16, 2};  // 13 blocks: summaries fill 2 slots per head
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
  CHECK(StagedKvLayout::Create({36, 8, 64, 2, 10, 8, 128, kBf16, 2}).status().code() ==
        StatusCode::kInvalidArgument);
  // Draft heads need a draft dtype, and no draft heads none.
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 8, 128, kBf16, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 0, 0, kBf16, 2}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 8, 128, kBf16, 3}).status().code() ==
        StatusCode::kInvalidArgument);
  // The KV dtype's code names its size.
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 0, 0, kFp8, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 1, 10, 0, 0, kBf16, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 0, 0, 0, 0}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({36, 8, 128, 2, 10, 0, 0, 99, 0}).status().code() ==
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
  CHECK(StagedKvLayout::Create({2, 2, 128, 2, 64, big, 64, kBf16, 2}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(StagedKvLayout::Create({2, 2, 128, 2, 64, 1, 64, kBf16, big}).status().code() ==
        StatusCode::kInvalidArgument);
  for (auto [dtype, code] : {std::pair{1u, kFp8}, {2u, kBf16}, {4u, kF32}}) {
    auto layout = StagedKvLayout::Create({2, 2, kMaxStagedHeadDim, dtype, 64, 0, 0, code, 0});
    REQUIRE(layout.ok());
    CHECK(layout->summaries_per_slot() == 8);
  }
}

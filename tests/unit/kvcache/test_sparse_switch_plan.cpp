// The dense -> sparse switch's plan without a backend: the initial working set, the host
// copies, working and tail slots taken over from the table or fresh, and what is freed.
#include <catch2/catch.hpp>

#include <algorithm>

#include "backend/backend.h"
#include "kvcache/sparse_switch_plan.h"

using namespace oasis;

namespace {

// Table slots: head h, block b -> 100 * h + b; host slots: head h, block b -> 1000 + 50 * h + b.
std::vector<std::vector<int32_t>> Table(int64_t heads, int64_t blocks) {
  std::vector<std::vector<int32_t>> t(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t b = 0; b < blocks; ++b)
      t[static_cast<size_t>(h)].push_back(static_cast<int32_t>(100 * h + b));
  }
  return t;
}

std::vector<int32_t> Host(int64_t heads, int64_t reserved) {
  std::vector<int32_t> s;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t b = 0; b < reserved; ++b) s.push_back(static_cast<int32_t>(1000 + 50 * h + b));
  }
  return s;
}

}  // namespace

TEST_CASE("initial working set: block 0 and the newest complete blocks", "[kvcache][sparse]") {
  CHECK(InitialWorkingBlocks(0, 3).empty());
  CHECK(InitialWorkingBlocks(2, 3) == std::vector<int64_t>{0, 1});
  CHECK(InitialWorkingBlocks(3, 3) == std::vector<int64_t>{0, 1, 2});
  CHECK(InitialWorkingBlocks(10, 3) == std::vector<int64_t>{0, 8, 9});
}

TEST_CASE("switch plan taking over the table: chosen blocks stay, the partial one is a tail",
          "[kvcache][sparse]") {
  // 2 heads, K = 3, 6 complete blocks + 5 tokens = 7 table blocks.
  const SparseSwitchShape s{2, 3, 6 * kBlockSize + 5, true};
  CHECK(SwitchFreshSlotsPerHead(s, 7) == 0);
  const SparseSwitchPlan p = PlanSparseSwitch(s, Table(2, 7), Host(2, 10), 10, {});
  CHECK(p.chosen == std::vector<int64_t>{0, 4, 5});
  REQUIRE(p.src.size() == 14);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t b = 0; b < 7; ++b) {
      const size_t i = static_cast<size_t>(h * 7 + b);
      CHECK(p.src[i] == 100 * h + b);
      CHECK(p.dst[i] == 1000 + 50 * h + b);
      CHECK(p.len[i] == (b < 6 ? kBlockSize : 5));
    }
  }
  CHECK(p.ws_src.empty());
  CHECK(p.ws_slots == std::vector<int32_t>{0, 4, 5, 100, 104, 105});
  // Block 6 (partial) sits in tail slot 6 % 2 = 0; the other tail slot is the first spare (1).
  CHECK(p.tail_slots == std::vector<int32_t>{6, 1, 106, 101});
  CHECK(p.free_later == std::vector<int32_t>{2, 3, 102, 103});
  CHECK(p.ws_blocks == std::vector<std::vector<int32_t>>{{0, 4, 5}, {0, 4, 5}});
}

TEST_CASE("switch plan of a short context asks for fresh slots", "[kvcache][sparse]") {
  // 1 complete block, no partial: 1 table block per head; K = 3 needs 2 more working + 2 tails.
  const SparseSwitchShape s{2, 3, kBlockSize, true};
  REQUIRE(SwitchFreshSlotsPerHead(s, 1) == 4);
  const std::vector<int32_t> fresh = {50, 51, 52, 53, 60, 61, 62, 63};
  const SparseSwitchPlan p = PlanSparseSwitch(s, Table(2, 1), Host(2, 4), 4, fresh);
  CHECK(p.chosen == std::vector<int64_t>{0});
  CHECK(p.len == std::vector<int32_t>{kBlockSize, kBlockSize});
  CHECK(p.ws_slots == std::vector<int32_t>{0, 50, 51, 100, 60, 61});
  CHECK(p.tail_slots == std::vector<int32_t>{52, 53, 62, 63});
  CHECK(p.ws_src.empty());
  CHECK(p.free_later.empty());
  CHECK(p.ws_blocks == std::vector<std::vector<int32_t>>{{0, -1, -1}, {0, -1, -1}});
}

TEST_CASE("switch plan with dense layers: fresh working slots filled by GPU copies",
          "[kvcache][sparse]") {
  // 4 complete blocks, K = 2: blocks 0 and 3 copied into fresh slots; the table stays.
  const SparseSwitchShape s{1, 2, 4 * kBlockSize, false};
  REQUIRE(SwitchFreshSlotsPerHead(s, 4) == 2);
  const SparseSwitchPlan p = PlanSparseSwitch(s, Table(1, 4), Host(1, 6), 6, {70, 71});
  CHECK(p.chosen == std::vector<int64_t>{0, 3});
  CHECK(p.src == std::vector<int32_t>{0, 1, 2, 3});
  CHECK(p.dst == std::vector<int32_t>{1000, 1001, 1002, 1003});
  CHECK(p.ws_slots == std::vector<int32_t>{70, 71});
  CHECK(p.ws_src == std::vector<int32_t>{0, 3});
  CHECK(p.ws_dst == std::vector<int32_t>{70, 71});
  CHECK(p.tail_slots.empty());
  CHECK(p.free_later.empty());
}

// Prefix caching: table slots the cache or another sequence holds are never working or tail
// slots. A chosen shared block is copied into a slot of the request's own (a spare table slot
// or a fresh one); every shared slot goes to free_later (only the request's reference goes).
TEST_CASE("switch plan with shared blocks: they are copied, never written", "[kvcache][sparse][prefix]") {
  // 2 heads, K = 3, 6 complete blocks + 5 tokens = 7 table blocks; blocks 0..3 shared (a
  // cached system prompt): chosen {0, 4, 5} -> block 0 needs a slot of its own; spares were
  // {1, 2, 3}, now none of them.
  const SparseSwitchShape s{2, 3, 6 * kBlockSize + 5, true};
  SharedSlots shared(2, std::vector<char>(7, 0));
  for (auto& head : shared) std::fill(head.begin(), head.begin() + 4, 1);
  // Needs per head: block 0's copy + the second tail slot = 2; spares: none.
  REQUIRE(SwitchFreshSlotsPerHead(s, 7, shared) == 2);
  CHECK(SwitchFreshSlotsPerHead(s, 7) == 0);
  const std::vector<int32_t> fresh = {70, 71, 170, 171};
  const SparseSwitchPlan p = PlanSparseSwitch(s, Table(2, 7), Host(2, 10), 10, fresh, shared);
  CHECK(p.chosen == std::vector<int64_t>{0, 4, 5});
  CHECK(p.src.size() == 14);  // every block still goes to the host store
  CHECK(p.ws_slots == std::vector<int32_t>{70, 4, 5, 170, 104, 105});
  CHECK(p.ws_src == std::vector<int32_t>{0, 100});
  CHECK(p.ws_dst == std::vector<int32_t>{70, 170});
  CHECK(p.tail_slots == std::vector<int32_t>{6, 71, 106, 171});
  std::vector<int32_t> freed = p.free_later;
  std::sort(freed.begin(), freed.end());
  CHECK(freed == std::vector<int32_t>{0, 1, 2, 3, 100, 101, 102, 103});
  // No shared slot is kept as a working or tail slot.
  for (int32_t slot : p.ws_slots) CHECK((slot % 100 >= 4 || slot >= 70));
  for (int32_t slot : p.tail_slots) CHECK((slot % 100 >= 4 || slot >= 70));
  // Every table and fresh slot is accounted for exactly once: kept or freed.
  std::vector<int32_t> all = p.ws_slots;
  all.insert(all.end(), p.tail_slots.begin(), p.tail_slots.end());
  all.insert(all.end(), p.free_later.begin(), p.free_later.end());
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  CHECK(all.size() == 14 + fresh.size());
}

#include <catch2/catch.hpp>

#include <set>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"

using namespace oasis;

TEST_CASE("allocator hands out distinct slots and refuses beyond capacity", "[kvcache]") {
  BlockAllocator a(10);
  auto x = a.Allocate(6);
  REQUIRE(x);
  CHECK(a.num_free() == 4);
  CHECK_FALSE(a.Allocate(5));
  CHECK(a.num_free() == 4);  // a refused allocation takes nothing
  auto y = a.Allocate(4);
  REQUIRE(y);
  std::set<int32_t> all(x->begin(), x->end());
  all.insert(y->begin(), y->end());
  CHECK(all.size() == 10);
  a.Free(*x);
  CHECK(a.num_free() == 6);
}

TEST_CASE("a reservation gives each head one contiguous run of slots where the pool has them", "[kvcache]") {
  BlockAllocator a(4096);
  auto contiguous = [](const std::vector<int32_t>& s) {
    for (size_t i = 1; i < s.size(); ++i)
      if (s[i] != s[i - 1] + 1) return false;
    return true;
  };
  HeadBlockTable first(8), second(8);
  REQUIRE(first.Reserve(16 * 100, a).ok());  // 100 blocks per head, from a fresh pool
  REQUIRE(second.Reserve(16 * 37 + 3, a).ok());
  for (int h = 0; h < 8; ++h) {
    INFO("head " << h);
    CHECK(contiguous(first.head_slots(h)));
    CHECK(contiguous(second.head_slots(h)));
    CHECK(first.head_slots(h).front() == 100 * h);  // head-major: head h's run follows head h-1's
  }
  // A released table's runs come back in order: a new reservation of the same size reuses them
  // as runs again, and growing a table by one block per head stays correct (each head one slot).
  first.Release(a);
  HeadBlockTable third(8);
  REQUIRE(third.Reserve(16 * 100, a).ok());
  std::set<int32_t> seen;
  for (int h = 0; h < 8; ++h) {
    CHECK(contiguous(third.head_slots(h)));
    seen.insert(third.head_slots(h).begin(), third.head_slots(h).end());
  }
  CHECK(seen.size() == 800);
  REQUIRE(third.Reserve(16 * 101, a).ok());
  for (int h = 0; h < 8; ++h) CHECK(third.head_slots(h).size() == 101);
  third.Release(a);
  second.Release(a);
  CHECK(a.num_free() == 4096);
}

TEST_CASE("head block tables grow per head and map positions to slots", "[kvcache]") {
  BlockAllocator a(64);
  HeadBlockTable t(4);
  REQUIRE(t.Reserve(1, a).ok());
  CHECK(t.num_blocks() == 1);
  CHECK(a.num_free() == 60);
  REQUIRE(t.Reserve(16, a).ok());
  CHECK(t.num_blocks() == 1);
  REQUIRE(t.Reserve(17, a).ok());
  CHECK(t.num_blocks() == 2);
  CHECK(HeadBlockTable::SlotsFor(17, 4) == 8);
  // Each head has its own slots; mapping = slot * 16 + offset.
  std::set<int32_t> seen;
  for (int h = 0; h < 4; ++h) {
    for (int32_t s : t.head_slots(h)) seen.insert(s);
    CHECK(t.SlotMapping(h, 16) == int64_t{t.head_slots(h)[1]} * kBlockSize);
    CHECK(t.SlotMapping(h, 5) == int64_t{t.head_slots(h)[0]} * kBlockSize + 5);
  }
  CHECK(seen.size() == 8);
  auto st = t.Reserve(16 * 100, a);
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK(t.num_blocks() == 2);  // unchanged on failure
  t.Release(a);
  CHECK(a.num_free() == 64);
}

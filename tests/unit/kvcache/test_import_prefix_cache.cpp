// Parked cells of the host store and the decode side's prefix cache over them
// (kvcache/import_prefix_cache.h): parked cells count as room, the store evicts them (least
// recently parked first) when it needs their slots, a taken entry leaves the cache, and random
// use against a plain model of the store leaves every count right.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "kvcache/import_prefix_cache.h"

using namespace oasis;

namespace {

constexpr int64_t kDim = 8;

HostKvStore MakeStore(CpuBackend& backend, int64_t layers, int32_t slots) {
  return HostKvStore(backend, layers, 0, kDim,
                     static_cast<size_t>(slots) * HostKvStore::BytesPerSlot(layers, kDim, DType::kF32));
}

std::vector<int32_t> Tokens(int32_t first) {
  std::vector<int32_t> t(kBlockSize);
  for (int32_t i = 0; i < kBlockSize; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

}  // namespace

TEST_CASE("host store: parked cells count as room and are evicted for it", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 2, 4);
  REQUIRE(store.num_slots() == 4);
  // Two slots split: layer 0 uses both, layer 1 one of them.
  auto a = store.AllocateCells(0, 2);
  REQUIRE(a);
  auto b = store.AllocateCells(1, 1);
  REQUIRE(b);
  CHECK(store.num_free() == 2);
  // Parking layer 0's cells: the slot whose only used cell is parked becomes evictable; the
  // one layer 1 also uses does not.
  store.ParkCells(0, *a);
  CHECK(store.num_parked_cells() == 2);
  CHECK(store.num_evictable_slots() == 1);
  CHECK(store.num_free() == 3);
  CHECK(store.IsParked(0, (*a)[0]));
  CHECK_FALSE(store.IsParked(1, (*b)[0]));
  // Freeing layer 1's cell leaves only parked cells in that slot: evictable too.
  store.FreeCells(1, *b);
  CHECK(store.num_evictable_slots() == 2);
  CHECK(store.num_free() == 4);
  // Unparking gives them back to a user (still in use, not room).
  store.UnparkCells(0, *a);
  CHECK(store.num_evictable_slots() == 0);
  CHECK(store.num_free() == 2);
  store.FreeCells(0, *a);
  CHECK(store.num_free() == 4);
  CHECK(store.num_cell_slots() == 0);
}

TEST_CASE("import prefix cache: park, take, merge, collisions", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 2, 8);
  ImportPrefixCache cache(store, /*num_kv_heads=*/2);
  REQUIRE(cache.cells_per_block() == 4);
  auto l0 = store.AllocateCells(0, 2);  // heads 0 and 1 of layer 0
  auto l1 = store.AllocateCells(1, 1);  // head 1 of layer 1; head 0 was remote
  REQUIRE(l0);
  REQUIRE(l1);
  const std::vector<int32_t> tokens = Tokens(100);
  const std::vector<int32_t> cells = {(*l0)[0], (*l0)[1], -1, (*l1)[0]};
  cache.Park(7, 1, tokens, cells);
  CHECK(cache.num_blocks() == 1);
  CHECK(cache.num_cells() == 3);
  CHECK(store.num_parked_cells() == 3);
  CHECK(cache.Contains(7, 1, tokens));
  CHECK_FALSE(cache.Contains(7, 2, tokens));         // another parent
  CHECK_FALSE(cache.Contains(7, 1, Tokens(101)));    // other tokens
  CHECK_FALSE(cache.Take(7, 1, Tokens(101)).has_value());
  // A second import of the same block parks what the entry lacks and frees the rest.
  auto more0 = store.AllocateCells(0, 1);
  auto more1 = store.AllocateCells(1, 1);
  REQUIRE(more0);
  REQUIRE(more1);
  cache.Park(7, 1, tokens, std::vector<int32_t>{(*more0)[0], -1, (*more1)[0], -1});
  CHECK(cache.num_cells() == 4);
  CHECK(store.num_parked_cells() == 4);
  // Taking it: exclusive, every cell unparked and the caller's.
  auto got = cache.Take(7, 1, tokens);
  REQUIRE(got);
  CHECK(*got == std::vector<int32_t>{(*l0)[0], (*l0)[1], (*more1)[0], (*l1)[0]});
  CHECK(cache.num_blocks() == 0);
  CHECK(store.num_parked_cells() == 0);
  CHECK_FALSE(cache.Take(7, 1, tokens).has_value());
  // A colliding hash (other tokens) keeps the cached entry and frees the newcomer's cells.
  cache.Park(7, 1, tokens, *got);
  auto c0 = store.AllocateCells(0, 1);
  REQUIRE(c0);
  const int64_t parked_before = store.num_parked_cells();
  cache.Park(7, 1, Tokens(500), std::vector<int32_t>{(*c0)[0], -1, -1, -1});
  CHECK(store.num_parked_cells() == parked_before);  // c0 freed (FreeCells checks it was in use)
  CHECK_FALSE(store.IsParked(0, (*c0)[0]));
  CHECK(cache.num_cells() == 4);
  CHECK(cache.Contains(7, 1, tokens));
  // An entry with nothing local is not kept.
  cache.Park(9, 7, Tokens(200), std::vector<int32_t>{-1, -1, -1, -1});
  CHECK(cache.num_blocks() == 1);
  // Destroyed with entries parked: their cells stay parked in the store (the store is
  // destroyed with the engine); evict them to leave it clean here.
  while (cache.EvictOldest()) {
  }
  CHECK(store.num_free() == 8);
  CHECK(store.num_parked_cells() == 0);
}

TEST_CASE("import prefix cache: the store evicts the least recently parked for room", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 1, 6);
  ImportPrefixCache cache(store, 1);
  // Three blocks of one head in one layer: 3 cells, each its own slot.
  for (uint64_t b = 0; b < 3; ++b) {
    auto c = store.AllocateCells(0, 1);
    REQUIRE(c);
    cache.Park(100 + b, b, Tokens(static_cast<int32_t>(16 * b)), *c);
  }
  CHECK(store.num_free() == 6);  // 3 free slots + 3 evictable
  // Block 0 parked again (a later import used and returned it): now the most recent.
  auto again = cache.Take(100, 0, Tokens(0));
  REQUIRE(again);
  cache.Park(100, 0, Tokens(0), *again);
  // Four whole slots: one eviction, the least recently parked (block 1).
  auto whole = store.Allocate(4);
  REQUIRE(whole);
  CHECK(cache.evictions_total() == 1);
  CHECK_FALSE(cache.Contains(101, 1, Tokens(16)));
  CHECK(cache.Contains(100, 0, Tokens(0)));
  CHECK(cache.Contains(102, 2, Tokens(32)));
  // Cells: the store evicts until the fresh slots are there (block 2, then block 0).
  CHECK(store.num_free() == 2);
  auto cells = store.AllocateCells(0, 2);
  REQUIRE(cells);
  CHECK(cache.num_blocks() == 0);
  CHECK(cache.evictions_total() == 3);
  CHECK_FALSE(store.AllocateCells(0, 1).has_value());  // nothing left to evict
  store.Free(*whole);
  store.FreeCells(0, *cells);
  CHECK(store.num_free() == 6);
}

TEST_CASE("import prefix cache: random use against a model of the store", "[kvcache][import_cache][fuzz]") {
  CpuBackend backend{1};
  const int64_t layers = 3, heads = 2;
  const int32_t slots = 24;
  HostKvStore store = MakeStore(backend, layers, slots);
  ImportPrefixCache cache(store, heads);
  std::mt19937_64 rng(33);
  // Requests hold blocks: per block the cells [layers * heads] (-1: remote). Whole slots too.
  struct Held {
    uint64_t hash;
    std::vector<int32_t> cells;
  };
  std::vector<Held> held;
  std::vector<std::vector<int32_t>> whole;
  std::map<uint64_t, int> parked_blocks;  // hash -> 1 (cached)
  auto tokens_of = [](uint64_t h) { return Tokens(static_cast<int32_t>(h * 16)); };
  for (int round = 0; round < 3000; ++round) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0) {  // an import takes a block: from the cache, else fresh cells
      const uint64_t h = rng() % 12;
      if (auto got = cache.Take(h, 0, tokens_of(h))) {
        held.push_back({h, *got});
        continue;
      }
      std::vector<int32_t> cells(static_cast<size_t>(layers * heads), -1);
      bool ok = true;
      for (int64_t l = 0; l < layers && ok; ++l) {
        const int32_t n = static_cast<int32_t>(rng() % (heads + 1));
        auto c = store.AllocateCells(l, n);
        if (!c) {
          ok = false;
          break;
        }
        for (int32_t i = 0; i < n; ++i) cells[static_cast<size_t>(l * heads + i)] = (*c)[static_cast<size_t>(i)];
      }
      held.push_back({h, cells});  // (partly allocated when !ok: still freed or parked below)
    } else if (op == 1 && !held.empty()) {  // it ends: park or free
      const size_t i = rng() % held.size();
      Held h = held[i];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      if (rng() % 3 != 0) {
        cache.Park(h.hash, 0, tokens_of(h.hash), h.cells);
      } else {
        for (int64_t l = 0; l < layers; ++l) {
          std::vector<int32_t> give;
          for (int64_t k = 0; k < heads; ++k)
            if (h.cells[static_cast<size_t>(l * heads + k)] >= 0) give.push_back(h.cells[static_cast<size_t>(l * heads + k)]);
          store.FreeCells(l, give);
        }
      }
    } else if (op == 2) {  // whole slots
      if (auto w = store.Allocate(static_cast<int32_t>(1 + rng() % 4))) whole.push_back(*w);
    } else if (op == 3 && !whole.empty()) {
      store.Free(whole.back());
      whole.pop_back();
    }
    // The model: count slots by what uses them.
    std::map<int32_t, std::pair<int, int>> use;  // slot -> (cells used, parked)
    int64_t parked = 0;
    for (const Held& h : held) {
      for (int32_t c : h.cells)
        if (c >= 0) ++use[c].first;
    }
    for (int64_t l = 0; l < layers; ++l) {
      for (int32_t s = 0; s < slots; ++s) {
        if (store.IsParked(l, s)) {
          ++use[s].first;
          ++use[s].second;
          ++parked;
        }
      }
    }
    int32_t whole_used = 0;
    for (const auto& w : whole) whole_used += static_cast<int32_t>(w.size());
    int32_t evictable = 0;
    for (const auto& [s, u] : use) evictable += u.first == u.second ? 1 : 0;
    // Free cells of a layer: in split slots that are not evictable, unused in that layer.
    std::set<std::pair<int64_t, int32_t>> used_cell;  // (layer, slot)
    for (const Held& h : held) {
      for (size_t j = 0; j < h.cells.size(); ++j)
        if (h.cells[j] >= 0) used_cell.insert({static_cast<int64_t>(j) / heads, h.cells[j]});
    }
    for (int64_t l = 0; l < layers; ++l) {
      int32_t free_cells = 0;
      for (const auto& [s, u] : use) {
        const bool in_use = used_cell.count({l, s}) > 0 || store.IsParked(l, s);
        free_cells += u.first != u.second && !in_use ? 1 : 0;
      }
      REQUIRE(free_cells == store.num_free_cells(l));
    }
    REQUIRE(parked == store.num_parked_cells());
    REQUIRE(parked == cache.num_cells());
    REQUIRE(evictable == store.num_evictable_slots());
    REQUIRE(store.num_free() == slots - whole_used - static_cast<int32_t>(use.size()) + evictable);
  }
  while (cache.EvictOldest()) {
  }
  for (const Held& h : held) {
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<int32_t> give;
      for (int64_t k = 0; k < heads; ++k)
        if (h.cells[static_cast<size_t>(l * heads + k)] >= 0) give.push_back(h.cells[static_cast<size_t>(l * heads + k)]);
      store.FreeCells(l, give);
    }
  }
  for (const auto& w : whole) store.Free(w);
  CHECK(store.num_free() == slots);
  CHECK(store.num_cell_slots() == 0);
}

// Parked cells of the host store and the decode side's prefix cache over them
// (kvcache/store_prefix_cache.h): parked cells count as room, the store evicts them (least
// recently parked first) when it needs their slots, a taken entry leaves the cache, and random
// use against a plain model of the store leaves every count right.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "kvcache/store_prefix_cache.h"

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

TEST_CASE("import prefix cache: release, acquire by several imports, merge, collisions", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 2, 8);
  StorePrefixCache cache(store, /*num_kv_heads=*/2);
  REQUIRE(cache.cells_per_block() == 4);
  auto l0 = store.AllocateCells(0, 2);  // heads 0 and 1 of layer 0
  auto l1 = store.AllocateCells(1, 1);  // head 1 of layer 1; head 0 was remote
  REQUIRE(l0);
  REQUIRE(l1);
  const std::vector<int32_t> tokens = Tokens(100);
  const PrefixBlockKey key{7, 1, tokens};
  // An import that made the block itself ends: the entry takes its cells, parked (room).
  cache.Release(key, std::vector<int32_t>{(*l0)[0], (*l0)[1], -1, (*l1)[0]}, /*held=*/false);
  CHECK(cache.num_blocks() == 1);
  CHECK(cache.num_held_blocks() == 0);
  CHECK(cache.num_cells() == 3);
  CHECK(store.num_parked_cells() == 3);
  CHECK(cache.Contains(key));
  CHECK_FALSE(cache.Contains({7, 2, tokens}));         // another parent
  CHECK_FALSE(cache.Contains({7, 1, Tokens(101)}));    // other tokens
  CHECK_FALSE(cache.Acquire({7, 1, Tokens(101)}).has_value());
  // Two imports hold it at once: the same cells, in use (not room) while held.
  auto a = cache.Acquire(key);
  auto b = cache.Acquire(key);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a == std::vector<int32_t>{(*l0)[0], (*l0)[1], -1, (*l1)[0]});
  CHECK(*b == *a);
  CHECK(cache.num_held_blocks() == 1);
  CHECK(store.num_parked_cells() == 0);
  CHECK_FALSE(cache.EvictOldest());  // a held entry is never evicted
  // One ends, having fetched head 0 of both layers itself: the entry takes layer 1's (it
  // lacked it) and layer 0's copy is freed; the other import still holds the entry.
  auto more0 = store.AllocateCells(0, 1);
  auto more1 = store.AllocateCells(1, 1);
  REQUIRE(more0);
  REQUIRE(more1);
  cache.Release(key, std::vector<int32_t>{(*more0)[0], -1, (*more1)[0], -1}, /*held=*/true);
  CHECK(cache.num_cells() == 4);
  CHECK(store.num_parked_cells() == 0);
  CHECK(cache.num_held_blocks() == 1);
  // The last holder ends: every cell parked.
  cache.Release(key, {}, /*held=*/true);
  CHECK(cache.num_held_blocks() == 0);
  CHECK(store.num_parked_cells() == 4);
  auto c = cache.Acquire(key);
  REQUIRE(c);
  CHECK(*c == std::vector<int32_t>{(*l0)[0], (*l0)[1], (*more1)[0], (*l1)[0]});
  cache.Release(key, {}, true);
  // A colliding hash (other tokens) keeps the cached entry and frees the newcomer's cells.
  auto c0 = store.AllocateCells(0, 1);
  REQUIRE(c0);
  const int64_t parked_before = store.num_parked_cells();
  const std::vector<int32_t> other = Tokens(500);
  cache.Release({7, 1, other}, std::vector<int32_t>{(*c0)[0], -1, -1, -1}, false);
  CHECK(store.num_parked_cells() == parked_before);  // c0 freed (FreeCells checks it was in use)
  CHECK_FALSE(store.IsParked(0, (*c0)[0]));
  CHECK(cache.num_cells() == 4);
  CHECK(cache.Contains(key));
  // Published by an import whose fetch landed: held by it at once, shared with later arrivals.
  auto p0 = store.AllocateCells(0, 1);
  auto p1 = store.AllocateCells(1, 1);
  REQUIRE(p0);
  REQUIRE(p1);
  const std::vector<int32_t> t300 = Tokens(300);
  const std::vector<int32_t> mine = {(*p0)[0], -1, (*p1)[0], -1};
  CHECK_FALSE(cache.Publish({8, 7, t300}, std::vector<int32_t>{-1, -1, -1, -1}));  // no cell
  CHECK_FALSE(cache.Publish(key, mine));  // cached already: nothing changes
  REQUIRE(cache.Publish({8, 7, t300}, mine));
  CHECK(cache.num_held_blocks() == 1);
  CHECK(store.num_parked_cells() == 4);  // the published cells stay in use
  auto later = cache.Acquire({8, 7, t300});
  REQUIRE(later);
  CHECK(*later == mine);
  cache.Release({8, 7, t300}, {}, true);
  CHECK(cache.num_held_blocks() == 1);
  cache.Release({8, 7, t300}, {}, true);  // the publisher ends
  CHECK(cache.num_held_blocks() == 0);
  CHECK(store.num_parked_cells() == 6);
  // An entry with nothing local is not kept.
  const std::vector<int32_t> t200 = Tokens(200);
  cache.Release({9, 7, t200}, std::vector<int32_t>{-1, -1, -1, -1}, false);
  cache.Release({9, 7, t200}, {}, false);
  CHECK(cache.num_blocks() == 2);
  while (cache.EvictOldest()) {
  }
  CHECK(store.num_free() == 8);
  CHECK(store.num_parked_cells() == 0);
}

TEST_CASE("import prefix cache: the store evicts the least recently released for room", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 1, 6);
  StorePrefixCache cache(store, 1);
  // Three blocks of one head in one layer: 3 cells, each its own slot.
  for (uint64_t b = 0; b < 3; ++b) {
    auto c = store.AllocateCells(0, 1);
    REQUIRE(c);
    cache.Release({100 + b, b, Tokens(static_cast<int32_t>(16 * b))}, *c, false);
  }
  CHECK(store.num_free() == 6);  // 3 free slots + 3 evictable
  // Block 0 used again by an import: the most recent now.
  REQUIRE(cache.Acquire({100, 0, Tokens(0)}));
  cache.Release({100, 0, Tokens(0)}, {}, true);
  // Four whole slots: one eviction, the least recently released (block 1).
  auto whole = store.Allocate(4);
  REQUIRE(whole);
  CHECK(cache.evictions_total() == 1);
  CHECK_FALSE(cache.Contains({101, 1, Tokens(16)}));
  CHECK(cache.Contains({100, 0, Tokens(0)}));
  CHECK(cache.Contains({102, 2, Tokens(32)}));
  // A held block stays: with block 0 held only block 2 can go.
  REQUIRE(cache.Acquire({100, 0, Tokens(0)}));
  CHECK(store.num_free() == 1);
  auto cell = store.AllocateCells(0, 1);
  REQUIRE(cell);
  CHECK(cache.evictions_total() == 2);
  CHECK(cache.Contains({100, 0, Tokens(0)}));
  CHECK_FALSE(store.AllocateCells(0, 1).has_value());  // only a held block is left
  cache.Release({100, 0, Tokens(0)}, {}, true);
  auto last = store.AllocateCells(0, 1);  // now it can go
  REQUIRE(last);
  CHECK(cache.num_blocks() == 0);
  store.Free(*whole);
  store.FreeCells(0, *cell);
  store.FreeCells(0, *last);
  CHECK(store.num_free() == 6);
}

TEST_CASE("import prefix cache: random use against a model of the store", "[kvcache][import_cache][fuzz]") {
  CpuBackend backend{1};
  const int64_t layers = 3, heads = 2, per = layers * heads;
  const int32_t slots = 24;
  HostKvStore store = MakeStore(backend, layers, slots);
  StorePrefixCache cache(store, heads);
  std::mt19937_64 rng(33);
  // Imports hold a block: acquired from the cache (its cells shared) and/or cells of their own
  // ([layers * heads], -1: none). The model mirrors the cache's entries (cells, holders).
  struct Import {
    uint64_t hash;
    bool acquired;
    std::vector<int32_t> own;
  };
  struct Entry {
    std::vector<int32_t> cells;
    int holders = 0;
  };
  std::vector<Import> imports;
  std::map<uint64_t, Entry> entries;
  std::vector<std::vector<int32_t>> whole;
  std::vector<std::vector<int32_t>> token_store(12);
  for (uint64_t h = 0; h < 12; ++h) token_store[h] = Tokens(static_cast<int32_t>(h * 16));
  auto key = [&](uint64_t h) { return PrefixBlockKey{h, 0, token_store[h]}; };
  auto free_own = [&](const std::vector<int32_t>& own) {
    for (int64_t l = 0; l < layers; ++l) {
      std::vector<int32_t> give;
      for (int64_t k = 0; k < heads; ++k)
        if (own[static_cast<size_t>(l * heads + k)] >= 0) give.push_back(own[static_cast<size_t>(l * heads + k)]);
      store.FreeCells(l, give);
    }
  };
  for (int round = 0; round < 4000; ++round) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0) {  // an import starts: acquires the block if cached, fetches some head-blocks
      const uint64_t h = rng() % 12;
      Import im{h, false, std::vector<int32_t>(static_cast<size_t>(per), -1)};
      std::vector<int32_t> shared(static_cast<size_t>(per), -1);
      if (auto got = cache.Acquire(key(h))) {
        im.acquired = true;
        shared = *got;
        REQUIRE(entries.count(h));
        REQUIRE(*got == entries[h].cells);
        ++entries[h].holders;
      }
      for (int64_t l = 0; l < layers; ++l) {
        std::vector<int64_t> want;
        for (int64_t k = 0; k < heads; ++k)
          if (shared[static_cast<size_t>(l * heads + k)] < 0 && rng() % 2) want.push_back(k);
        auto c = store.AllocateCells(l, static_cast<int32_t>(want.size()));
        if (!c) continue;
        for (size_t i = 0; i < want.size(); ++i) im.own[static_cast<size_t>(l * heads + want[i])] = (*c)[i];
      }
      imports.push_back(im);
    } else if (op == 1 && !imports.empty()) {  // it ends: its cells to the cache, or freed
      const size_t i = rng() % imports.size();
      const Import im = imports[i];
      imports.erase(imports.begin() + static_cast<std::ptrdiff_t>(i));
      const bool give = rng() % 3 != 0;
      if (!give) free_own(im.own);
      const std::vector<int32_t> none;
      cache.Release(key(im.hash), give ? std::span<const int32_t>(im.own) : std::span<const int32_t>(none),
                    im.acquired);
      Entry& e = entries[im.hash];  // (made if none)
      if (e.cells.empty()) e.cells.assign(static_cast<size_t>(per), -1);
      if (give) {
        for (size_t j = 0; j < im.own.size(); ++j)
          if (im.own[j] >= 0 && e.cells[j] < 0) e.cells[j] = im.own[j];
      }
      if (im.acquired) --e.holders;
      if (e.holders == 0 && std::all_of(e.cells.begin(), e.cells.end(), [](int32_t c) { return c < 0; }))
        entries.erase(im.hash);
    } else if (op == 2) {  // whole slots (may evict)
      if (auto w = store.Allocate(static_cast<int32_t>(1 + rng() % 4))) whole.push_back(*w);
    } else if (op == 3 && !whole.empty()) {
      store.Free(whole.back());
      whole.pop_back();
    }
    // Evictions the store made: parked entries only.
    for (auto it = entries.begin(); it != entries.end();) {
      if (!cache.Contains(key(it->first))) {
        REQUIRE(it->second.holders == 0);
        it = entries.erase(it);
      } else {
        ++it;
      }
    }
    // The model's counts against the store's.
    std::set<std::pair<int64_t, int32_t>> used;  // (layer, cell)
    int64_t parked = 0, cached = 0;
    for (const Import& im : imports) {
      for (size_t j = 0; j < im.own.size(); ++j)
        if (im.own[j] >= 0) REQUIRE(used.insert({static_cast<int64_t>(j) / heads, im.own[j]}).second);
    }
    for (const auto& [h, e] : entries) {
      for (size_t j = 0; j < e.cells.size(); ++j) {
        if (e.cells[j] < 0) continue;
        REQUIRE(used.insert({static_cast<int64_t>(j) / heads, e.cells[j]}).second);
        ++cached;
        parked += e.holders == 0 ? 1 : 0;
        REQUIRE(store.IsParked(static_cast<int64_t>(j) / heads, e.cells[j]) == (e.holders == 0));
      }
    }
    REQUIRE(parked == store.num_parked_cells());
    REQUIRE(cached == cache.num_cells());
    std::map<int32_t, std::pair<int, int>> use;  // slot -> (cells used, parked)
    for (const auto& [l, c] : used) {
      ++use[c].first;
      use[c].second += store.IsParked(l, c) ? 1 : 0;
    }
    int32_t whole_used = 0;
    for (const auto& w : whole) whole_used += static_cast<int32_t>(w.size());
    int32_t evictable = 0;
    for (const auto& [s, u] : use) evictable += u.first == u.second ? 1 : 0;
    REQUIRE(evictable == store.num_evictable_slots());
    REQUIRE(store.num_free() == slots - whole_used - static_cast<int32_t>(use.size()) + evictable);
    for (int64_t l = 0; l < layers; ++l) {
      int32_t free_cells = 0;
      for (const auto& [s, u] : use) free_cells += u.first != u.second && !used.count({l, s}) ? 1 : 0;
      REQUIRE(free_cells == store.num_free_cells(l));
    }
  }
  for (const Import& im : imports) {
    free_own(im.own);
    if (im.acquired) cache.Release(key(im.hash), {}, true);
  }
  while (cache.EvictOldest()) {
  }
  for (const auto& w : whole) store.Free(w);
  CHECK(store.num_free() == slots);
  CHECK(store.num_cell_slots() == 0);
  CHECK(cache.num_blocks() == 0);
}

TEST_CASE("store prefix cache, whole slots: parked slots are room, held ones stay", "[kvcache][import_cache]") {
  CpuBackend backend{1};
  HostKvStore store = MakeStore(backend, 2, 6);
  StorePrefixCache cache(store, /*num_kv_heads=*/2, StorePrefixCache::Unit::kSlots);
  REQUIRE(cache.cells_per_block() == 2);
  auto a = store.Allocate(2);  // block 0: one whole slot per head (every layer)
  auto b = store.Allocate(2);  // block 1
  REQUIRE(a);
  REQUIRE(b);
  const std::vector<int32_t> t0 = Tokens(0), t1 = Tokens(16);
  cache.Release({10, 0, t0}, *a, false);
  cache.Release({11, 10, t1}, *b, false);
  CHECK(store.num_evictable_slots() == 4);
  CHECK(store.num_free() == 6);
  CHECK(store.IsSlotParked((*a)[0]));
  // A request holds block 0: its slots are in use again.
  auto got = cache.Acquire({10, 0, t0});
  REQUIRE(got);
  CHECK(*got == *a);
  CHECK(store.num_free() == 4);
  // Four slots: block 1 is evicted for them; block 0, held, is not.
  auto four = store.Allocate(4);
  REQUIRE(four);
  CHECK(cache.evictions_total() == 1);
  CHECK(cache.Contains({10, 0, t0}));
  CHECK_FALSE(store.Allocate(1).has_value());
  cache.Release({10, 0, t0}, {}, true);
  CHECK(store.num_free() == 2);
  store.Free(*four);
  while (cache.EvictOldest()) {
  }
  CHECK(store.num_free() == 6);
  CHECK(store.num_evictable_slots() == 0);
}

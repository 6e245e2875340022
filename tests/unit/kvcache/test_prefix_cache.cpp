#include <catch2/catch.hpp>

#include <algorithm>
#include <list>
#include <map>
#include <random>
#include <set>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "kvcache/prefix_cache.h"

using namespace oasis;

namespace {

std::vector<int32_t> Tokens(int32_t first) {
  std::vector<int32_t> t(kBlockSize);
  for (int i = 0; i < kBlockSize; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

}  // namespace

TEST_CASE("block hashes chain through the parent and see every token", "[kvcache][prefix]") {
  const uint64_t root = PrefixCacheRoot(0);
  const auto a = Tokens(0), b = Tokens(100);
  CHECK(HashPrefixBlock(root, a) == HashPrefixBlock(root, a));
  CHECK(HashPrefixBlock(root, a) != HashPrefixBlock(root, b));
  CHECK(HashPrefixBlock(root, a) != HashPrefixBlock(PrefixCacheRoot(1), a));  // the salt
  const uint64_t ab = HashPrefixBlock(HashPrefixBlock(root, a), b);
  CHECK(ab != HashPrefixBlock(HashPrefixBlock(root, b), b));
  auto c = a;
  c.back() = 999;
  CHECK(HashPrefixBlock(root, c) != HashPrefixBlock(root, a));
}

TEST_CASE("a cached block outlives its sequence and is evicted only when the pool needs it",
          "[kvcache][prefix]") {
  BlockAllocator a(8);
  a.EnablePrefixCache(2);
  PrefixCache& cache = *a.prefix_cache();
  const uint64_t root = PrefixCacheRoot(0);
  const auto toks = Tokens(7);
  const uint64_t h = HashPrefixBlock(root, toks);

  HeadBlockTable t(2);
  REQUIRE(t.Reserve(2 * kBlockSize, a).ok());  // 2 blocks x 2 heads
  const std::vector<int32_t> block0 = {t.head_slots(0)[0], t.head_slots(1)[0]};
  REQUIRE(cache.Insert(h, root, toks, block0));
  CHECK_FALSE(cache.Insert(h, root, toks, {t.head_slots(0)[1], t.head_slots(1)[1]}));
  CHECK(a.num_free() == 4);
  t.Release(a);
  CHECK(a.num_free() == 8);  // the cached block counts as free (evictable)
  CHECK(cache.num_evictable_slots() == 2);
  REQUIRE(cache.Find(h, root, toks) != nullptr);
  CHECK(*cache.Find(h, root, toks) == block0);
  CHECK(cache.Find(h, PrefixCacheRoot(5), toks) == nullptr);  // another parent
  CHECK(cache.Find(h, root, Tokens(8)) == nullptr);          // other tokens

  // A hit shares it: no longer evictable, not free.
  HeadBlockTable u(2);
  u.AdoptShared({block0}, a);
  CHECK(u.num_blocks() == 1);
  CHECK(a.num_free() == 6);
  CHECK(cache.num_evictable_slots() == 0);
  CHECK_FALSE(a.Allocate(7));
  auto six = a.Allocate(6);  // everything else: the shared block is never handed out
  REQUIRE(six);
  for (int32_t s : block0) CHECK(std::find(six->begin(), six->end(), s) == six->end());
  a.Free(*six);
  u.Release(a);
  CHECK(a.num_free() == 8);

  // The pool runs short: the cached block is evicted and its slots reused.
  auto all = a.Allocate(8);
  REQUIRE(all);
  CHECK(cache.num_entries() == 0);
  CHECK(cache.evictions_total() == 1);
  CHECK(cache.Find(h, root, toks) == nullptr);
  a.Free(*all);
  CHECK(a.num_free() == 8);
}

TEST_CASE("eviction takes the least recently released cached block first", "[kvcache][prefix]") {
  BlockAllocator a(4);
  a.EnablePrefixCache(1);
  PrefixCache& cache = *a.prefix_cache();
  const uint64_t root = PrefixCacheRoot(0);
  std::vector<uint64_t> hashes;
  std::vector<std::vector<int32_t>> slots;
  for (int i = 0; i < 3; ++i) {
    auto s = a.Allocate(1);
    REQUIRE(s);
    hashes.push_back(HashPrefixBlock(root, Tokens(i * 100)));
    REQUIRE(cache.Insert(hashes.back(), root, Tokens(i * 100), *s));
    slots.push_back(*s);
  }
  a.Free(slots[1]);
  a.Free(slots[0]);
  a.Free(slots[2]);
  a.Share(slots[1]);  // a hit refreshes it: released again later, evicted last
  a.Free(slots[1]);
  REQUIRE(a.Allocate(2));  // the free slot, then the LRU entry (block 0)
  CHECK(cache.Find(hashes[0], root, Tokens(0)) == nullptr);
  CHECK(cache.Find(hashes[2], root, Tokens(200)) != nullptr);
  REQUIRE(a.Allocate(1));
  CHECK(cache.Find(hashes[2], root, Tokens(200)) == nullptr);
  CHECK(cache.Find(hashes[1], root, Tokens(100)) != nullptr);
}

// Random operations on an allocator with a prefix cache against a plain model: reference
// counts, which blocks are cached, LRU eviction order, the free count; every slot carries the
// "content" its block was written with, and a holder always reads back what it expects (no
// slot is handed out while referenced).
TEST_CASE("prefix cache fuzz: operations match a reference model", "[kvcache][prefix]") {
  constexpr int32_t kSlots = 40, kHeads = 2, kPatterns = 12, kIterations = 20000;
  std::mt19937 rng(20261203);
  BlockAllocator a(kSlots);
  a.EnablePrefixCache(kHeads);
  PrefixCache& cache = *a.prefix_cache();
  const uint64_t root = PrefixCacheRoot(0);
  auto pattern_hash = [&](int p) { return HashPrefixBlock(root, Tokens(p * 1000)); };

  struct Block {
    std::vector<int32_t> slots;
    int64_t content;
  };
  std::vector<std::vector<Block>> holders;  // each: some blocks it references
  std::vector<int64_t> content(kSlots, -1);
  std::vector<int32_t> refs(kSlots, 0);
  std::map<int, std::vector<int32_t>> cached;  // pattern → slots (the model's cache)
  std::map<int, int64_t> cached_content;
  std::list<int> lru;  // evictable patterns, least recently released first
  int64_t next_content = 0;
  int64_t hits = 0, full = 0;

  auto pattern_of = [&](int32_t slot) {
    for (auto& [p, s] : cached)
      if (std::find(s.begin(), s.end(), slot) != s.end()) return p;
    return -1;
  };
  auto drop_ref = [&](const std::vector<int32_t>& slots) {
    for (int32_t s : slots) --refs[static_cast<size_t>(s)];
    const int p = pattern_of(slots[0]);
    if (p >= 0 && std::all_of(cached[p].begin(), cached[p].end(),
                              [&](int32_t s) { return refs[static_cast<size_t>(s)] == 0; }))
      lru.push_back(p);
  };
  auto model_free = [&] {
    int64_t n = 0;
    for (int32_t s = 0; s < kSlots; ++s)
      if (refs[static_cast<size_t>(s)] == 0 && pattern_of(s) < 0) ++n;
    return n + static_cast<int64_t>(lru.size()) * kHeads;
  };

  for (int it = 0; it < kIterations; ++it) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {  // allocate a fresh block into a new or existing holder
      const int64_t free_before = model_free();
      auto s = a.Allocate(kHeads);
      REQUIRE(s.has_value() == (free_before >= kHeads));
      if (!s) {
        ++full;
        continue;
      }
      // What the allocator had to evict: the model's LRU front, in order.
      const int64_t plain = free_before - static_cast<int64_t>(lru.size()) * kHeads;
      for (int64_t short_by = kHeads - plain; short_by > 0; short_by -= kHeads) {
        REQUIRE_FALSE(lru.empty());
        const int p = lru.front();
        lru.pop_front();
        REQUIRE(cache.Find(pattern_hash(p), root, Tokens(p * 1000)) == nullptr);
        cached.erase(p);
        cached_content.erase(p);
      }
      for (int32_t slot : *s) {
        REQUIRE(refs[static_cast<size_t>(slot)] == 0);  // never handed out while referenced
        refs[static_cast<size_t>(slot)] = 1;
        content[static_cast<size_t>(slot)] = next_content;
      }
      Block b{*s, next_content++};
      if (holders.empty() || rng() % 2) holders.emplace_back();
      holders[rng() % holders.size()].push_back(b);
    } else if (op == 1 && !holders.empty()) {  // register a holder's block under a pattern
      auto& h = holders[rng() % holders.size()];
      if (h.empty()) continue;
      const Block& b = h[rng() % h.size()];
      const int p = static_cast<int>(rng() % kPatterns);
      const bool fresh = !cached.count(p) && pattern_of(b.slots[0]) < 0;
      if (pattern_of(b.slots[0]) >= 0) continue;  // the engine registers a block once
      REQUIRE(cache.Insert(pattern_hash(p), root, Tokens(p * 1000), b.slots) == fresh);
      if (fresh) {
        cached[p] = b.slots;
        cached_content[p] = b.content;
      }
    } else if (op == 2 && !holders.empty()) {  // a holder releases everything
      const size_t i = rng() % holders.size();
      std::vector<int32_t> all;
      for (const Block& b : holders[i]) {
        a.Free(b.slots);
        drop_ref(b.slots);
      }
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 3) {  // a lookup hit adopts a cached block
      const int p = static_cast<int>(rng() % kPatterns);
      const std::vector<int32_t>* found = cache.Find(pattern_hash(p), root, Tokens(p * 1000));
      REQUIRE((found != nullptr) == (cached.count(p) > 0));
      if (found == nullptr) continue;
      REQUIRE(*found == cached[p]);
      ++hits;
      const std::vector<int32_t> slots = *found;
      a.Share(slots);
      for (int32_t s : slots) {
        if (refs[static_cast<size_t>(s)]++ == 0) lru.remove(p);
      }
      if (holders.empty() || rng() % 2) holders.emplace_back();
      holders[rng() % holders.size()].push_back({slots, cached_content[p]});
    }
    // Invariants after every operation.
    REQUIRE(a.num_free() == model_free());
    REQUIRE(cache.num_evictable_slots() == static_cast<int64_t>(lru.size()) * kHeads);
    REQUIRE(cache.num_entries() == static_cast<int64_t>(cached.size()));
    for (int32_t s = 0; s < kSlots; ++s) REQUIRE(a.ref_count(s) == refs[static_cast<size_t>(s)]);
    for (const auto& h : holders)
      for (const Block& b : h)
        for (int32_t s : b.slots) REQUIRE(content[static_cast<size_t>(s)] == b.content);
  }
  for (const auto& h : holders)
    for (const Block& b : h) a.Free(b.slots);
  CHECK(a.num_free() == kSlots);
  // The budget exercised every path: hits, evictions, a full pool.
  CHECK(hits > 100);
  CHECK(cache.evictions_total() > 100);
  CHECK(full > 10);
}

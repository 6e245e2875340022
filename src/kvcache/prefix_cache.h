// PrefixCache: the index of automatic prefix caching (issue 33, docs/prefix_caching.md) — which
// computed, full KV blocks a later prompt can reuse instead of recomputing them.
//
// A cached block is one logical block (kBlockSize tokens at one position) of some sequence:
// with head-level block tables that is one head-block slot per KV head. It is identified by a
// chained hash: hash(parent block's hash, the block's token ids), the first block's parent
// being a root derived from a salt (the model, later a per-request cache salt). An entry also
// keeps its parent hash and its tokens, and a lookup compares both, so two prefixes map to the
// same entry only if their parents' 64-bit hashes collide.
//
// Slots stay owned by the BlockAllocator, which counts references to every slot. The cache
// only learns when a cached slot's last reference goes (Park) or an unreferenced one is
// shared again (Unpark). An entry whose slots are all unreferenced is evictable: it waits in
// an LRU list (least recently released first) and the allocator evicts it when its free list
// runs short, so the pool's free count includes evictable entries (admission and preemption
// see them as free). An entry with a referenced slot is never evicted.
//
// Not thread-safe: owned by the BlockAllocator, used by the engine loop thread.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace oasis {

// The root of a chain of block hashes (the "parent" of a sequence's first block).
uint64_t PrefixCacheRoot(uint64_t salt);
// The hash of a full block of `tokens` (kBlockSize ids) following a block hashed `parent`.
uint64_t HashPrefixBlock(uint64_t parent, std::span<const int32_t> tokens);
// The chain of hashes of the full blocks of `tokens` from `root`.
std::vector<uint64_t> HashPrefixBlocks(uint64_t root, std::span<const int32_t> tokens);

// The key of one full block of a chain (PrefixCache::Find's arguments).
struct PrefixBlockKey {
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::span<const int32_t> tokens;
};

class PrefixCache {
 public:
  PrefixCache(int32_t num_slots, int32_t num_kv_heads);

  // The slots ([head]) of the cached block `hash` whose parent and tokens are these; null on
  // a miss.
  const std::vector<int32_t>* Find(uint64_t hash, uint64_t parent,
                                   std::span<const int32_t> tokens) const;
  // Registers referenced `slots` ([head], none cached yet) as block `hash`. False (nothing
  // changes) when the hash is already cached: the caller keeps its own copy uncached.
  bool Insert(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
              const std::vector<int32_t>& slots);
  bool IsCached(int32_t slot) const { return entry_of_[static_cast<size_t>(slot)] != kNone; }
  // Whether cached `slot`'s entry is evictable (all its slots parked).
  bool IsParked(int32_t slot) const;
  // Cached `slot` lost its last reference: the cache keeps it (its entry becomes evictable
  // once all its slots are parked).
  void Park(int32_t slot);
  // Parked cached `slot` is referenced again: its entry is no longer evictable.
  void Unpark(int32_t slot);
  // An entry dropped by EvictEntry: its key and slots (the caller frees them).
  struct Evicted {
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::array<int32_t, kBlockSize> tokens{};
    std::vector<int32_t> slots;  // [head]
  };
  // Drops the least recently released evictable entry; nullopt when nothing is evictable.
  std::optional<Evicted> EvictEntry();
  // EvictEntry's slots only (empty when nothing is evictable).
  std::vector<int32_t> EvictOne();

  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_evictable_slots() const { return num_evictable_slots_; }
  int64_t evictions_total() const { return evictions_total_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }

  // Token counters (vLLM's prefix_cache_queries / _hits): prompt tokens looked up at
  // admission and those found cached.
  void CountLookup(int64_t queried_tokens, int64_t hit_tokens) {
    queries_tokens_total_ += queried_tokens;
    hits_tokens_total_ += hit_tokens;
  }
  int64_t queries_tokens_total() const { return queries_tokens_total_; }
  int64_t hits_tokens_total() const { return hits_tokens_total_; }

 private:
  static constexpr uint64_t kNone = ~uint64_t{0};
  struct Entry {
    uint64_t parent = 0;
    std::array<int32_t, kBlockSize> tokens{};
    std::vector<int32_t> slots;  // [head]
    int32_t num_parked = 0;      // slots without a reference
    bool evictable = false;      // in lru_
    std::list<uint64_t>::iterator lru_pos;
  };

  int32_t num_kv_heads_;
  std::unordered_map<uint64_t, Entry> entries_;  // by hash
  std::vector<uint64_t> entry_of_;               // [slot] → its entry's hash, or kNone
  std::list<uint64_t> lru_;                      // evictable entries, least recently released first
  int64_t num_evictable_slots_ = 0;
  int64_t evictions_total_ = 0;
  int64_t queries_tokens_total_ = 0;
  int64_t hits_tokens_total_ = 0;
};

}  // namespace oasis

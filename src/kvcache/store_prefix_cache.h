// StorePrefixCache: prompt blocks kept in the host KV store for later requests with the same
// prefix (issue 33; docs/prefix_caching.md "The decode side", "One host store"). Two users:
//  - disaggregation's decode side (Unit::kCells): when an imported request ends, the cells of
//    its full prompt blocks whose K/V is in the store (its admission set and what drifted in,
//    per sparse layer and KV head) stay here; a later import of the same leading blocks holds
//    them too and fetches only the rest from the prefill instance's staging pool;
//  - local host-home sparse requests (Unit::kSlots): the whole store slots (a head-block in
//    every layer, with its summaries) of the blocks a request computed while dense stay here;
//    a later request switching to sparse with the same prefix takes them instead of copying
//    those blocks to the store and summarising them again.
// Keys are the prefix cache's chained hashes (kvcache/prefix_cache.h: hash(parent, the
// block's 16 token ids), with the request's cache salt).
//
// An entry is one block: kCells: per sparse layer i and KV head h (index i * Hkv + h) a cell of
// layer first_sparse_layer + i, or -1 where nobody had that head-block locally; kSlots: per KV
// head a whole slot. Entries are shared: Acquire counts a holder (requests reading its
// storage; the blocks are never written once their K/V is in), Release ends one and gives the
// entry what it lacks of the releasing request's own; Publish shares a request's blocks while
// it runs. An entry no request holds is *parked*: its storage counts as room
// (HostKvStore::num_free), and the store evicts parked entries, least recently released first,
// when it needs the room. A held entry is never evicted.
//
// Not thread-safe: the engine loop thread, like the store.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kvcache/host_kv_store.h"
#include "kvcache/prefix_cache.h"

namespace oasis {

class StorePrefixCache final : public HostKvStore::CellEvictor {
 public:
  enum class Unit { kCells, kSlots };
  // One of `store`'s evictors until destroyed.
  StorePrefixCache(HostKvStore& store, int64_t num_kv_heads, Unit unit = Unit::kCells);
  ~StorePrefixCache() override;
  StorePrefixCache(const StorePrefixCache&) = delete;
  StorePrefixCache& operator=(const StorePrefixCache&) = delete;

  // Storage ids per entry: sparse layers × KV heads (cells), or KV heads (whole slots).
  int64_t cells_per_block() const {
    return unit_ == Unit::kCells ? num_sparse_layers_ * num_kv_heads_ : num_kv_heads_;
  }

  // The cells ([cells_per_block()], -1 where none) of the block of `key`, now held by one more
  // import (unparked if it was parked); nullopt on a miss (also when the parent or the tokens
  // differ: a hash collision).
  std::optional<std::vector<int32_t>> Acquire(const PrefixBlockKey& key);
  // An import is done with the block of `key`: `held` when it had acquired the entry; `own`
  // (empty, or [cells_per_block()]): cells of the block it holds itself (in use) whose K/V is
  // in the store, -1 elsewhere. The entry (made if there is none) takes the ones it lacks; the
  // others are freed. With no holder left the entry is parked (room, evictable).
  void Release(const PrefixBlockKey& key, std::span<const int32_t> own, bool held);
  // An import whose fetch landed publishes a block the cache lacks: an entry of `own` (its
  // cells, in use, with their K/V; -1 elsewhere), held by that import (Release(key, ..., true)
  // when it ends), so imports arriving meanwhile share it. False (nothing changes) when the
  // block is cached already or `own` has no cell.
  bool Publish(const PrefixBlockKey& key, std::span<const int32_t> own);
  bool Contains(const PrefixBlockKey& key) const;

  bool EvictOldest() override;

  int64_t num_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_cells() const { return num_cells_; }
  int64_t num_held_blocks() const { return num_blocks() - static_cast<int64_t>(lru_.size()); }
  int64_t evictions_total() const { return evictions_total_; }

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> cells;  // [cells_per_block()]
    int64_t holders = 0;
    std::list<uint64_t>::iterator lru;  // in lru_ (front: least recently parked) iff holders 0
  };
  bool Matches(const Entry& e, const PrefixBlockKey& key) const;
  // The ids >= 0 of an entry.
  static std::vector<int32_t> Present(std::span<const int32_t> cells);
  // Calls on_slots(ids) (whole slots) or on_layer(layer, ids) for each sparse layer with ids,
  // over an entry's ids >= 0.
  template <typename OnSlots, typename OnLayer>
  void Apply(std::span<const int32_t> cells, OnSlots on_slots, OnLayer on_layer);
  void ParkAll(std::span<const int32_t> cells);
  void UnparkAll(std::span<const int32_t> cells);
  // Frees cells in use that are not parked.
  void FreeAll(std::span<const int32_t> cells);

  HostKvStore& store_;
  Unit unit_;
  int64_t first_layer_, num_sparse_layers_, num_kv_heads_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // parked entries
  int64_t num_cells_ = 0;
  int64_t evictions_total_ = 0;
};

}  // namespace oasis

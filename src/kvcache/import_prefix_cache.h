// ImportPrefixCache: disaggregation's decode side reusing a prompt prefix it already holds
// (issue 33; docs/prefix_caching.md "The decode side"). When an imported request ends, the
// cells of its full prompt blocks whose K/V is in the host store (its admission set and what
// drifted in, per sparse layer and KV head) are parked here under the block's chain hash
// (kvcache/prefix_cache.h: hash(parent, the block's 16 token ids)); a later import of a prompt
// with the same leading blocks takes them back and fetches only the rest from the prefill
// instance's staging pool.
//
// An entry is one block: per sparse layer i and KV head h (index i * Hkv + h) a cell of layer
// first_sparse_layer + i, or -1 where that head-block was not local. Taking an entry is
// exclusive (the entry leaves the cache and its cells go to the import that took it, which
// parks them again when it ends), so a cell always has one owner and is never written by two.
// Parked cells count as room (HostKvStore::num_free): the store evicts entries, least recently
// parked first, when it needs their slots.
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

namespace oasis {

class ImportPrefixCache final : public HostKvStore::CellEvictor {
 public:
  // Becomes `store`'s evictor until destroyed.
  ImportPrefixCache(HostKvStore& store, int64_t num_kv_heads);
  ~ImportPrefixCache() override;
  ImportPrefixCache(const ImportPrefixCache&) = delete;
  ImportPrefixCache& operator=(const ImportPrefixCache&) = delete;

  // Cells per entry: sparse layers × KV heads.
  int64_t cells_per_block() const { return num_sparse_layers_ * num_kv_heads_; }

  // Parks `cells` ([cells_per_block()]: cells in use that no request holds any more, or -1) as
  // block `hash` (whose parent hash and token ids are these). If the block is cached already,
  // the entry takes the cells it lacks and the others are freed.
  void Park(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
            std::span<const int32_t> cells);
  // Takes block `hash` out of the cache: its cells ([cells_per_block()], -1 where none),
  // unparked (in use, the caller's now); nullopt on a miss (also when the parent or the
  // tokens differ: a hash collision).
  std::optional<std::vector<int32_t>> Take(uint64_t hash, uint64_t parent,
                                           std::span<const int32_t> tokens);
  bool Contains(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;

  bool EvictOldest() override;

  int64_t num_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_cells() const { return num_cells_; }
  int64_t evictions_total() const { return evictions_total_; }

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::vector<int32_t> cells;       // [cells_per_block()]
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: least recently parked)
  };
  bool Matches(const Entry& e, uint64_t parent, std::span<const int32_t> tokens) const;
  // Unparks an entry's cells (they stay in use) and forgets the entry.
  std::vector<int32_t> Remove(std::unordered_map<uint64_t, Entry>::iterator it);
  // An entry's cells per sparse layer (the ones >= 0).
  std::vector<std::vector<int32_t>> ByLayer(std::span<const int32_t> cells) const;
  // Frees cells in use that are not parked.
  void FreeAll(std::span<const int32_t> cells);

  HostKvStore& store_;
  int64_t first_layer_, num_sparse_layers_, num_kv_heads_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;
  int64_t num_cells_ = 0;
  int64_t evictions_total_ = 0;
};

}  // namespace oasis

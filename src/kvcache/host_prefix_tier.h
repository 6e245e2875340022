// HostPrefixTier: the host-memory tier of automatic prefix caching (issue 33,
// docs/prefix_caching.md "Host tier"). Cached blocks the GPU pool evicts are copied here
// (SGLang HiCache's write-back) instead of being lost; a later prompt whose prefix continues
// into them reloads them into fresh GPU slots (engine/prefix_reuse.cpp) instead of
// recomputing them.
//
// A host slot is one head-block (kBlockSize tokens of one KV head) in EVERY layer, like a GPU
// slot of the paged pools, in page-locked memory the device reads and writes directly
// (Backend::EmptyHost); an entry is one logical block: num_kv_heads host slots, keyed like the
// GPU cache (PrefixCache: chained hash, parent, tokens). Every entry is evictable (least
// recently spilled or hit first) except while a reload pins it.
//
// Ordering: the spill copies of one allocation are enqueued on the backend's stream when the
// allocation ends evicting (EndEvictions), before the allocated slots can be written; a reload
// is enqueued before the step that reads it. Both run on the backend's current stream, in
// order with each other, so a host slot reused by a later spill is read by earlier reloads
// first.
//
// Tensor parallelism: one slot id names the same (sequence, local head, block) in every rank's
// pool (runner/tp/tp_model_runner.h), so the tier has one index and one slot allocator and a
// host pool per rank ("side"); every copy runs on every side with the same slot lists, each
// on its rank's thread (`run_sides`).
//
// Not thread-safe: used by the engine loop thread (through the BlockAllocator).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"
#include "kvcache/prefix_cache.h"

namespace oasis {

class HostPrefixTier : public EvictionSink {
 public:
  // One rank's backend and GPU pools (one per layer, all the same head_dim and dtype; the
  // caller keeps them alive).
  struct Side {
    Backend* backend = nullptr;
    std::vector<LayerKvPool>* gpu = nullptr;
  };
  // Runs fn(side) for every side, each where that side's backend may be used; returns when
  // all have returned.
  using RunSides = std::function<void(const std::function<void(int side)>& fn)>;

  // A tier of `bytes` in all (split evenly over the sides, rounded down to whole slots) for
  // blocks of `num_kv_heads` head-slots. Holds at least one block: smaller sizes are refused
  // by the caller.
  HostPrefixTier(std::vector<Side> sides, RunSides run_sides, int32_t num_kv_heads, size_t bytes);
  // One side, used on the caller's thread.
  HostPrefixTier(Backend& backend, std::vector<LayerKvPool>& gpu_pools, int32_t num_kv_heads,
                 size_t bytes);

  // Host bytes of one slot of one side (K and V, every layer).
  static size_t BytesPerSlot(int64_t num_layers, int64_t head_dim, DType dtype);

  int32_t num_slots() const { return slots_.num_slots(); }
  int64_t num_blocks_capacity() const { return num_slots() / num_kv_heads_; }
  int64_t num_entries() const { return index_.num_entries(); }
  size_t bytes_per_slot() const { return bytes_per_slot_; }

  // EvictionSink: records the copy of an evicted GPU block into host slots (evicting the
  // tier's least recently used entries for room); EndEvictions enqueues the recorded copies.
  void Evicted(const PrefixCache::Evicted& e) override;
  void EndEvictions() override;

  // The host slots ([head]) of cached block `hash` (its parent and tokens as these), or null.
  const std::vector<int32_t>* Find(uint64_t hash, uint64_t parent,
                                   std::span<const int32_t> tokens) const;
  // Keeps found entries (their host slots) from eviction until Unpin, which makes them the
  // most recently used: a reload pins what it will read while it allocates GPU slots (an
  // allocation may spill into the tier).
  void Pin(const std::vector<int32_t>& host_slots);
  void Unpin(const std::vector<int32_t>& host_slots);
  // Enqueues gpu[i][h] <- host[i][h] (K and V, every layer).
  void Reload(const std::vector<std::vector<int32_t>>& host,
              const std::vector<std::vector<int32_t>>& gpu);

  // Counters (Prometheus: oasis:prefix_cache_host_*).
  void CountHit(int64_t tokens) { hits_tokens_total_ += tokens; }
  int64_t hits_tokens_total() const { return hits_tokens_total_; }
  int64_t spilled_blocks_total() const { return spilled_blocks_total_; }
  int64_t reloaded_blocks_total() const { return reloaded_blocks_total_; }
  int64_t spilled_bytes_total() const { return spilled_blocks_total_ * BlockBytes(); }
  int64_t reloaded_bytes_total() const { return reloaded_blocks_total_ * BlockBytes(); }
  int64_t evictions_total() const { return index_.evictions_total(); }
  // Blocks the tier dropped on a spill because every entry was pinned.
  int64_t dropped_blocks_total() const { return dropped_blocks_total_; }

 private:
  int64_t BlockBytes() const {
    return static_cast<int64_t>(bytes_per_slot_) * num_kv_heads_ *
           static_cast<int64_t>(sides_.size());
  }
  // Copies per layer: dst[dst_slots[i]] = src[src_slots[i]].
  void CopyAll(bool to_host, const std::vector<int32_t>& src_slots,
               const std::vector<int32_t>& dst_slots);

  std::vector<Side> sides_;
  RunSides run_sides_;
  int32_t num_kv_heads_;
  size_t bytes_per_slot_;
  BlockAllocator slots_;  // host slots (no cache of its own)
  PrefixCache index_;     // entries over host slots; unpinned entries are "parked" (evictable)
  std::vector<std::vector<LayerKvPool>> host_;       // [side][layer]
  std::vector<int32_t> pending_gpu_, pending_host_;  // copies EndEvictions enqueues
  int64_t hits_tokens_total_ = 0;
  int64_t spilled_blocks_total_ = 0;
  int64_t reloaded_blocks_total_ = 0;
  int64_t dropped_blocks_total_ = 0;
};

}  // namespace oasis

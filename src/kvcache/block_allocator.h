// BlockAllocator: hands out head-block slots of the paged KV cache, [0, num_slots).
// A slot id addresses the same head-block in every layer's pool (LayerKvPool).
// Owns the free list, a reference count per slot and, with prefix caching on, the
// PrefixCache index: a slot whose last reference goes while it is cached stays cached
// (evictable) instead of returning to the free list, and Allocate evicts the least recently
// released cached blocks when the free list runs short. num_free() counts evictable slots as
// free. Not thread-safe: owned and used by the engine loop thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kvcache/prefix_cache.h"

namespace oasis {

class HostPrefixTier;

// Learns of cached blocks the allocator evicts, before their slots are handed out again (the
// host tier of prefix caching copies them to host memory: kvcache/host_prefix_tier.h).
class EvictionSink {
 public:
  virtual ~EvictionSink() = default;
  // Cached block `e` is evicted; its slots go to the allocation under way once EndEvictions
  // returns, and nothing writes them before.
  virtual void Evicted(const PrefixCache::Evicted& e) = 0;
  // The allocation that evicted is done evicting (once per such allocation).
  virtual void EndEvictions() = 0;
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_slots);

  // Turns automatic prefix caching on for blocks of `num_kv_heads` slots (once, before any
  // allocation).
  void EnablePrefixCache(int32_t num_kv_heads);
  PrefixCache* prefix_cache() { return cache_.get(); }
  const PrefixCache* prefix_cache() const { return cache_.get(); }
  // The host tier of the prefix cache (null: none): evicted cached blocks go to it (its
  // EvictionSink) and prefix_reuse reloads hits from it. Not owned; set after
  // EnablePrefixCache, before allocations.
  void set_host_tier(HostPrefixTier* tier, EvictionSink* sink) {
    host_tier_ = tier;
    sink_ = sink;
  }
  HostPrefixTier* host_tier() { return host_tier_; }
  const HostPrefixTier* host_tier() const { return host_tier_; }

  // `count` slots (one reference each), or nullopt (nothing taken) when fewer are free.
  // Most recently freed first; a fresh pool gives ascending slots and a vector freed together
  // comes back in its own order, so reservations get contiguous runs where the pool has them.
  // Evicts cached blocks (least recently released first) when the free list is short.
  std::optional<std::vector<int32_t>> Allocate(int32_t count);
  // Drops one reference of each slot; a slot without references returns to the free list (or,
  // cached, becomes evictable). Freeing a slot without a reference is a CHECK failure.
  void Free(const std::vector<int32_t>& slots);
  // Adds a reference to each slot: a referenced one, or a cached one kept after its last
  // reference went (prefix-cache hits share blocks read-only).
  void Share(const std::vector<int32_t>& slots);

  int32_t num_slots() const { return static_cast<int32_t>(refs_.size()); }
  int32_t num_free() const;
  int32_t ref_count(int32_t slot) const { return refs_[static_cast<size_t>(slot)]; }
  // Whether the one holder of `slot` may write it: referenced once and not in the prefix
  // cache (a cached block is read by later hits, a shared one by its other holders).
  bool Overwritable(int32_t slot) const {
    return refs_[static_cast<size_t>(slot)] == 1 && (cache_ == nullptr || !cache_->IsCached(slot));
  }

 private:
  std::vector<int32_t> free_;  // LIFO: recently freed slots are reused first
  std::vector<int32_t> refs_;  // [slot] references (0: free or cached-evictable)
  std::unique_ptr<PrefixCache> cache_;
  HostPrefixTier* host_tier_ = nullptr;
  EvictionSink* sink_ = nullptr;
};

}  // namespace oasis

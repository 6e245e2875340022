// StagingPool: the prefill node's host memory that keeps each disaggregated request's full
// KV until the decode node has no more use for it.
//
// One anonymous mapping of `num_blocks` fixed-size slots (one KV head-block each, typically)
// registered with UCX (ucp_mem_map) so that a decode node can read any slot with an RMA get
// (RemoteReader) through the packed remote key in descriptor(). Requests take slots through
// leases: Acquire() hands out a lease id and a list of slot indices; the lease ends with
// Release(kCompleted) when the request finished, Release(kAborted) when it was cancelled, or
// by expiry when nobody renewed it for its TTL (a decode node that died). Expiry is driven by
// ReleaseExpired(now) — the StagingServer's progress thread calls it periodically — and every
// time-dependent call takes `now` explicitly, so tests need no sleeps. Slots are handed out
// lowest-first from coalesced free runs, so a lease is usually one or a few extents.
//
// Ownership: owns the mapping and its registration (the UcxContext is kept alive by it).
// Thread-safe: every method may be called from any thread. BlockData() pointers stay valid for
// the pool's lifetime; writing a slot is the lease holder's business (the pool does not track
// who writes).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "disagg/ucx.h"
#include "disagg/wire.h"
#include "oasis/status.h"

namespace oasis::disagg {

struct StagingPoolOptions {
  uint64_t block_bytes = 0;  // bytes per slot, e.g. one head-block: 16 × head_dim × 2 (K, V) × 2
  uint64_t num_blocks = 0;
  // TTL of a lease when Acquire() is not given one: how long the decode side may stay silent.
  std::chrono::milliseconds default_lease_ttl{30000};
};

// Why a lease ended.
enum class LeaseEnd { kCompleted, kAborted, kExpired };

struct Lease {
  uint64_t id = 0;               // never reused within a pool
  std::vector<uint32_t> blocks;  // slot indices, ascending (ordinal i of the request → blocks[i])
  std::vector<SlotExtent> extents;  // the same slots as runs (what a handoff sends)
};

struct StagingPoolStats {
  uint64_t blocks_total = 0;
  uint64_t block_bytes = 0;
  uint64_t blocks_held = 0;
  uint64_t bytes_held = 0;
  uint64_t requests_held = 0;  // live leases
  uint64_t leases_granted = 0;
  uint64_t leases_completed = 0;
  uint64_t leases_aborted = 0;
  uint64_t leases_expired = 0;
  uint64_t acquire_failures = 0;  // Acquire() refused for lack of free slots
  uint64_t renewals = 0;
  uint64_t free_runs = 0;  // runs of free slots (1 = unfragmented)
};

class StagingPool {
 public:
  static StatusOr<std::unique_ptr<StagingPool>> Create(std::shared_ptr<UcxContext> context,
                                                       const StagingPoolOptions& options);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A lease of `num_blocks` slots expiring at now + ttl unless renewed. kResourceExhausted
  // when fewer slots are free (nothing is taken then); kInvalidArgument for 0 blocks.
  StatusOr<Lease> Acquire(uint64_t num_blocks, Clock::time_point now,
                          std::optional<std::chrono::milliseconds> ttl = std::nullopt);
  StatusOr<Lease> Acquire(uint64_t num_blocks) { return Acquire(num_blocks, Clock::now()); }

  // Moves the lease's expiry to now + its TTL. kNotFound when the lease ended (expired,
  // released) or never existed.
  Status Renew(uint64_t lease_id, Clock::time_point now);
  Status Renew(uint64_t lease_id) { return Renew(lease_id, Clock::now()); }

  // Ends a lease and frees its slots. `why` is kCompleted or kAborted. kNotFound as Renew.
  Status Release(uint64_t lease_id, LeaseEnd why);

  // Ends every lease whose expiry is <= now; returns how many ended.
  size_t ReleaseExpired(Clock::time_point now);

  // The slot's memory (index < num_blocks, a CHECK).
  std::byte* BlockData(uint32_t index);
  // The whole mapping, [base(), base() + bytes()): e.g. to register it with cudaHostRegister
  // so that GPU → staging copies are pinned DMA.
  std::byte* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  bool HoldsLease(uint64_t lease_id) const;
  // The earliest expiry among live leases.
  std::optional<Clock::time_point> NextExpiry() const;

  const StagingDescriptor& descriptor() const { return descriptor_; }
  const StagingPoolOptions& options() const { return options_; }
  StagingPoolStats Stats() const;

 private:
  struct LeaseState {
    std::vector<SlotExtent> extents;
    uint64_t num_blocks;
    std::chrono::milliseconds ttl;
    Clock::time_point expiry;
  };
  StagingPool(std::shared_ptr<UcxContext> context, StagingPoolOptions options, std::byte* base,
              size_t bytes, ucp_mem_h memh, StagingDescriptor descriptor);
  void EndLocked(std::unordered_map<uint64_t, LeaseState>::iterator it, LeaseEnd why);

  std::shared_ptr<UcxContext> context_;
  const StagingPoolOptions options_;
  std::byte* const base_;
  const size_t bytes_;
  const ucp_mem_h memh_;
  const StagingDescriptor descriptor_;

  mutable std::mutex mu_;
  // Free slots as runs start → count, coalesced; leases take the lowest slots first, so a
  // lease is a few extents and the pool fragments little.
  std::map<uint32_t, uint32_t> free_runs_;
  uint64_t free_slots_ = 0;
  std::unordered_map<uint64_t, LeaseState> leases_;
  uint64_t next_lease_id_ = 1;
  StagingPoolStats stats_;
};

}  // namespace oasis::disagg

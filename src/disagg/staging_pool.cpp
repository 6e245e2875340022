#include "disagg/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "common/check.h"

namespace oasis::disagg {

StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(std::shared_ptr<UcxContext> context,
                                                           const StagingPoolOptions& options) {
  OASIS_CHECK(context != nullptr) << "StagingPool needs a UCX context";
  if (options.block_bytes == 0 || options.block_bytes > kMaxBlockBytes) {
    return InvalidArgument("staging pool: block size " + std::to_string(options.block_bytes) +
                           " outside 1.." + std::to_string(kMaxBlockBytes));
  }
  if (options.num_blocks == 0 || options.num_blocks > kMaxBlocks) {
    return InvalidArgument("staging pool: block count " + std::to_string(options.num_blocks) +
                           " outside 1.." + std::to_string(kMaxBlocks));
  }
  if (options.default_lease_ttl.count() <= 0) {
    return InvalidArgument("staging pool: the lease TTL must be positive");
  }
  const size_t bytes = options.block_bytes * options.num_blocks;
  // Our own anonymous mapping (not UCX-allocated memory): a peer on the same host then reads
  // it through the kernel (CMA) or the network, never through a shared mapping that would
  // outlive this process.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return ResourceExhausted("staging pool: mmap of " + std::to_string(bytes) +
                             " bytes: " + std::strerror(errno));
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(context->get(), &mp, &memh);
  if (s != UCS_OK) {
    munmap(base, bytes);
    return UcsStatus(s, "staging pool: ucp_mem_map of " + std::to_string(bytes) + " bytes");
  }
  void* rkey_buffer = nullptr;
  size_t rkey_size = 0;
  s = ucp_rkey_pack(context->get(), memh, &rkey_buffer, &rkey_size);
  if (s != UCS_OK) {
    ucp_mem_unmap(context->get(), memh);
    munmap(base, bytes);
    return UcsStatus(s, "staging pool: ucp_rkey_pack");
  }
  StagingDescriptor d;
  d.pool_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  d.base_address = reinterpret_cast<uint64_t>(base);
  d.block_bytes = options.block_bytes;
  d.num_blocks = options.num_blocks;
  d.rkey.assign(static_cast<const char*>(rkey_buffer), rkey_size);
  ucp_rkey_buffer_release(rkey_buffer);
  if (d.rkey.empty() || d.rkey.size() > kMaxRkeyBytes) {
    ucp_mem_unmap(context->get(), memh);
    munmap(base, bytes);
    return Internal("staging pool: UCX packed a remote key of " + std::to_string(d.rkey.size()) +
                    " bytes");
  }
  return std::unique_ptr<StagingPool>(new StagingPool(
      std::move(context), options, static_cast<std::byte*>(base), bytes, memh, std::move(d)));
}

StagingPool::StagingPool(std::shared_ptr<UcxContext> context, StagingPoolOptions options,
                         std::byte* base, size_t bytes, ucp_mem_h memh,
                         StagingDescriptor descriptor)
    : context_(std::move(context)),
      options_(options),
      base_(base),
      bytes_(bytes),
      memh_(memh),
      descriptor_(std::move(descriptor)) {
  free_runs_.emplace(0, static_cast<uint32_t>(options_.num_blocks));
  free_slots_ = options_.num_blocks;
  stats_.blocks_total = options_.num_blocks;
  stats_.block_bytes = options_.block_bytes;
}

StagingPool::~StagingPool() {
  ucp_mem_unmap(context_->get(), memh_);
  munmap(base_, bytes_);
}

StatusOr<Lease> StagingPool::Acquire(uint64_t num_blocks, Clock::time_point now,
                                     std::optional<std::chrono::milliseconds> ttl) {
  if (num_blocks == 0) return InvalidArgument("staging pool: a lease needs at least one block");
  const std::chrono::milliseconds lease_ttl = ttl.value_or(options_.default_lease_ttl);
  if (lease_ttl.count() <= 0)
    return InvalidArgument("staging pool: the lease TTL must be positive");
  std::lock_guard lock(mu_);
  if (num_blocks > free_slots_) {
    ++stats_.acquire_failures;
    return ResourceExhausted("staging pool: " + std::to_string(num_blocks) + " blocks asked, " +
                             std::to_string(free_slots_) + " of " +
                             std::to_string(options_.num_blocks) + " free");
  }
  Lease lease;
  lease.id = next_lease_id_++;
  uint64_t left = num_blocks;
  while (left > 0) {
    auto run = free_runs_.begin();
    const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(left, run->second));
    lease.extents.push_back({run->first, take});
    if (take < run->second) free_runs_.emplace(run->first + take, run->second - take);
    free_runs_.erase(run);
    left -= take;
  }
  free_slots_ -= num_blocks;
  lease.blocks = ExpandExtents(lease.extents);
  leases_.emplace(lease.id, LeaseState{lease.extents, num_blocks, lease_ttl, now + lease_ttl});
  ++stats_.leases_granted;
  ++stats_.requests_held;
  stats_.blocks_held += num_blocks;
  stats_.bytes_held = stats_.blocks_held * options_.block_bytes;
  return lease;
}

Status StagingPool::Renew(uint64_t lease_id, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return NotFound("staging pool: no live lease " + std::to_string(lease_id));
  }
  it->second.expiry = now + it->second.ttl;
  ++stats_.renewals;
  return Status::Ok();
}

Status StagingPool::Release(uint64_t lease_id, LeaseEnd why) {
  OASIS_CHECK(why != LeaseEnd::kExpired) << "expiry is ReleaseExpired's business";
  std::lock_guard lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return NotFound("staging pool: no live lease " + std::to_string(lease_id));
  }
  EndLocked(it, why);
  return Status::Ok();
}

size_t StagingPool::ReleaseExpired(Clock::time_point now) {
  std::lock_guard lock(mu_);
  size_t ended = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.expiry <= now) {
      EndLocked(it, LeaseEnd::kExpired);
      ++ended;
    }
    it = next;
  }
  return ended;
}

void StagingPool::EndLocked(std::unordered_map<uint64_t, LeaseState>::iterator it, LeaseEnd why) {
  for (const SlotExtent& e : it->second.extents) {
    uint32_t start = e.start;
    uint32_t count = e.count;
    auto next = free_runs_.lower_bound(start);
    if (next != free_runs_.end() && start + count == next->first) {  // merge the run after
      count += next->second;
      next = free_runs_.erase(next);
    }
    if (next != free_runs_.begin()) {  // merge the run before
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        count += prev->second;
        free_runs_.erase(prev);
      }
    }
    free_runs_.emplace(start, count);
  }
  free_slots_ += it->second.num_blocks;
  stats_.blocks_held -= it->second.num_blocks;
  stats_.bytes_held = stats_.blocks_held * options_.block_bytes;
  --stats_.requests_held;
  switch (why) {
    case LeaseEnd::kCompleted:
      ++stats_.leases_completed;
      break;
    case LeaseEnd::kAborted:
      ++stats_.leases_aborted;
      break;
    case LeaseEnd::kExpired:
      ++stats_.leases_expired;
      break;
  }
  leases_.erase(it);
}

std::byte* StagingPool::BlockData(uint32_t index) {
  OASIS_CHECK_LT(uint64_t{index}, options_.num_blocks) << "staging pool block index";
  return base_ + size_t{index} * options_.block_bytes;
}

bool StagingPool::HoldsLease(uint64_t lease_id) const {
  std::lock_guard lock(mu_);
  return leases_.count(lease_id) != 0;
}

std::optional<Clock::time_point> StagingPool::NextExpiry() const {
  std::lock_guard lock(mu_);
  std::optional<Clock::time_point> next;
  for (const auto& [id, lease] : leases_) {
    if (!next || lease.expiry < *next) next = lease.expiry;
  }
  return next;
}

StagingPoolStats StagingPool::Stats() const {
  std::lock_guard lock(mu_);
  StagingPoolStats s = stats_;
  s.free_runs = free_runs_.size();
  return s;
}

}  // namespace oasis::disagg

#include "kvcache/block_allocator.h"

#include "common/check.h"

namespace oasis {

BlockAllocator::BlockAllocator(int32_t num_slots) : in_use_(static_cast<size_t>(num_slots), false) {
  OASIS_CHECK_GE(num_slots, 0) << "negative KV pool size";
  free_.reserve(static_cast<size_t>(num_slots));
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

std::optional<std::vector<int32_t>> BlockAllocator::Allocate(int32_t count) {
  OASIS_CHECK_GE(count, 0) << "negative allocation";
  if (count > num_free()) return std::nullopt;
  // The free list's tail, last in first: ascending slots from a fresh pool, and a freed run
  // comes back in its own order (Free pushes it reversed), so a reservation gets contiguous runs.
  std::vector<int32_t> out(free_.rbegin(), free_.rbegin() + count);
  free_.resize(free_.size() - static_cast<size_t>(count));
  for (int32_t s : out) in_use_[static_cast<size_t>(s)] = true;
  return out;
}

void BlockAllocator::Free(const std::vector<int32_t>& slots) {
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const int32_t s = *it;
    OASIS_CHECK(s >= 0 && s < num_slots()) << "freeing slot " << s << " outside the pool";
    OASIS_CHECK(in_use_[static_cast<size_t>(s)]) << "double free of slot " << s;
    in_use_[static_cast<size_t>(s)] = false;
    free_.push_back(s);
  }
}

}  // namespace oasis

#include "kvcache/block_allocator.h"

#include "common/check.h"

namespace oasis {

BlockAllocator::BlockAllocator(int32_t num_slots) : refs_(static_cast<size_t>(num_slots), 0) {
  OASIS_CHECK_GE(num_slots, 0) << "negative KV pool size";
  free_.reserve(static_cast<size_t>(num_slots));
  for (int32_t s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

void BlockAllocator::EnablePrefixCache(int32_t num_kv_heads) {
  OASIS_CHECK(cache_ == nullptr) << "prefix caching enabled twice";
  OASIS_CHECK_EQ(num_free(), num_slots()) << "prefix caching enabled after allocations";
  cache_ = std::make_unique<PrefixCache>(num_slots(), num_kv_heads);
}

int32_t BlockAllocator::num_free() const {
  const int64_t evictable = cache_ != nullptr ? cache_->num_evictable_slots() : 0;
  return static_cast<int32_t>(static_cast<int64_t>(free_.size()) + evictable);
}

std::optional<std::vector<int32_t>> BlockAllocator::Allocate(int32_t count) {
  OASIS_CHECK_GE(count, 0) << "negative allocation";
  if (count > num_free()) return std::nullopt;
  bool evicted_any = false;
  while (static_cast<int32_t>(free_.size()) < count) {
    std::optional<PrefixCache::Evicted> evicted = cache_->EvictEntry();
    OASIS_CHECK(evicted.has_value() && !evicted->slots.empty())
        << "free count includes blocks that cannot be evicted";
    if (sink_ != nullptr) sink_->Evicted(*evicted);
    evicted_any = true;
    for (auto it = evicted->slots.rbegin(); it != evicted->slots.rend(); ++it) free_.push_back(*it);
  }
  if (evicted_any && sink_ != nullptr) sink_->EndEvictions();
  // The free list's tail, last in first: ascending slots from a fresh pool, and a freed run
  // comes back in its own order (Free pushes it reversed), so a reservation gets contiguous runs.
  std::vector<int32_t> out(free_.rbegin(), free_.rbegin() + count);
  free_.resize(free_.size() - static_cast<size_t>(count));
  for (int32_t s : out) {
    OASIS_CHECK_EQ(refs_[static_cast<size_t>(s)], 0) << "free slot " << s << " is referenced";
    refs_[static_cast<size_t>(s)] = 1;
  }
  return out;
}

void BlockAllocator::Free(const std::vector<int32_t>& slots) {
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const int32_t s = *it;
    OASIS_CHECK(s >= 0 && s < num_slots()) << "freeing slot " << s << " outside the pool";
    int32_t& refs = refs_[static_cast<size_t>(s)];
    OASIS_CHECK_GT(refs, 0) << "double free of slot " << s;
    if (--refs > 0) continue;
    if (cache_ != nullptr && cache_->IsCached(s)) {
      cache_->Park(s);
    } else {
      free_.push_back(s);
    }
  }
}

void BlockAllocator::Share(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) {
    OASIS_CHECK(s >= 0 && s < num_slots()) << "sharing slot " << s << " outside the pool";
    int32_t& refs = refs_[static_cast<size_t>(s)];
    if (refs == 0) {
      OASIS_CHECK(cache_ != nullptr && cache_->IsCached(s)) << "sharing free slot " << s;
      cache_->Unpark(s);
    }
    ++refs;
  }
}

}  // namespace oasis

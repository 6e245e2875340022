#include "kvcache/head_block_table.h"

#include "backend/backend.h"
#include "common/check.h"

namespace oasis {

HeadBlockTable::HeadBlockTable(int32_t num_kv_heads)
    : num_kv_heads_(num_kv_heads), slots_(static_cast<size_t>(num_kv_heads)) {
  OASIS_CHECK_GT(num_kv_heads, 0) << "a block table needs at least one KV head";
}

HeadBlockTable::~HeadBlockTable() {
  // Slots must be released explicitly; leaking them would shrink the pool silently.
  OASIS_CHECK(owner_ == nullptr || num_blocks() == 0)
      << "HeadBlockTable destroyed while holding " << num_blocks() << " blocks per head";
}

int64_t HeadBlockTable::SlotsFor(int64_t num_tokens, int32_t num_kv_heads) {
  return (num_tokens + kBlockSize - 1) / kBlockSize * num_kv_heads;
}

Status HeadBlockTable::Reserve(int64_t num_tokens, BlockAllocator& allocator) {
  OASIS_CHECK(owner_ == nullptr || owner_ == &allocator) << "one table, one allocator";
  const int64_t need_blocks = (num_tokens + kBlockSize - 1) / kBlockSize;
  const int64_t extra = need_blocks - num_blocks();
  if (extra <= 0) return Status::Ok();
  auto slots = allocator.Allocate(static_cast<int32_t>(extra * num_kv_heads_));
  if (!slots) {
    return ResourceExhausted("KV cache full: need " + std::to_string(extra * num_kv_heads_) +
                             " head-blocks, " + std::to_string(allocator.num_free()) + " free");
  }
  owner_ = &allocator;
  // Head-major: each head's new blocks are one run of the allocation (contiguous slots from a
  // fresh or a cleanly freed pool), so the decode attention streams each head's KV from
  // neighbouring addresses (docs/kernels/decode_attention.md, "Slot order").
  size_t i = 0;
  for (auto& head : slots_) {
    for (int64_t b = 0; b < extra; ++b) head.push_back((*slots)[i++]);
  }
  return Status::Ok();
}

void HeadBlockTable::AdoptShared(const std::vector<std::vector<int32_t>>& blocks,
                                 BlockAllocator& allocator) {
  OASIS_CHECK(owner_ == nullptr || owner_ == &allocator) << "one table, one allocator";
  OASIS_CHECK_EQ(num_blocks(), 0) << "cached blocks are adopted by an empty table";
  if (blocks.empty()) return;
  owner_ = &allocator;
  for (const std::vector<int32_t>& block : blocks) {
    OASIS_CHECK_EQ(block.size(), slots_.size()) << "a cached block has one slot per KV head";
    allocator.Share(block);
    for (size_t h = 0; h < slots_.size(); ++h) slots_[h].push_back(block[h]);
  }
}

void HeadBlockTable::Release(BlockAllocator& allocator) {
  OASIS_CHECK(owner_ == nullptr || owner_ == &allocator) << "released to a different allocator";
  for (auto& head : slots_) {
    allocator.Free(head);
    head.clear();
  }
}

std::vector<std::vector<int32_t>> HeadBlockTable::TakeSlots() {
  std::vector<std::vector<int32_t>> out(slots_.size());
  out.swap(slots_);
  owner_ = nullptr;
  return out;
}

int64_t HeadBlockTable::SlotMapping(int32_t head, int64_t position) const {
  const auto& s = slots_[static_cast<size_t>(head)];
  const int64_t block = position / kBlockSize;
  OASIS_CHECK_LT(block, static_cast<int64_t>(s.size()))
      << "position " << position << " beyond reserved blocks";
  return static_cast<int64_t>(s[static_cast<size_t>(block)]) * kBlockSize + position % kBlockSize;
}

}  // namespace oasis

// HeadBlockTable: the head-level block table of one sequence — for every KV head, the
// head-block slots holding its logical blocks in order. A dense sequence gives every head
// the same number of blocks (allocated together); the sparse pipeline will give heads
// different resident sets. Owns its slots while it lives: Release() returns them.
// Not thread-safe: owned by the engine loop thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/block_allocator.h"
#include "oasis/status.h"

namespace oasis {

class HeadBlockTable {
 public:
  explicit HeadBlockTable(int32_t num_kv_heads);
  ~HeadBlockTable();
  HeadBlockTable(HeadBlockTable&&) = default;
  HeadBlockTable& operator=(HeadBlockTable&&) = default;

  // Grows capacity to hold `num_tokens` tokens for every head. ResourceExhausted (and no
  // change) when the allocator has too few free slots.
  Status Reserve(int64_t num_tokens, BlockAllocator& allocator);
  // Appends cached blocks to an empty table: blocks[b][head] are the slots of its logical
  // block b, shared read-only with the prefix cache (one more reference each).
  void AdoptShared(const std::vector<std::vector<int32_t>>& blocks, BlockAllocator& allocator);
  // Returns every slot to the allocator (drops one reference of each).
  void Release(BlockAllocator& allocator);
  // Hands every slot over to the caller ([head][logical block]), who now owns them (the
  // sparse switch keeps some and frees the rest); the table is left empty.
  std::vector<std::vector<int32_t>> TakeSlots();
  // Slots a sequence of `num_tokens` tokens needs for all heads.
  static int64_t SlotsFor(int64_t num_tokens, int32_t num_kv_heads);

  int32_t num_kv_heads() const { return num_kv_heads_; }
  int64_t num_blocks() const { return slots_.empty() ? 0 : static_cast<int64_t>(slots_[0].size()); }
  const std::vector<int32_t>& head_slots(int32_t head) const {
    return slots_[static_cast<size_t>(head)];
  }
  // slot * kBlockSize + offset of the token at `position` for `head`.
  int64_t SlotMapping(int32_t head, int64_t position) const;

 private:
  int32_t num_kv_heads_;
  std::vector<std::vector<int32_t>> slots_;  // [head][logical block]
  BlockAllocator* owner_ = nullptr;          // the allocator the slots came from
};

}  // namespace oasis

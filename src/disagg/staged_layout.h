// Where a request's staged state lives inside its staging lease (docs/disaggregation.md §3):
// slot ordinals (positions in Lease::blocks / ExpandExtents(extents)) of every K/V head-block
// of every staged layer, of the block summaries, and of the EAGLE-3 draft head's KV.
//
// One slot holds one K or one V head-block of one layer: 16 tokens × head_dim × dtype bytes.
//   KV:        ordinal = ((l · Hkv + h) · 2 + kv) · nb + b          kv: 0 = K, 1 = V
//              (for a fixed layer, head and K/V, consecutive blocks are consecutive slots, so
//              runs of blocks merge into one get when they land in consecutive host slots)
//   summaries: after the KV; for (l, h), blocks b packed `summaries_per_slot` to a slot, each
//              summary kmin[head_dim] then kmax[head_dim] (2 · head_dim · dtype bytes)
//   draft KV:  after the summaries; ((h · 2 + kv) · nb + b) over the draft head's KV heads,
//              blocks of 16 × draft_head_dim × dtype (≤ one slot)
// Value type; thread-compatible.
#pragma once

#include <cstdint>

#include "oasis/status.h"

namespace oasis::disagg {

struct StagedKvGeometry {
  uint32_t num_layers = 0;    // staged (sparse) layers, Ls
  uint32_t num_kv_heads = 0;  // Hkv (under TP: this rank's)
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;     // 2 for bf16
  uint32_t num_blocks = 0;      // nb = ceil(staged tokens / 16)
  uint32_t draft_kv_heads = 0;  // 0: no draft KV staged
  uint32_t draft_head_dim = 0;
};

inline constexpr uint32_t kStagedBlockTokens = 16;
// Bounds a geometry must keep (StagedKvLayout::Create refuses more): with them every slot count
// and byte size below fits uint64_t.
inline constexpr uint32_t kMaxStagedHeadDim = 4096;
inline constexpr uint32_t kMaxStagedLayers = 4096;
inline constexpr uint32_t kMaxStagedKvHeads = 4096;

struct SummarySlot {
  uint64_t ordinal = 0;  // slot ordinal in the lease
  uint64_t offset = 0;   // byte offset of this block's kmin inside the slot (kmax follows)
};

class StagedKvLayout {
 public:
  // kInvalidArgument for zero sizes, a dtype other than 1, 2 or 4 bytes, sizes beyond the
  // kMaxStaged* bounds, a draft block larger than a slot, or more slots than a pool can address.
  static StatusOr<StagedKvLayout> Create(const StagedKvGeometry& g);

  const StagedKvGeometry& geometry() const { return g_; }
  // Bytes of one slot: one K or V head-block of the target model.
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t summary_bytes() const { return 2ull * g_.head_dim * g_.dtype_bytes; }
  uint64_t summaries_per_slot() const { return slot_bytes_ / summary_bytes(); }

  uint64_t KvSlot(uint32_t layer, uint32_t head, uint32_t block, uint32_t kv) const;
  SummarySlot Summary(uint32_t layer, uint32_t head, uint32_t block) const;
  uint64_t DraftKvSlot(uint32_t head, uint32_t block, uint32_t kv) const;

  uint64_t num_kv_slots() const { return kv_slots_; }
  uint64_t num_summary_slots() const { return summary_slots_; }
  uint64_t num_draft_slots() const { return draft_slots_; }
  uint64_t num_slots() const { return kv_slots_ + summary_slots_ + draft_slots_; }

 private:
  explicit StagedKvLayout(const StagedKvGeometry& g);
  StagedKvGeometry g_;
  uint64_t slot_bytes_ = 0;
  uint64_t kv_slots_ = 0;
  uint64_t summary_slots_per_head_ = 0;
  uint64_t summary_slots_ = 0;
  uint64_t draft_slots_ = 0;
};

}  // namespace oasis::disagg

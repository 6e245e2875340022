#include "disagg/staged_layout.h"

#include "common/check.h"
#include "disagg/wire.h"

namespace oasis::disagg {

StatusOr<StagedKvLayout> StagedKvLayout::Create(const StagedKvGeometry& g) {
  if (g.num_layers == 0 || g.num_kv_heads == 0 || g.head_dim == 0 || g.dtype_bytes == 0 ||
      g.num_blocks == 0) {
    return InvalidArgument(
        "staged KV layout: layers, KV heads, head_dim, dtype and blocks must "
        "be positive");
  }
  // Bounds before any arithmetic: a slot's bytes (16 · head_dim · dtype) and the slot counts
  // (layers · heads · 2 · blocks) must not wrap, or the summary packing divides by zero.
  if (g.dtype_bytes != 1 && g.dtype_bytes != 2 && g.dtype_bytes != 4) {
    return InvalidArgument("staged KV layout: dtype of " + std::to_string(g.dtype_bytes) +
                           " bytes; 1, 2 or 4 are supported");
  }
  if (StagedKvDtypeBytes(g.kv_dtype) != g.dtype_bytes) {
    return InvalidArgument("staged KV layout: KV dtype " + StagedKvDtypeName(g.kv_dtype) +
                           " with elements of " + std::to_string(g.dtype_bytes) + " bytes");
  }
  if (g.head_dim > kMaxStagedHeadDim || g.num_layers > kMaxStagedLayers ||
      g.num_kv_heads > kMaxStagedKvHeads || g.draft_kv_heads > kMaxStagedKvHeads) {
    return InvalidArgument(
        "staged KV layout: head_dim " + std::to_string(g.head_dim) + ", " +
        std::to_string(g.num_layers) + " layers, " + std::to_string(g.num_kv_heads) +
        " KV heads, " + std::to_string(g.draft_kv_heads) +
        " draft KV heads: beyond what a staging pool lays out (head_dim <= " +
        std::to_string(kMaxStagedHeadDim) + ", layers <= " + std::to_string(kMaxStagedLayers) +
        ", KV heads <= " + std::to_string(kMaxStagedKvHeads) + ")");
  }
  if ((g.draft_kv_heads == 0) != (g.draft_head_dim == 0) ||
      (g.draft_kv_heads == 0) != (g.draft_dtype_bytes == 0)) {
    return InvalidArgument(
        "staged KV layout: draft KV heads, draft head_dim and draft dtype go together");
  }
  if (g.draft_dtype_bytes != 0 && g.draft_dtype_bytes != 1 && g.draft_dtype_bytes != 2 &&
      g.draft_dtype_bytes != 4) {
    return InvalidArgument("staged KV layout: draft dtype of " +
                           std::to_string(g.draft_dtype_bytes) + " bytes; 1, 2 or 4 are supported");
  }
  if (g.draft_head_dim > g.head_dim) {
    return InvalidArgument("staged KV layout: a draft head-block of head_dim " +
                           std::to_string(g.draft_head_dim) + " does not fit a slot of head_dim " +
                           std::to_string(g.head_dim));
  }
  StagedKvLayout layout(g);
  if (layout.num_slots() > kMaxBlocks) {
    return InvalidArgument("staged KV layout: " + std::to_string(layout.num_slots()) +
                           " slots, more than a staging pool addresses");
  }
  return layout;
}

StagedKvLayout::StagedKvLayout(const StagedKvGeometry& g) : g_(g) {
  slot_bytes_ = uint64_t{kStagedBlockTokens} * g.head_dim * g.dtype_bytes;
  // (≤ 4: draft_head_dim ≤ head_dim, draft dtype ≤ 4 bytes, KV dtype ≥ 1 byte.)
  draft_slots_per_block_ = (draft_block_bytes() + slot_bytes_ - 1) / slot_bytes_;
  const uint64_t heads = uint64_t{g.num_layers} * g.num_kv_heads;
  kv_slots_ = heads * 2 * g.num_blocks;
  const uint64_t per_slot = summaries_per_slot();  // 8 = 16 tokens · D / (2 · D)
  summary_slots_per_head_ = (g.num_blocks + per_slot - 1) / per_slot;
  summary_slots_ = heads * summary_slots_per_head_;
  draft_slots_ = uint64_t{g.draft_kv_heads} * 2 * g.num_blocks * draft_slots_per_block_;
}

uint64_t StagedKvLayout::KvSlot(uint32_t layer, uint32_t head, uint32_t block, uint32_t kv) const {
  OASIS_CHECK(layer < g_.num_layers && head < g_.num_kv_heads && block < g_.num_blocks && kv < 2)
      << "staged KV slot (" << layer << ", " << head << ", " << block << ", " << kv << ")";
  return ((uint64_t{layer} * g_.num_kv_heads + head) * 2 + kv) * g_.num_blocks + block;
}

SummarySlot StagedKvLayout::Summary(uint32_t layer, uint32_t head, uint32_t block) const {
  OASIS_CHECK(layer < g_.num_layers && head < g_.num_kv_heads && block < g_.num_blocks)
      << "staged summary (" << layer << ", " << head << ", " << block << ")";
  const uint64_t per_slot = summaries_per_slot();
  const uint64_t head_index = uint64_t{layer} * g_.num_kv_heads + head;
  return {kv_slots_ + head_index * summary_slots_per_head_ + block / per_slot,
          (block % per_slot) * summary_bytes()};
}

uint64_t StagedKvLayout::DraftKvSlot(uint32_t head, uint32_t block, uint32_t kv) const {
  OASIS_CHECK(head < g_.draft_kv_heads && block < g_.num_blocks && kv < 2)
      << "staged draft KV slot (" << head << ", " << block << ", " << kv << ")";
  return kv_slots_ + summary_slots_ +
         ((uint64_t{head} * 2 + kv) * g_.num_blocks + block) * draft_slots_per_block_;
}

uint32_t StagedKvDtypeBytes(uint32_t code) {
  switch (static_cast<StagedKvDtype>(code)) {
    case StagedKvDtype::kF32:
      return 4;
    case StagedKvDtype::kBF16:
    case StagedKvDtype::kF16:
      return 2;
    case StagedKvDtype::kF8E4M3:
      return 1;
  }
  return 0;
}

std::string StagedKvDtypeName(uint32_t code) {
  switch (static_cast<StagedKvDtype>(code)) {
    case StagedKvDtype::kF32:
      return "f32";
    case StagedKvDtype::kBF16:
      return "bf16";
    case StagedKvDtype::kF16:
      return "f16";
    case StagedKvDtype::kF8E4M3:
      return "fp8_e4m3";
  }
  return "unknown (" + std::to_string(code) + ")";
}

}  // namespace oasis::disagg

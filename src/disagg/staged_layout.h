// Where a request's staged state lives inside its staging lease (docs/disaggregation.md §3):
// slot ordinals (positions in Lease::blocks / ExpandExtents(extents)) of every K/V head-block
// of every staged layer, of the block summaries, and of the EAGLE-3 draft head's KV.
//
// One slot holds one K or one V head-block of one layer: 16 tokens × head_dim × KV dtype bytes
// (1 for an FP8 KV cache, docs/disaggregation.md "FP8 KV cache").
//   KV:        ordinal = ((l · Hkv + h) · 2 + kv) · nb + b          kv: 0 = K, 1 = V
//              (for a fixed layer, head and K/V, consecutive blocks are consecutive slots, so
//              runs of blocks merge into one get when they land in consecutive host slots)
//   summaries: after the KV; for (l, h), blocks b packed `summaries_per_slot` to a slot, each
//              summary kmin[head_dim] then kmax[head_dim] (2 · head_dim · KV dtype bytes: the
//              summaries of an FP8 pool are e4m3 too)
//   draft KV:  after the summaries; ((h · 2 + kv) · nb + b) · S over the draft head's KV heads,
//              blocks of 16 × draft_head_dim × draft dtype bytes (the activation dtype: the
//              draft head's KV is never FP8), each in S = draft_slots_per_block() consecutive
//              ordinals (1 unless the draft block is larger than a slot, as with FP8 KV)
// Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "oasis/status.h"

namespace oasis::disagg {

// The element type of the staged KV and summaries (a wire code: the ticket carries it).
enum class StagedKvDtype : uint32_t {
  kF32 = 1,   // the CPU reference's KV
  kBF16 = 2,  // the CUDA backend's KV
  kF16 = 3,
  kF8E4M3 = 4,  // --kv-cache-dtype fp8: e4m3 with per-(layer, KV head) scales
};
// Bytes of one element; 0 for a code that is none of the above.
uint32_t StagedKvDtypeBytes(uint32_t code);
// "f32", "bf16", "f16", "fp8_e4m3", or "unknown (N)".
std::string StagedKvDtypeName(uint32_t code);

struct StagedKvGeometry {
  uint32_t num_layers = 0;    // staged (sparse) layers, Ls
  uint32_t num_kv_heads = 0;  // Hkv (under TP: this rank's)
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;     // of the KV and summaries: 2 for bf16, 1 for FP8
  uint32_t num_blocks = 0;      // nb = ceil(staged tokens / 16)
  uint32_t draft_kv_heads = 0;  // 0: no draft KV staged
  uint32_t draft_head_dim = 0;
  uint32_t kv_dtype = static_cast<uint32_t>(StagedKvDtype::kBF16);  // a StagedKvDtype
  uint32_t draft_dtype_bytes = 0;  // the draft head's KV (activation dtype); 0 without one
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
  // kInvalidArgument for zero sizes, an unknown KV dtype or dtype bytes other than its size,
  // draft dtype bytes other than 1, 2 or 4 (0 without draft heads), sizes beyond the kMaxStaged*
  // bounds, a draft head_dim larger than head_dim, or more slots than a pool can address.
  static StatusOr<StagedKvLayout> Create(const StagedKvGeometry& g);

  const StagedKvGeometry& geometry() const { return g_; }
  // Bytes of one slot: one K or V head-block of the target model.
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t summary_bytes() const { return 2ull * g_.head_dim * g_.dtype_bytes; }
  uint64_t summaries_per_slot() const { return slot_bytes_ / summary_bytes(); }

  uint64_t KvSlot(uint32_t layer, uint32_t head, uint32_t block, uint32_t kv) const;
  SummarySlot Summary(uint32_t layer, uint32_t head, uint32_t block) const;
  // The first of the draft block's draft_slots_per_block() consecutive ordinals.
  uint64_t DraftKvSlot(uint32_t head, uint32_t block, uint32_t kv) const;
  uint64_t draft_block_bytes() const {
    return uint64_t{kStagedBlockTokens} * g_.draft_head_dim * g_.draft_dtype_bytes;
  }
  uint64_t draft_slots_per_block() const { return draft_slots_per_block_; }

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
  uint64_t draft_slots_per_block_ = 0;
  uint64_t draft_slots_ = 0;
};

}  // namespace oasis::disagg

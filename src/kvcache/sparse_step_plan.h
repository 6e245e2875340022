// The host-side description of one engine step for the sparse pipeline: which sequences of
// the batch are sparse, where their tokens' K/V go, and which query rows predict. Built by
// SparseKvManager::BuildStepPlan (host logic, no device work), uploaded and consumed by
// SparseAttentionPipeline. Plain data; thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "oasis/tensor.h"

namespace oasis {

// The most draft tokens a sparse step stacks after its real token (--num-speculative-tokens),
// hence the most accepted drafts whose write-through the next step owes (lag_src / lag_dst).
inline constexpr int64_t kMaxSparseDraftTokens = 4;

// For the batch builder: the K/V destinations of one sparse sequence's tokens this step and
// its attention rows before the per-layer tables are written on the device
// (batch_builder.h, StepSequence::sparse).
struct SparseStepSlots {
  std::vector<int64_t> slot_mapping;  // [num_tokens * num_kv_heads]: slot * kBlockSize + offset
  std::vector<int32_t> tail_slots;    // [num_kv_heads * num_tail_blocks]: the tail's GPU slots
  int32_t num_tail_blocks = 0;        // 1 or 2
  int32_t tail_len = 0;               // tokens of the tail blocks the step's last query sees
  int32_t table_width = 0;            // block-table width the per-layer rows need (K + 2)
};

// S = sequences in the batch, T = tokens, Hkv = KV heads, R = sparse rows. Host tensors.
struct SparseStepPlan {
  Tensor seq_rows;      // [S] int32: sparse row of batch sequence s, -1 = dense
  Tensor tail_slots;    // [S, Hkv, 2] int32: tail blocks' GPU slots (-1 = none)
  Tensor tail_lens;     // [S] int32: tokens in the tail blocks (0 for dense)
  Tensor host_mapping;  // [T, Hkv] int64: write-through target (host slot * 16 + offset), -1 = none
  Tensor lag_src;       // [S * Hkv * kMaxSparseDraftTokens] int64: tail positions (slot * 16 +
                        //   offset) of drafts the previous step accepted, -1 = none
  Tensor lag_dst;       // [S * Hkv * kMaxSparseDraftTokens] int64: their host-store positions
  Tensor summary_src;   // [S * Hkv] int32: GPU slot of the tail's first block (the real token's,
                        //   or the block accepted drafts completed at the previous step)
  Tensor summary_len;   // [S * Hkv] int32: its valid tokens (0 = no update)
  Tensor summary_dst;   // [S * Hkv] int32: its summary row (host slot, or in-place row)
  Tensor table_index;   // [S * Hkv] int32: where summary_dst goes in every sparse layer's
                        //   host_tables (flat), -1 = nowhere (HBM home: the tail's first
                        //   block's entry)
  Tensor predict_gather;  // [P] int32: batch rows whose queries predict the next step; they
                          //   are copied out of q after each layer's attention (q is reused).
                          //   SparseConfig::chain_queries Q > 1: [P * Hkv * Q], rows of q
                          //   as [T * Hkv, G * D] (batch row * Hkv + KV head), per sequence
                          //   KV head-major: the snapshot is [P, Q * Hq, D], one GQA group
                          //   of Q * G query heads per KV head
  Tensor predict_rows;    // [R] int32: the predicting sequence's snapshot index (< P), -1 = none
  Tensor predict_num_blocks;  // [R] int32: candidate blocks for the next step
  Tensor current_rows;        // [R] int32: batch row of the step's real query (oracle selection
                              //   or agreement measurement), -1 = none
  Tensor current_num_blocks;  // [R] int32: candidate blocks for this step
  bool measure_agreement = false;      // score current_rows against the previous prediction
  int64_t num_sparse = 0;              // sparse sequences in the batch
  std::vector<SparseStepSlots> slots;  // [S]; empty slot_mapping for dense sequences
};

}  // namespace oasis

// Prefill attention on tensor cores (FlashAttention-2 style) over head-level block tables.
//
// Semantics are exactly those of Backend::Attention (src/backend/backend.h) and of the
// reference kernel LaunchPagedAttention (kernels/attention.h): sequence s owns query rows
// [query_start[s], query_start[s+1]); for KV head h its visible keys are the first
// kv_lens[s, h] tokens listed by block_tables[s, h, :] (16-token head-blocks), and its q_len
// queries are the last q_len of those tokens, causal among themselves: query i (0-based in the
// sequence's chunk) sees kv positions p < kv_len - q_len + i + 1. A prefill chunk therefore
// attends to the cached context plus itself. GQA: query head j reads KV head
// j / (num_q_heads / num_kv_heads). kv_len >= q_len is required (as the CPU reference checks).
//
// How it runs: one CTA owns a tile of query rows of one sequence and one query head; it walks
// the KV tiles (64 tokens = 4 table entries) of its (sequence, KV head), gathering them into
// shared memory with cp.async (double-buffered), computes S = Q·Kᵀ and O += P·V with
// bf16 mma.sync m16n8k16 (float accumulation) and an online softmax. Tiles are mapped to
// (sequence, query tile) on the device from query_start, so a launch takes any mix of
// sequence lengths and needs no host copy of the metadata (graph-capturable).
// Documentation and measurements: docs/kernels/prefill_attention.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

// Query rows per CTA and warps per CTA. kAuto: kM64W4 when max_query_len <= 64, else kM128W8
// at head_dim 128 and kM128W4 at head_dim 64 (see LaunchHeadDim in the .cu).
enum class PrefillTileConfig {
  kAuto,
  kM128W4,  // 128 query rows, 4 warps of 32 rows (FA2's layout; Q re-read from shared)
  kM128W8,  // 128 query rows, 8 warps of 16 rows (Q fragments held in registers)
  kM64W4,   // 64 query rows, 4 warps of 16 rows (short chunks; Q in registers)
};

struct PrefillAttentionParams {
  const __nv_bfloat16* q;        // [tokens, num_q_heads, head_dim]
  const __nv_bfloat16* k_pool;   // [num_slots, 16, head_dim]
  const __nv_bfloat16* v_pool;   // [num_slots, 16, head_dim]
  const int32_t* query_start;    // [num_seqs + 1], device
  const int32_t* kv_lens;        // [num_seqs, num_kv_heads], device
  const int32_t* block_tables;   // [num_seqs, num_kv_heads, max_blocks] slot ids, device
  __nv_bfloat16* out;            // [tokens, num_q_heads, head_dim]
  int64_t tokens = 0;            // query rows in the batch (= query_start[num_seqs])
  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;              // 64 or 128
  int max_blocks = 0;            // block table row length
  int max_query_len = 0;         // upper bound on any q_len; 0 = unknown (only sizes the grid)
  float scale = 1.0f;            // softmax scale applied to q·k
  PrefillTileConfig tile = PrefillTileConfig::kAuto;
};

// Returns cudaErrorInvalidValue for an unsupported head_dim (not 64 or 128), a GQA ratio
// that does not divide, or misaligned pointers (q, pools and out need 16-byte alignment).
// Launches nothing when tokens == 0. Queued on `stream`; no host synchronisation.
cudaError_t LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

// True when LaunchPrefillAttention accepts this head_dim.
inline bool PrefillAttentionSupportsHeadDim(int head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace oasis::kernels

// Kernels of the sparse-KV pipeline (DESIGN.md §1, docs/sparse.md): block summaries, block
// scoring against the summaries, per-KV-head top-K, select under a per-step fetch cap, the
// UVA gather of head-blocks from pinned host memory, token write-through, per-layer table
// assembly and the predictor-agreement counter. The exact semantics (and the CPU reference)
// are those of the same-named Backend ops in src/backend/backend.h; integer outputs equal the
// CPU's bit for bit. Each launcher takes raw pointers (device memory, or mapped pinned host
// memory where noted), sizes and an explicit stream, and returns the launch error. The kernels
// are split by stage: kernels/sparse_score.cu (summaries, scores), sparse_topk.cu (top-K, the
// agreement counter), sparse_select.cu (select, table assembly), sparse_gather.cu (copies).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/tuning.h"

namespace oasis::kernels {

// Tokens per head-block (the KV cache's block size).
inline constexpr int kHeadBlockTokens = 16;

// kmin/kmax[dst_rows[i]] = element-wise min/max over the first num_tokens[i] keys of head-block
// src_slots[i] of k_pool (device or mapped host). Entries with num_tokens <= 0 or dst < 0 skip.
cudaError_t LaunchBlockSummaries(const __nv_bfloat16* k_pool,  // [slots, 16, head_dim]
                                 const int32_t* src_slots,     // [n]
                                 const int32_t* num_tokens,    // [n]
                                 const int32_t* dst_rows,      // [n]
                                 __nv_bfloat16* kmin,          // [rows, head_dim]
                                 __nv_bfloat16* kmax,          // [rows, head_dim]
                                 int64_t n, int head_dim, cudaStream_t stream);

// The same over an FP8 pool (e4m3 bytes): the stored values as numbers, unscaled, into bf16
// summaries (exact: every e4m3 value is a bf16 value) or e4m3 summaries (the chosen stored bytes).
// Equal values keep the earlier token's (as the CPU's std::min / std::max: ±0 bit-exact too).
cudaError_t LaunchBlockSummariesFp8(const uint8_t* k_pool,      // [slots, 16, head_dim] e4m3
                                    const int32_t* src_slots,   // [n]
                                    const int32_t* num_tokens,  // [n]
                                    const int32_t* dst_rows,    // [n]
                                    __nv_bfloat16* kmin,        // [rows, head_dim]
                                    __nv_bfloat16* kmax,        // [rows, head_dim]
                                    int64_t n, int head_dim, cudaStream_t stream);
cudaError_t LaunchBlockSummariesFp8(const uint8_t* k_pool,      // [slots, 16, head_dim] e4m3
                                    const int32_t* src_slots,   // [n]
                                    const int32_t* num_tokens,  // [n]
                                    const int32_t* dst_rows,    // [n]
                                    uint8_t* kmin,              // [rows, head_dim] e4m3
                                    uint8_t* kmax,              // [rows, head_dim] e4m3
                                    int64_t n, int head_dim, cudaStream_t stream);

struct ScoreBlocksParams {
  const __nv_bfloat16* q;      // [T, num_q_heads, head_dim]
  const int32_t* query_rows;   // [R] batch row, -1 = inactive
  const int32_t* num_blocks;   // [R]
  const int32_t* host_tables;  // [R, num_kv_heads, max_blocks] summary row per block
  // The summaries: bf16 (kmin, kmax), or e4m3 (kmin_fp8, kmax_fp8 below: FP8 pools' summaries,
  // in stored units); exactly one pair is given (16-byte aligned), the other null.
  const __nv_bfloat16* kmin = nullptr;  // [summary rows, head_dim]
  const __nv_bfloat16* kmax = nullptr;
  float* scores;                                        // [R, num_kv_heads, max_blocks]
  int rows = 0;                                         // R
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;  // head_dim in {32, 64, 128, 256}
  int max_blocks = 0;
  bool reduce_max = false;            // GQA group: max instead of sum
  const uint8_t* kmin_fp8 = nullptr;  // [summary rows, head_dim] e4m3 (instead of kmin, kmax)
  const uint8_t* kmax_fp8 = nullptr;
};
bool ScoreBlocksSupported(int head_dim, int group);
cudaError_t LaunchScoreBlocks(const ScoreBlocksParams& p, cudaStream_t stream);

// topk[r, h, :] = the min(K, num_blocks[r]) best blocks by (score desc, id asc), then -1.
cudaError_t LaunchTopKBlocks(const float* scores,        // [R, Hkv, max_blocks]
                             const int32_t* rows,        // [R], -1 = inactive
                             const int32_t* num_blocks,  // [R]
                             int32_t* topk,              // [R, Hkv, k]
                             int num_rows, int num_kv_heads, int max_blocks, int k,
                             cudaStream_t stream);

struct SelectBlocksParams {
  const int32_t* topk;         // [R, Hkv, K]
  const int32_t* rows;         // [R]
  const int32_t* host_tables;  // [R, Hkv, max_blocks]
  const int32_t* ws_slots;     // [R, Hkv, K]
  int32_t* ws_blocks;          // [R, Hkv, K] in/out
  int32_t* ws_age;             // [R, Hkv, K] in/out
  int32_t* fetch_src;          // [R, Hkv, C]
  int32_t* fetch_dst;          // [R, Hkv, C]
  int32_t* resident_slots;     // [R, Hkv, K]
  int32_t* num_resident;       // [R, Hkv]
  int32_t* stats;              // [R, Hkv, 3] accumulated
  const uint8_t* remote =
      nullptr;                    // [R, Hkv, max_blocks] or null: blocks not in the host store yet
  int32_t* remote_out = nullptr;  // [R, Hkv, cr]: remote misses in topk order, -1 padded
  const int32_t* fetch_cap = nullptr;  // [Hkv] or null: per-head admission cap, clamped to [0, c]
  int rows_count = 0, num_kv_heads = 0, k = 0, c = 0, max_blocks = 0, cr = 0;
  int32_t in_place_base = INT32_MAX;  // host_tables entries >= it: GPU slot + in_place_base
};
inline constexpr int kSelectMaxK = 1024;
cudaError_t LaunchSelectBlocks(const SelectBlocksParams& p, cudaStream_t stream);
// out[index[i]] = values[i] where 0 <= index[i] < out_numel (in-place table entries).
cudaError_t LaunchWriteIndexed(const int32_t* values, const int32_t* index, int32_t* out, int64_t n,
                               int64_t out_numel, cudaStream_t stream);

// How the UVA gather moves head-blocks (common/tuning.h: OASIS_GATHER_KERNEL chooses the CUDA
// backend's, OASIS_GATHER_CTAS its CTAs).
using GatherKernel = ::oasis::GatherKernel;
// Copies whole head-blocks (K and V): dst[dst_slots[i]] = src[src_slots[i]] where both >= 0.
// Either side may be mapped pinned host memory (the UVA gather); `max_ctas` bounds the grid.
cudaError_t LaunchCopyBlocks(const __nv_bfloat16* src_k,
                             const __nv_bfloat16* src_v,  // [src slots, 16, head_dim]
                             const int32_t* src_slots,    // [n]
                             __nv_bfloat16* dst_k,
                             __nv_bfloat16* dst_v,      // [dst slots, 16, head_dim]
                             const int32_t* dst_slots,  // [n]
                             int64_t n, int head_dim, int max_ctas, cudaStream_t stream,
                             GatherKernel kernel = GatherKernel::kTma);

// The same for pools of any element type, moved as bytes: `row_bytes` per token row (head_dim ·
// element size, a multiple of 16; FP8 pools: head_dim).
cudaError_t LaunchCopyBlockBytes(const void* src_k, const void* src_v,  // [src slots, 16, row]
                                 const int32_t* src_slots,              // [n]
                                 void* dst_k, void* dst_v,              // [dst slots, 16, row]
                                 const int32_t* dst_slots,              // [n]
                                 int64_t n, int row_bytes, int max_ctas, cudaStream_t stream,
                                 GatherKernel kernel = GatherKernel::kTma);

// Copies single token rows (K and V): dst row dst_index[i] = src row src_index[i] (both >= 0).
cudaError_t LaunchCopyTokens(const __nv_bfloat16* src_k,
                             const __nv_bfloat16* src_v,  // [.., head_dim] rows
                             const int64_t* src_index,    // [n]
                             __nv_bfloat16* dst_k, __nv_bfloat16* dst_v,
                             const int64_t* dst_index,  // [n]
                             int64_t n, int head_dim, cudaStream_t stream);

// The same for pools of any element type, moved as bytes (`row_bytes` a multiple of 16).
cudaError_t LaunchCopyTokenBytes(const void* src_k, const void* src_v,  // [.., row_bytes] rows
                                 const int64_t* src_index,              // [n]
                                 void* dst_k, void* dst_v,
                                 const int64_t* dst_index,  // [n]
                                 int64_t n, int row_bytes, cudaStream_t stream);

struct AssembleTablesParams {
  const int32_t* seq_rows;        // [S], -1 = dense
  const int32_t* resident_slots;  // [R, Hkv, K]
  const int32_t* num_resident;    // [R, Hkv]
  const int32_t* tail_slots;      // [S, Hkv, 2]
  const int32_t* tail_lens;       // [S]
  int32_t* block_tables;          // [S, Hkv, width]
  int32_t* kv_lens;               // [S, Hkv]
  int num_seqs = 0, num_kv_heads = 0, k = 0, width = 0;
};
cudaError_t LaunchAssembleSparseTables(const AssembleTablesParams& p, cudaStream_t stream);

// counts[r, h] += {|predicted ∩ actual|, |actual|} over the non-negative entries.
cudaError_t LaunchTopKOverlap(const int32_t* predicted, const int32_t* actual,  // [R, Hkv, K]
                              const int32_t* rows,                              // [R]
                              int32_t* counts,                                  // [R, Hkv, 2]
                              int num_rows, int num_kv_heads, int k, cudaStream_t stream);

// counts[r, h] += {|fetched blocks ∩ actual|, |fetched|}: the blocks of the working slots whose
// GPU slot (ws_slots) a non-negative fetch_dst entry names (CpuBackend::FetchOverlap).
cudaError_t LaunchFetchOverlap(const int32_t* fetch_dst,  // [R, Hkv, C]
                               const int32_t* ws_slots, const int32_t* ws_blocks,
                               const int32_t* actual,  // [R, Hkv, K] each
                               const int32_t* rows,    // [R]
                               int32_t* counts,        // [R, Hkv, 2]
                               int num_rows, int num_kv_heads, int k, int c, cudaStream_t stream);

}  // namespace oasis::kernels

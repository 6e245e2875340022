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
// the KV tiles of its (sequence, KV head), gathering them into shared memory with cp.async,
// and computes S = Q·Kᵀ and O += P·V on tensor cores (bf16 inputs, float accumulation) with an
// online softmax. Two kernels:
//   - sm_90a (compute capability 9.0, chosen by kAuto there): wgmma, 128 query rows x 128-key
//     tiles, a producer warpgroup filling a multi-stage K/V ring and two consumer warpgroups
//     (FlashAttention-3 style; kernels/attention_prefill_sm90.cu);
//   - mma.sync m16n8k16, 64-key tiles, double-buffered (FlashAttention-2 style; any sm_80+ GPU:
//     the fallback off Hopper; kernels/attention_prefill.cu).
// Tiles are mapped to (sequence, query tile) on the device from query_start, so a launch takes
// any mix of sequence lengths and needs no host copy of the metadata (graph-capturable).
// Documentation and measurements: docs/kernels/prefill_attention.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace oasis::kernels {

// Kernel and tile shape. kAuto: kSm90 on a compute capability 9.0 device; elsewhere kM64W4
// when max_query_len <= 64, else kM128W8 at head_dim 128 and kM128W4 at head_dim 64 (see
// LaunchHeadDim in the .cu).
enum class PrefillTileConfig {
  kAuto,
  kM128W4,  // mma.sync: 128 query rows, 4 warps of 32 rows (FA2's layout; Q re-read from shared)
  kM128W8,  // mma.sync: 128 query rows, 8 warps of 16 rows (Q fragments held in registers)
  kM64W4,   // mma.sync: 64 query rows, 4 warps of 16 rows (short chunks; Q in registers)
  kSm90,    // wgmma (CC 9.0 only): 128 rows, K/V ring of 3 stages (head_dim 128) or 4 (64);
            // FP8 pools: 2 widened stages at head_dim 128
  kSm90S2,  // wgmma (CC 9.0 only): the same with a 2-stage K/V ring
};

struct PrefillAttentionParams {
  const __nv_bfloat16* q;       // [tokens, num_q_heads, head_dim]
  const __nv_bfloat16* k_pool;  // [num_slots, 16, head_dim]
  const __nv_bfloat16* v_pool;  // [num_slots, 16, head_dim]
  const int32_t* query_start;   // [num_seqs + 1], device
  const int32_t* kv_lens;       // [num_seqs, num_kv_heads], device
  const int32_t* block_tables;  // [num_seqs, num_kv_heads, max_blocks] slot ids, device
  __nv_bfloat16* out;           // [tokens, num_q_heads, head_dim]
  int64_t tokens = 0;           // query rows in the batch (= query_start[num_seqs])
  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;       // 64 or 128
  int max_blocks = 0;     // block table row length
  int max_query_len = 0;  // upper bound on any q_len; 0 = unknown (only sizes the grid)
  float scale = 1.0f;     // softmax scale applied to q·k
  PrefillTileConfig tile = PrefillTileConfig::kAuto;
  // FP8 pools (kv_dtype kFp8E4M3): k_pool / v_pool are unused; these hold the e4m3 bytes
  // (16-byte aligned) and the per-KV-head scales. Both kernels read FP8, and kAuto picks as for
  // bf16: on CC 9.0 the wgmma kernel, whose producer warpgroup widens the bytes into its f16
  // K/V ring (2 widened stages at head_dim 128 for both tiles); elsewhere (or an mma.sync tile)
  // the mma.sync kernel (each thread gathers K/V bytes with cp.async into a staging buffer and
  // widens its own pieces exactly to f16 into the swizzled tiles). Either way the MMAs run
  // in f16 (Q converted to f16 in shared memory, P in f16), k_scale[h] folded into the softmax
  // scale and v_scale[h] into the output.
  KvDtype kv_dtype = KvDtype::kBf16;
  const uint8_t* k_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const uint8_t* v_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const float* k_scale = nullptr;       // [num_kv_heads]
  const float* v_scale = nullptr;       // [num_kv_heads]
};

// Returns cudaErrorInvalidValue for an unsupported head_dim (not 64 or 128), a GQA ratio
// that does not divide, misaligned pointers (q, pools and out need 16-byte alignment), a
// kSm90* tile on a device that is not compute capability 9.0, or an FP8 launch without its
// pools or scales. Launches nothing when
// tokens == 0. Queued on `stream`; no host synchronisation.
cudaError_t LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);

// True when LaunchPrefillAttention accepts this head_dim.
inline bool PrefillAttentionSupportsHeadDim(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}

// True when the current device runs the sm_90a kernel (compute capability 9.0); the build must
// carry sm_90a code (CMAKE_CUDA_ARCHITECTURES 90a, the project default).
bool PrefillAttentionSm90Available();

namespace detail {
// The wgmma kernel (attention_prefill_sm90.cu); `stages` 2, or 0 for the deepest K/V ring.
// Called by LaunchPrefillAttention after it has validated `p`.
cudaError_t LaunchPrefillAttentionSm90(const PrefillAttentionParams& p, int stages,
                                       cudaStream_t stream);
}  // namespace detail

}  // namespace oasis::kernels

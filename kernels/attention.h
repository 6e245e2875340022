// KV append and attention over head-level block tables (bf16 or FP8 e4m3 KV, float
// accumulation; kernels/kv_dtype.h).
//
// Attention semantics are those of Backend::Attention (src/backend/backend.h): sequence s
// owns query rows [query_start[s], query_start[s+1]); for KV head h its visible keys are the
// first kv_lens[s, h] tokens listed by block_tables[s, h, :], and its queries are the last
// q_len of them, causal among themselves. GQA: query head j reads KV head j / group.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace oasis::kernels {

inline constexpr int kKvBlockSize = 16;

// k_pool[slot_mapping[t, h]] = k[t, h, :] (and v); negative mappings are skipped.
cudaError_t LaunchKvAppend(const __nv_bfloat16* k,       // [tokens, num_kv_heads, head_dim]
                           const __nv_bfloat16* v,       // [tokens, num_kv_heads, head_dim]
                           const int64_t* slot_mapping,  // [tokens, num_kv_heads]
                           __nv_bfloat16* k_pool,        // [num_slots, 16, head_dim]
                           __nv_bfloat16* v_pool,        // [num_slots, 16, head_dim]
                           int64_t tokens, int num_kv_heads, int head_dim, cudaStream_t stream);

// The FP8 pool's append: k_pool[slot_mapping[t, h]] = e4m3(k[t, h, :] / k_scale[h]) (IEEE
// division, round to nearest even, saturating at ±448; and v likewise), and k_amax[h] / v_amax[h]
// raised to the largest |value| of the stored (non-negative mapping) tokens, NaN ignored.
cudaError_t LaunchKvAppendFp8(const __nv_bfloat16* k,       // [tokens, num_kv_heads, head_dim]
                              const __nv_bfloat16* v,       // [tokens, num_kv_heads, head_dim]
                              const int64_t* slot_mapping,  // [tokens, num_kv_heads]
                              uint8_t* k_pool,              // [num_slots, 16, head_dim] e4m3
                              uint8_t* v_pool,              // [num_slots, 16, head_dim] e4m3
                              const float* k_scale,         // [num_kv_heads]
                              const float* v_scale,         // [num_kv_heads]
                              float* k_amax,                // [num_kv_heads], raised
                              float* v_amax,                // [num_kv_heads], raised
                              int64_t tokens, int num_kv_heads, int head_dim, cudaStream_t stream);

struct PagedAttentionParams {
  const __nv_bfloat16* q;       // [tokens, num_q_heads, head_dim]
  const __nv_bfloat16* k_pool;  // [num_slots, 16, head_dim]
  const __nv_bfloat16* v_pool;  // [num_slots, 16, head_dim]
  const int32_t* query_start;   // [num_seqs + 1]
  const int32_t* kv_lens;       // [num_seqs, num_kv_heads]
  const int32_t* block_tables;  // [num_seqs, num_kv_heads, max_blocks]
  __nv_bfloat16* out;           // [tokens, num_q_heads, head_dim]
  int64_t tokens = 0;
  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // <= 256
  int max_blocks = 0;
  float scale = 1.0f;
  // FP8 pools (kv_dtype kFp8E4M3): k_pool / v_pool are unused, these hold the e4m3 bytes and
  // the per-KV-head scales (a key reads x · k_scale[h], a value x · v_scale[h]).
  KvDtype kv_dtype = KvDtype::kBf16;
  const uint8_t* k_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const uint8_t* v_pool_fp8 = nullptr;  // [num_slots, 16, head_dim]
  const float* k_scale = nullptr;       // [num_kv_heads]
  const float* v_scale = nullptr;       // [num_kv_heads]
};

// Reference-grade kernel: one CTA per (query row, query head), warps split the keys with an
// online softmax, merged at the end. Correct for prefill and decode; the fast tensor-core
// prefill and split-K decode kernels are measured against it.
cudaError_t LaunchPagedAttention(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace oasis::kernels

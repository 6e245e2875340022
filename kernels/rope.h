// Fused per-head RMSNorm (Qwen3 q_norm/k_norm, optional) + RoPE (rotate_half layout),
// in place on q and k. One warp per (token, head).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace oasis::kernels {

struct QkNormRopeParams {
  __nv_bfloat16* q;             // [tokens, num_q_heads, head_dim]
  __nv_bfloat16* k;             // [tokens, num_kv_heads, head_dim]
  const __nv_bfloat16* q_norm;  // [head_dim] or nullptr (no q/k norm)
  const __nv_bfloat16* k_norm;  // [head_dim] or nullptr
  const int32_t* positions;     // [tokens]
  const float* inv_freq;        // [head_dim / 2]
  float attention_scaling = 1.0f;
  float eps = 1e-6f;
  int64_t tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // even, <= 512
};

cudaError_t LaunchQkNormRope(const QkNormRopeParams& p, cudaStream_t stream);

// The attention block's whole input side in one launch, reading the fused QKV projection:
// q heads: optional q_norm, RoPE, written to `q`; k heads: optional k_norm, RoPE, written to
// the K pool at slot_mapping; v heads: copied to the V pool (negative mapping = not stored).
struct QkvRopeAppendParams {
  const __nv_bfloat16* qkv;     // [tokens, (num_q_heads + 2 * num_kv_heads) * head_dim]
  __nv_bfloat16* q;             // [tokens, num_q_heads, head_dim]
  __nv_bfloat16* k_pool;        // [num_slots, 16, head_dim]
  __nv_bfloat16* v_pool;        // [num_slots, 16, head_dim]
  const int64_t* slot_mapping;  // [tokens, num_kv_heads]
  const __nv_bfloat16* q_norm;  // [head_dim] or nullptr
  const __nv_bfloat16* k_norm;  // [head_dim] or nullptr
  const int32_t* positions;     // [tokens]
  const float* inv_freq;        // [head_dim / 2]
  float attention_scaling = 1.0f;
  float eps = 1e-6f;
  int64_t tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // even, <= 512
  KvDtype kv_dtype = KvDtype::kBf16;
  uint8_t* k_pool_fp8 = nullptr;   // [num_slots, 16, head_dim] e4m3 (kFp8E4M3 only)
  uint8_t* v_pool_fp8 = nullptr;   // [num_slots, 16, head_dim] e4m3
  const float* k_scale = nullptr;  // [num_kv_heads]
  const float* v_scale = nullptr;  // [num_kv_heads]
  float* k_amax = nullptr;         // [num_kv_heads], raised
  float* v_amax = nullptr;         // [num_kv_heads], raised
};

// Whether the FP8 fields a kFp8E4M3 launch reads are set (always true for kBf16).
inline bool QkvRopeAppendFp8Ready(const QkvRopeAppendParams& p) {
  return p.kv_dtype != KvDtype::kFp8E4M3 ||
         (p.k_pool_fp8 != nullptr && p.v_pool_fp8 != nullptr && p.k_scale != nullptr &&
          p.v_scale != nullptr && p.k_amax != nullptr && p.v_amax != nullptr);
}

// Launches of more tokens than this (bf16 KV, head_dim 32/64/128/256) take a vectorised kernel
// (head_dim / 16 lanes a head); fewer keep the warp-per-head kernel, bit-identical to the fused
// QKV GEMV epilogue (kernels/gemv.cu, at most kGemvMaxRows rows). The two differ only in the
// order of a head's sum of squares.
inline constexpr int64_t kRopeVecMinTokens = 8;
cudaError_t LaunchQkvRopeAppend(const QkvRopeAppendParams& p, cudaStream_t stream);

}  // namespace oasis::kernels

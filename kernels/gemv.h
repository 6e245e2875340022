// Skinny matrix products for decode: out[r, f] = Σ_k x[r, k] · w[f, k] for a few rows
// (1..4), streaming the bf16 weight once with 16-byte loads and float accumulation. cuBLAS
// is not bandwidth-bound at these shapes; this kernel is (it is limited by HBM reads).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/rope.h"

namespace oasis::kernels {

inline constexpr int kGemvMaxRows = 4;  // beyond 4 rows cuBLAS is faster (H200, 2026-11-29)

// Whether LaunchGemv handles these sizes (rows <= 8, in % 8 == 0, 16-byte aligned pointers).
bool GemvSupported(int64_t rows, int64_t in, const void* x, const void* w);

// out is bf16 when `out_f32` is null, else float (`out_bf16` null).
cudaError_t LaunchGemv(const __nv_bfloat16* x,   // [rows, in]
                       const __nv_bfloat16* w,   // [out, in]
                       __nv_bfloat16* out_bf16,  // [rows, out] or nullptr
                       float* out_f32,           // [rows, out] or nullptr
                       int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

// The GEMV's kernel configurations. kPerGroup: 4 features × 256 threads per CTA, one CTA per
// group (LaunchGemv's choice for one row); kPersistent: 8 features × 128 threads, a persistent
// grid of the resident CTAs (its choice for 2–4 rows); kAuto: that choice.
enum class GemvConfig : int { kAuto = 0, kPerGroup = 1, kPersistent = 2 };
// LaunchGemv with a given configuration (the benchmark and the tests run both).
cudaError_t LaunchGemvWith(GemvConfig config, const __nv_bfloat16* x, const __nv_bfloat16* w,
                           __nv_bfloat16* out_bf16, float* out_f32, int64_t rows, int64_t in,
                           int64_t out, cudaStream_t stream);

// The configuration of a plain GEMV whose sums equal the norm-fused GEMV's (LaunchGemvRmsNorm)
// at these sizes, for callers that must agree with it bit for bit (MoeRoute's router against
// AddRmsNormMoeRoute's): kPerGroup for one row under OASIS_GEMV_NARROW_NORM below
// OASIS_GEMV_NARROW_K features, else kAuto (the plain GEMV's choice already agrees).
GemvConfig GemvConfigMatchingNorm(int64_t rows, int64_t in);

// RMSNorm (+ residual add) fused into the GEMV that consumes it (decode, 1..4 rows):
//   v = x ? bf16(residual + x) : residual          (written to residual_out when given)
//   n = bf16(norm_w · bf16(v · rsqrt(mean(v²) + eps)))   (RMSNorm's rounding)
//   out = n · wᵀ
// residual_out must differ from residual (other CTAs still read it) and needs x. normed_out,
// when given, receives n (16-byte aligned; the MoE layer's experts read it after the router).
inline constexpr size_t kGemvNormMaxSmem = 96 * 1024;  // rows × in × 2 bytes of normalised rows
bool GemvNormSupported(int64_t rows, int64_t in, const void* residual, const void* w);
cudaError_t LaunchGemvRmsNorm(const __nv_bfloat16* x,         // [rows, in] or nullptr
                              const __nv_bfloat16* residual,  // [rows, in]
                              __nv_bfloat16* residual_out,    // [rows, in] or nullptr
                              const __nv_bfloat16* norm_w,    // [in]
                              float eps, const __nv_bfloat16* w, __nv_bfloat16* out_bf16,
                              float* out_f32, int64_t rows, int64_t in, int64_t out,
                              cudaStream_t stream,
                              __nv_bfloat16* normed_out = nullptr);  // [rows, in] or nullptr

// The same GEMV with SiLU·mul folded in: w is the fused [gate | up] weight [2·inter, in];
// out[r, j] = bf16(silu(bf16(n·gate_j)) rounded to bf16 × bf16(n·up_j)) — exactly the GEMV to
// bf16 followed by the SiLU·mul kernel, without the [rows, 2·inter] intermediate.
cudaError_t LaunchGemvRmsNormSiluMul(const __nv_bfloat16* x,             // [rows, in] or nullptr
                                     const __nv_bfloat16* residual,      // [rows, in]
                                     __nv_bfloat16* residual_out,        // [rows, in] or nullptr
                                     const __nv_bfloat16* norm_w,        // [in]
                                     float eps, const __nv_bfloat16* w,  // [2 * inter, in]
                                     __nv_bfloat16* out,                 // [rows, inter]
                                     int64_t rows, int64_t in, int64_t inter, cudaStream_t stream);

// The attention block's input side for decode: the norm-fused QKV GEMV writes rope.qkv
// (rows = rope.tokens), and the last CTA to finish each head applies QkvRopeAppend's work to
// it (q/k norm, RoPE, q to rope.q, k and v into the pools) — one launch instead of two.
// `counters` [num_q_heads + 2·num_kv_heads] int32 device memory, zero before the first
// launch; every launch leaves it zero. Launches sharing counters must not run concurrently.
inline constexpr int kGemvQkvMaxHeads = 1024;
bool GemvQkvRopeSupported(int64_t rows, int64_t in, int num_heads, int head_dim,
                          const void* residual, const void* w);
cudaError_t LaunchGemvRmsNormQkvRope(const __nv_bfloat16* x,         // [rows, in] or nullptr
                                     const __nv_bfloat16* residual,  // [rows, in]
                                     __nv_bfloat16* residual_out,    // [rows, in] or nullptr
                                     const __nv_bfloat16* norm_w,    // [in]
                                     float eps,
                                     const __nv_bfloat16* w,  // [(Hq + 2 Hkv) · head_dim, in]
                                     int64_t in, const QkvRopeAppendParams& rope, int* counters,
                                     cudaStream_t stream);

}  // namespace oasis::kernels

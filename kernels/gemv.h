// Skinny matrix products for decode: out[r, f] = Σ_k x[r, k] · w[f, k] for a few rows
// (1..4), streaming the bf16 weight once with 16-byte loads and float accumulation. cuBLAS
// is not bandwidth-bound at these shapes; this kernel is (it is limited by HBM reads).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

inline constexpr int kGemvMaxRows = 4;  // beyond 4 rows cuBLAS is faster (H200, 2026-11-29)

// Whether LaunchGemv handles these sizes (rows <= 8, in % 8 == 0, 16-byte aligned pointers).
bool GemvSupported(int64_t rows, int64_t in, const void* x, const void* w);

// out is bf16 when `out_f32` is null, else float (`out_bf16` null).
cudaError_t LaunchGemv(const __nv_bfloat16* x,  // [rows, in]
                       const __nv_bfloat16* w,  // [out, in]
                       __nv_bfloat16* out_bf16,  // [rows, out] or nullptr
                       float* out_f32,           // [rows, out] or nullptr
                       int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

// The same with a given kernel configuration (1..kGemvVariants; 0 = the default choice),
// for the benchmark and tests.
inline constexpr int kGemvVariants = 8;
cudaError_t LaunchGemvVariant(int variant, const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out_bf16,
                              float* out_f32, int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

// RMSNorm (+ residual add) fused into the GEMV that consumes it (decode, 1..4 rows):
//   v = x ? bf16(residual + x) : residual          (written to residual_out when given)
//   n = bf16(norm_w · bf16(v · rsqrt(mean(v²) + eps)))   (RMSNorm's rounding)
//   out = n · wᵀ
// residual_out must differ from residual (other CTAs still read it) and needs x.
inline constexpr size_t kGemvNormMaxSmem = 96 * 1024;  // rows × in × 2 bytes of normalised rows
bool GemvNormSupported(int64_t rows, int64_t in, const void* residual, const void* w);
cudaError_t LaunchGemvRmsNorm(const __nv_bfloat16* x,         // [rows, in] or nullptr
                              const __nv_bfloat16* residual,  // [rows, in]
                              __nv_bfloat16* residual_out,    // [rows, in] or nullptr
                              const __nv_bfloat16* norm_w,    // [in]
                              float eps, const __nv_bfloat16* w, __nv_bfloat16* out_bf16, float* out_f32,
                              int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

}  // namespace oasis::kernels

// RMSNorm kernels (bf16 in/out, float math), one CTA per row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

// out = x * rsqrt(mean(x^2) + eps) * weight. Rounds like Hugging Face's bf16 RMSNorm: the
// normalised row to bf16 first, then the product with the weight.
// When `residual` is not null: residual = residual + x (bf16) first, and the norm is of
// the updated residual (x is then only read).
cudaError_t LaunchRmsNorm(const __nv_bfloat16* x,       // [rows, n]
                          __nv_bfloat16* residual,      // [rows, n] or nullptr
                          const __nv_bfloat16* weight,  // [n]
                          __nv_bfloat16* out,           // [rows, n]
                          int64_t rows, int64_t n, float eps, cudaStream_t stream);

// residual_out = residual + x (bf16), out = RMSNorm(residual_out) · weight, in one pass:
// the add-then-norm of a decoder layer whose residual streams ping-pong between buffers.
// residual_out must not alias residual or x.
cudaError_t LaunchAddRmsNorm(const __nv_bfloat16* x, const __nv_bfloat16* residual,
                             __nv_bfloat16* residual_out, const __nv_bfloat16* weight,
                             __nv_bfloat16* out, int64_t rows, int64_t n, float eps,
                             cudaStream_t stream);

}  // namespace oasis::kernels

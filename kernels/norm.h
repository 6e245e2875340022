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

}  // namespace oasis::kernels

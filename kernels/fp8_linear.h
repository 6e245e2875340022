// Linear layers with FP8 (e4m3) weights of an FP8 checkpoint, 128×128 block-scaled (the Qwen3-FP8
// / DeepSeek layout): the real weight is w[o, i] · scales[o / 128, i / 128]
// (docs/kernels/fp8_linear.md).
//
//  - LaunchGemvFp8: decode (a few rows): streams the e4m3 weight once (half the bytes of bf16),
//    bf16 activations unquantized, dequantizes in registers, f32 accumulation.
//  - LaunchQuantizeFp8Groups: the activation side of the cuBLASLt block-scaled FP8 GEMM
//    (src/backend/cuda/cuda_fp8_linear.h): bf16 rows → e4m3 with one f32 scale per row and group
//    of 128 columns ("1×128", dynamic: scale = amax / 448).
//  - LaunchFillNormalFp8: dummy FP8 weights (Backend::FillNormal of an F8E4M3 tensor).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

inline constexpr int kFp8Block = 128;      // the weight's scale blocks are kFp8Block × kFp8Block
inline constexpr int kGemvFp8MaxRows = 4;  // rows one GEMV launch takes (more: several launches)

// Whether LaunchGemvFp8 takes these operands: rows >= 1, in % 16 == 0, out >= 1, 16-byte aligned
// x and w, 4-byte aligned scales.
bool GemvFp8Supported(int64_t rows, int64_t in, int64_t out, const void* x, const void* w,
                      const void* w_scales);

// out[r, o] = Σ_i x[r, i] · w[o, i] · w_scales[o / 128, i / 128], f32 accumulation (per 16-element
// vector: x times the block's scale in f32, then the products accumulated in element order).
// out is bf16 when `out_f32` is null, else float (`out_bf16` null). Rows beyond kGemvFp8MaxRows
// are computed kGemvFp8MaxRows at a time (one launch each). PDL launch: the first weight vectors
// are loaded before waiting for the kernel that produces x.
cudaError_t LaunchGemvFp8(const __nv_bfloat16* x,   // [rows, in]
                          const uint8_t* w,         // [out, in] e4m3
                          const float* w_scales,    // [ceil(out / 128), ceil(in / 128)]
                          __nv_bfloat16* out_bf16,  // [rows, out] or nullptr
                          float* out_f32,           // [rows, out] or nullptr
                          int64_t rows, int64_t in, int64_t out, cudaStream_t stream);

// Dynamic per-token-group quantization, exactly as this CPU computation (IEEE f32 division,
// FloatToFp8E4M3 = round to nearest even, saturating):
//   amax  = max |x[r, 128 g .. 128 g + 127]|
//   scale = amax / 448, or 1 where that is not > 0 (all-zero groups)
//   q[r, i] = FloatToFp8E4M3(x[r, i] / scale[g, r])
// Scales are stored token-major, scales[g * scale_ld + r] (the "outer-dimension-major" layout
// cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F wants for the activation operand). Rows
// rows..padded_rows-1 (padding, padded_rows <= scale_ld) get q = 0 and scale 1. Requires
// in % 128 == 0, x 8-byte aligned and q 4-byte aligned.
cudaError_t LaunchQuantizeFp8Groups(const __nv_bfloat16* x,  // [rows, in]
                                    uint8_t* q,              // [padded_rows, in] e4m3
                                    float* scales,           // [in / 128, scale_ld]
                                    int64_t rows, int64_t padded_rows, int64_t in, int64_t scale_ld,
                                    cudaStream_t stream);

// t[i] = FloatToFp8E4M3 of the value LaunchFillNormalF32 (kernels/elementwise.h) writes at i for
// the same seed and stddev (RNE, saturating at ±448).
cudaError_t LaunchFillNormalFp8(uint8_t* t, int64_t n, uint64_t seed, float stddev,
                                cudaStream_t stream);

}  // namespace oasis::kernels

// Device helpers of the FP8 (e4m3fn) KV cache (kernels/kv_dtype.h): quantization as the CPU
// reference does it, the per-head running maximum, exact e4m3 -> f16 widening, and the f16
// tensor-core MMA the FP8 attention kernels compute with.
//
// Exactness: every e4m3fn value is an f16 value (and a bf16 value), so widening is exact;
// cvt.rn.f16x2.e4m3x2 (sm_89+) widens two in one instruction, the low byte into the low half.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/ptx.cuh"

namespace oasis::kernels {

// FloatToFp8E4M3(x / scale) of include/oasis/dtype.h: an IEEE division (not a reciprocal
// multiply, so the bits equal the CPU's), then round to nearest even saturating at ±448.
__device__ __forceinline__ uint8_t QuantizeE4M3(float x, float scale) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

// The stored value as a number (unscaled), exact.
__device__ __forceinline__ float E4M3ToFloat(uint8_t x) {
  return __half2float(
      __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x), __NV_E4M3)));
}

// Four e4m3 bytes (byte i = element i) -> two f16x2 words: lo = elements 0, 1; hi = 2, 3 (the
// lower-numbered element in the low half, as the MMA fragments want it).
__device__ __forceinline__ void E4M3x4ToF16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 "
      "%1, "
      "h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// Four e4m3 bytes (byte i = element i) -> two bf16x2 words holding the values times 2^-112,
// exactly (lo = elements 0, 1; hi = 2, 3). Widened to f16 first (cvt.rn.f16x2.e4m3x2): every
// e4m3 value is zero or a normal f16 whose mantissa uses only its top 3 bits, so moving the f16's
// exponent and mantissa right by 3 bits gives the bf16 with the same exponent field and mantissa,
// whose value is the f16's times 2^(15 - 127) (a normal bf16: |x| >= 2^-9 gives >= 2^-121; zeros
// stay zeros, signs are kept). Two integer ops and the conversion per word, no multiply: the caller
// folds 2^112 into its other operand or its result (ScoreBlocks: q · 2^64, scores · 2^48).
// NaN bytes give garbage (not NaN).
inline constexpr float kE4M3ToBf16Tiny = 0x1p-112f;  // what the words hold, per unit of value
__device__ __forceinline__ uint32_t E4M3F16x2ToBf16x2Tiny(uint32_t h) {
  return ((h & 0x7fff7fffu) >> 3) | (h & 0x80008000u);
}
__device__ __forceinline__ void E4M3x4ToBf16x2Tiny(uint32_t w, uint32_t& lo, uint32_t& hi) {
  uint32_t a, b;
  E4M3x4ToF16x2(w, a, b);
  lo = E4M3F16x2ToBf16x2Tiny(a);
  hi = E4M3F16x2ToBf16x2Tiny(b);
}

// A bf16x2 word -> an f16x2 word (round to nearest; exact for |x| in [2^-14, 65504]).
__device__ __forceinline__ uint32_t Bf16x2ToF16x2(uint32_t w) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  const __half2 h = __floats2half2_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Two floats rounded to an f16x2 word, `lo` in the low half.
__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// acc += A · B for one m16n8k16 tile with f16 inputs (fragment layouts as the bf16 Mma of
// kernels/ptx.cuh).
__device__ __forceinline__ void MmaF16(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void MmaF16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  MmaF16(acc, a[0], a[1], a[2], a[3], b0, b1);
}

// The m16n8k16 MMA and the pack of two floats into an MMA operand word, for bf16 (kF16 false:
// kernels/ptx.cuh) or f16 (kF16 true) operands.
template <bool kF16>
__device__ __forceinline__ void MmaT(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                     uint32_t b1) {
  if constexpr (kF16)
    MmaF16(acc, a, b0, b1);
  else
    Mma(acc, a, b0, b1);
}
template <bool kF16>
__device__ __forceinline__ uint32_t PackT(float lo, float hi) {
  if constexpr (kF16)
    return PackF16(lo, hi);
  else
    return PackBf16(lo, hi);
}

// Raises *amax to the warp's largest `v` (each lane's max of |value| so far, >= 0, NaN never
// taken: fmaxf drops it). Every lane of the warp calls it; lane 0 does one atomicMax on the
// float's bits (non-negative floats order like their int bits).
__device__ __forceinline__ void WarpRaiseAmax(float* amax, float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0 && v > 0.0f)
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(v));
}

}  // namespace oasis::kernels

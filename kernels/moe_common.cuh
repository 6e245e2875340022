// Device helpers the MoE kernels share (kernels/moe.cu, kernels/moe_gemm.cu).
#pragma once

#include "kernels/common.cuh"

namespace oasis::kernels {

// SiLU(gate)·up with the dense path's rounding: the gate/up products rounded to bf16 (as the
// GEMM or GEMV writes them), SiLU rounded to bf16, the product rounded to bf16
// (SiluMulKernel, GemvGroup's kSiluPair epilogue).
__device__ __forceinline__ bf16 SiluMulRounded(float gate, float up) {
  const float g = ToFloat(ToBf16(gate));
  const float silu = g / (1.0f + __expf(-g));
  return ToBf16(ToFloat(ToBf16(silu)) * ToFloat(ToBf16(up)));
}

// acc += the dot product of 8 bf16 pairs, in element order (the GEMV kernels' summation order).
__device__ __forceinline__ void Dot8(const uint4& wv, const uint4& xv, float& acc) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
  const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(w2[i]);
    const float2 b = __bfloat1622float2(x2[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}

// The lanes below this one (a warp's %lanemask_lt).
__device__ __forceinline__ unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

}  // namespace oasis::kernels

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

// The lanes below this one (a warp's %lanemask_lt).
__device__ __forceinline__ unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

}  // namespace oasis::kernels

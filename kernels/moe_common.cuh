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

// Top-k routing of one token by one warp (every lane calls it; it ends converged). The logits
// (read through L2: the fused route reads other CTAs' values) go to the warp's shared `s`; k
// rounds of a warp argmax under the order (logit descending, expert ascending) pick the experts;
// lane l owns experts l + 32 i (bit i of `taken`, so experts <= 1024). Softmax is monotone, so
// this is CpuBackend::MoeRoute's order of the probabilities (exactly, unless float rounding makes
// two distinct logits' probabilities equal, where the CPU then prefers the lower index;
// docs/moe.md). weights[j] = softmax(l)[ids[j]], divided by their sum (j ascending) when
// `renormalize`.
__device__ __forceinline__ void MoeTopKWarp(const float* l,  // [experts]
                                            int experts, int k, bool renormalize,
                                            float* s,          // [experts] shared, this warp's
                                            int* chosen,       // [k] shared, this warp's
                                            int32_t* ids,      // [k]
                                            float* weights) {  // [k]
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < experts; e += 32) s[e] = __ldcg(l + e);
  __syncwarp();
  uint32_t taken = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0.0f;
    int be = -1;
    for (int i = 0, e = lane; e < experts; ++i, e += 32) {
      if ((taken >> i) & 1u) continue;
      const float v = s[e];
      if (be < 0 || v > bv) bv = v, be = e;  // e ascends: an equal logit keeps the lower index
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oe = __shfl_xor_sync(kFull, be, o);
      if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
    }
    be = __shfl_sync(kFull, be, 0);  // one decision for the warp (NaN logits compare unordered)
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    if (lane == 0) chosen[j] = be;
  }
  __syncwarp();
  const float mx = s[chosen[0]];  // the largest logit
  float sum = 0.0f;
  for (int e = lane; e < experts; e += 32) sum += expf(s[e] - mx);
  sum = WarpSum(sum);
  if (lane == 0) {
    float chosen_sum = 0.0f;
    for (int j = 0; j < k; ++j) chosen_sum += expf(s[chosen[j]] - mx) / sum;
    for (int j = 0; j < k; ++j) {
      const float p = expf(s[chosen[j]] - mx) / sum;
      ids[j] = chosen[j];
      weights[j] = renormalize ? p / chosen_sum : p;
    }
  }
  __syncwarp();  // s and chosen may be reused for the next token
}

// The lanes below this one (a warp's %lanemask_lt).
__device__ __forceinline__ unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

}  // namespace oasis::kernels

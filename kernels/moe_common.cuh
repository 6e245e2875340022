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
  constexpr int kNone = 0x7fffffff;
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < experts; e += 32) s[e] = __ldcg(l + e);
  __syncwarp();
  // A logit's key orders as the float does (-0 as +0; NaN below everything, so it is chosen
  // only when nothing else is left); a round is two warp reductions: the largest key, then the
  // lowest expert holding it.
  auto key = [](float v) -> unsigned {
    if (v != v) return 0u;
    const unsigned b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  };
  uint32_t taken = 0;
  for (int j = 0; j < k; ++j) {
    unsigned bk = 0;
    int be = kNone;
    for (int i = 0, e = lane; e < experts; ++i, e += 32) {
      if ((taken >> i) & 1u) continue;
      const unsigned kv = key(s[e]);
      if (be == kNone || kv > bk) bk = kv, be = e;  // e ascends: an equal logit keeps the lower
    }
    const unsigned mx = __reduce_max_sync(kFull, bk);
    be = static_cast<int>(
        __reduce_min_sync(kFull, static_cast<unsigned>(be != kNone && bk == mx ? be : kNone)));
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    if (lane == 0) chosen[j] = be;
  }
  __syncwarp();
  const float mx = s[chosen[0]];  // the largest logit
  float sum = 0.0f;
  for (int e = lane; e < experts; e += 32) sum += expf(s[e] - mx);
  sum = WarpSum(sum);
  // p_j on lane j % 32; their sum in slot order (j ascending) on lane 0, as the reference adds.
  float chosen_sum = 0.0f;
  for (int j0 = 0; j0 < k; j0 += 32) {
    const float p = j0 + lane < k ? expf(s[chosen[j0 + lane]] - mx) / sum : 0.0f;
    for (int j = 0; j < 32 && j0 + j < k; ++j) chosen_sum += __shfl_sync(kFull, p, j);
  }
  for (int j0 = 0; j0 < k; j0 += 32) {
    const int j = j0 + lane;
    if (j < k) {
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

// Device helper shared by the RoPE kernels and the fused QKV GEMV epilogue (kernels/gemv.cu).
#pragma once

#include "kernels/common.cuh"

namespace oasis::kernels {

constexpr int kMaxPairsPerLane = 8;  // head_dim <= 2 * 32 * 8 = 512

// One warp: src (one head of head_dim values) -> optional RMSNorm with `norm` -> RoPE at
// `pos` -> dst (src and dst may alias). Rounds like Hugging Face's bf16 path: the normalised
// value to bf16, times the weight to bf16; cos/sin cast to bf16 before the products.
__device__ __forceinline__ void NormRopeHead(const bf16* src, bf16* dst, const bf16* norm,
                                             float pos, const float* inv_freq,
                                             float attention_scaling, float eps, int head_dim,
                                             int lane) {
  const int half = head_dim / 2;
  float a[kMaxPairsPerLane], b[kMaxPairsPerLane];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    a[j] = i < half ? ToFloat(src[i]) : 0.0f;
    b[j] = i < half ? ToFloat(src[i + half]) : 0.0f;
    sum += a[j] * a[j] + b[j] * b[j];
  }
  if (norm) {
    const float inv = rsqrtf(WarpSum(sum) / static_cast<float>(head_dim) + eps);
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        a[j] = ToFloat(ToBf16(ToFloat(norm[i]) * ToFloat(ToBf16(a[j] * inv))));
        b[j] = ToFloat(ToBf16(ToFloat(norm[i + half]) * ToFloat(ToBf16(b[j] * inv))));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < half) {
      float sn, c;
      sincosf(pos * inv_freq[i], &sn, &c);
      c = ToFloat(ToBf16(c * attention_scaling));
      sn = ToFloat(ToBf16(sn * attention_scaling));
      dst[i] = ToBf16(a[j] * c - b[j] * sn);
      dst[i + half] = ToBf16(b[j] * c + a[j] * sn);
    }
  }
}

}  // namespace oasis::kernels

// Device helper shared by the RoPE kernels and the fused QKV GEMV epilogue (kernels/gemv.cu).
#pragma once

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"

namespace oasis::kernels {

constexpr int kMaxPairsPerLane = 8;  // head_dim <= 2 * 32 * 8 = 512

// One element of a normalised head: bf16(weight · bf16(v · inv)) (Hugging Face's rounding).
__device__ __forceinline__ float NormElement(float v, float inv, float weight) {
  return ToFloat(ToBf16(weight * ToFloat(ToBf16(v * inv))));
}

// RoPE of the pair (a, b) = (x[i], x[i + head_dim / 2]) at `pos`: cos/sin at pos · inv_freq
// scaled and cast to bf16 before the products; the results before the final rounding.
__device__ __forceinline__ void RopePair(float a, float b, float pos, float inv_freq,
                                         float attention_scaling, float& out_a, float& out_b) {
  float sn, c;
  sincosf(pos * inv_freq, &sn, &c);
  c = ToFloat(ToBf16(c * attention_scaling));
  sn = ToFloat(ToBf16(sn * attention_scaling));
  out_a = a * c - b * sn;
  out_b = b * c + a * sn;
}

// One warp: src (one head of head_dim values) -> optional RMSNorm with `norm` -> RoPE at
// `pos` -> store(i, value) for every element i (each lane its own elements, once each; every
// read of src comes before the first store, so src may be the store's destination). Rounds like
// Hugging Face's bf16 path: the normalised value to bf16, times the weight to bf16; cos/sin cast
// to bf16 before the products. The value given to `store` is the float before the final
// rounding (NormRopeHead rounds it to bf16).
template <typename Store>
__device__ __forceinline__ void NormRopeHeadTo(const bf16* src, const bf16* norm, float pos,
                                               const float* inv_freq, float attention_scaling,
                                               float eps, int head_dim, int lane, Store&& store) {
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
        a[j] = NormElement(a[j], inv, ToFloat(norm[i]));
        b[j] = NormElement(b[j], inv, ToFloat(norm[i + half]));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < half) {
      float ra, rb;
      RopePair(a[j], b[j], pos, inv_freq[i], attention_scaling, ra, rb);
      store(i, ra);
      store(i + half, rb);
    }
  }
}

// NormRopeHeadTo into a bf16 head `dst` (src and dst may alias).
__device__ __forceinline__ void NormRopeHead(const bf16* src, bf16* dst, const bf16* norm,
                                             float pos, const float* inv_freq,
                                             float attention_scaling, float eps, int head_dim,
                                             int lane) {
  NormRopeHeadTo(src, norm, pos, inv_freq, attention_scaling, eps, head_dim, lane,
                 [&](int i, float x) { dst[i] = ToBf16(x); });
}

// NormRopeHeadTo into one FP8 head-row `dst` (head_dim e4m3 bytes): the value rounded to bf16
// (what the bf16 pool would hold) is stored as e4m3(value / scale) and the head's amax raised
// to its largest |value|. Every lane of the warp calls it.
__device__ __forceinline__ void NormRopeHeadFp8(const bf16* src, uint8_t* dst, const bf16* norm,
                                                float pos, const float* inv_freq,
                                                float attention_scaling, float eps, int head_dim,
                                                int lane, float scale, float* amax) {
  float m = 0.0f;
  NormRopeHeadTo(src, norm, pos, inv_freq, attention_scaling, eps, head_dim, lane,
                 [&](int i, float x) {
                   const float r = ToFloat(ToBf16(x));
                   dst[i] = QuantizeE4M3(r, scale);
                   m = fmaxf(m, fabsf(r));
                 });
  WarpRaiseAmax(amax, m);
}

// One warp: a V head-row of bf16 values into an FP8 head-row (e4m3(value / scale)), amax raised.
__device__ __forceinline__ void StoreHeadFp8(const bf16* src, uint8_t* dst, int head_dim, int lane,
                                             float scale, float* amax) {
  float m = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float x = ToFloat(src[i]);
    dst[i] = QuantizeE4M3(x, scale);
    m = fmaxf(m, fabsf(x));
  }
  WarpRaiseAmax(amax, m);
}

}  // namespace oasis::kernels

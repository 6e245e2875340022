#include "kernels/common.cuh"
#include "kernels/rope.h"

namespace oasis::kernels {
namespace {

constexpr int kMaxPairsPerLane = 8;  // head_dim <= 2 * 32 * 8 = 512

// One warp: src (one head of head_dim values) -> optional RMSNorm with `norm` -> RoPE at
// `pos` -> dst (src and dst may alias). Rounds like Hugging Face's bf16 path: the normalised
// value to bf16, times the weight to bf16; cos/sin cast to bf16 before the products.
__device__ __forceinline__ void NormRopeHead(const bf16* src, bf16* dst, const bf16* norm, float pos,
                                             const float* inv_freq, float attention_scaling, float eps,
                                             int head_dim, int lane) {
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

__global__ void QkNormRopeKernel(QkNormRopeParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int heads = p.num_q_heads + p.num_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (item >= p.tokens * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const bool is_q = h < p.num_q_heads;
  bf16* head = is_q ? p.q + (t * p.num_q_heads + h) * p.head_dim
                    : p.k + (t * p.num_kv_heads + (h - p.num_q_heads)) * p.head_dim;
  const bf16* norm = is_q ? p.q_norm : p.k_norm;
  NormRopeHead(head, head, norm, static_cast<float>(p.positions[t]), p.inv_freq, p.attention_scaling, p.eps,
               p.head_dim, lane);
}

__global__ void QkvRopeAppendKernel(QkvRopeAppendParams p) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (item >= p.tokens * heads) return;
  const int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const bf16* src = p.qkv + (t * heads + h) * p.head_dim;
  if (h >= p.num_q_heads + p.num_kv_heads) {  // V: straight into the pool
    const int kv = h - p.num_q_heads - p.num_kv_heads;
    const int64_t dst = p.slot_mapping[t * p.num_kv_heads + kv];
    if (dst < 0) return;
    for (int i = lane; i < p.head_dim; i += 32) p.v_pool[dst * p.head_dim + i] = src[i];
    return;
  }
  const bool is_q = h < p.num_q_heads;
  bf16* dst;
  if (is_q) {
    dst = p.q + (t * p.num_q_heads + h) * p.head_dim;
  } else {
    const int64_t slot = p.slot_mapping[t * p.num_kv_heads + (h - p.num_q_heads)];
    if (slot < 0) return;
    dst = p.k_pool + slot * p.head_dim;
  }
  NormRopeHead(src, dst, is_q ? p.q_norm : p.k_norm, static_cast<float>(p.positions[t]), p.inv_freq,
               p.attention_scaling, p.eps, p.head_dim, lane);
}

}  // namespace

cudaError_t LaunchQkvRopeAppend(const QkvRopeAppendParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.head_dim % 2 != 0 || p.head_dim > 2 * 32 * kMaxPairsPerLane) return cudaErrorInvalidValue;
  const int warps_per_block = 8;
  const int64_t items = p.tokens * (p.num_q_heads + 2 * p.num_kv_heads);
  return LaunchPdl(QkvRopeAppendKernel, dim3(CeilDiv(items, warps_per_block)), dim3(warps_per_block * 32), 0, stream, p);
}

cudaError_t LaunchQkNormRope(const QkNormRopeParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.head_dim % 2 != 0 || p.head_dim > 2 * 32 * kMaxPairsPerLane) return cudaErrorInvalidValue;
  const int warps_per_block = 8;
  const int64_t items = p.tokens * (p.num_q_heads + p.num_kv_heads);
  QkNormRopeKernel<<<CeilDiv(items, warps_per_block), warps_per_block * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

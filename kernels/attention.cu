#include <cfloat>

#include "kernels/attention.h"
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"

namespace oasis::kernels {
namespace {

constexpr int kMaxDimPerLane = 8;  // head_dim <= 256
constexpr int kWarps = 4;

__global__ void KvAppendKernel(const bf16* k, const bf16* v, const int64_t* slot_mapping,
                               bf16* k_pool, bf16* v_pool, int num_kv_heads, int head_dim) {
  const int64_t item = blockIdx.x;  // (token, head)
  const int64_t dst = slot_mapping[item];
  if (dst < 0) return;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    k_pool[dst * head_dim + i] = k[item * head_dim + i];
    v_pool[dst * head_dim + i] = v[item * head_dim + i];
  }
}

// One CTA per (token, head): quantized K and V rows, and the head's amax raised (one atomic per
// warp).
__global__ void KvAppendFp8Kernel(const bf16* k, const bf16* v, const int64_t* slot_mapping,
                                  uint8_t* k_pool, uint8_t* v_pool, const float* k_scale,
                                  const float* v_scale, float* k_amax, float* v_amax,
                                  int num_kv_heads, int head_dim) {
  const int64_t item = blockIdx.x;  // (token, head)
  const int64_t dst = slot_mapping[item];
  if (dst < 0) return;
  const int h = static_cast<int>(item % num_kv_heads);
  const float ks = k_scale[h], vs = v_scale[h];
  float ka = 0.0f, va = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    const float kx = ToFloat(k[item * head_dim + i]), vx = ToFloat(v[item * head_dim + i]);
    k_pool[dst * head_dim + i] = QuantizeE4M3(kx, ks);
    v_pool[dst * head_dim + i] = QuantizeE4M3(vx, vs);
    ka = fmaxf(ka, fabsf(kx));
    va = fmaxf(va, fabsf(vx));
  }
  WarpRaiseAmax(k_amax + h, ka);
  WarpRaiseAmax(v_amax + h, va);
}

// kFp8: the pools hold e4m3 bytes, read as x · scale[h] (PagedAttentionParams).
template <bool kFp8>
__global__ void __launch_bounds__(kWarps * 32) PagedAttentionKernel(PagedAttentionParams p) {
  const int64_t row = blockIdx.x;
  const int qh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Which sequence owns this row (query_start is sorted).
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.query_start[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int s = lo;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int h = qh / group;
  const int64_t q_len = p.query_start[s + 1] - p.query_start[s];
  const int64_t i = row - p.query_start[s];
  const int64_t kv_len = p.kv_lens[s * p.num_kv_heads + h];
  const int64_t visible = kv_len - q_len + i + 1;
  const int32_t* table =
      p.block_tables + (static_cast<int64_t>(s) * p.num_kv_heads + h) * p.max_blocks;
  float ks = 1.0f, vs = 1.0f;
  if constexpr (kFp8) ks = p.k_scale[h], vs = p.v_scale[h];
  auto key = [&](int64_t i) {
    if constexpr (kFp8)
      return E4M3ToFloat(p.k_pool_fp8[i]) * ks;
    else
      return ToFloat(p.k_pool[i]);
  };
  auto value = [&](int64_t i) {
    if constexpr (kFp8)
      return E4M3ToFloat(p.v_pool_fp8[i]) * vs;
    else
      return ToFloat(p.v_pool[i]);
  };

  float qv[kMaxDimPerLane], acc[kMaxDimPerLane];
  const bf16* qp = p.q + (row * p.num_q_heads + qh) * p.head_dim;
#pragma unroll
  for (int j = 0; j < kMaxDimPerLane; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < p.head_dim ? ToFloat(qp[d]) * p.scale : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  for (int64_t pos = warp; pos < visible; pos += kWarps) {
    const int64_t slot = table[pos / kKvBlockSize];
    const int64_t base = (slot * kKvBlockSize + pos % kKvBlockSize) * p.head_dim;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxDimPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < p.head_dim) dot += qv[j] * key(base + d);
    }
    dot = WarpSum(dot);
    const float m_new = fmaxf(m, dot);
    const float correction = __expf(m - m_new), w = __expf(dot - m_new);
    l = l * correction + w;
#pragma unroll
    for (int j = 0; j < kMaxDimPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < p.head_dim) acc[j] = acc[j] * correction + w * value(base + d);
    }
    m = m_new;
  }
  // Merge the warps' partial softmax states.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxDimPerLane * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kMaxDimPerLane; ++j) sacc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp == 0) {
    float mg = -FLT_MAX;
    for (int w = 0; w < kWarps; ++w) mg = fmaxf(mg, sm[w]);
    float lg = 0.0f;
    float out[kMaxDimPerLane] = {};
    for (int w = 0; w < kWarps; ++w) {
      if (sl[w] == 0.0f) continue;
      const float c = __expf(sm[w] - mg);
      lg += sl[w] * c;
#pragma unroll
      for (int j = 0; j < kMaxDimPerLane; ++j) out[j] += sacc[w][lane + 32 * j] * c;
    }
    bf16* op = p.out + (row * p.num_q_heads + qh) * p.head_dim;
#pragma unroll
    for (int j = 0; j < kMaxDimPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < p.head_dim) op[d] = ToBf16(out[j] / lg);
    }
  }
}

}  // namespace

cudaError_t LaunchKvAppend(const bf16* k, const bf16* v, const int64_t* slot_mapping, bf16* k_pool,
                           bf16* v_pool, int64_t tokens, int num_kv_heads, int head_dim,
                           cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  KvAppendKernel<<<static_cast<unsigned>(tokens * num_kv_heads), 128, 0, stream>>>(
      k, v, slot_mapping, k_pool, v_pool, num_kv_heads, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchKvAppendFp8(const bf16* k, const bf16* v, const int64_t* slot_mapping,
                              uint8_t* k_pool, uint8_t* v_pool, const float* k_scale,
                              const float* v_scale, float* k_amax, float* v_amax, int64_t tokens,
                              int num_kv_heads, int head_dim, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (k_scale == nullptr || v_scale == nullptr || k_amax == nullptr || v_amax == nullptr ||
      num_kv_heads <= 0)
    return cudaErrorInvalidValue;
  KvAppendFp8Kernel<<<static_cast<unsigned>(tokens * num_kv_heads), 128, 0, stream>>>(
      k, v, slot_mapping, k_pool, v_pool, k_scale, v_scale, k_amax, v_amax, num_kv_heads, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchPagedAttention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.head_dim > 32 * kMaxDimPerLane || p.num_q_heads % p.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.num_q_heads));
  if (p.kv_dtype == KvDtype::kFp8E4M3) {
    if (p.k_pool_fp8 == nullptr || p.v_pool_fp8 == nullptr || p.k_scale == nullptr ||
        p.v_scale == nullptr)
      return cudaErrorInvalidValue;
    PagedAttentionKernel<true><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    PagedAttentionKernel<false><<<grid, kWarps * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace oasis::kernels

#include "kernels/common.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope.h"

namespace oasis::kernels {
namespace {

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
  NormRopeHead(head, head, norm, static_cast<float>(p.positions[t]), p.inv_freq,
               p.attention_scaling, p.eps, p.head_dim, lane);
}

template <bool kFp8>
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
    if constexpr (kFp8) {
      StoreHeadFp8(src, p.v_pool_fp8 + dst * p.head_dim, p.head_dim, lane, p.v_scale[kv],
                   p.v_amax + kv);
    } else {
      for (int i = lane; i < p.head_dim; i += 32) p.v_pool[dst * p.head_dim + i] = src[i];
    }
    return;
  }
  const bool is_q = h < p.num_q_heads;
  bf16* dst;
  if (is_q) {
    dst = p.q + (t * p.num_q_heads + h) * p.head_dim;
  } else {
    const int kv = h - p.num_q_heads;
    const int64_t slot = p.slot_mapping[t * p.num_kv_heads + kv];
    if (slot < 0) return;
    if constexpr (kFp8) {
      NormRopeHeadFp8(src, p.k_pool_fp8 + slot * p.head_dim, p.k_norm,
                      static_cast<float>(p.positions[t]), p.inv_freq, p.attention_scaling, p.eps,
                      p.head_dim, lane, p.k_scale[kv], p.k_amax + kv);
      return;
    }
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
  if (p.kv_dtype == KvDtype::kFp8E4M3) {
    if (!QkvRopeAppendFp8Ready(p)) return cudaErrorInvalidValue;
    return LaunchPdl(QkvRopeAppendKernel<true>, dim3(CeilDiv(items, warps_per_block)),
                     dim3(warps_per_block * 32), 0, stream, p);
  }
  return LaunchPdl(QkvRopeAppendKernel<false>, dim3(CeilDiv(items, warps_per_block)),
                   dim3(warps_per_block * 32), 0, stream, p);
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

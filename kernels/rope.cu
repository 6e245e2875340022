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

// Prefill-sized launches (more than kRopeVecMinTokens tokens, bf16 KV, head_dim 32..256 a
// multiple of 16, 16-byte aligned rows): L = head_dim / 16 lanes per head instead of a warp, each
// lane loading the 8 elements i = 8 sl .. 8 sl + 7 of the first half and their RoPE partners
// i + head_dim / 2 as 16-byte vectors and storing them so. The same roundings as NormRopeHead; the
// head's sum of squares is added in another order (so a few values can differ from the warp
// kernel's by a bf16 ulp), which is why the fused QKV GEMV epilogue's row counts (<= 4) keep the
// warp kernel it is bit-identical to.
template <int D>
__global__ void __launch_bounds__(256) QkvRopeAppendVecKernel(QkvRopeAppendParams p) {
  constexpr int L = D / 16, kHalf = D / 2;
  GridDependencyWait();
  AllowDependentLaunch();
  const int heads = p.num_q_heads + 2 * p.num_kv_heads;
  const int64_t item = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / L;
  const int sl = static_cast<int>(threadIdx.x % L);
  const bool valid = item < p.tokens * heads;
  const int64_t t = valid ? item / heads : 0;
  const int h = valid ? static_cast<int>(item % heads) : 0;
  const bf16* src = p.qkv + (t * heads + h) * D;
  uint4 va = make_uint4(0, 0, 0, 0), vb = va;
  if (valid) {
    va = *reinterpret_cast<const uint4*>(src + 8 * sl);
    vb = *reinterpret_cast<const uint4*>(src + kHalf + 8 * sl);
  }
  float a[8], b[8];
  const bf16* ha = reinterpret_cast<const bf16*>(&va);
  const bf16* hb = reinterpret_cast<const bf16*>(&vb);
  float sum = 0.0f;
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    a[m] = ToFloat(ha[m]);
    b[m] = ToFloat(hb[m]);
    sum += a[m] * a[m] + b[m] * b[m];
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!valid) return;
  if (h >= p.num_q_heads + p.num_kv_heads) {  // V: straight into the pool
    const int64_t slot = p.slot_mapping[t * p.num_kv_heads + (h - p.num_q_heads - p.num_kv_heads)];
    if (slot < 0) return;
    bf16* dst = p.v_pool + slot * D;
    *reinterpret_cast<uint4*>(dst + 8 * sl) = va;
    *reinterpret_cast<uint4*>(dst + kHalf + 8 * sl) = vb;
    return;
  }
  const bool is_q = h < p.num_q_heads;
  bf16* dst;
  if (is_q) {
    dst = p.q + (t * p.num_q_heads + h) * D;
  } else {
    const int64_t slot = p.slot_mapping[t * p.num_kv_heads + (h - p.num_q_heads)];
    if (slot < 0) return;
    dst = p.k_pool + slot * D;
  }
  const bf16* norm = is_q ? p.q_norm : p.k_norm;
  if (norm) {
    const float inv = rsqrtf(sum / static_cast<float>(D) + p.eps);
    const uint4 na = *reinterpret_cast<const uint4*>(norm + 8 * sl);
    const uint4 nb = *reinterpret_cast<const uint4*>(norm + kHalf + 8 * sl);
    const bf16* wa = reinterpret_cast<const bf16*>(&na);
    const bf16* wb = reinterpret_cast<const bf16*>(&nb);
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      a[m] = NormElement(a[m], inv, ToFloat(wa[m]));
      b[m] = NormElement(b[m], inv, ToFloat(wb[m]));
    }
  }
  const float pos = static_cast<float>(p.positions[t]);
  uint4 oa, ob;
  bf16* out_a = reinterpret_cast<bf16*>(&oa);
  bf16* out_b = reinterpret_cast<bf16*>(&ob);
#pragma unroll
  for (int m = 0; m < 8; ++m) {
    float ra, rb;
    RopePair(a[m], b[m], pos, p.inv_freq[8 * sl + m], p.attention_scaling, ra, rb);
    out_a[m] = ToBf16(ra);
    out_b[m] = ToBf16(rb);
  }
  *reinterpret_cast<uint4*>(dst + 8 * sl) = oa;
  *reinterpret_cast<uint4*>(dst + kHalf + 8 * sl) = ob;
}

template <int D>
cudaError_t LaunchVec(const QkvRopeAppendParams& p, cudaStream_t stream) {
  const int64_t threads = p.tokens * (p.num_q_heads + 2 * p.num_kv_heads) * (D / 16);
  return LaunchPdl(QkvRopeAppendVecKernel<D>, dim3(CeilDiv(threads, 256)), dim3(256), 0, stream, p);
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
  const bool vec = p.tokens > kRopeVecMinTokens && p.head_dim % 16 == 0 && p.head_dim >= 32 &&
                   p.head_dim <= 256 && Aligned16(p.qkv) && Aligned16(p.q) && Aligned16(p.k_pool) &&
                   Aligned16(p.v_pool) && (p.q_norm == nullptr || Aligned16(p.q_norm)) &&
                   (p.k_norm == nullptr || Aligned16(p.k_norm));
  if (vec) {
    switch (p.head_dim) {
      case 32:
        return LaunchVec<32>(p, stream);
      case 64:
        return LaunchVec<64>(p, stream);
      case 128:
        return LaunchVec<128>(p, stream);
      case 256:
        return LaunchVec<256>(p, stream);
      default:
        break;  // 48, 80, ...: the warp kernel
    }
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

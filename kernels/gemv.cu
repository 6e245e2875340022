#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/gemv.h"

namespace oasis::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kFeaturesPerWarp = 2;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane and feature

__device__ __forceinline__ void Accumulate(const uint4& wv, const uint4& xv, float& acc) {
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

template <int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* out_bf16, float* out_f32, int64_t in,
               int64_t out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t f0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kFeaturesPerWarp;
  if (f0 >= out) return;
  const int64_t vecs = in / 8;  // uint4 per row
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[kFeaturesPerWarp][R];
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;
  const uint4* wrow[kFeaturesPerWarp];
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f) {
    const int64_t feat = f0 + f < out ? f0 + f : out - 1;  // clamp: duplicate work, never written
    wrow[f] = reinterpret_cast<const uint4*>(w + feat * in);
  }
  int64_t v = lane;
  for (; v + 32 * (kUnroll - 1) < vecs; v += 32 * kUnroll) {
    uint4 wv[kFeaturesPerWarp][kUnroll];
#pragma unroll
    for (int f = 0; f < kFeaturesPerWarp; ++f)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[f][u] = __ldcs(wrow[f] + v + 32 * u);  // streamed once
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 xr = __ldg(xv + r * vecs + v + 32 * u);
#pragma unroll
        for (int f = 0; f < kFeaturesPerWarp; ++f) Accumulate(wv[f][u], xr, acc[f][r]);
      }
    }
  }
  for (; v < vecs; v += 32) {
#pragma unroll
    for (int f = 0; f < kFeaturesPerWarp; ++f) {
      const uint4 wv = __ldcs(wrow[f] + v);
#pragma unroll
      for (int r = 0; r < R; ++r) Accumulate(wv, __ldg(xv + r * vecs + v), acc[f][r]);
    }
  }
#pragma unroll
  for (int f = 0; f < kFeaturesPerWarp; ++f) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = WarpSum(acc[f][r]);
      if (lane == 0 && f0 + f < out) {
        if (out_f32) {
          out_f32[r * out + f0 + f] = s;
        } else {
          out_bf16[r * out + f0 + f] = ToBf16(s);
        }
      }
    }
  }
}

template <int R>
cudaError_t Launch(const bf16* x, const bf16* w, bf16* ob, float* of, int64_t in, int64_t out, cudaStream_t stream) {
  const int64_t per_block = kWarpsPerBlock * kFeaturesPerWarp;
  GemvKernel<R><<<CeilDiv(out, per_block), kWarpsPerBlock * 32, 0, stream>>>(x, w, ob, of, in, out);
  return cudaGetLastError();
}

}  // namespace

bool GemvSupported(int64_t rows, int64_t in, const void* x, const void* w) {
  return rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t LaunchGemv(const bf16* x, const bf16* w, bf16* ob, float* of, int64_t rows, int64_t in, int64_t out,
                       cudaStream_t stream) {
  if (!GemvSupported(rows, in, x, w) || (ob == nullptr) == (of == nullptr)) return cudaErrorInvalidValue;
  switch (rows) {
    case 1: return Launch<1>(x, w, ob, of, in, out, stream);
    case 2: return Launch<2>(x, w, ob, of, in, out, stream);
    case 3: return Launch<3>(x, w, ob, of, in, out, stream);
    case 4: return Launch<4>(x, w, ob, of, in, out, stream);
    case 5: return Launch<5>(x, w, ob, of, in, out, stream);
    case 6: return Launch<6>(x, w, ob, of, in, out, stream);
    case 7: return Launch<7>(x, w, ob, of, in, out, stream);
    default: return Launch<8>(x, w, ob, of, in, out, stream);
  }
}

}  // namespace oasis::kernels

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/gemv.h"

namespace oasis::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kFeaturesPerBlock = 4;  // 16-byte weight loads in flight per thread: 4 per K step

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

// One CTA computes kFeaturesPerBlock output features for all R rows; its 256 threads split
// the K dimension (16-byte vectors, strided), so even narrow layers launch enough CTAs to
// keep every SM streaming; partial sums are reduced through shared memory.
template <int R>
__global__ void __launch_bounds__(kThreads)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* out_bf16, float* out_f32, int64_t in,
               int64_t out) {
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kFeaturesPerBlock;
  const int64_t vecs = in / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* wrow[kFeaturesPerBlock];
#pragma unroll
  for (int f = 0; f < kFeaturesPerBlock; ++f) {
    const int64_t feat = f0 + f < out ? f0 + f : out - 1;  // clamp: computed, never written
    wrow[f] = reinterpret_cast<const uint4*>(w + feat * in);
  }
  float acc[kFeaturesPerBlock][R];
#pragma unroll
  for (int f = 0; f < kFeaturesPerBlock; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;
  // The first weight vectors (constant data) are loaded before waiting for the kernel that
  // produces x (PDL launch), overlapping its tail.
  int64_t v = threadIdx.x;
  uint4 wa[kFeaturesPerBlock], wb[kFeaturesPerBlock];
  if (v + kThreads < vecs) {
#pragma unroll
    for (int f = 0; f < kFeaturesPerBlock; ++f) {
      wa[f] = __ldcs(wrow[f] + v);
      wb[f] = __ldcs(wrow[f] + v + kThreads);
    }
  }
  GridDependencyWait();
  AllowDependentLaunch();
  for (; v + kThreads < vecs; v += 2 * kThreads) {  // two K steps per iteration: 8 loads in flight
    if (v != threadIdx.x) {
#pragma unroll
      for (int f = 0; f < kFeaturesPerBlock; ++f) {
        wa[f] = __ldcs(wrow[f] + v);
        wb[f] = __ldcs(wrow[f] + v + kThreads);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xa = __ldg(xv + r * vecs + v), xb = __ldg(xv + r * vecs + v + kThreads);
#pragma unroll
      for (int f = 0; f < kFeaturesPerBlock; ++f) {
        Accumulate(wa[f], xa, acc[f][r]);
        Accumulate(wb[f], xb, acc[f][r]);
      }
    }
  }
  if (v < vecs) {
#pragma unroll
    for (int f = 0; f < kFeaturesPerBlock; ++f) {
      const uint4 wv = __ldcs(wrow[f] + v);
#pragma unroll
      for (int r = 0; r < R; ++r) Accumulate(wv, __ldg(xv + r * vecs + v), acc[f][r]);
    }
  }
  __shared__ float partial[kThreads / 32][kFeaturesPerBlock * R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int f = 0; f < kFeaturesPerBlock; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = WarpSum(acc[f][r]);
      if (lane == 0) partial[warp][f * R + r] = s;
    }
  __syncthreads();
  if (threadIdx.x < kFeaturesPerBlock * R) {
    const int f = threadIdx.x / R, r = threadIdx.x % R;
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kThreads / 32; ++wi) s += partial[wi][threadIdx.x];
    if (f0 + f < out) {
      if (out_f32) {
        out_f32[r * out + f0 + f] = s;
      } else {
        out_bf16[r * out + f0 + f] = ToBf16(s);
      }
    }
  }
}

template <int R>
cudaError_t Launch(const bf16* x, const bf16* w, bf16* ob, float* of, int64_t in, int64_t out, cudaStream_t stream) {
  return LaunchPdl(GemvKernel<R>, dim3(CeilDiv(out, kFeaturesPerBlock)), dim3(kThreads), 0, stream, x, w, ob, of, in,
                   out);
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
    default: return Launch<4>(x, w, ob, of, in, out, stream);
  }
}

}  // namespace oasis::kernels

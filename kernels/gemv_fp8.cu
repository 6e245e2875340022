// FP8-weight GEMV, the activation quantization of the block-scaled FP8 GEMM, and the FP8 normal
// fill (kernels/fp8_linear.h).
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/fp8_linear.h"

namespace oasis::kernels {
namespace {

// acc += Σ_j w[j] · xs[j] over one 16-byte vector of e4m3 weights (byte j = element j), in element
// order; the bytes are widened exactly (e4m3 → f16 → f32).
__device__ __forceinline__ void DotFp8x16(const uint4& wv, const float (&xs)[16], float& acc) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t lo, hi;
    E4M3x4ToF16x2(words[k], lo, hi);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    acc = fmaf(a.x, xs[4 * k + 0], acc);
    acc = fmaf(a.y, xs[4 * k + 1], acc);
    acc = fmaf(b.x, xs[4 * k + 2], acc);
    acc = fmaf(b.y, xs[4 * k + 3], acc);
  }
}

// 16 bf16 activations of row `xr` from vector v on, times the weight block's scale `s`.
__device__ __forceinline__ void ScaledX16(const bf16* __restrict__ xr, int64_t v, float s,
                                          float (&xs)[16]) {
  const uint4* p = reinterpret_cast<const uint4*>(xr + v * 16);
  const uint4 a = __ldg(p), b = __ldg(p + 1);
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[k]));
    xs[2 * k] = f.x * s;
    xs[2 * k + 1] = f.y * s;
  }
}

// A CTA of T threads computes F consecutive output features (a group; F divides 128, so the
// group lies in one block row of the scales) for R rows. Threads split the K dimension in 16-byte
// weight vectors (16 elements; a scale block spans 8 of them), U K-steps per iteration, U·F
// weight loads in flight per thread, loaded before waiting for the producer of x (PDL). Per
// vector, the R rows of x are read (L1/L2-resident), multiplied by the block's scale and dotted
// with the F weight vectors; partial sums are reduced over the CTA through shared memory.
template <int R, int F, int T, int U>
__global__ void __launch_bounds__(T)
    GemvFp8Kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                  const float* __restrict__ w_scales, bf16* out_bf16, float* out_f32, int64_t in,
                  int64_t out) {
  static_assert(kFp8Block % F == 0, "a group must not straddle scale blocks");
  const int64_t vecs = in / 16, kblocks = (in + kFp8Block - 1) / kFp8Block;
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * F;
  const uint4* wrow[F];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const int64_t feat = f0 + f < out ? f0 + f : out - 1;  // clamped: computed, never written
    wrow[f] = reinterpret_cast<const uint4*>(w + feat * in);
  }
  const float* srow = w_scales + (f0 / kFp8Block) * kblocks;
  uint4 wv[U][F];
  int64_t v = threadIdx.x;
  bool loaded = v + (U - 1) * T < vecs;
  if (loaded) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int f = 0; f < F; ++f) wv[u][f] = __ldcs(wrow[f] + v + u * T);
  }
  GridDependencyWait();
  AllowDependentLaunch();
  float acc[F][R];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;
  for (; v + (U - 1) * T < vecs; v += U * T) {
    if (!loaded) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int f = 0; f < F; ++f) wv[u][f] = __ldcs(wrow[f] + v + u * T);
    }
    loaded = false;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vu = v + u * T;
      const float s = __ldg(srow + (vu >> 3));  // 8 vectors of 16 per 128-column block
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xs[16];
        ScaledX16(x + r * in, vu, s, xs);
#pragma unroll
        for (int f = 0; f < F; ++f) DotFp8x16(wv[u][f], xs, acc[f][r]);
      }
    }
  }
  for (; v < vecs; v += T) {  // fewer than U K-steps left for this thread
    const float s = __ldg(srow + (v >> 3));
    uint4 w1[F];
#pragma unroll
    for (int f = 0; f < F; ++f) w1[f] = __ldcs(wrow[f] + v);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float xs[16];
      ScaledX16(x + r * in, v, s, xs);
#pragma unroll
      for (int f = 0; f < F; ++f) DotFp8x16(w1[f], xs, acc[f][r]);
    }
  }
  __shared__ float partial[T / 32][F * R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float s = WarpSum(acc[f][r]);
      if (lane == 0) partial[warp][f * R + r] = s;
    }
  __syncthreads();
  if (threadIdx.x < F * R) {
    const int f = threadIdx.x / R, r = threadIdx.x % R;
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < T / 32; ++wi) s += partial[wi][threadIdx.x];
    if (f0 + f < out) {
      if (out_f32) {
        out_f32[r * out + f0 + f] = s;
      } else {
        out_bf16[r * out + f0 + f] = ToBf16(s);
      }
    }
  }
}

// 8 features × 128 threads, 2 K-steps: 16 weight vectors (256 bytes) in flight per thread.
inline constexpr int kF = 8, kT = 128, kU = 2;

template <int R>
cudaError_t LaunchRows(const bf16* x, const uint8_t* w, const float* s, bf16* ob, float* of,
                       int64_t in, int64_t out, cudaStream_t stream) {
  const int64_t groups = (out + kF - 1) / kF;
  return LaunchPdl(GemvFp8Kernel<R, kF, kT, kU>, dim3(static_cast<unsigned>(groups)), dim3(kT), 0,
                   stream, x, w, s, ob, of, in, out);
}

// One warp per (row, group of 128 columns): 4 columns per lane.
__global__ void __launch_bounds__(256)
    QuantizeFp8GroupsKernel(const bf16* __restrict__ x, uint8_t* __restrict__ q, float* scales,
                            int64_t rows, int64_t padded_rows, int64_t in, int64_t scale_ld) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t groups = in / kFp8Block;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= padded_rows * groups) return;
  const int64_t r = item / groups, g = item % groups;
  const int64_t col = g * kFp8Block + lane * 4;
  uint32_t packed = 0;
  float scale = 1.0f;
  if (r < rows) {
    const uint2 raw = *reinterpret_cast<const uint2*>(x + r * in + col);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    const float amax = WarpMax(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))));
    scale = __fdiv_rn(amax, 448.0f);
    if (!(scale > 0.0f)) scale = 1.0f;
    packed = static_cast<uint32_t>(QuantizeE4M3(a.x, scale)) |
             static_cast<uint32_t>(QuantizeE4M3(a.y, scale)) << 8 |
             static_cast<uint32_t>(QuantizeE4M3(b.x, scale)) << 16 |
             static_cast<uint32_t>(QuantizeE4M3(b.y, scale)) << 24;
  }
  *reinterpret_cast<uint32_t*>(q + r * in + col) = packed;
  if (lane == 0) scales[g * scale_ld + r] = scale;
}

__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The value formula of FillNormalKernel (kernels/elementwise.cu), kept identical so that an F8
// fill is the e4m3 conversion of the F32 fill (tests/kernels/test_cuda_fp8_linear.cpp checks it).
__global__ void FillNormalFp8Kernel(uint8_t* t, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(r >> 40) + 0.5f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float x = stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    t[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  }
}

}  // namespace

bool GemvFp8Supported(int64_t rows, int64_t in, int64_t out, const void* x, const void* w,
                      const void* w_scales) {
  return rows >= 1 && out >= 1 && in >= 16 && in % 16 == 0 && Aligned16(x) && Aligned16(w) &&
         (reinterpret_cast<uintptr_t>(w_scales) & 3) == 0;
}

cudaError_t LaunchGemvFp8(const bf16* x, const uint8_t* w, const float* w_scales, bf16* out_bf16,
                          float* out_f32, int64_t rows, int64_t in, int64_t out,
                          cudaStream_t stream) {
  if (!GemvFp8Supported(rows, in, out, x, w, w_scales) ||
      (out_bf16 == nullptr) == (out_f32 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kGemvFp8MaxRows) {
    const int64_t n = std::min<int64_t>(kGemvFp8MaxRows, rows - r0);
    const bf16* xr = x + r0 * in;
    bf16* ob = out_bf16 ? out_bf16 + r0 * out : nullptr;
    float* of = out_f32 ? out_f32 + r0 * out : nullptr;
    cudaError_t err;
    switch (n) {
      case 1:
        err = LaunchRows<1>(xr, w, w_scales, ob, of, in, out, stream);
        break;
      case 2:
        err = LaunchRows<2>(xr, w, w_scales, ob, of, in, out, stream);
        break;
      case 3:
        err = LaunchRows<3>(xr, w, w_scales, ob, of, in, out, stream);
        break;
      default:
        err = LaunchRows<4>(xr, w, w_scales, ob, of, in, out, stream);
        break;
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t LaunchQuantizeFp8Groups(const bf16* x, uint8_t* q, float* scales, int64_t rows,
                                    int64_t padded_rows, int64_t in, int64_t scale_ld,
                                    cudaStream_t stream) {
  if (in % kFp8Block != 0 || rows < 0 || padded_rows < rows || scale_ld < padded_rows ||
      (reinterpret_cast<uintptr_t>(x) & 7) != 0 || (reinterpret_cast<uintptr_t>(q) & 3) != 0) {
    return cudaErrorInvalidValue;
  }
  if (padded_rows == 0) return cudaSuccess;
  const int64_t warps = padded_rows * (in / kFp8Block);
  return LaunchPdl(QuantizeFp8GroupsKernel, dim3(CeilDiv(warps, 8)), dim3(256), 0, stream, x, q,
                   scales, rows, padded_rows, in, scale_ld);
}

cudaError_t LaunchFillNormalFp8(uint8_t* t, int64_t n, uint64_t seed, float stddev,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillNormalFp8Kernel<<<std::min(CeilDiv(n, 256), 8192u), 256, 0, stream>>>(t, n, seed, stddev);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

// Shared device helpers for the kernels: bf16 <-> float, warp reductions, PDL launches. The PTX
// wrappers (cp.async, mma, mbarriers, TMA, griddepcontrol) are in kernels/ptx.cuh.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/tuning.h"
#include "kernels/ptx.cuh"

namespace oasis::kernels {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 ToBf16(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of `blockDim.x` threads (a multiple of 32, at most 1024). Every thread
// gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

// The current device's SM count, queried once per device (host; 0 when there is no device).
int DeviceSmCount();

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = GetTuning().pdl ? 1 : 0;  // OASIS_PDL=0 turns PDL off, for comparisons
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<KernelArgs>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Whether a pointer is 16-byte aligned (what 16-byte vector loads and cp.async need).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// acc += the dot product of 8 bf16 pairs, in element order (the dense and MoE GEMVs' summation
// order).
__device__ __forceinline__ void Dot8(const uint4& wv, const uint4& xv, float& acc) {
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

inline unsigned CeilDiv(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace oasis::kernels

// Shared device helpers for the kernels: bf16 <-> float, warp reductions, launch checks.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

// Programmatic dependent launch (Hopper). A kernel launched with LaunchPdl may be scheduled
// while the kernel before it in the stream is still finishing, so every such kernel calls
// GridDependencyWait() before it reads anything an earlier kernel writes or writes anything
// an earlier kernel may read (work on constant data — weights — may come first). Calling
// AllowDependentLaunch() lets the next PDL kernel be scheduled early; it is harmless when
// the next kernel is launched normally. Both are no-ops without a PDL launch.
__device__ __forceinline__ void GridDependencyWait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void AllowDependentLaunch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Whether LaunchPdl uses programmatic stream serialisation (OASIS_PDL=0 turns it off, for
// comparisons); read once.
bool PdlEnabled();

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PdlEnabled() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<KernelArgs>(args)...);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// mbarriers and 1-D bulk copies through the TMA (sm_90). `bar` and shared-memory operands are
// shared-state-space addresses (__cvta_generic_to_shared); bulk sizes and addresses are
// multiples of 16 bytes. Global operands may be mapped host memory.
__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {  // release, CTA scope
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and adds `bytes` to the phase's expected transaction count (the bulk loads' bytes).
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase with parity `parity` of the barrier has completed (acquire, CTA scope).
// On a fresh barrier, parity 1 names the phase "before" the first and returns at once.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// global -> shared, completing `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// shared -> global, in the current bulk group (BulkCommit, BulkWaitRead / BulkWait).
__device__ __forceinline__ void BulkStore(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Every committed bulk store has read its shared memory (which may then be overwritten).
__device__ __forceinline__ void BulkWaitRead() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Every committed bulk store is complete.
__device__ __forceinline__ void BulkWait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

inline unsigned CeilDiv(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace oasis::kernels

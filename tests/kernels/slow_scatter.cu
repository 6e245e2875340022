// A stand-in for a step's KV append in the GPU tests of kernels that read ahead of their PDL wait
// (DecodeAttentionParams::after_append): it lets the next kernel launch at once, spins, and only
// then writes its rows, so anything read before the wait still holds what was there before.
#include "slow_scatter.h"

#include "kernels/common.cuh"

namespace oasis::testing {
namespace {

__global__ void SlowScatterKernel(long long cycles, SlowScatterJob a, SlowScatterJob b,
                                  SlowScatterJob c) {
  kernels::GridDependencyWait();  // launched as a PDL kernel itself (below)
  kernels::AllowDependentLaunch();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  const SlowScatterJob jobs[3] = {a, b, c};
  for (const SlowScatterJob& job : jobs) {
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < job.n;
         i += int64_t{gridDim.x} * blockDim.x) {
      job.dst[job.dst_units ? job.dst_units[i] : i] = job.src[i];
    }
  }
}

}  // namespace

cudaError_t LaunchSlowScatter(long long cycles, const SlowScatterJob& a, const SlowScatterJob& b,
                              const SlowScatterJob& c, cudaStream_t stream) {
  // Its SMs configured for the most shared memory: a CTA of the next kernel that needs more
  // than an SM's current configuration waits until the SM is empty, so it would not start early.
  // (Asked for every kernel of a step, the same carveout made Qwen3-30B-A3B's batch-1 step 4%
  // slower on an H100: docs/benchmarks.md, forty-second session.)
  const cudaError_t err =
      cudaFuncSetAttribute(SlowScatterKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  // A programmatic dependent launch, as the kernels it stands in for are.
  return kernels::LaunchPdl(SlowScatterKernel, dim3(132), dim3(256), 0, stream, cycles, a, b, c);
}

}  // namespace oasis::testing

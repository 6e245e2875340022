// GPU: what programmatic dependent launch (kernels/common.cuh LaunchPdl) may and may not
// overlap. A PDL kernel reads, before and after its griddepcontrol.wait, a buffer that a
// host-to-device copy has just filled, right behind a long kernel that allows dependents to
// launch early. The copy must be visible even before the wait: the kernels that load
// constant data (weights) ahead of the wait rely on copies never being overlapped.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <vector>

#include "kernels/common.cuh"

using namespace oasis::kernels;

namespace {

__global__ void SlowKernel(long long cycles, int* sink) {
  AllowDependentLaunch();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

__global__ void ReaderKernel(const int* data, int n, int* before, int* after) {
  int v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v |= data[i];
  before[blockIdx.x * blockDim.x + threadIdx.x] = v;
  GridDependencyWait();
  int w = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) w |= data[i];
  after[blockIdx.x * blockDim.x + threadIdx.x] = w;
}

}  // namespace

TEST_CASE("a PDL kernel sees a preceding host-to-device copy before its wait", "[gpu][pdl]") {
  constexpr int kN = 1 << 20, kBlocks = 64, kThreads = 256;
  int *data, *before, *after, *sink, *host;
  REQUIRE(cudaMalloc(&data, kN * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&before, kBlocks * kThreads * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&after, kBlocks * kThreads * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMalloc(&sink, sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMallocHost(&host, kN * sizeof(int)) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  std::vector<int> b(kBlocks * kThreads), a(kBlocks * kThreads);
  int stale_before = 0, stale_after = 0;
  for (int iter = 0; iter < 50; ++iter) {
    const bool pinned = iter % 2 == 0;
    REQUIRE(cudaMemsetAsync(data, 0, kN * sizeof(int), stream) == cudaSuccess);
    std::vector<int> pageable;
    for (int i = 0; i < kN; ++i) host[i] = 1 << (iter % 16);
    if (!pinned) pageable.assign(host, host + kN);
    SlowKernel<<<132, 128, 0, stream>>>(200000, sink);  // ~0.1 ms
    REQUIRE(cudaMemcpyAsync(data, pinned ? static_cast<const void*>(host) : pageable.data(), kN * sizeof(int),
                            cudaMemcpyHostToDevice, stream) == cudaSuccess);
    REQUIRE(LaunchPdl(ReaderKernel, dim3(kBlocks), dim3(kThreads), 0, stream, static_cast<const int*>(data), kN,
                      before, after) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(b.data(), before, b.size() * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(a.data(), after, a.size() * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    const int want = 1 << (iter % 16);
    for (size_t i = 0; i < b.size(); ++i) {
      stale_before += b[i] != want;
      stale_after += a[i] != want;
    }
  }
  CHECK(stale_after == 0);
  CHECK(stale_before == 0);
  cudaFreeHost(host);
  cudaFree(data);
  cudaFree(before);
  cudaFree(after);
  cudaFree(sink);
  cudaStreamDestroy(stream);
}

namespace {

__device__ __forceinline__ unsigned long long GlobalTimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Allows its dependents at its start (after its own wait when PDL-launched), spins, then
// records when it ended.
__global__ void TimedSlowKernel(long long cycles, unsigned long long* end) {
  GridDependencyWait();
  AllowDependentLaunch();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(end, GlobalTimer());
}

// Records when its first thread started, before waiting.
__global__ void TimedReaderKernel(unsigned long long* start) {
  if (threadIdx.x == 0) atomicMin(start, GlobalTimer());
  GridDependencyWait();
}

}  // namespace

TEST_CASE("a PDL kernel starts while the kernel ahead of it, which allowed it, still runs", "[gpu][pdl]") {
  // What the kernels that read ahead of their wait (and their tests' stand-ins) rely on: with
  // the attribute, the next kernel's CTAs run before the one ahead ends — whether that one was
  // launched plainly or as a PDL kernel itself.
  unsigned long long *times, host[2];
  REQUIRE(cudaMalloc(&times, 2 * sizeof(unsigned long long)) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  // Each kernel launched once first: a kernel's first launch loads its module (lazy loading),
  // which does not overlap.
  TimedSlowKernel<<<1, 32, 0, stream>>>(1LL, times);
  TimedReaderKernel<<<1, 32, 0, stream>>>(times + 1);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  for (int pdl_ahead = 0; pdl_ahead < 2; ++pdl_ahead) {
    int early = 0;
    for (int iter = 0; iter < 10; ++iter) {
      host[0] = 0, host[1] = ~0ull;
      REQUIRE(cudaMemcpy(times, host, sizeof(host), cudaMemcpyHostToDevice) == cudaSuccess);
      if (pdl_ahead) {
        REQUIRE(LaunchPdl(TimedSlowKernel, dim3(132), dim3(256), 0, stream, 400000LL, times) == cudaSuccess);
      } else {
        TimedSlowKernel<<<132, 256, 0, stream>>>(400000LL, times);
      }
      REQUIRE(LaunchPdl(TimedReaderKernel, dim3(4), dim3(128), 0, stream, times + 1) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
      REQUIRE(cudaMemcpy(host, times, sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess);
      early += host[1] < host[0];
    }
    INFO("kernel ahead launched " << (pdl_ahead ? "as a PDL kernel" : "plainly"));
    CHECK(early == 10);
  }
  cudaFree(times);
  cudaStreamDestroy(stream);
}

// GPU: the CUDA RAII wrappers move data host -> device -> host through pinned memory.
#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <vector>

#include "common/cuda_rt.h"

using namespace oasis;

TEST_CASE("pinned -> device -> pinned round trip on a stream", "[gpu]") {
  const size_t n = 1 << 20;
  auto pinned = cuda::PinnedBuffer::Allocate(n * sizeof(int));
  auto device = cuda::DeviceBuffer::Allocate(n * sizeof(int));
  auto back = cuda::PinnedBuffer::Allocate(n * sizeof(int));
  REQUIRE(pinned.ok());
  REQUIRE(device.ok());
  REQUIRE(back.ok());
  std::iota(pinned->as<int>(), pinned->as<int>() + n, 7);
  std::memset(back->data(), 0xff, n * sizeof(int));
  cuda::Stream stream;
  cuda::Event start(cuda::EventTiming::kEnabled), stop(cuda::EventTiming::kEnabled);
  start.Record(stream.get());
  OASIS_CUDA_CHECK(cudaMemcpyAsync(device->data(), pinned->data(), n * sizeof(int),
                                   cudaMemcpyHostToDevice, stream.get()));
  OASIS_CUDA_CHECK(cudaMemcpyAsync(back->data(), device->data(), n * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream.get()));
  stop.Record(stream.get());
  stop.Synchronize();
  CHECK(stop.ElapsedMsSince(start) >= 0.0f);
  CHECK(std::memcmp(pinned->data(), back->data(), n * sizeof(int)) == 0);
}

TEST_CASE("an impossible allocation is a ResourceExhausted status", "[gpu]") {
  auto huge = cuda::DeviceBuffer::Allocate(size_t{1} << 50);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
}

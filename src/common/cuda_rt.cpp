#include "common/cuda_rt.h"

#include <algorithm>
#include <utility>

namespace oasis::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

size_t MinDeviceTotalMemory(int count) {
  size_t least = 0;
  for (int d = 0; d < std::min(count, DeviceCount()); ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    least = d == 0 ? prop.totalGlobalMem : std::min(least, prop.totalGlobalMem);
  }
  return least;
}

Status ToStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg = what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhausted(msg);
  return Internal(msg);
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  cudaError_t err = cudaMalloc(&b.ptr_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return ToStatus(err, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  cudaError_t err = cudaHostAlloc(&b.ptr_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return ToStatus(err, "cudaHostAlloc(" + std::to_string(bytes) + " bytes)");
  }
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Stream::Stream() : Stream(StreamPriority::kDefault) {}
Stream::Stream(StreamPriority priority) {
  if (priority == StreamPriority::kDefault) {
    OASIS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return;
  }
  int least = 0, greatest = 0;  // numerically, the greatest priority is the lowest value
  OASIS_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  OASIS_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
}
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
Stream::Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}
void Stream::Synchronize() const { OASIS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
void Stream::Wait(cudaEvent_t event) const {
  OASIS_CUDA_CHECK(cudaStreamWaitEvent(stream_, event, 0));
}

Event::Event(EventTiming timing) {
  unsigned flags = timing == EventTiming::kEnabled ? cudaEventDefault : cudaEventDisableTiming;
  OASIS_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags));
}
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_) cudaEventDestroy(event_);
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}
void Event::Record(cudaStream_t stream) const { OASIS_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::Synchronize() const { OASIS_CUDA_CHECK(cudaEventSynchronize(event_)); }
float Event::ElapsedMsSince(const Event& start) const {
  float ms = 0;
  OASIS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace oasis::cuda

// RAII wrappers for CUDA runtime objects: device and pinned host buffers, streams, events,
// and the CUDA error checks every launch uses. Only compiled when OASIS_CUDA is on.
//
// Each wrapper owns exactly one CUDA object, is move-only, and releases it in its
// destructor. None is thread-safe; a wrapper may be moved between threads.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/check.h"
#include "oasis/status.h"

// Broken invariant when a CUDA call fails (launch configuration bugs, lost device).
#define OASIS_CUDA_CHECK(expr)                                          \
  do {                                                                  \
    cudaError_t oasis_cuda_err_ = (expr);                               \
    OASIS_CHECK(oasis_cuda_err_ == cudaSuccess)                         \
        << #expr << " -> " << cudaGetErrorName(oasis_cuda_err_) << ": " \
        << cudaGetErrorString(oasis_cuda_err_);                         \
  } while (0)

namespace oasis::cuda {

// Number of CUDA devices visible, 0 when there is no driver or no device.
int DeviceCount();

// The smallest total memory of devices 0..count-1 (bytes), 0 when none can be queried.
size_t MinDeviceTotalMemory(int count);

// Converts a CUDA error to a Status (for recoverable failures such as out of memory).
Status ToStatus(cudaError_t err, const std::string& what);

// Device memory from cudaMalloc.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory from cudaHostAlloc, mapped into the device address space
// (cudaHostAllocMapped), so kernels can read it directly through UVA.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static StatusOr<PinnedBuffer> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// How a stream's work is scheduled against other streams' (cudaStreamCreateWithPriority): kGreatest
// is the device's greatest priority (cudaDeviceGetStreamPriorityRange), so its pending CTAs are
// started ahead of those of lower-priority streams as SMs free up.
enum class StreamPriority { kDefault, kGreatest };

// A non-blocking stream (never synchronises with the legacy default stream).
class Stream {
 public:
  Stream();
  explicit Stream(StreamPriority priority);
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  void Synchronize() const;
  // Makes this stream wait for `event` (no host synchronisation).
  void Wait(cudaEvent_t event) const;

 private:
  cudaStream_t stream_ = nullptr;
};

// An event; timing is enabled only when asked for (timing events are slower to record).
enum class EventTiming { kDisabled, kEnabled };

class Event {
 public:
  explicit Event(EventTiming timing = EventTiming::kDisabled);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void Record(cudaStream_t stream) const;
  void Synchronize() const;
  // Milliseconds between `start` and this event (both recorded with timing enabled).
  float ElapsedMsSince(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace oasis::cuda

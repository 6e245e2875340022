// Host helpers of kernels/common.cuh's launches.
#include <array>
#include <atomic>

#include "kernels/common.cuh"

namespace oasis::kernels {

int DeviceSmCount() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> sms{};  // 0: not asked yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  int n = sms[dev].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
    sms[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace oasis::kernels

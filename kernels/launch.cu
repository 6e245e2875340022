// Host helpers of kernels/common.cuh's launches.
#include <array>
#include <atomic>
#include <mutex>
#include <set>
#include <utility>

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

cudaError_t PreferMaxSharedCarveout(const void* kernel) {
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> done;  // (device, kernel)
  int dev = 0;
  if (const cudaError_t err = cudaGetDevice(&dev); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.emplace(dev, kernel).second) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) done.erase({dev, kernel});
  return err;
}

}  // namespace oasis::kernels

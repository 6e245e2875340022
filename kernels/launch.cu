// Host helpers of kernels/common.cuh's launches.
#include <mutex>
#include <set>
#include <utility>

#include "kernels/common.cuh"

namespace oasis::kernels {

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

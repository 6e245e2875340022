// LaunchSlowScatter: a kernel that allows the next (PDL) kernel to launch at once, spins for
// `cycles`, then writes dst[dst_units[i]] = src[i] (dst[i] when dst_units is null) for each
// job's n 16-byte units. Tests of kernels that read ahead of their PDL wait launch it right
// before them: what they read early must not be what it writes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::testing {

struct SlowScatterJob {
  const uint4* src = nullptr;
  uint4* dst = nullptr;
  const int64_t* dst_units = nullptr;  // device; null: the identity
  int64_t n = 0;
};

cudaError_t LaunchSlowScatter(long long cycles, const SlowScatterJob& a, const SlowScatterJob& b,
                              const SlowScatterJob& c, cudaStream_t stream);

}  // namespace oasis::testing

#include "kernels/common.cuh"
#include "kernels/norm.h"

namespace oasis::kernels {
namespace {

// residual_in/residual_out: both null (norm of x), equal (in-place add), or distinct.
__global__ void RmsNormKernel(const bf16* x, const bf16* residual_in, bf16* residual,
                              const bf16* weight, bf16* out, int64_t n, float eps) {
  __shared__ float scratch[32];
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * n;
  const bf16* ri = residual_in ? residual_in + row * n : nullptr;
  bf16* rr = residual ? residual + row * n : nullptr;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = ToFloat(xr[i]);
    if (rr) {
      const bf16 s = ToBf16(ToFloat(ri[i]) + v);
      rr[i] = s;
      v = ToFloat(s);
    }
    sum += v * v;
  }
  sum = BlockSum(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(n) + eps);
  const bf16* src = rr ? rr : xr;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float normed = ToFloat(ToBf16(ToFloat(src[i]) * inv));
    out[row * n + i] = ToBf16(ToFloat(weight[i]) * normed);
  }
}

// The same with 8 elements per thread in registers (n % 8 == 0, n / 8 <= 1024 threads): one
// 16-byte load of each input, no second pass over memory. Same roundings as RmsNormKernel.
__global__ void RmsNormVec8Kernel(const bf16* x, const bf16* residual_in, bf16* residual,
                                  const bf16* weight, bf16* out, int64_t n, float eps) {
  __shared__ float scratch[32];
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t row = blockIdx.x;
  const int64_t i = static_cast<int64_t>(threadIdx.x) * 8;
  const bool active = i < n;
  float v[8];
  float sum = 0.0f;
  if (active) {
    uint4 xv = *reinterpret_cast<const uint4*>(x + row * n + i);
    const bf16* xe = reinterpret_cast<const bf16*>(&xv);
    for (int j = 0; j < 8; ++j) v[j] = ToFloat(xe[j]);
    if (residual) {
      uint4 rv = *reinterpret_cast<const uint4*>(residual_in + row * n + i);
      const bf16* re = reinterpret_cast<const bf16*>(&rv);
      uint4 sv;
      bf16* se = reinterpret_cast<bf16*>(&sv);
      for (int j = 0; j < 8; ++j) {
        se[j] = ToBf16(ToFloat(re[j]) + v[j]);
        v[j] = ToFloat(se[j]);
      }
      *reinterpret_cast<uint4*>(residual + row * n + i) = sv;
    }
    for (int j = 0; j < 8; ++j) sum += v[j] * v[j];
  }
  sum = BlockSum(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(n) + eps);
  if (!active) return;
  const uint4 wv = *reinterpret_cast<const uint4*>(weight + i);
  const bf16* we = reinterpret_cast<const bf16*>(&wv);
  uint4 ov;
  bf16* oe = reinterpret_cast<bf16*>(&ov);
  for (int j = 0; j < 8; ++j) oe[j] = ToBf16(ToFloat(we[j]) * ToFloat(ToBf16(v[j] * inv)));
  *reinterpret_cast<uint4*>(out + row * n + i) = ov;
}

bool Vec8(const void* a, const void* b, const void* c, const void* d, const void* e, int64_t n) {
  for (const void* p : {a, b, c, d, e}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return n % 8 == 0 && n / 8 <= 1024;
}

int Vec8Threads(int64_t n) { return static_cast<int>((n / 8 + 31) / 32 * 32); }

}  // namespace

cudaError_t LaunchRmsNorm(const bf16* x, bf16* residual, const bf16* weight, bf16* out,
                          int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (Vec8(x, residual, weight, out, nullptr, n)) {
    return LaunchPdl(RmsNormVec8Kernel, dim3(static_cast<unsigned>(rows)), dim3(Vec8Threads(n)), 0,
                     stream, x, static_cast<const bf16*>(residual), residual, weight, out, n, eps);
  }
  const int threads = n >= 1024 ? 1024 : ((static_cast<int>(n) + 31) / 32) * 32;
  return LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream, x,
                   static_cast<const bf16*>(residual), residual, weight, out, n, eps);
}

cudaError_t LaunchAddRmsNorm(const bf16* x, const bf16* residual, bf16* residual_out,
                             const bf16* weight, bf16* out, int64_t rows, int64_t n, float eps,
                             cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (residual == nullptr || residual_out == nullptr || residual_out == residual ||
      residual_out == x) {
    return cudaErrorInvalidValue;
  }
  if (Vec8(x, residual, residual_out, weight, out, n)) {
    return LaunchPdl(RmsNormVec8Kernel, dim3(static_cast<unsigned>(rows)), dim3(Vec8Threads(n)), 0,
                     stream, x, residual, residual_out, weight, out, n, eps);
  }
  const int threads = n >= 1024 ? 1024 : ((static_cast<int>(n) + 31) / 32) * 32;
  return LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream, x,
                   residual, residual_out, weight, out, n, eps);
}

}  // namespace oasis::kernels

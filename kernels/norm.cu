#include "kernels/common.cuh"
#include "kernels/norm.h"

namespace oasis::kernels {
namespace {

// residual_in/residual_out: both null (norm of x), equal (in-place add), or distinct.
__global__ void RmsNormKernel(const bf16* x, const bf16* residual_in, bf16* residual, const bf16* weight, bf16* out,
                              int64_t n, float eps) {
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

}  // namespace

cudaError_t LaunchRmsNorm(const bf16* x, bf16* residual, const bf16* weight, bf16* out, int64_t rows, int64_t n,
                          float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const int threads = n >= 1024 ? 1024 : ((static_cast<int>(n) + 31) / 32) * 32;
  return LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream, x,
                   static_cast<const bf16*>(residual), residual, weight, out, n, eps);
}

cudaError_t LaunchAddRmsNorm(const bf16* x, const bf16* residual, bf16* residual_out, const bf16* weight, bf16* out,
                             int64_t rows, int64_t n, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (residual == nullptr || residual_out == nullptr || residual_out == residual || residual_out == x) {
    return cudaErrorInvalidValue;
  }
  const int threads = n >= 1024 ? 1024 : ((static_cast<int>(n) + 31) / 32) * 32;
  return LaunchPdl(RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream, x, residual,
                   residual_out, weight, out, n, eps);
}

}  // namespace oasis::kernels

#include "kernels/common.cuh"
#include "kernels/elementwise.h"

namespace oasis::kernels {
namespace {

__global__ void EmbeddingKernel(const int32_t* ids, const bf16* table, bf16* out, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const bf16* src = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = src[i];
}

__global__ void AddKernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = ToBf16(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

__global__ void SiluMulKernel(const bf16* gate_up, bf16* out, int64_t inter) {
  const int64_t r = blockIdx.y;
  const bf16* g = gate_up + r * 2 * inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < inter; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(g[i]);
    const float silu = x / (1.0f + __expf(-x));
    out[r * inter + i] = ToBf16(ToFloat(ToBf16(silu)) * ToFloat(g[inter + i]));
  }
}

__global__ void SplitQkvKernel(const bf16* qkv, bf16* q, bf16* k, bf16* v, int64_t nq, int64_t nk, int64_t nv) {
  const int64_t t = blockIdx.x, width = nq + nk + nv;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const bf16 x = qkv[t * width + i];
    if (i < nq) {
      q[t * nq + i] = x;
    } else if (i < nq + nk) {
      k[t * nk + i - nq] = x;
    } else {
      v[t * nv + i - nq - nk] = x;
    }
  }
}

__global__ void GatherRowsKernel(const char* x, const int32_t* rows, char* out, int64_t row_bytes) {
  const int64_t i = blockIdx.x;
  const char* src = x + static_cast<int64_t>(rows[i]) * row_bytes;
  for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) out[i * row_bytes + b] = src[b];
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* ids, const bf16* table, bf16* out, int64_t tokens, int64_t hidden,
                            cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  EmbeddingKernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(ids, table, out, hidden);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<std::min(CeilDiv(n, 256), 4096u), 256, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const bf16* gate_up, bf16* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  dim3 grid(std::min(CeilDiv(inter, 256), 64u), static_cast<unsigned>(rows));
  SiluMulKernel<<<grid, 256, 0, stream>>>(gate_up, out, inter);
  return cudaGetLastError();
}

cudaError_t LaunchSplitQkv(const bf16* qkv, bf16* q, bf16* k, bf16* v, int64_t tokens, int64_t nq, int64_t nk,
                           int64_t nv, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  SplitQkvKernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(qkv, q, k, v, nq, nk, nv);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRows(const void* x, const int32_t* rows, void* out, int64_t num_rows, int64_t row_bytes,
                             cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  GatherRowsKernel<<<static_cast<unsigned>(num_rows), 256, 0, stream>>>(static_cast<const char*>(x), rows,
                                                                        static_cast<char*>(out), row_bytes);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

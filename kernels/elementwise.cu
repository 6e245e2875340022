#include <algorithm>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/elementwise.h"

namespace oasis::kernels {
namespace {

__global__ void EmbeddingKernel(const int32_t* ids, const bf16* table, bf16* out, int64_t hidden) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t t = blockIdx.x;
  const bf16* src = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = src[i];
}

__global__ void AddKernel(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = ToBf16(ToFloat(a[i]) + ToFloat(b[i]));
  }
}

__global__ void SiluMulKernel(const bf16* gate_up, bf16* out, int64_t inter) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t r = blockIdx.y;
  const bf16* g = gate_up + r * 2 * inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = ToFloat(g[i]);
    const float silu = x / (1.0f + __expf(-x));
    out[r * inter + i] = ToBf16(ToFloat(ToBf16(silu)) * ToFloat(g[inter + i]));
  }
}

// Eight elements a thread in 16-byte vectors (rows of inter % 8 == 0, 16-byte aligned): the
// scalar kernel's one 2-byte element a thread left the batch-64 step's 128-row SiLU·mul at
// ~0.9 TB/s. Same rounding as SiluMulKernel, element for element.
__global__ void SiluMulVec8Kernel(const bf16* gate_up, bf16* out, int64_t inter) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t r = blockIdx.y, vecs = inter / 8;
  const uint4* g = reinterpret_cast<const uint4*>(gate_up + r * 2 * inter);
  const uint4* u = g + vecs;
  uint4* o = reinterpret_cast<uint4*>(out + r * inter);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < vecs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 gv = g[i], uv = u[i];
    uint4 ov;
    const bf16* gp = reinterpret_cast<const bf16*>(&gv);
    const bf16* up = reinterpret_cast<const bf16*>(&uv);
    bf16* op = reinterpret_cast<bf16*>(&ov);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float x = ToFloat(gp[j]);
      const float silu = x / (1.0f + __expf(-x));
      op[j] = ToBf16(ToFloat(ToBf16(silu)) * ToFloat(up[j]));
    }
    o[i] = ov;
  }
}

__global__ void SplitQkvKernel(const bf16* qkv, bf16* q, bf16* k, bf16* v, int64_t nq, int64_t nk,
                               int64_t nv) {
  const int64_t t = blockIdx.y, width = nq + nk + nv;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < width;
       i += int64_t{gridDim.x} * blockDim.x) {
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

// Copies rows in units of T (16 bytes when rows are 16-byte aligned, else 1 byte): gather
// out[i] = x[rows[i]], or scatter out[rows[i]] = x[i].
template <typename T, bool kScatter>
__global__ void MoveRowsKernel(const T* x, const int32_t* rows, T* out, int64_t row_units) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t i = blockIdx.y;
  const T* src = x + (kScatter ? i : static_cast<int64_t>(rows[i])) * row_units;
  T* dst = out + (kScatter ? static_cast<int64_t>(rows[i]) : i) * row_units;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < row_units;
       b += int64_t{gridDim.x} * blockDim.x) {
    dst[b] = src[b];
  }
}

__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void FillNormalKernel(T* t, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
    const float u1 = (static_cast<float>(r >> 40) + 0.5f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float x = stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    if constexpr (sizeof(T) == 2)
      t[i] = ToBf16(x);
    else
      t[i] = x;
  }
}

template <typename T>
__global__ void FillKernel(T* t, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if constexpr (sizeof(T) == 2)
      t[i] = ToBf16(value);
    else
      t[i] = value;
  }
}

}  // namespace

cudaError_t LaunchFillNormal(bf16* t, int64_t n, uint64_t seed, float stddev, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillNormalKernel<<<std::min(CeilDiv(n, 256), 8192u), 256, 0, stream>>>(t, n, seed, stddev);
  return cudaGetLastError();
}
cudaError_t LaunchFillNormalF32(float* t, int64_t n, uint64_t seed, float stddev,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillNormalKernel<<<std::min(CeilDiv(n, 256), 8192u), 256, 0, stream>>>(t, n, seed, stddev);
  return cudaGetLastError();
}
cudaError_t LaunchFill(bf16* t, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<std::min(CeilDiv(n, 256), 8192u), 256, 0, stream>>>(t, n, value);
  return cudaGetLastError();
}
cudaError_t LaunchFillF32(float* t, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<std::min(CeilDiv(n, 256), 8192u), 256, 0, stream>>>(t, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const int32_t* ids, const bf16* table, bf16* out, int64_t tokens,
                            int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return LaunchPdl(EmbeddingKernel, dim3(static_cast<unsigned>(tokens)), dim3(256), 0, stream, ids,
                   table, out, hidden);
}

cudaError_t LaunchAdd(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<std::min(CeilDiv(n, 256), 4096u), 256, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

// The largest grid.y of a launch: the row-per-block launches below go in pieces past it.
constexpr int64_t kMaxGridY = 65535;

cudaError_t LaunchSiluMul(const bf16* gate_up, bf16* out, int64_t rows, int64_t inter,
                          cudaStream_t stream) {
  const bool vec8 = inter % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  // A launch covers at most kMaxGridY rows (grid.y's limit): long prefill chunks take several.
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridY) {
    const unsigned n = static_cast<unsigned>(std::min<int64_t>(rows - r0, kMaxGridY));
    const bf16* g = gate_up + r0 * 2 * inter;
    bf16* o = out + r0 * inter;
    const cudaError_t err =
        vec8 ? LaunchPdl(SiluMulVec8Kernel, dim3(std::min(CeilDiv(inter / 8, 256), 64u), n),
                         dim3(256), 0, stream, g, o, inter)
             : LaunchPdl(SiluMulKernel, dim3(std::min(CeilDiv(inter, 256), 64u), n), dim3(256), 0,
                         stream, g, o, inter);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t LaunchSplitQkv(const bf16* qkv, bf16* q, bf16* k, bf16* v, int64_t tokens, int64_t nq,
                           int64_t nk, int64_t nv, cudaStream_t stream) {
  for (int64_t t0 = 0; t0 < tokens; t0 += kMaxGridY) {
    const dim3 grid(CeilDiv(nq + nk + nv, 256),
                    static_cast<unsigned>(std::min<int64_t>(tokens - t0, kMaxGridY)));
    SplitQkvKernel<<<grid, 256, 0, stream>>>(qkv + t0 * (nq + nk + nv), q + t0 * nq, k + t0 * nk,
                                             v + t0 * nv, nq, nk, nv);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

namespace {

template <bool kScatter>
cudaError_t LaunchMoveRows(const void* x, const int32_t* rows, void* out, int64_t num_rows,
                           int64_t row_bytes, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t units = vec ? row_bytes / 16 : row_bytes;
  dim3 grid(std::min(CeilDiv(units, 256), 64u), static_cast<unsigned>(num_rows));
  if (vec) {
    return LaunchPdl(MoveRowsKernel<uint4, kScatter>, grid, dim3(256), 0, stream,
                     static_cast<const uint4*>(x), rows, static_cast<uint4*>(out), units);
  }
  return LaunchPdl(MoveRowsKernel<char, kScatter>, grid, dim3(256), 0, stream,
                   static_cast<const char*>(x), rows, static_cast<char*>(out), units);
}

}  // namespace

cudaError_t LaunchGatherRows(const void* x, const int32_t* rows, void* out, int64_t num_rows,
                             int64_t row_bytes, cudaStream_t stream) {
  return LaunchMoveRows<false>(x, rows, out, num_rows, row_bytes, stream);
}

cudaError_t LaunchScatterRows(const void* x, const int32_t* rows, void* out, int64_t num_rows,
                              int64_t row_bytes, cudaStream_t stream) {
  return LaunchMoveRows<true>(x, rows, out, num_rows, row_bytes, stream);
}

}  // namespace oasis::kernels

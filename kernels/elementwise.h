// Elementwise and copy kernels of the op set (bf16 activations). Each launcher takes raw
// device pointers, sizes and an explicit stream, and returns the launch error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

// out[t, :] = table[ids[t], :]
cudaError_t LaunchEmbedding(const int32_t* ids,          // [tokens]
                            const __nv_bfloat16* table,  // [vocab, hidden]
                            __nv_bfloat16* out,          // [tokens, hidden]
                            int64_t tokens, int64_t hidden, cudaStream_t stream);

// out = a + b (n elements)
cudaError_t LaunchAdd(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, int64_t n,
                      cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i], computed in float.
cudaError_t LaunchSiluMul(const __nv_bfloat16* gate_up,  // [rows, 2 * inter]
                          __nv_bfloat16* out,            // [rows, inter]
                          int64_t rows, int64_t inter, cudaStream_t stream);

// Splits rows of [q | k | v] into three contiguous tensors.
cudaError_t LaunchSplitQkv(const __nv_bfloat16* qkv,  // [tokens, nq + nk + nv]
                           __nv_bfloat16* q,          // [tokens, nq]
                           __nv_bfloat16* k,          // [tokens, nk]
                           __nv_bfloat16* v,          // [tokens, nv]
                           int64_t tokens, int64_t nq, int64_t nk, int64_t nv, cudaStream_t stream);

// out[i, :] = x[rows[i], :] (row_bytes per row, any dtype)
cudaError_t LaunchGatherRows(const void* x,        // [T, row_bytes]
                             const int32_t* rows,  // [num_rows]
                             void* out,            // [num_rows, row_bytes]
                             int64_t num_rows, int64_t row_bytes, cudaStream_t stream);

// out[rows[i], :] = x[i, :] (row_bytes per row, any dtype; rows distinct)
cudaError_t LaunchScatterRows(const void* x,        // [num_rows, row_bytes]
                              const int32_t* rows,  // [num_rows]
                              void* out,            // [M, row_bytes]
                              int64_t num_rows, int64_t row_bytes, cudaStream_t stream);

// t[i] = stddev * N(0,1) hashed from (seed, i) — the same values as oasis::HashNormal.
cudaError_t LaunchFillNormal(__nv_bfloat16* t, int64_t n, uint64_t seed, float stddev,
                             cudaStream_t stream);
cudaError_t LaunchFillNormalF32(float* t, int64_t n, uint64_t seed, float stddev,
                                cudaStream_t stream);
// t[i] = value
cudaError_t LaunchFill(__nv_bfloat16* t, int64_t n, float value, cudaStream_t stream);
cudaError_t LaunchFillF32(float* t, int64_t n, float value, cudaStream_t stream);

}  // namespace oasis::kernels

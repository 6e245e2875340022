// The model shapes the CUDA kernels compute (kernels/*.cu as dispatched by CudaBackend), checked
// when the CUDA backend loads a model or a draft head, before any weight is uploaded. Pure C++
// (no CUDA header): the CPU build compiles and tests it. docs/kernels/README.md has the table
// and where each limit comes from.
#pragma once

#include <cstdint>

#include "oasis/model_config.h"
#include "oasis/status.h"

namespace oasis {

// The limits (docs/kernels/README.md, "Model shapes").
inline constexpr int64_t kCudaMinHeadDim = 16;          // smallest head_dim verified on the H200
inline constexpr int64_t kCudaMaxHeadDim = 256;         // kernels/attention.cu kMaxDimPerLane · 32
inline constexpr int64_t kCudaHeadDimMultiple = 8;      // 16-byte rows of the KV pools
inline constexpr int64_t kCudaMaxGemmDim = 2147483647;  // cuBLAS and the sampler take int sizes
// Mixture of experts (kernels/moe.h MoeSupported): at most this many experts, hidden and each
// rank's moe_intermediate_size multiples of 8.
inline constexpr int64_t kCudaMoeMaxExperts = 1024;
inline constexpr int64_t kCudaMoeDimMultiple = 8;
// Sparse KV (kernels/sparse_score.cu ScoreBlocksSupported).
inline constexpr int64_t kCudaSparseMaxGroup = 16;

// OK when every kernel the CUDA backend runs for `config` (a decoder or an EAGLE-3 head) on
// one of `tp_size` tensor-parallel ranks computes it; otherwise Unimplemented naming the
// config value and the limit, ending in "use --backend cpu".
Status CheckCudaKernelShapes(const ModelConfig& config, int tp_size = 1);

// The sparse-KV kernels' extra limits (head_dim 32/64/128/256, query heads per KV head <= 16);
// checked when sparse decoding is enabled.
Status CheckCudaSparseShapes(const ModelConfig& config);

}  // namespace oasis

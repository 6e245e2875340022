// GemmTuner: the bf16 projections of decode-sized batches (more rows than the GEMV kernel
// takes, at most kMaxTunedRows) through cuBLASLt, with the algorithm timed fastest on this GPU
// for each shape. cuBLAS's default choice for memory-bound shapes is not always the fastest:
// on the H200 the Qwen3-8B gate/up projection at 128 rows (the lookahead step's stacked batch of
// 64 sequences) ran cuBLAS's pick at 3.4 TB/s against 3.8 TB/s at 64 rows (docs/benchmarks.md,
// 2026-11-30). The first eager call of a shape asks cuBLASLt's heuristic for up to
// kCandidates algorithms, times each on the stream (events, a few runs), and keeps the fastest
// for the rest of the process: one algorithm per shape, so CUDA graphs and eager steps compute
// the same. A shape first met inside a stream capture takes the heuristic's first choice (no
// timing is possible there) and keeps it. OASIS_GEMM_TUNE=0 turns the timing off (the
// heuristic's first choice everywhere).
//
// Thread-safe (a mutex around the plan cache); the workspace is the caller's cuBLAS workspace,
// used on the same stream.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace oasis {

class GemmTuner {
 public:
  static constexpr int64_t kMaxTunedRows = 512;
  static constexpr int kCandidates = 8;

  GemmTuner(void* workspace, size_t workspace_bytes);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // out[rows, n] (row-major, bf16 or f32) = x[rows, k] · w[n, k]ᵀ (bf16, row-major), fp32
  // accumulation. false: not handled here (rows beyond kMaxTunedRows, unaligned pointers or
  // sizes, no cuBLASLt algorithm): the caller runs cublasGemmEx instead.
  bool Run(const void* w, const void* x, void* out, cudaDataType_t out_type, int64_t rows, int64_t k, int64_t n,
           cudaStream_t stream);

  // What was chosen so far, a line per shape (for logs and benchmarks).
  std::string Describe() const;

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int>;  // rows, k, n, out type
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool tuned = false;
    int candidates = 0, chosen = 0;
    float heuristic_us = 0, chosen_us = 0;
  };
  bool MakePlan(const Key& key, const void* w, const void* x, void* out, cudaStream_t stream, Plan* plan);
  cublasStatus_t Launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x, void* out,
                        cudaStream_t stream) const;
  static void Destroy(Plan& p);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  bool tune_;
  mutable std::mutex mu_;
  std::map<Key, Plan> plans_;
  std::map<Key, bool> unsupported_;
};

}  // namespace oasis

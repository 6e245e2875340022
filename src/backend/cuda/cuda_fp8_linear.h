// CudaFp8Linear: Linear with an FP8 (e4m3) weight of 128×128 block scales on one GPU
// (docs/kernels/fp8_linear.md). Decode batches (rows <= kernels::kGemvFp8MaxRows) go to the
// FP8-weight GEMV (kernels/fp8_linear.h: bf16 activations, weights dequantized in registers);
// from 4 rows on (kAutoGemvRows) to cuBLASLt's block-scaled FP8 GEMM: the activations quantized per
// token and 128-column group (1×128, dynamic amax / 448) into a preallocated scratch, then
//   D[out, T] (column-major) = op(A = W, TRANSA = T, BLK128x128 scales) · (B = Xq, VEC128 scales)
// with f32 accumulation and a bf16 or f32 D.
//
// Owns a cuBLASLt handle, its workspace, the quantization scratch and the plans (descriptors and
// the heuristic's algorithm, per shape, output type and alignment). Everything is allocated at the
// first Supported() query that says yes (model load, outside any capture), so Linear neither
// allocates nor synchronises and is CUDA-graph capturable; a plan missing at capture time is
// built by a host-only heuristic query. Rows beyond the scratch run as several GEMMs. Not
// thread-safe: used by its CudaBackend's one thread; the scratch is shared by every call, so
// calls must not run concurrently on different streams.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "common/cuda_rt.h"
#include "oasis/tensor.h"

namespace oasis {

class CudaFp8Linear {
 public:
  CudaFp8Linear() = default;
  ~CudaFp8Linear();
  CudaFp8Linear(const CudaFp8Linear&) = delete;
  CudaFp8Linear& operator=(const CudaFp8Linear&) = delete;

  // Whether a weight [out, in] with block_out × block_in scales is computed here: blocks of
  // 128 × 128, out % 128 == 0, in % 512 == 0 (whole scale blocks, and rows of weight scales a
  // multiple of 4 floats as cuBLASLt reads them), both at most 2^30, and cuBLASLt offers a
  // block-scaled FP8 algorithm for this shape (probed once per shape; the first failure is
  // logged). Sets up the handle, workspace and scratch on the first yes. `stream` is the
  // backend's stream (allocations are ordered on it).
  bool Supported(int64_t out, int64_t in, int block_out, int block_in, cudaStream_t stream);

  // out = x · (w · scales)ᵀ. x: device bf16 [rows, in]; weight: device F8E4M3 [outf, in] with
  // block scales for which Supported() said yes (CHECKed); out: bf16 or f32 [rows, outf].
  // Rows up to which kAuto takes the GEMV: the GEMM needs multiples of 4 rows, and at 4 rows it
  // was as fast or faster on 3 of Qwen3-8B's 4 shapes (bench_fp8_gemm, H200, 2026-12-03).
  static constexpr int64_t kAutoGemvRows = 3;
  // `path`: kAuto picks by rows; kGemv forces the GEMV, kGemm the GEMM for every row it takes
  // (multiples of 4 rows; the last rows % 4 rows always run in the GEMV).
  enum class Path : uint8_t { kAuto, kGemv, kGemm };
  void Linear(const Tensor& x, const Tensor& weight, Tensor& out, cudaStream_t stream,
              Path path = Path::kAuto);

  // The GEMM's two steps on raw pointers (the benchmark times them like Linear does):
  // quantization into the scratch, then the cuBLASLt call. Returns false when cuBLASLt has no
  // algorithm for the shape or rows % 4 != 0 (nothing enqueued).
  bool Gemm(const void* x, const uint8_t* w, const float* w_scales, void* out, bool out_f32,
            int64_t rows, int64_t in, int64_t outf, cudaStream_t stream);

  // Whether cuBLASLt has a block-scaled algorithm for this case (256-byte aligned operands).
  bool GemmAvailable(int64_t outf, int64_t rows, int64_t in, bool out_f32);

  // Rows one GEMM takes at `in` columns (the scratch's capacity; more rows run as several).
  int64_t GemmChunkRows(int64_t in) const;

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  // (outf, rows, in, out_f32, alignment of the pointers in bytes)
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, int>;
  bool Init(cudaStream_t stream);
  const Plan& GetPlan(int64_t outf, int64_t rows, int64_t in, bool out_f32, int align);
  static void DestroyPlan(Plan& p);

  bool init_tried_ = false, init_ok_ = false;
  std::string init_error_;
  cublasLtHandle_t handle_ = nullptr;
  cuda::DeviceBuffer workspace_;  // cuBLASLt's (never allocates itself)
  cuda::DeviceBuffer scratch_;    // quantized activations, then their scales
  std::map<std::pair<int64_t, int64_t>, bool> supported_;  // (out, in) probed
  std::map<PlanKey, Plan> plans_;
  bool warned_ = false;
};

}  // namespace oasis

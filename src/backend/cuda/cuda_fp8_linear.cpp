#include "backend/cuda/cuda_fp8_linear.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "kernels/fp8_linear.h"

namespace oasis {
namespace {

using bf16 = __nv_bfloat16;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Quantized activations and their scales: 64 MiB holds 5,248 rows of 12,288 columns (Qwen3-8B's
// down projection) or 16,000 of 4,096 per GEMM.
constexpr size_t kScratchBytes = size_t{64} << 20;
constexpr int64_t kMaxDim = int64_t{1} << 30;

size_t QBytes(int64_t rows, int64_t in) {
  return (static_cast<size_t>(rows * in) + 255) / 256 * 256;
}

size_t ScratchBytes(int64_t rows, int64_t in) {
  return QBytes(rows, in) + static_cast<size_t>(in / kernels::kFp8Block * rows) * 4;
}

// The largest power of two (at most 256) dividing every address.
int CommonAlignment(std::initializer_list<const void*> ptrs) {
  uintptr_t bits = 256;
  for (const void* p : ptrs) bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<int>(bits & (~bits + 1));
}

const char* StatusName(cublasStatus_t st) { return cublasLtGetStatusName(st); }

}  // namespace

CudaFp8Linear::~CudaFp8Linear() {
  for (auto& [key, plan] : plans_) DestroyPlan(plan);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void CudaFp8Linear::DestroyPlan(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

bool CudaFp8Linear::Init(cudaStream_t stream) {
  if (init_tried_) return init_ok_;
  init_tried_ = true;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    init_error_ = "no CUDA device";
    return false;
  }
  if (major < 9) {  // cvt.rn.f16x2.e4m3x2 and cuBLASLt's block-scaled FP8 need Hopper
    init_error_ = "compute capability " + std::to_string(major) + ".x (FP8 needs 9.0)";
    return false;
  }
  if (const cublasStatus_t st = cublasLtCreate(&handle_); st != CUBLAS_STATUS_SUCCESS) {
    handle_ = nullptr;
    init_error_ = std::string("cublasLtCreate: ") + StatusName(st);
    return false;
  }
  // The backend's earlier work on `stream` may still use memory cudaMalloc could hand out again
  // only after a free; these are fresh allocations, so no ordering is needed beyond the device.
  (void)stream;
  auto ws = cuda::DeviceBuffer::Allocate(kWorkspaceBytes);
  auto scratch = cuda::DeviceBuffer::Allocate(kScratchBytes);
  if (!ws.ok() || !scratch.ok()) {
    init_error_ = "device memory for the FP8 GEMM workspace and scratch";
    return false;
  }
  workspace_ = std::move(*ws);
  scratch_ = std::move(*scratch);
  init_ok_ = true;
  return true;
}

int64_t CudaFp8Linear::GemmChunkRows(int64_t in) const {
  int64_t rows = static_cast<int64_t>((kScratchBytes - 4096) / (in + 4 * (in / 128) + 16));
  rows = rows / 128 * 128;
  return std::max<int64_t>(rows, 128);
}

const CudaFp8Linear::Plan& CudaFp8Linear::GetPlan(int64_t outf, int64_t rows, int64_t in,
                                                  bool out_f32, int align) {
  const PlanKey key{outf, rows, in, out_f32, align};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  const auto fail = [&](const char* what, cublasStatus_t st) -> const Plan& {
    if (!warned_) {
      spdlog::warn("FP8 GEMM (cuBLASLt, block scales) out {} rows {} in {} {}: {}: {}", outf, rows,
                   in, out_f32 ? "f32" : "bf16", what, StatusName(st));
      warned_ = true;
    }
    DestroyPlan(p);
    return plans_.emplace(key, Plan{}).first->second;
  };
  cublasStatus_t st = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescCreate", st);
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const void* placeholder = scratch_.data();  // real scale pointers are set per call
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t n) {
    return st == CUBLAS_STATUS_SUCCESS ? (st = cublasLtMatmulDescSetAttribute(p.desc, attr, v, n))
                                       : st;
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n);
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode);
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder, sizeof placeholder);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder, sizeof placeholder);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulDescSetAttribute", st);
  // Column-major views: A = W stored [in, outf] (ld in), used transposed; B = Xq [in, rows];
  // D = outᵀ [outf, rows].
  const cudaDataType_t d_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  st = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, in, outf, in);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, in, rows, in);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.d, d_type, outf, rows, outf);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatrixLayoutCreate", st);
  cublasLtMatmulPreference_t pref = nullptr;
  st = cublasLtMatmulPreferenceCreate(&pref);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulPreferenceCreate", st);
  const uint64_t ws_bytes = workspace_.size();
  const uint32_t al = static_cast<uint32_t>(align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof ws_bytes);
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return fail("cublasLtMatmulAlgoGetHeuristic", st);
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return fail("no algorithm", found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : result.state);
  }
  p.algo = result.algo;
  p.ok = true;
  return plans_.emplace(key, p).first->second;
}

bool CudaFp8Linear::Supported(int64_t out, int64_t in, int block_out, int block_in,
                              cudaStream_t stream) {
  if (block_out != kernels::kFp8Block || block_in != kernels::kFp8Block || out <= 0 || in <= 0 ||
      out % 128 != 0 || in % 512 != 0 || out > kMaxDim || in > kMaxDim) {
    return false;
  }
  const auto key = std::make_pair(out, in);
  if (auto it = supported_.find(key); it != supported_.end()) return it->second;
  bool ok = Init(stream);
  if (!ok) {
    if (!warned_) {
      spdlog::warn("FP8 weights are dequantized to bf16: {}", init_error_);
      warned_ = true;
    }
  } else {
    ok = GetPlan(out, 512, in, false, 256).ok;  // logs the first failure
  }
  supported_.emplace(key, ok);
  return ok;
}

bool CudaFp8Linear::Gemm(const void* x, const uint8_t* w, const float* w_scales, void* out,
                         bool out_f32, int64_t rows, int64_t in, int64_t outf,
                         cudaStream_t stream) {
  OASIS_CHECK(init_ok_) << "CudaFp8Linear::Gemm before a successful Supported()";
  if (rows <= 0 || rows % 4 != 0) return false;  // cuBLASLt's VEC128 operand: 4 | rows
  OASIS_CHECK_LE(ScratchBytes(rows, in), kScratchBytes) << "FP8 GEMM chunk of " << rows << " rows";
  auto* q = static_cast<uint8_t*>(scratch_.data());
  auto* scales = reinterpret_cast<float*>(static_cast<char*>(scratch_.data()) + QBytes(rows, in));
  const Plan& plan = GetPlan(outf, rows, in, out_f32, CommonAlignment({w, q, out}));
  if (!plan.ok) return false;
  OASIS_CUDA_CHECK(kernels::LaunchQuantizeFp8Groups(static_cast<const bf16*>(x), q, scales, rows,
                                                    rows, in, rows, stream));
  OASIS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                             &w_scales, sizeof w_scales) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                             &scales, sizeof scales) == CUBLAS_STATUS_SUCCESS)
      << "FP8 GEMM scale pointers";
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, q, plan.b, &beta, out, plan.d, out,
                     plan.d, &plan.algo, workspace_.data(), workspace_.size(), stream);
  OASIS_CHECK(st == CUBLAS_STATUS_SUCCESS)
      << "cublasLtMatmul (FP8, block scales) out " << outf << " rows " << rows << " in " << in
      << ": " << StatusName(st);
  return true;
}

void CudaFp8Linear::Linear(const Tensor& x, const Tensor& weight, Tensor& out, cudaStream_t stream,
                           Path path) {
  OASIS_CHECK(x.device() == Device::kCuda && x.dtype() == DType::kBF16)
      << "Linear x (FP8 weight): expected a device BF16 tensor, got " << x.ToString();
  OASIS_CHECK(weight.device() == Device::kCuda && weight.dtype() == DType::kF8E4M3 &&
              weight.ndim() == 2 && weight.block_scales() != nullptr &&
              weight.scale_block_rows() == kernels::kFp8Block &&
              weight.scale_block_cols() == kernels::kFp8Block)
      << "Linear: an F8_E4M3 weight needs 128x128 block scales, got " << weight.ToString();
  const Tensor& scales = *weight.block_scales();
  OASIS_CHECK(scales.device() == Device::kCuda && scales.dtype() == DType::kF32)
      << "Linear: FP8 weight scales " << scales.ToString();
  const int64_t in = weight.dim(1), outf = weight.dim(0), rows = x.numel() / in;
  OASIS_CHECK_EQ(x.dim(-1), in) << "Linear: x " << x.ToString() << " weight " << weight.ToString();
  OASIS_CHECK_EQ(out.numel(), rows * outf) << "Linear out";
  OASIS_CHECK(out.device() == Device::kCuda &&
              (out.dtype() == DType::kBF16 || out.dtype() == DType::kF32))
      << "Linear out dtype " << out.ToString();
  {
    auto it = supported_.find({outf, in});
    OASIS_CHECK(it != supported_.end() && it->second)
        << "Linear: FP8 weight " << weight.ToString()
        << " of a shape Fp8WeightSupported did not accept (it should have been dequantized)";
  }
  if (rows == 0) return;
  const bool f32 = out.dtype() == DType::kF32;
  const auto* w = static_cast<const uint8_t*>(weight.raw());
  const auto* ws = static_cast<const float*>(scales.raw());
  const auto gemv = [&](int64_t r0, int64_t n) {
    const auto* xr = static_cast<const bf16*>(x.raw()) + r0 * in;
    OASIS_CUDA_CHECK(kernels::LaunchGemvFp8(
        xr, w, ws, f32 ? nullptr : static_cast<bf16*>(out.raw()) + r0 * outf,
        f32 ? static_cast<float*>(out.raw()) + r0 * outf : nullptr, n, in, outf, stream));
  };
  const bool gemv_ok = kernels::GemvFp8Supported(rows, in, outf, x.raw(), w, ws);
  if (path == Path::kGemv || (path == Path::kAuto && rows <= kAutoGemvRows)) {
    OASIS_CHECK(gemv_ok) << "Linear (FP8 GEMV): unaligned operands, x " << x.ToString();
    gemv(0, rows);
    return;
  }
  // The GEMM takes row counts that are multiples of 4 (cuBLASLt has no block-scaled algorithm
  // otherwise: H200, cuBLAS 13.1); the last rows % 4 rows go to the GEMV.
  const int64_t chunk = GemmChunkRows(in);
  const size_t elem = f32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < rows;) {
    const int64_t n = std::min(chunk, (rows - r0) / 4 * 4);
    const void* xr = static_cast<const bf16*>(x.raw()) + r0 * in;
    void* o = static_cast<char*>(out.raw()) + static_cast<size_t>(r0 * outf) * elem;
    const bool x_aligned = (reinterpret_cast<uintptr_t>(xr) & 7) == 0;
    if (n > 0 && x_aligned && Gemm(xr, w, ws, o, f32, n, in, outf, stream)) {
      r0 += n;
      continue;
    }
    // The tail, or no cuBLASLt algorithm (logged once): the GEMV, kGemvFp8MaxRows rows a launch.
    OASIS_CHECK(gemv_ok) << "Linear (FP8): unaligned operands for the GEMV, x " << x.ToString();
    gemv(r0, rows - r0);
    r0 = rows;
  }
}

bool CudaFp8Linear::GemmAvailable(int64_t outf, int64_t rows, int64_t in, bool out_f32) {
  return init_ok_ && rows % 4 == 0 && GetPlan(outf, rows, in, out_f32, 256).ok;
}

}  // namespace oasis

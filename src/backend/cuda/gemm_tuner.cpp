#include "backend/cuda/gemm_tuner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "common/check.h"

namespace oasis {
namespace {

bool Capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

bool TuneEnabled() {
  const char* v = std::getenv("OASIS_GEMM_TUNE");
  return v == nullptr || std::string(v) != "0";
}

// Mean microseconds of `runs` launches after one untimed one; < 0 if a launch failed.
template <typename F>
float TimeUs(F&& launch, cudaStream_t stream, int runs) {
  if (launch() != CUBLAS_STATUS_SUCCESS) return -1;
  cudaEvent_t a = nullptr, b = nullptr;
  if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) {
    (void)cudaGetLastError();
    if (a) cudaEventDestroy(a);
    return -1;
  }
  bool ok = cudaEventRecord(a, stream) == cudaSuccess;
  for (int i = 0; ok && i < runs; ++i) ok = launch() == CUBLAS_STATUS_SUCCESS;
  ok = ok && cudaEventRecord(b, stream) == cudaSuccess && cudaEventSynchronize(b) == cudaSuccess;
  float ms = -1;
  if (ok && cudaEventElapsedTime(&ms, a, b) != cudaSuccess) ms = -1;
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  (void)cudaGetLastError();
  return ok && ms >= 0 ? ms * 1000.0f / static_cast<float>(runs) : -1;
}

}  // namespace

GemmTuner::GemmTuner(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes), tune_(TuneEnabled()) {
  OASIS_CHECK(cublasLtCreate(&lt_) == CUBLAS_STATUS_SUCCESS) << "cublasLtCreate failed";
}

GemmTuner::~GemmTuner() {
  for (auto& [key, plan] : plans_) Destroy(plan);
  if (lt_) cublasLtDestroy(lt_);
}

void GemmTuner::Destroy(Plan& p) {
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c}) {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
  p = Plan{};
}

cublasStatus_t GemmTuner::Launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* w, const void* x,
                                 void* out, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major out[rows, n] = x · wᵀ is column-major outᵀ[n, rows] = (w as stored, k × n)ᵀ · xᵀ.
  return cublasLtMatmul(lt_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &algo, workspace_,
                        workspace_bytes_, stream);
}

bool GemmTuner::MakePlan(const Key& key, const void* w, const void* x, void* out, cudaStream_t stream, Plan* plan) {
  const auto [rows, k, n, out_type] = key;
  Plan p;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  bool ok = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(rows), k) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&p.c, static_cast<cudaDataType_t>(out_type), static_cast<uint64_t>(n),
                                       static_cast<uint64_t>(rows), n) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  const uint64_t ws = workspace_bytes_;
  const uint32_t align = 16;
  ok = ok &&
       cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
           CUBLAS_STATUS_SUCCESS;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align) == CUBLAS_STATUS_SUCCESS;
  }
  cublasLtMatmulHeuristicResult_t found[kCandidates] = {};
  int returned = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, kCandidates, found, &returned) ==
                 CUBLAS_STATUS_SUCCESS;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  std::vector<int> usable;
  for (int i = 0; ok && i < returned; ++i) {
    if (found[i].state == CUBLAS_STATUS_SUCCESS && found[i].workspaceSize <= workspace_bytes_) usable.push_back(i);
  }
  if (!ok || usable.empty()) {
    Destroy(p);
    return false;
  }
  p.candidates = static_cast<int>(usable.size());
  p.chosen = usable.front();
  p.algo = found[p.chosen].algo;
  if (tune_ && usable.size() > 1 && !Capturing(stream)) {
    // Inputs are only read and `out` is rewritten by the real launch after: timing in place.
    float best = -1;
    for (int i : usable) {
      const float us = TimeUs([&] { return Launch(p, found[i].algo, w, x, out, stream); }, stream, 5);
      if (i == usable.front()) p.heuristic_us = us;
      if (us > 0 && (best < 0 || us < best)) best = us, p.chosen = i, p.algo = found[i].algo;
    }
    p.chosen_us = best;
    p.tuned = true;
    spdlog::debug("gemm tune rows {} k {} n {}: {} algorithms, heuristic's first {:.1f} us, chosen #{} {:.1f} us", rows,
                  k, n, p.candidates, p.heuristic_us, p.chosen, p.chosen_us);
  }
  *plan = p;
  return true;
}

bool GemmTuner::Run(const void* w, const void* x, void* out, cudaDataType_t out_type, int64_t rows, int64_t k,
                    int64_t n, cudaStream_t stream) {
  if (rows < 1 || rows > kMaxTunedRows || k % 8 != 0 || n % 8 != 0 ||
      ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) % 16) != 0 ||
      (out_type != CUDA_R_16BF && out_type != CUDA_R_32F)) {
    return false;
  }
  const Key key{rows, k, n, static_cast<int>(out_type)};
  std::lock_guard<std::mutex> lock(mu_);
  if (unsupported_.count(key)) return false;
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    if (!MakePlan(key, w, x, out, stream, &p)) {
      unsupported_[key] = true;
      return false;
    }
    it = plans_.emplace(key, p).first;
  }
  return Launch(it->second, it->second.algo, w, x, out, stream) == CUBLAS_STATUS_SUCCESS;
}

std::string GemmTuner::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream s;
  for (const auto& [key, p] : plans_) {
    s << "rows " << std::get<0>(key) << " k " << std::get<1>(key) << " n " << std::get<2>(key) << ": "
      << p.candidates << " algorithms";
    if (p.tuned) s << ", heuristic's first " << p.heuristic_us << " us, chosen #" << p.chosen << " " << p.chosen_us << " us";
    s << "\n";
  }
  return s.str();
}

}  // namespace oasis

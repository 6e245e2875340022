// FP8-weight linear layers (e4m3, 128×128 block scales; docs/kernels/fp8_linear.md) at Qwen3-8B's
// four layer shapes and T = 1..8192 rows, against bf16 in the same run: the FP8 GEMV (T <= 16,
// kernels/fp8_linear.h; beyond 4 rows several launches) and the cuBLASLt block-scaled FP8 GEMM
// (the activation quantization kernel's time included) through CudaFp8Linear, vs cuBLAS bf16
// GEMM and (T <= 4) the bf16 GEMV. Time per call from CUDA events over back-to-back calls after
// warm-up, median of 5 runs; weights rotated over 4 copies so small T does not find them in L2.
// Prints TFLOP/s (2·T·out·in) and GB/s over the weight bytes, ceilings and ratios:
//   HBM read ceiling 4560 GB/s and bf16 dense 788 TFLOP/s (DESIGN.md §5, measured on the H200);
//   FP8 dense 1979 TFLOP/s (H200 datasheet figure without sparsity; not measured here).
// Last line: RESULT fp8_linear ... (T=1 GEMV bandwidth, T=8192 GEMM TFLOP/s, ratios vs bf16).
//   bench_fp8_gemm [--rows T,T,...]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_fp8_linear.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_linear.h"
#include "kernels/gemv.h"

namespace {

constexpr double kReadCeilingGBs = 4560.0;
constexpr double kBf16PeakTflops = 788.0;
constexpr double kFp8PeakTflops = 1979.0;
constexpr int kCopies = 4;

#define CHECK_CUDA(x)                                                                        \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// Median microseconds per call of launch(i) (i = call index, for weight rotation).
double TimeUs(cudaStream_t stream, int64_t iters, const std::function<void(int)>& launch) {
  for (int i = 0; i < 10; ++i) launch(i);
  std::vector<float> runs;
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int r = 0; r < 5; ++r) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    for (int64_t i = 0; i < iters; ++i) launch(static_cast<int>(i));
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(ms * 1000.0f / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

}  // namespace

int main(int argc, char** argv) {
  using oasis::CudaFp8Linear;
  using oasis::DType;
  using oasis::Tensor;
  std::vector<int64_t> row_list = {1, 4, 16, 64, 256, 2048, 8192};
  bool probe = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--probe") probe = true;
    if (std::string(argv[i]) == "--rows" && i + 1 < argc) {
      row_list.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) row_list.push_back(std::atoll(t.c_str()));
    }
  }
  struct Shape {
    const char* name;
    int64_t in, out;
  };
  const Shape shapes[] = {{"qkv 4096->6144", 4096, 6144},
                          {"o 4096->4096", 4096, 4096},
                          {"gate_up 4096->24576", 4096, 24576},
                          {"down 12288->4096", 12288, 4096}};
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(cublas, stream);
  CudaFp8Linear fp8;
  if (probe) {  // which row counts / output types cuBLASLt has a block-scaled algorithm for
    if (!fp8.Supported(4096, 4096, 128, 128, stream)) return 1;
    for (bool f32 : {false, true}) {
      std::printf("GEMM algorithms, %s out, 4096x4096, rows:", f32 ? "f32" : "bf16");
      for (int64_t n :
           {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 20, 24, 32, 64, 100, 128, 300, 301, 4096})
        std::printf(" %lld:%s", static_cast<long long>(n),
                    n % 4 == 0 && fp8.GemmAvailable(4096, n, 4096, f32) ? "yes" : "no");
      std::printf("\n");
    }
    return 0;
  }
  const int64_t max_rows = *std::max_element(row_list.begin(), row_list.end());
  std::printf(
      "ceilings: HBM read %.0f GB/s, bf16 dense %.0f TFLOP/s (DESIGN.md), FP8 dense %.0f "
      "TFLOP/s (datasheet)\n",
      kReadCeilingGBs, kBf16PeakTflops, kFp8PeakTflops);
  // Sums over the four shapes at T = 1 and the largest T: FP8 / bf16 times.
  double t1_fp8 = 0, t1_bf16 = 0, t1_bytes = 0, tmax_fp8 = 0, tmax_bf16 = 0, tmax_flop = 0;
  for (const Shape& s : shapes) {
    if (!fp8.Supported(s.out, s.in, 128, 128, stream)) {
      std::printf("%s: FP8 weights not supported here (see the log)\n", s.name);
      return 1;
    }
    const size_t wn = static_cast<size_t>(s.in) * s.out;
    const int64_t sn = (s.out / 128) * (s.in / 128);
    std::vector<void*> w8(kCopies), wb(kCopies);
    std::vector<float*> ws(kCopies);
    std::vector<float> host_scales(sn, 1.0f / 4096);
    for (int c = 0; c < kCopies; ++c) {
      CHECK_CUDA(cudaMalloc(&w8[c], wn));
      CHECK_CUDA(cudaMalloc(&wb[c], wn * 2));
      CHECK_CUDA(cudaMalloc(&ws[c], sn * 4));
      CHECK_CUDA(oasis::kernels::LaunchFillNormalFp8(static_cast<uint8_t*>(w8[c]), wn, 7 + c,
                                                     100.0f, stream));
      CHECK_CUDA(oasis::kernels::LaunchFillNormal(static_cast<__nv_bfloat16*>(wb[c]), wn, 7 + c,
                                                  0.02f, stream));
      CHECK_CUDA(cudaMemcpy(ws[c], host_scales.data(), sn * 4, cudaMemcpyHostToDevice));
    }
    void *x, *y;
    CHECK_CUDA(cudaMalloc(&x, max_rows * s.in * 2));
    CHECK_CUDA(oasis::kernels::LaunchFillNormal(static_cast<__nv_bfloat16*>(x), max_rows * s.in, 3,
                                                1.0f, stream));
    CHECK_CUDA(cudaMalloc(&y, max_rows * s.out * 4));
    std::vector<Tensor> wt;
    for (int c = 0; c < kCopies; ++c) {
      wt.push_back(Tensor(w8[c], DType::kF8E4M3, {s.out, s.in}, oasis::Device::kCuda)
                       .WithBlockScales(Tensor(ws[c], DType::kF32, {s.out / 128, s.in / 128},
                                               oasis::Device::kCuda),
                                        128, 128));
    }
    for (int64_t T : row_list) {
      const double flop = 2.0 * T * s.in * s.out;
      const int64_t iters = std::clamp<int64_t>(static_cast<int64_t>(2e12 / (flop + 1e9)), 5, 200);
      Tensor xt(x, DType::kBF16, {T, s.in}, oasis::Device::kCuda);
      Tensor yt(y, DType::kBF16, {T, s.out}, oasis::Device::kCuda);
      auto fp8_call = [&](CudaFp8Linear::Path p) {
        return [&, p](int i) { fp8.Linear(xt, wt[i % kCopies], yt, stream, p); };
      };
      // The GEMM takes multiples of 4 rows (others: the GEMV for the rest).
      const bool gemm_ok = T % 4 == 0 && fp8.GemmAvailable(s.out, T, s.in, false);
      const double gemm8 =
          gemm_ok ? TimeUs(stream, iters, fp8_call(CudaFp8Linear::Path::kGemm)) : 0;
      const double gemv8 =
          T <= 16 ? TimeUs(stream, iters, fp8_call(CudaFp8Linear::Path::kGemv)) : 0;
      const float alpha = 1.0f, beta = 0.0f;
      const double gemm16 = TimeUs(stream, iters, [&](int i) {
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.out), static_cast<int>(T),
                     static_cast<int>(s.in), &alpha, wb[i % kCopies], CUDA_R_16BF,
                     static_cast<int>(s.in), x, CUDA_R_16BF, static_cast<int>(s.in), &beta, y,
                     CUDA_R_16BF, static_cast<int>(s.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      });
      const double gemv16 =
          T <= oasis::kernels::kGemvMaxRows
              ? TimeUs(stream, iters,
                       [&](int i) {
                         CHECK_CUDA(oasis::kernels::LaunchGemv(
                             static_cast<const __nv_bfloat16*>(x),
                             static_cast<const __nv_bfloat16*>(wb[i % kCopies]),
                             static_cast<__nv_bfloat16*>(y), nullptr, T, s.in, s.out, stream));
                       })
              : 0;
      CHECK_CUDA(cudaStreamSynchronize(stream));
      const double best8 = gemv8 > 0 && gemm8 > 0 ? std::min(gemv8, gemm8) : gemv8 + gemm8;
      const double best16 = gemv16 > 0 ? std::min(gemv16, gemm16) : gemm16;
      const double w8_gbs = wn / best8 / 1e3, w16_gbs = 2.0 * wn / best16 / 1e3;
      std::printf("%-20s T=%-5lld fp8:", s.name, static_cast<long long>(T));
      if (gemm8 > 0)
        std::printf(" gemm %8.1fus %6.1f TFLOP/s (%.2f of fp8 peak)", gemm8, flop / gemm8 / 1e6,
                    flop / gemm8 / 1e6 / kFp8PeakTflops);
      if (gemv8 > 0) std::printf(" gemv %7.1fus", gemv8);
      std::printf(" %6.0f GB/s (%.2f of HBM) | bf16: gemm %8.1fus %6.1f TFLOP/s", w8_gbs,
                  w8_gbs / kReadCeilingGBs, gemm16, flop / gemm16 / 1e6);
      if (gemv16 > 0) std::printf(" gemv %7.1fus", gemv16);
      std::printf(" %6.0f GB/s | bf16/fp8 time %.2fx\n", w16_gbs, best16 / best8);
      if (T == 1) {
        t1_fp8 += best8;
        t1_bf16 += best16;
        t1_bytes += wn;
      }
      if (T == max_rows) {
        tmax_fp8 += gemm8;
        tmax_bf16 += gemm16;
        tmax_flop += flop;
      }
    }
    for (int c = 0; c < kCopies; ++c) {
      cudaFree(w8[c]);
      cudaFree(wb[c]);
      cudaFree(ws[c]);
    }
    cudaFree(x);
    cudaFree(y);
  }
  std::printf(
      "RESULT fp8_linear Qwen3-8B 4 shapes: T=1 %.0f GB/s of e4m3 weights (%.2f of %.0f), %.2fx "
      "bf16's time; T=%lld GEMM %.0f TFLOP/s (%.2f of fp8 %.0f), %.2fx bf16 cuBLAS (%.0f "
      "TFLOP/s)\n",
      t1_bytes / t1_fp8 / 1e3, t1_bytes / t1_fp8 / 1e3 / kReadCeilingGBs, kReadCeilingGBs,
      t1_bf16 / t1_fp8, static_cast<long long>(max_rows), tmax_flop / tmax_fp8 / 1e6,
      tmax_flop / tmax_fp8 / 1e6 / kFp8PeakTflops, kFp8PeakTflops, tmax_bf16 / tmax_fp8,
      tmax_flop / tmax_bf16 / 1e6);
  cublasDestroy(cublas);
  return 0;
}

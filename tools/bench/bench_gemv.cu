// GEMV (decode projections) bandwidth at Qwen3-8B shapes: the default choice and both kernel
// configurations (kernels/gemv.h GemvConfig) per shape, time per call from CUDA events over
// back-to-back launches after warm-up (median of 5 runs), bytes = weights + x + out; ceiling = the
// read-only streaming figure of DESIGN.md §5.
//   bench_gemv [--rows R] [--shapes qwen3-8b|qwen3-30b-a3b]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemv.h"

namespace {

constexpr double kReadCeilingGBs = 4560.0;
constexpr int kConfigs = 2;  // oasis::kernels::GemvConfig after kAuto
constexpr const char* kConfigNames[kConfigs + 1] = {"auto", "per-group", "persistent"};

#define CHECK_CUDA(x)                                                                        \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  int rows = 1;
  std::string model = "qwen3-8b";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--rows" && i + 1 < argc) rows = std::atoi(argv[++i]);
    if (std::string(argv[i]) == "--shapes" && i + 1 < argc) model = argv[++i];
  }
  struct Shape {
    const char* name;
    int64_t in, out;
  };
  std::vector<Shape> shapes = {{"qkv 4096->6144", 4096, 6144},
                               {"o 4096->4096", 4096, 4096},
                               {"gate_up 4096->24576", 4096, 24576},
                               {"down 12288->4096", 12288, 4096},
                               {"lm_head 4096->151936", 4096, 151936}};
  if (model == "qwen3-30b-a3b") {  // the attention half, the router and the lm_head (hidden 2,048)
    shapes = {{"qkv 2048->5120", 2048, 5120},
              {"o 4096->2048", 4096, 2048},
              {"router 2048->128", 2048, 128},
              {"lm_head 2048->151936", 2048, 151936}};
  } else if (model != "qwen3-8b") {
    std::fprintf(stderr, "bench_gemv: --shapes qwen3-8b | qwen3-30b-a3b\n");
    return 2;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // Several weight copies, rotated, so that no call finds its weights in the 60 MB L2.
  constexpr int kCopies = 4;
  double total_best_us = 0, total_default_us = 0, total_bytes = 0;
  for (const Shape& s : shapes) {
    const size_t wbytes = static_cast<size_t>(s.in) * s.out * 2;
    std::vector<void*> w(kCopies);
    for (auto& p : w) {
      CHECK_CUDA(cudaMalloc(&p, wbytes));
      CHECK_CUDA(cudaMemset(p, 0x11, wbytes));
    }
    void *x, *y;
    CHECK_CUDA(cudaMalloc(&x, rows * s.in * 2));
    CHECK_CUDA(cudaMemset(x, 0x22, rows * s.in * 2));
    CHECK_CUDA(cudaMalloc(&y, rows * s.out * 4));
    const double bytes = double(wbytes) + rows * s.in * 2.0 + rows * s.out * 2.0;
    double best = 1e30, dflt = 0;
    int best_v = 0;
    std::printf("%-22s rows %d:", s.name, rows);
    for (int v = 0; v <= kConfigs; ++v) {  // kAuto, then each configuration
      const auto config = static_cast<oasis::kernels::GemvConfig>(v);
      auto launch = [&](int i) {
        return oasis::kernels::LaunchGemvWith(config, static_cast<const __nv_bfloat16*>(x),
                                              static_cast<const __nv_bfloat16*>(w[i % kCopies]),
                                              static_cast<__nv_bfloat16*>(y), nullptr, rows, s.in,
                                              s.out, stream);
      };
      for (int i = 0; i < 20; ++i) CHECK_CUDA(launch(i));
      const int iters = 100;
      std::vector<float> runs;
      for (int r = 0; r < 5; ++r) {
        cudaEvent_t a, b;
        CHECK_CUDA(cudaEventCreate(&a));
        CHECK_CUDA(cudaEventCreate(&b));
        CHECK_CUDA(cudaEventRecord(a, stream));
        for (int i = 0; i < iters; ++i) CHECK_CUDA(launch(i));
        CHECK_CUDA(cudaEventRecord(b, stream));
        CHECK_CUDA(cudaEventSynchronize(b));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        runs.push_back(ms * 1000.0f / iters);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      std::sort(runs.begin(), runs.end());
      const double us = runs[2];
      std::printf(" %s %.1fus %.0fGB/s", kConfigNames[v], us, bytes / us / 1e3);
      if (v == 0) dflt = us;
      if (v > 0 && us < best) best = us, best_v = v;
    }
    std::printf(" | best %s\n", kConfigNames[best_v]);
    total_best_us += best;
    total_default_us += dflt;
    total_bytes += bytes;
    for (auto& p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(y);
  }
  std::printf(
      "RESULT gemv rows=%d %s layer+lm_head shapes: default %.0f GB/s, best-per-shape %.0f "
      "GB/s, "
      "ceiling %.0f GB/s, ratio %.2f (best %.2f)\n",
      rows, model.c_str(), total_bytes / total_default_us / 1e3, total_bytes / total_best_us / 1e3,
      kReadCeilingGBs, total_bytes / total_default_us / 1e3 / kReadCeilingGBs,
      total_bytes / total_best_us / 1e3 / kReadCeilingGBs);
  return 0;
}

// bench_moe: the MoE expert kernels (kernels/moe.h) alone at Qwen3-30B-A3B's shapes (128
// experts, 8 per token, I 768, hidden 2048; --inter 384 for a TP2 rank), one layer:
//  - for each batch size T, the grouped GEMV path (T · k <= 1024) and the permuted grouped GEMM
//    path (plan, gate/up + SiLU, down, combine), against the read roofline of the distinct
//    experts the batch touched (uniform random routing, counted on the host) at 4.56 TB/s and
//    against bf16 peak on the active FLOPs (2 · T · k · 3 · I · hidden) at 788 TFLOP/s;
//  - for T * k <= kMoeFusedDownPairs, the grouped gate/up then down + combine in one kernel
//    ("gemvf") beside the three launches ("gemv"); for T <= 8 the gate/up with one CTA per pair
//    then down + combine ("gemvp": what the backend runs up to kMoeGemvPairGateUpPairs pairs,
//    "gemvf" above; these rows set that threshold and kMoeFusedDownPairs); for T <= 8 the
//    routing, router GEMV (cuBLAS above 4 rows) + top-k ("route"), on the router's bytes
//    (E x hidden bf16);
//  - the GEMM path with the backend's row tile ("gemm") and with each tile ("g16" ... "g128"; the
//    128-row tile is the sm_90a wgmma kernel, "m128" the same tile through mma.sync);
//  - for large T, a cuBLAS peer: one cublasGemmEx per expert on rows already grouped by expert
//    (sizes known on the host, no permutation or combine: an optimistic bound of a cuBLAS path).
// Prints measured, ceiling and ratio per row and a final RESULT line (tools/gpu_suite.sh).
//
//   bench_moe [--tokens 1,8,64,128,512,8192] [--inter 768] [--iters 50]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/tuning.h"
#include "kernels/elementwise.h"
#include "kernels/gemv.h"
#include "kernels/moe.h"

namespace {

using bf16 = __nv_bfloat16;
namespace k = oasis::kernels;

constexpr double kReadTBs = 4.56;    // DESIGN.md §5: read-only streaming kernel
constexpr double kPeakTflops = 788;  // DESIGN.md §5: bf16 8192³ through cuBLAS
constexpr int64_t kRouteTokens = 8;  // routing timed up to this many tokens (decode batches)

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

template <typename T>
T* DeviceAlloc(size_t n) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 16)));
  return static_cast<T*>(p);
}

void FillRandom(bf16* d, size_t n, float scale, uint64_t seed) {
  std::vector<bf16> h(n);
  uint64_t s = seed;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = __float2bfloat16((static_cast<float>(s >> 40) / 16777216.0f * 2 - 1) * scale);
  }
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
}

// Mean milliseconds of fn() over `iters` runs after 3 warm-up runs.
template <typename F>
double TimeMs(F&& fn, int iters, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) fn();
  CHECK_CUDA(cudaEventRecord(b, s));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> token_list = {1, 8, 64, 128, 512, 8192};
  int64_t inter = 768, iters = 50;
  const int64_t E = 128, K = 8, H = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--tokens") {
      token_list.clear();
      for (size_t p = 0; p < v.size();) {
        const size_t q = v.find(',', p);
        token_list.push_back(std::stoll(v.substr(p, q - p)));
        p = q == std::string::npos ? v.size() : q + 1;
      }
    } else if (f == "--inter") {
      inter = std::stoll(v);
    } else if (f == "--iters") {
      iters = std::stoll(v);
    } else {
      std::fprintf(stderr, "bench_moe: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  const int64_t I = inter, max_t = *std::max_element(token_list.begin(), token_list.end());
  const int64_t max_pairs = max_t * K;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bf16* gate_up = DeviceAlloc<bf16>(E * 2 * I * H);
  bf16* down = DeviceAlloc<bf16>(E * H * I);
  FillRandom(gate_up, E * 2 * I * H, 0.04f, 1);
  FillRandom(down, E * H * I, 0.06f, 2);
  bf16* x = DeviceAlloc<bf16>(max_t * H);
  FillRandom(x, max_t * H, 1.0f, 3);
  int32_t* ids = DeviceAlloc<int32_t>(max_pairs);
  float* weights = DeviceAlloc<float>(max_pairs);
  bf16* h = DeviceAlloc<bf16>(max_pairs * I);
  float* y32 = DeviceAlloc<float>(max_pairs * H);
  bf16* y16 = DeviceAlloc<bf16>(max_pairs * H);
  bf16* out = DeviceAlloc<bf16>(max_t * H);
  int32_t* plan_buf = DeviceAlloc<int32_t>(k::MoePlanInts(max_pairs, E));
  bf16* gu_out = DeviceAlloc<bf16>(max_pairs * 2 * I);  // cuBLAS peer's [gate | up]
  bf16* router = DeviceAlloc<bf16>(E * H);
  FillRandom(router, E * H, 0.02f, 4);
  float* logits = DeviceAlloc<float>(kRouteTokens * E);
  int32_t* ids_r = DeviceAlloc<int32_t>(kRouteTokens * K);  // routing outputs (unused)
  float* w_r = DeviceAlloc<float>(kRouteTokens * K);
  cublasHandle_t cublas;
  cublasCreate(&cublas);
  cublasSetStream(cublas, stream);

  std::printf("MoE experts of one layer: %lld experts, %lld per token, I %lld, hidden %lld\n",
              (long long)E, (long long)K, (long long)I, (long long)H);
  std::printf("%7s %5s %9s %9s %8s %9s %8s %9s\n", "tokens", "path", "us", "distinct", "TB/s",
              "read-roof", "TFLOP/s", "peak");
  std::string result;
  std::mt19937 rng(7);
  for (int64_t T : token_list) {
    const int64_t pairs = T * K;
    std::vector<int32_t> hid(pairs);
    std::vector<float> hw(pairs, 1.0f / K);
    std::vector<int32_t> perm(E);
    for (int64_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::copy(perm.begin(), perm.begin() + K, hid.begin() + t * K);
    }
    const std::set<int32_t> distinct(hid.begin(), hid.end());
    CHECK_CUDA(cudaMemcpy(ids, hid.data(), pairs * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(weights, hw.data(), pairs * 4, cudaMemcpyHostToDevice));
    const double bytes = double(distinct.size()) * 3 * I * H * 2 + double(T) * H * 4;
    const double flops = 2.0 * pairs * 3 * I * H;
    const auto report = [&](const char* path, double ms) {
      const double tbs = bytes / (ms * 1e-3) / 1e12, tf = flops / (ms * 1e-3) / 1e12;
      std::printf("%7lld %5s %9.1f %9zu %8.2f %9.2f %8.1f %9.2f\n", (long long)T, path, ms * 1e3,
                  distinct.size(), tbs, tbs / kReadTBs, tf, tf / kPeakTflops);
      char buf[160];
      std::snprintf(buf, sizeof buf, "%sT=%lld %s %.1f us (%.2f roof, %.2f peak)",
                    result.empty() ? "" : "; ", (long long)T, path, ms * 1e3, tbs / kReadTBs,
                    tf / kPeakTflops);
      const bool tile_row = path[0] == 'g' && path[1] >= '0' && path[1] <= '9';  // "g16" ...
      if ((T == 1 || T == 64 || T == 8192) && !tile_row) result += buf;
    };
    if (pairs <= k::kMoeGemvMaxPairs) {
      report("gemv",
             TimeMs(
                 [&] {
                   CHECK_CUDA(k::LaunchMoeGemvGateUp(x, ids, gate_up, h, T, K, E, H, I, stream));
                   CHECK_CUDA(k::LaunchMoeGemvDown(h, ids, down, y32, T, K, E, H, I, stream));
                   CHECK_CUDA(k::LaunchMoeCombineF32(y32, nullptr, weights, out, T, K, H, stream));
                 },
                 static_cast<int>(iters), stream));
    }
    if (k::MoeUseFusedDown(T, K)) {  // grouped gate/up + fused down-combine
      report("gemvf",
             TimeMs(
                 [&] {
                   CHECK_CUDA(k::LaunchMoeGemvGateUp(x, ids, gate_up, h, T, K, E, H, I, stream));
                   CHECK_CUDA(k::LaunchMoeGemvDownCombine(h, ids, weights, down, out, T, K, E, H, I,
                                                          stream));
                 },
                 static_cast<int>(iters), stream));
    }
    if (T <= 8) {  // gate/up one CTA per pair (the backend's up to kMoeGemvPairGateUpPairs)
      report("gemvp", TimeMs(
                          [&] {
                            CHECK_CUDA(k::LaunchMoeGemvGateUpPairs(x, ids, gate_up, h, T, K, E, H,
                                                                   I, stream));
                            CHECK_CUDA(k::LaunchMoeGemvDownCombine(h, ids, weights, down, out, T, K,
                                                                   E, H, I, stream));
                          },
                          static_cast<int>(iters), stream));
    }
    if (T <= kRouteTokens) {  // routing: router GEMV + top-k
      const double route_bytes = double(E) * H * 2;
      const auto report_route = [&](const char* path, double ms) {
        const double tbs = route_bytes / (ms * 1e-3) / 1e12;
        std::printf("%7lld %5s %9.1f %9s %8.2f %9.2f\n", (long long)T, path, ms * 1e3, "router",
                    tbs, tbs / kReadTBs);
        char buf[96];
        std::snprintf(buf, sizeof buf, "; T=%lld %s %.1f us", (long long)T, path, ms * 1e3);
        if (T == 1) result += buf;
      };
      report_route("route",
                   TimeMs(
                       [&] {
                         if (T <= k::kGemvMaxRows) {  // CudaBackend::Linear's choice
                           CHECK_CUDA(k::LaunchGemv(x, router, nullptr, logits, T, H, E, stream));
                         } else {
                           const float one = 1.0f, zero = 0.0f;
                           cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(E), int(T), int(H),
                                        &one, router, CUDA_R_16BF, int(H), x, CUDA_R_16BF, int(H),
                                        &zero, logits, CUDA_R_32F, int(E), CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
                         }
                         CHECK_CUDA(k::LaunchMoeTopK(logits, T, E, K, true, ids_r, w_r, stream));
                       },
                       static_cast<int>(iters), stream));
    }
    // The permuted GEMM path with the row tile the backend chooses ("gemm"), then every tile
    // ("g16" ... "g128": they set kernels::MoeGemmTileRowsFor).
    const int auto_tile = k::MoeGemmTileRowsFor(pairs, static_cast<int>(E));
    const oasis::Tuning tuning = oasis::GetTuning();
    for (int tile : {0, 16, 32, 64, 128, -128}) {  // -128: the 128-row tile through mma.sync
      oasis::Tuning t = tuning;
      if (tile == -128) t.moe_gemm_wgmma = false;
      oasis::SetTuningForTesting(t);
      const k::MoePlan plan =
          k::MoePlanIn(plan_buf, pairs, E, tile == 0 ? auto_tile : std::abs(tile));
      char name[16];
      std::snprintf(name, sizeof name, tile == 0 ? "gemm" : tile == -128 ? "m128" : "g%d", tile);
      report(
          name,
          TimeMs(
              [&] {
                CHECK_CUDA(k::LaunchMoePlan(ids, pairs, E, plan, stream));
                CHECK_CUDA(k::LaunchMoeGemmGateUp(x, plan, K, gate_up, h, pairs, E, H, I, stream));
                CHECK_CUDA(k::LaunchMoeGemmDown(h, plan, down, y16, pairs, E, H, I, stream));
                CHECK_CUDA(k::LaunchMoeCombineBf16(y16, plan.pos, weights, out, T, K, H, stream));
              },
              static_cast<int>(iters), stream));
      if (tile == 0) std::printf("        (gemm: tile rows %d)\n", auto_tile);
      oasis::SetTuningForTesting(tuning);
    }
    if (T >= 512) {  // the cuBLAS peer: per-expert GEMMs on pre-grouped rows
      std::vector<int64_t> count(E, 0);
      for (int32_t e : hid) ++count[e];
      const float one = 1.0f, zero = 0.0f;
      report("cublas",
             TimeMs(
                 [&] {
                   int64_t row = 0;
                   for (int64_t e = 0; e < E; ++e) {
                     const int n = static_cast<int>(count[e]);
                     if (n == 0) continue;
                     cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(2 * I), n, int(H), &one,
                                  gate_up + e * 2 * I * H, CUDA_R_16BF, int(H), x, CUDA_R_16BF,
                                  int(H), &zero, gu_out + row * 2 * I, CUDA_R_16BF, int(2 * I),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                     row += n;
                   }
                   CHECK_CUDA(k::LaunchSiluMul(gu_out, h, pairs, I, stream));
                   row = 0;
                   for (int64_t e = 0; e < E; ++e) {
                     const int n = static_cast<int>(count[e]);
                     if (n == 0) continue;
                     cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(H), n, int(I), &one,
                                  down + e * H * I, CUDA_R_16BF, int(I), h + row * I, CUDA_R_16BF,
                                  int(I), &zero, y16 + row * H, CUDA_R_16BF, int(H),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                     row += n;
                   }
                 },
                 static_cast<int>(std::min<int64_t>(iters, 10)), stream));
    }
  }
  std::printf("RESULT moe experts I=%lld: %s\n", (long long)I, result.c_str());
  return 0;
}

// The fused small-batch MoE kernels (docs/moe.md, "Fused decode launches"): the down projection
// with the weighted combine folded in (token-major, no float y round trip, one launch fewer), the
// gate/up GEMV with one CTA per pair (no expert-finding prologue).
#include "kernels/moe.h"
#include "kernels/moe_common.cuh"

namespace oasis::kernels {
namespace {

// ---- gate/up, one CTA per pair (the fewest pairs) ----------------------------------------------

constexpr int kGuWarps = 8;
constexpr int kGuThreads = kGuWarps * 32;
constexpr int kGuSteps = 4;  // K-steps of both rows (and x) loaded at once

// CTA (pair p, block of kGuWarps intermediate rows): warp w computes row i = blockIdx.y ·
// kGuWarps + w of expert e = ids[p] — the gate row i and the up row inter + i — with x[p / k],
// exactly as MoeGemvGateUpKernel does (lane l: vectors l, l + 32, ... ascending, Dot8, WarpSum,
// SiluMulRounded): bit-identical h. No expert-finding prologue or shared tables (more CTAs
// resident, weight loads issued right after the PDL wait and one read of ids[p]); an expert
// chosen by several pairs is read once per pair, hence only for the fewest pairs.
__global__ void __launch_bounds__(kGuThreads, 4)  // 64 registers (68 unbounded): 4 CTAs per SM
    MoeGemvGateUpPairsKernel(const bf16* __restrict__ x, const int32_t* __restrict__ ids,
                             const bf16* __restrict__ gate_up, bf16* __restrict__ h, int k,
                             int experts, int64_t hidden, int64_t inter) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t p = blockIdx.x;
  const int64_t i = int64_t{blockIdx.y} * kGuWarps + warp;
  const int e = ids[p];
  if (e < 0 || e >= experts || i >= inter) return;  // warp-uniform; no barrier follows
  const int64_t vecs = hidden / 8;
  const uint4* wg = reinterpret_cast<const uint4*>(gate_up + (int64_t{e} * 2 * inter + i) * hidden);
  const uint4* wu = wg + inter * vecs;  // row inter + i
  const uint4* xr = reinterpret_cast<const uint4*>(x + (p / k) * hidden);
  float ag = 0.0f, au = 0.0f;
  for (int64_t v0 = lane; v0 < vecs; v0 += 32 * kGuSteps) {
    uint4 g[kGuSteps], u[kGuSteps], xv[kGuSteps];
#pragma unroll
    for (int q = 0; q < kGuSteps; ++q) {
      if (v0 + 32 * q < vecs) {
        g[q] = __ldcs(wg + v0 + 32 * q);
        u[q] = __ldcs(wu + v0 + 32 * q);
        xv[q] = __ldg(xr + v0 + 32 * q);
      }
    }
#pragma unroll
    for (int q = 0; q < kGuSteps; ++q) {
      if (v0 + 32 * q < vecs) {
        Dot8(g[q], xv[q], ag);
        Dot8(u[q], xv[q], au);
      }
    }
  }
  const float sg = WarpSum(ag), su = WarpSum(au);
  if (lane == 0) h[p * inter + i] = SiluMulRounded(sg, su);
}

// ---- down + combine, token-major ----------------------------------------------------------------

constexpr int kDcWarps = 8;
constexpr int kDcThreads = kDcWarps * 32;
constexpr int kDcGroupRows = 4;  // down rows of one slot a warp computes at once
// K-steps (16-byte vectors per lane and row) loaded at once, and the CTAs per SM the register
// bound asks for: 3 steps unbounded (98-104 registers, 2 CTAs per SM), or 2 steps in 64
// registers (4 CTAs per SM: Qwen3-30B-A3B's 512 row blocks in one wave; OASIS_MOE_DOWN_ONE_WAVE).
// The step count does not change a lane's order of vectors: the results are bit-identical.
constexpr int kDcSteps = 3;
constexpr int kDcStepsOneWave = 2;
constexpr int kDcOneWaveCtasPerSm = 4;

// Down rows per CTA: kDcGroupRows per warp item, enough row groups that k slots give every warp
// an item (k >= kDcWarps: one group).
int DcRowsPerCta(int k) { return kDcGroupRows * (k >= kDcWarps ? 1 : kDcWarps / k); }

// CTA (token t, block of `rows_per_cta` hidden rows). A warp item is (slot j, group of
// kDcGroupRows rows): the dot products of those rows of down_e (e = ids[t·k + j]) with
// h[t·k + j], exactly as MoeGemvDownKernel computes them (lane l takes the 16-byte vectors
// l, l + 32, ... in ascending order, Dot8 each, then WarpSum), into shared memory. Then thread r
// sums its row over the slots in ascending order, fmaf(w[t, j], dot, acc) as MoeCombineKernel,
// and rounds once to bf16: bit-identical to the grouped down GEMV followed by the combine.
// Slots with an id outside [0, experts) contribute nothing. Each chosen expert's rows are read
// once per token (tokens sharing an expert read it again, mostly from L2: blockIdx.x is the
// token, so the CTAs of one row block run side by side).
template <int kDcSteps, int kMinCtas>
__global__ void __launch_bounds__(kDcThreads, kMinCtas)
    MoeGemvDownCombineKernel(const bf16* __restrict__ h, const int32_t* __restrict__ ids,
                             const float* __restrict__ weights, const bf16* __restrict__ down,
                             bf16* __restrict__ out, int k, int experts, int64_t hidden,
                             int64_t inter, int rows_per_cta) {
  extern __shared__ float dc_dots[];  // [rows_per_cta][k]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x;
  const int64_t row0 = int64_t{blockIdx.y} * rows_per_cta;
  const int groups = rows_per_cta / kDcGroupRows;
  const int64_t vecs = inter / 8;
  const uint4* w[kDcGroupRows];
  uint4 wv[kDcSteps][kDcGroupRows];
  // The item's expert, its rows' pointers and the weight vectors of the K-steps from v0.
  auto expert_of = [&](int item) { return __ldcg(ids + t * k + item % k); };
  auto rows_of = [&](int item, int e) {
#pragma unroll
    for (int r = 0; r < kDcGroupRows; ++r) {
      const int64_t row = min(row0 + (item / k) * kDcGroupRows + r, hidden - 1);  // clamped
      w[r] = reinterpret_cast<const uint4*>(down + (int64_t{e} * hidden + row) * inter);
    }
  };
  auto load = [&](int64_t v0) {
#pragma unroll
    for (int u = 0; u < kDcSteps; ++u) {
      if (v0 + 32 * u < vecs) {
#pragma unroll
        for (int r = 0; r < kDcGroupRows; ++r) wv[u][r] = __ldcs(w[r] + v0 + 32 * u);
      }
    }
  };
  // PDL: the first item's first weight vectors stream while the gate/up kernel finishes. Its
  // expert id was written two kernels back (the top-k): every kernel allows its dependents only
  // after its own wait (kernels/ptx.cuh), so that kernel has completed once this one runs; read
  // through L2. h (the gate/up output) is read after the wait.
  int e_first = -1;
  if (warp < k * groups) {
    e_first = expert_of(warp);
    if (e_first >= 0 && e_first < experts) {
      rows_of(warp, e_first);
      load(lane);
    }
  }
  GridDependencyWait();
  AllowDependentLaunch();
  for (int item = warp; item < k * groups; item += kDcWarps) {  // warp-uniform
    const int j = item % k, g = item / k;
    const bool first = item == warp;
    const int e = first ? e_first : expert_of(item);
    if (e < 0 || e >= experts) continue;  // skipped by the sum below as well
    if (!first) rows_of(item, e);
    const uint4* hr = reinterpret_cast<const uint4*>(h + (t * k + j) * inter);
    float acc[kDcGroupRows];
#pragma unroll
    for (int r = 0; r < kDcGroupRows; ++r) acc[r] = 0.0f;
    for (int64_t v0 = lane; v0 < vecs; v0 += 32 * kDcSteps) {
      if (!first || v0 != lane) load(v0);
      uint4 hv[kDcSteps];
#pragma unroll
      for (int u = 0; u < kDcSteps; ++u) {
        if (v0 + 32 * u < vecs) hv[u] = __ldg(hr + v0 + 32 * u);
      }
#pragma unroll
      for (int u = 0; u < kDcSteps; ++u) {
        if (v0 + 32 * u < vecs) {
#pragma unroll
          for (int r = 0; r < kDcGroupRows; ++r) Dot8(wv[u][r], hv[u], acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kDcGroupRows; ++r) {
      const float s = WarpSum(acc[r]);
      if (lane == 0) dc_dots[(g * kDcGroupRows + r) * k + j] = s;
    }
  }
  __syncthreads();
  if (threadIdx.x >= rows_per_cta) return;
  const int64_t row = row0 + threadIdx.x;
  if (row >= hidden) return;
  float a = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int e = ids[t * k + j];
    if (e < 0 || e >= experts) continue;
    a = fmaf(weights[t * k + j], dc_dots[threadIdx.x * k + j], a);
  }
  out[t * hidden + row] = ToBf16(a);
}

}  // namespace

cudaError_t LaunchMoeGemvGateUpPairs(const bf16* x, const int32_t* ids, const bf16* gate_up,
                                     bf16* h, int64_t tokens, int k, int experts, int64_t hidden,
                                     int64_t inter, cudaStream_t stream) {
  const int64_t pairs = tokens * k;
  if (pairs == 0) return cudaSuccess;
  if (pairs > kMoeGemvMaxPairs || !MoeSupported(hidden, inter, experts, k) ||
      CeilDiv(inter, kGuWarps) > 65535u) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(pairs), CeilDiv(inter, kGuWarps));
  return LaunchPdl(MoeGemvGateUpPairsKernel, grid, dim3(kGuThreads), 0, stream, x, ids, gate_up, h,
                   k, experts, hidden, inter);
}

cudaError_t LaunchMoeGemvDownCombine(const bf16* h, const int32_t* ids, const float* weights,
                                     const bf16* down, bf16* out, int64_t tokens, int k,
                                     int experts, int64_t hidden, int64_t inter,
                                     cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int rows = DcRowsPerCta(k);
  if (tokens * k > kMoeGemvMaxPairs || !MoeSupported(hidden, inter, experts, k) ||
      CeilDiv(hidden, rows) > 65535u) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(float) * rows * k;  // <= 16 KiB (k <= kMoeMaxExperts)
  const dim3 grid(static_cast<unsigned>(tokens), CeilDiv(hidden, rows));
  // The 64-register instance where it makes the grid one wave (4 CTAs per SM: batch 1 of
  // Qwen3-30B-A3B); past that its 2 K-steps in flight lose (batch 8: 7.98 -> 8.17 ms a step).
  const int sms = DeviceSmCount();
  if (sms == 0) return cudaErrorInvalidDevice;
  const bool one_wave = GetTuning().moe_down_one_wave &&
                        int64_t{grid.x} * grid.y <= int64_t{kDcOneWaveCtasPerSm} * sms;
  const auto kernel = one_wave ? MoeGemvDownCombineKernel<kDcStepsOneWave, kDcOneWaveCtasPerSm>
                               : MoeGemvDownCombineKernel<kDcSteps, 1>;
  return LaunchPdl(kernel, grid, dim3(kDcThreads), smem, stream, h, ids, weights, down, out, k,
                   experts, hidden, inter, rows);
}

}  // namespace oasis::kernels

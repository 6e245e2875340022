// Token sampling. The candidate set of the CPU sampler — a prefix of the vocabulary in
// (logit desc, id asc) order — is found without sorting: a 16-ary search over
// order-preserving 32-bit keys of the logits finds the top-k boundary (by count) and the
// top-p boundary (by probability mass); a search over ids resolves exact ties at a
// boundary. The token is then the Gumbel-max over the candidates with the counter-based
// noise the CPU sampler uses.
//
// One cooperative grid: `parts` CTAs per row, each owning a contiguous slice of the
// vocabulary. Each search round, every CTA sums the weight above 16 probes over its slice in
// registers, writes the block totals to the row's scratch and the grid synchronises; every
// CTA of the row then reduces the parts in the same order, so all of them take the same
// decision and the sums are the same on every run. Rounds run for the whole grid (grid.sync
// is grid-wide); rows that do not need a phase contribute zeros.
#include <cooperative_groups.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <mutex>

#include "include/oasis/sampling_noise.h"
#include "kernels/common.cuh"
#include "kernels/sampling.h"

namespace oasis::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxParts = 32;  // CTAs per row at most
constexpr int kProbes = 16;    // per search round: lo + j·step, j = 0..15 (4 bits of the key)
constexpr int kRounds = 8;     // 16^8 = 2^32 keys
constexpr int kTopCap = 64;    // top-logprob candidates collected (>= kSampleMaxTop)

// Per-row scratch in device memory.
struct RowScratch {
  float max[kMaxParts];  // of the raw logits (the log-partition function)
  int arg[kMaxParts];
  float sum[kMaxParts];
  float smax[kMaxParts];  // of the processed logits the draw reads (processed rows)
  int sarg[kMaxParts];
  float probe[2][kMaxParts][kProbes];  // double-buffered by round parity
  double best[kMaxParts];
  int best_id[kMaxParts];
  int top_n;
  int top_ids[kTopCap];
  float top_vals[kTopCap];
};

struct GridScratch {
  int flags[4];  // grid-wide "some row needs a tie-cut search" per search site
};

// Larger float -> larger key (total order on non-NaN floats).
__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float FromKey(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Shared {
  float rf[kWarps];
  double rd[kWarps];
  int ri[kWarps];
  float sums[kWarps][kProbes];
  float totals[kProbes];
};

template <typename T>
__device__ __forceinline__ void ArgMaxStep(T& v, int& i, T ov, int oi) {
  if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

template <typename T>
__device__ void BlockArgMax(T& v, int& i, T lowest, T* scratch_v, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
  __syncthreads();
  if (lane == 0) scratch_v[warp] = v, s.ri[warp] = i;
  __syncthreads();
  v = lane < kWarps ? scratch_v[lane] : lowest, i = lane < kWarps ? s.ri[lane] : INT_MAX;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    ArgMaxStep(v, i, __shfl_xor_sync(~0u, v, o), __shfl_xor_sync(~0u, i, o));
}

__device__ float BlockSumF(float v, Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) s.rf[warp] = v;
  __syncthreads();
  return WarpSum(lane < kWarps ? s.rf[lane] : 0.0f);
}

// Sums kProbes values over the block; every thread gets the totals.
__device__ void BlockSums(float (&v)[kProbes], Shared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kProbes; ++j) v[j] = WarpSum(v[j]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kProbes; ++j) s.sums[warp][j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < kProbes) {
    float t = 0.0f;
    for (int w = 0; w < kWarps; ++w) t += s.sums[w][threadIdx.x];
    s.totals[threadIdx.x] = t;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kProbes; ++j) v[j] = s.totals[j];
}

// The context one CTA works in.
struct Ctx {
  cg::grid_group grid;
  RowScratch* rs;
  int part, parts, begin, end;
  Shared* s;
  int round = 0;  // search rounds so far (parity selects the probe buffer)

  // Sums v over the block and then over every part of the row (a grid-wide sync); every
  // thread of every part gets the same totals.
  __device__ void RowSums(float (&v)[kProbes]) {
    float(*buf)[kProbes] = rs->probe[round & 1];
    ++round;
    BlockSums(v, *s);
    if (threadIdx.x < kProbes) buf[part][threadIdx.x] = v[threadIdx.x];
    grid.sync();
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      float t = 0.0f;
      for (int q = 0; q < parts; ++q) t += buf[q][j];
      v[j] = t;
    }
  }
};

// Among the elements i of the row with pred(i), each of weight w(i) > 0, finds the largest key
// K with W(key >= K) >= target — where the cumulative weight in descending key order first
// reaches `target` — with W(key > K) and W(key >= K). `active` false: this row takes part in
// the rounds without searching (result 0). A target above the total yields key 0.
template <typename Key, typename Pred, typename Weight>
__device__ uint32_t SelectKey(Ctx& c, bool active, float target, Key key, Pred pred, Weight weight,
                              float& w_above, float& w_ge) {
  uint64_t lo = 0, hi = uint64_t{1} << 32;
  float w_lo = 0.0f, w_hi = 0.0f;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t step = (hi - lo + kProbes - 1) / kProbes;
    uint32_t probe[kProbes];
    float sums[kProbes];
#pragma unroll
    for (int j = 0; j < kProbes; ++j) {
      const uint64_t pj = lo + j * step;
      probe[j] = static_cast<uint32_t>(pj < hi ? pj : hi - 1);
      sums[j] = 0.0f;
    }
    if (active) {
      // Only keys inside [lo, hi) tell the probes apart; the weight at or above hi is w_hi.
      const uint32_t lo32 = static_cast<uint32_t>(lo);
      const uint32_t hi_last = static_cast<uint32_t>(hi - 1);
      for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
        const uint32_t k = key(i);
        if (k < lo32 || k > hi_last || !pred(i)) continue;
        const float w = weight(i);
#pragma unroll
        for (int j = 0; j < kProbes; ++j) sums[j] += k >= probe[j] ? w : 0.0f;
      }
    }
    c.RowSums(sums);
#pragma unroll
    for (int j = 0; j < kProbes; ++j) sums[j] += w_hi;
    if (r == 0) w_lo = sums[0];
    uint64_t new_lo = lo, new_hi = hi;
    float new_w_lo = w_lo, new_w_hi = w_hi;
    for (int j = 1; j < kProbes; ++j) {
      const uint64_t pj = lo + j * step;
      if (pj >= hi) break;
      if (sums[j] >= target) {
        new_lo = pj, new_w_lo = sums[j];
      } else {
        new_hi = pj, new_w_hi = sums[j];
        break;
      }
    }
    lo = new_lo, hi = new_hi, w_lo = new_w_lo, w_hi = new_w_hi;
  }
  w_above = w_hi;
  w_ge = w_lo;
  return active ? static_cast<uint32_t>(lo) : 0u;
}

// Sums one value over the row's parts.
__device__ float RowSum(Ctx& c, float v) {
  float a[kProbes] = {};
  a[0] = v;
  c.RowSums(a);
  return a[0];
}

// Grid-wide OR of `need` (one flag slot per call site).
__device__ bool AnyRow(Ctx& c, GridScratch* g, int slot, bool need) {
  if (need && threadIdx.x == 0 && c.part == 0) atomicOr(&g->flags[slot], 1);
  c.grid.sync();
  return *reinterpret_cast<volatile int*>(&g->flags[slot]) != 0;
}

// When `needed` of the `at` elements with key == k (and pred) are admitted, the id of the
// last one admitted (lowest ids first); INT_MAX when all are. Runs the id search only when
// some row of the grid needs it.
template <typename Key, typename Pred>
__device__ int TieIdCut(Ctx& c, GridScratch* g, int slot, bool active, uint32_t k, int needed,
                        int at, Key key, Pred pred) {
  const bool need = active && needed < at;
  if (!AnyRow(c, g, slot, need)) return INT_MAX;
  float above, ge;
  const uint32_t inv = SelectKey(
      c, need, static_cast<float>(needed), [](int i) { return ~static_cast<uint32_t>(i); },
      [&](int i) { return pred(i) && key(i) == k; }, [](int) { return 1.0f; }, above, ge);
  return need ? static_cast<int>(~inv) : INT_MAX;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, int64_t stride,
                 const SampleParamsDevice* __restrict__ params,
                 SampleOutputDevice* __restrict__ out, RowScratch* scratch, GridScratch* gscratch,
                 int parts, uint32_t stages, const float* __restrict__ processed,
                 int64_t processed_stride) {
  __shared__ Shared s;
  const int row = blockIdx.x / parts, part = blockIdx.x % parts;
  const int chunk = (vocab + parts - 1) / parts;
  Ctx c{cg::this_grid(),
        scratch + row,
        part,
        parts,
        min(vocab, part * chunk),
        min(vocab, (part + 1) * chunk),
        &s};
  const SampleParamsDevice p = params[row];
  const bool needed = p.needed != 0;
  // The raw logits give the log-probabilities; the draw reads the processed logits of a row
  // with logits processing (penalties, biases, masks), the raw ones otherwise.
  const float* rowp = logits + row * stride;
  const bool is_processed = processed != nullptr && p.processed >= 0;
  const float* drawp = is_processed ? processed + p.processed * processed_stride : rowp;
  auto raw_logit = [&](int i) { return __ldg(rowp + i); };
  auto raw_key = [&](int i) { return OrderKey(__ldg(rowp + i)); };
  auto logit = [&](int i) { return __ldg(drawp + i); };
  auto key = [&](int i) { return OrderKey(__ldg(drawp + i)); };
  auto all = [](int) { return true; };
  RowScratch& rs = *c.rs;
  if (blockIdx.x == 0 && threadIdx.x < 4) gscratch->flags[threadIdx.x] = 0;
  if (part == 0 && threadIdx.x == 0) rs.top_n = 0;

  // Phase 1: max / first argmax and the raw log-partition function, per part, then per row;
  // a processed row also the max / first argmax of its processed logits.
  float mx = -FLT_MAX;
  int arg = INT_MAX;
  for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads)
    ArgMaxStep(mx, arg, raw_logit(i), i);
  BlockArgMax(mx, arg, -FLT_MAX, s.rf, s);
  float sum = 0.0f;
  for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads) sum += __expf(raw_logit(i) - mx);
  sum = BlockSumF(sum, s);
  if (threadIdx.x == 0) rs.max[part] = mx, rs.arg[part] = arg, rs.sum[part] = sum;
  if (is_processed) {  // (uniform over the CTA: one row)
    float smx = -FLT_MAX;
    int sarg = INT_MAX;
    for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads)
      ArgMaxStep(smx, sarg, logit(i), i);
    BlockArgMax(smx, sarg, -FLT_MAX, s.rf, s);
    if (threadIdx.x == 0) rs.smax[part] = smx, rs.sarg[part] = sarg;
  }
  c.grid.sync();
  mx = -FLT_MAX, arg = INT_MAX;
  for (int q = 0; q < parts; ++q) ArgMaxStep(mx, arg, rs.max[q], rs.arg[q]);
  if (arg == INT_MAX) arg = 0;
  float z_raw = 0.0f;
  for (int q = 0; q < parts; ++q) z_raw += rs.sum[q] * __expf(rs.max[q] - mx);
  const float log_z = mx + logf(z_raw);
  if (is_processed) {  // the draw's max and argmax (every token masked: token 0, as the CPU)
    mx = -FLT_MAX, arg = INT_MAX;
    for (int q = 0; q < parts; ++q) ArgMaxStep(mx, arg, rs.smax[q], rs.sarg[q]);
    if (arg == INT_MAX) arg = 0;
  }

  const bool greedy = p.temperature == 0.0f || p.top_k == 1;
  const bool sampling = needed && !greedy;
  int token = arg;
  if (stages & kStageSample) {
    const double inv_t = sampling ? 1.0 / static_cast<double>(p.temperature) : 0.0;
    const float inv_tf = static_cast<float>(inv_t);
    // top-k boundary.
    const bool use_k = sampling && p.top_k > 0 && p.top_k < vocab;
    uint32_t k_key = 0;
    int k_cut = INT_MAX;
    if (stages & kStageTopK) {
      float above, ge;
      k_key = SelectKey(
          c, use_k, static_cast<float>(p.top_k), key, all, [](int) { return 1.0f; }, above, ge);
      k_cut = TieIdCut(c, gscratch, 0, use_k, k_key, p.top_k - static_cast<int>(above),
                       static_cast<int>(ge) - static_cast<int>(above), key, all);
    }
    auto in_k = [&](int i) {
      if (!use_k) return true;
      const uint32_t k = key(i);
      return k > k_key || (k == k_key && i <= k_cut);
    };
    auto q_of = [&](int i) { return __expf((logit(i) - mx) * inv_tf); };
    // top-p boundary over the top-k set.
    const bool use_p = sampling && p.top_p < 1.0f;
    uint32_t p_key = 0;
    int p_cut = INT_MAX;
    if (stages & kStageTopP) {
      float z = 0.0f;
      if (use_p) {
        for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads) z += in_k(i) ? q_of(i) : 0.0f;
      }
      z = RowSum(c, z);
      const float target = p.top_p * z;
      float mass_above, mass_ge;
      p_key = SelectKey(c, use_p, target, key, in_k, q_of, mass_above, mass_ge);
      float at = 0.0f;
      if (use_p) {
        for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads)
          at += (in_k(i) && key(i) == p_key) ? 1.0f : 0.0f;
      }
      const int n_at = static_cast<int>(RowSum(c, at));
      // Ties at the boundary share one probability: admit as many as the mass needs.
      const float q_tie = __expf((FromKey(p_key) - mx) * inv_tf);
      int want = n_at;
      if (use_p && q_tie > 0.0f)
        want = max(1, min(n_at, static_cast<int>(ceilf((target - mass_above) / q_tie))));
      p_cut = TieIdCut(c, gscratch, 1, use_p, p_key, want, n_at, key, in_k);
    }
    auto in_set = [&](int i) {
      if (!in_k(i)) return false;
      if (use_p) {
        const uint32_t k = key(i);
        if (!(k > p_key || (k == p_key && i <= p_cut))) return false;
      }
      if (p.min_p > 0.0f &&
          exp(static_cast<double>(logit(i) - mx) * inv_t) < static_cast<double>(p.min_p)) {
        return i == arg;  // the top token always stays
      }
      return true;
    };
    // Gumbel-max over the candidates, per part, then per row.
    double best = -DBL_MAX;
    int best_i = INT_MAX;
    if (sampling) {
      const uint64_t nkey = NoiseKey(p.seed, p.counter);
      for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
        if (!in_set(i)) continue;
        const double g = -log(-log(NoiseUniform(nkey, i)));
        ArgMaxStep(best, best_i, static_cast<double>(logit(i) - mx) * inv_t + g, i);
      }
    }
    BlockArgMax(best, best_i, -DBL_MAX, s.rd, s);
    if (threadIdx.x == 0) rs.best[part] = best, rs.best_id[part] = best_i;
    c.grid.sync();
    if (sampling) {
      best = -DBL_MAX, best_i = INT_MAX;
      for (int q = 0; q < parts; ++q) ArgMaxStep(best, best_i, rs.best[q], rs.best_id[q]);
      token = best_i == INT_MAX ? arg : best_i;
    }
  }

  // Top log-probabilities: the num_top best (logit desc, id asc), sorted.
  const int num_top = needed ? min(p.num_top, min(kSampleMaxTop, vocab)) : 0;
  if (stages & kStageTopN) {
    float above, ge;
    const uint32_t t_key = SelectKey(
        c, num_top > 0, static_cast<float>(num_top), raw_key, all, [](int) { return 1.0f; }, above,
        ge);
    const int t_cut =
        TieIdCut(c, gscratch, 2, num_top > 0, t_key, num_top - static_cast<int>(above),
                 static_cast<int>(ge) - static_cast<int>(above), raw_key, all);
    if (num_top > 0) {
      for (int i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
        const uint32_t k = raw_key(i);
        if (k > t_key || (k == t_key && i <= t_cut)) {
          const int slot = atomicAdd(&rs.top_n, 1);
          if (slot < kTopCap) rs.top_ids[slot] = i, rs.top_vals[slot] = raw_logit(i);
        }
      }
    }
    c.grid.sync();
    if (num_top > 0 && part == 0 && threadIdx.x == 0) {
      const int n = min(rs.top_n, kTopCap);
      for (int a = 1; a < n; ++a) {  // insertion sort, (logit desc, id asc)
        const int id = rs.top_ids[a];
        const float v = rs.top_vals[a];
        int b = a - 1;
        while (b >= 0 && (rs.top_vals[b] < v || (rs.top_vals[b] == v && rs.top_ids[b] > id))) {
          rs.top_ids[b + 1] = rs.top_ids[b], rs.top_vals[b + 1] = rs.top_vals[b];
          --b;
        }
        rs.top_ids[b + 1] = id, rs.top_vals[b + 1] = v;
      }
      for (int a = 0; a < min(n, num_top); ++a) {
        out[row].top_tokens[a] = rs.top_ids[a];
        out[row].top_logprobs[a] = rs.top_vals[a] - log_z;
      }
    }
  }
  if (needed && part == 0 && threadIdx.x == 0) {
    const int32_t chosen = p.forced >= 0 && p.forced < vocab ? p.forced : token;
    out[row].token = chosen;
    out[row].logprob = raw_logit(chosen) - log_z;
  }
}

struct DeviceLimits {
  int resident = 0;  // CTAs of SampleKernel the device holds at once
};

DeviceLimits Limits() {
  static DeviceLimits limits;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SampleKernel, kThreads, 0);
    limits.resident = sms * (per_sm > 0 ? per_sm : 1);
  });
  return limits;
}

}  // namespace

uint32_t SampleStagesFor(const SampleParamsDevice* host, int64_t rows, int64_t vocab) {
  uint32_t stages = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleParamsDevice& p = host[r];
    if (!p.needed) continue;
    if (p.num_top > 0) stages |= kStageTopN;
    if (p.temperature == 0.0f || p.top_k == 1) continue;
    stages |= kStageSample;
    if (p.top_k > 0 && p.top_k < vocab) stages |= kStageTopK;
    if (p.top_p < 1.0f) stages |= kStageTopP;
  }
  return stages;
}

size_t SampleWorkspaceBytes(int64_t rows) {
  return sizeof(GridScratch) + 256 + rows * sizeof(RowScratch);
}

cudaError_t LaunchSample(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                         const SampleParamsDevice* params, SampleOutputDevice* out, uint32_t stages,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream,
                         const float* processed, int64_t processed_stride) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT_MAX || stride < vocab || workspace == nullptr ||
      workspace_bytes < SampleWorkspaceBytes(rows) ||
      (processed != nullptr && processed_stride < vocab)) {
    return cudaErrorInvalidValue;
  }
  auto* g = static_cast<GridScratch*>(workspace);
  auto* rs = reinterpret_cast<RowScratch*>(static_cast<char*>(workspace) + 256);
  const int resident = Limits().resident;
  // Rows go in batches the device holds at once (a cooperative grid must be resident).
  for (int64_t r0 = 0; r0 < rows; r0 += resident) {
    const int n = static_cast<int>(rows - r0 < resident ? rows - r0 : resident);
    int parts = resident / n;
    parts = parts < 1 ? 1 : (parts > kMaxParts ? kMaxParts : parts);
    const int max_parts = static_cast<int>((vocab + kThreads - 1) / kThreads);
    if (parts > max_parts) parts = max_parts;
    const float* lg = logits + r0 * stride;
    const SampleParamsDevice* pp = params + r0;
    SampleOutputDevice* oo = out + r0;
    RowScratch* rr = rs + r0;
    int v = static_cast<int>(vocab);
    void* args[] = {&lg,     &v,         &stride,          &pp, &oo, &rr, &g, &parts,
                    &stages, &processed, &processed_stride};
    const cudaError_t err = cudaLaunchCooperativeKernel(reinterpret_cast<void*>(SampleKernel),
                                                        dim3(static_cast<unsigned>(n * parts)),
                                                        dim3(kThreads), args, 0, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaGetLastError();
}

namespace {
__global__ void ScatterSampledTokensKernel(const SampleOutputDevice* out, const int32_t* pairs,
                                           int64_t n, int32_t* ids) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) ids[pairs[2 * i + 1]] = out[pairs[2 * i]].token;
}
}  // namespace

cudaError_t LaunchScatterSampledTokens(const SampleOutputDevice* out, const int32_t* pairs,
                                       int64_t n, int32_t* ids, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScatterSampledTokensKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(out, pairs,
                                                                                         n, ids);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

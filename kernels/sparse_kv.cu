#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "kernels/common.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

constexpr int kBlockTokens = 16;

// ---- Block summaries: one CTA per entry, threads over head_dim.
__global__ void BlockSummariesKernel(const bf16* k_pool, const int32_t* src_slots, const int32_t* num_tokens,
                                     const int32_t* dst_rows, bf16* kmin, bf16* kmax, int head_dim) {
  const int64_t i = blockIdx.x;
  const int count = num_tokens[i], dst = dst_rows[i];
  if (count <= 0 || dst < 0) return;
  const bf16* k = k_pool + static_cast<int64_t>(src_slots[i]) * kBlockTokens * head_dim;
  for (int x = threadIdx.x; x < head_dim; x += blockDim.x) {
    float lo = ToFloat(k[x]), hi = lo;
    for (int j = 1; j < count && j < kBlockTokens; ++j) {
      const float v = ToFloat(k[j * head_dim + x]);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    kmin[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(lo);  // exact: a stored bf16 value
    kmax[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(hi);
  }
}

// ---- Block scores on the tensor cores. score(b) = Σ_d max(q_d·hi_d, q_d·lo_d) is, term by term
// and exactly, q⁺_d·max(hi_d, lo_d) + q⁻_d·min(hi_d, lo_d) with q⁺ = max(q, 0), q⁻ = min(q, 0)
// (x ↦ q·x is monotone, so rounding keeps the larger product the larger one): a dot product of
// [max | min] (2·D bf16, from the summary row) with [q⁺ | q⁻] (bf16, exact), so one 16-block tile
// against the group's (≤ 8, or ≤ 16 in two n-tiles) query heads is a bf16 m16n8k16 MMA chain
// with fp32 accumulation (exact products; only the summation order differs from the CPU's).
// Each warp owns a contiguous run of blocks of one (row, KV head): `steps` steps of 16·kTiles
// blocks (at most kScoreMaxSteps; the launcher aims at one wave of the SMs). A step's summary
// rows are copied whole into the warp's shared memory with cp.async (lanes along each row, so
// every 128-byte line is asked for by one instruction), double-buffered: the next step's rows
// are in flight while this step's are scored; table entries are loaded two steps ahead. Lane
// (g, t) then reads the 16-byte chunks t + 4c of the rows of blocks g and g+8 of each tile (the
// MMA's k order is a permutation of d, the same for A and B; odd rows swizzled so those reads
// are conflict-free). The queries' fragments are loaded once per warp into registers.
// Steps per warp, at most: the launcher sizes it so the grid is one wave (at batch 32 × 16K, 8
// steps made 768 CTAs for 528 slots, a second partial wave; 11 make 512).
constexpr int kScoreMaxSteps = 64;
constexpr int kScoreMaxGroup = 16;
constexpr int kScoreSmemBytes = 48 * 1024;  // per CTA (no opt-in attribute needed)

template <int D>
struct ScoreShape {
  static constexpr int kChunks = D / 32;                 // 16-byte chunks per lane and row, MMA layout
  static constexpr int kTiles = D >= 128 ? 1 : 128 / D;  // 16-block tiles per step
  static constexpr int kStepBlocks = 16 * kTiles;
  static constexpr int kRowChunks = D / 8;               // 16-byte chunks of a summary row
  static constexpr int kStageChunks = 2 * kStepBlocks * kRowChunks;  // kmin rows, then kmax rows
  static constexpr int kWarps = kScoreSmemBytes / (2 * kStageChunks * 16);  // 3 (D ≤ 128), 1 (D 256)
  static constexpr int kTabRegs = (kStepBlocks + 31) / 32;
  // Slot of chunk `col` of row `row` in a stage (odd rows: chunks xor 4, so the MMA-layout reads
  // of 8 rows × 4 chunks spread over all banks; rows of 64 bytes already do).
  static __device__ __forceinline__ int Slot(int row, int col) {
    return row * kRowChunks + (D >= 64 ? col ^ ((row & 1) << 2) : col);
  }
};

__device__ __forceinline__ uint32_t MaxBf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmax2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t MinBf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmin2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <int D, int NT>  // NT: n-tiles of 8 query heads (group ≤ 8: 1, ≤ 16: 2)
__global__ void __launch_bounds__(32 * ScoreShape<D>::kWarps) ScoreBlocksKernel(ScoreBlocksParams p, int steps) {
  using S = ScoreShape<D>;
  __shared__ uint4 stages[S::kWarps][2][S::kStageChunks];
  const int r = blockIdx.y / p.num_kv_heads, h = blockIdx.y % p.num_kv_heads;
  const int row = p.query_rows[r];
  if (row < 0) return;
  const int nb = min(p.num_blocks[r], p.max_blocks);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_blocks = S::kStepBlocks * steps;
  const int w_begin = (blockIdx.x * S::kWarps + warp) * warp_blocks;
  if (w_begin >= nb) return;
  const int w_end = min(nb, w_begin + warp_blocks);
  const int g = lane >> 2, t = lane & 3;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t base = (static_cast<int64_t>(r) * p.num_kv_heads + h) * p.max_blocks;
  const int32_t* table = p.host_tables + base;

  // Table entries of a step's blocks: lane i holds block first + i + 32·j (-1: none).
  auto load_tab = [&](int first, int (&tab)[S::kTabRegs]) {
#pragma unroll
    for (int j = 0; j < S::kTabRegs; ++j) {
      const int b = first + lane + 32 * j;
      tab[j] = lane + 32 * j < S::kStepBlocks && b < w_end ? __ldg(table + b) : -1;
    }
  };
  // Copies a step's summary rows into stage `buf`, lanes along the rows; returns (in `own`) the
  // rows of this lane's MMA blocks (tile τ, half e: block 16τ + 8e + g of the step).
  auto issue = [&](const int (&tab)[S::kTabRegs], int buf, int (&own)[S::kTiles][2]) {
    uint4* lo = stages[warp][buf];
    uint4* hi = lo + S::kStepBlocks * S::kRowChunks;
#pragma unroll
    for (int j = 0; j < S::kStepBlocks * S::kRowChunks / 32; ++j) {
      const int x = lane + 32 * j, blk = x / S::kRowChunks, col = x % S::kRowChunks;
      const int m = __shfl_sync(0xffffffffu, tab[(32 * j) / S::kRowChunks / 32], blk % 32);
      const int64_t at = m >= 0 ? static_cast<int64_t>(m) * D + 8 * col : 0;
      CpAsync16(SmemAddr(lo + S::Slot(blk, col)), p.kmin + at, m >= 0 ? 16 : 0);
      CpAsync16(SmemAddr(hi + S::Slot(blk, col)), p.kmax + at, m >= 0 ? 16 : 0);
    }
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int blk = 16 * tau + 8 * e + g;
        own[tau][e] = __shfl_sync(0xffffffffu, tab[blk / 32], blk % 32);
      }
    }
  };
  int tab[S::kTabRegs], own[S::kTiles][2], own_next[S::kTiles][2];
  load_tab(w_begin, tab);
  issue(tab, 0, own);
  CpAsyncCommit();
  load_tab(w_begin + S::kStepBlocks, tab);

  // B fragments: lane (g, t) holds query head n = g + 8·nt at dims 8t + 32c + {0..7} as q⁺ and q⁻
  // bf16 pairs (pairs 0, 1 feed the chunk's first MMA, pairs 2, 3 its second).
  uint32_t qp[S::kChunks][NT][4], qn[S::kChunks][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = g + 8 * nt;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(
        p.q + (static_cast<int64_t>(row) * p.num_q_heads + h * group + min(n, group - 1)) * D + 8 * t);
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t v = n < group ? __ldg(qrow + 16 * c + i) : 0u;
        qp[c][nt][i] = MaxBf16x2(v, 0u);
        qn[c][nt][i] = MinBf16x2(v, 0u);
      }
    }
  }

  int buf = 0;
  for (int first = w_begin; first < w_end; first += S::kStepBlocks, buf ^= 1) {
    if (first + S::kStepBlocks < w_end) issue(tab, buf ^ 1, own_next);
    CpAsyncCommit();  // possibly empty: one group per step either way
    load_tab(first + 2 * S::kStepBlocks, tab);
    CpAsyncWait<1>();  // this step's rows (this lane's copies) have landed
    __syncwarp();            // ... and every lane's
    const uint4* lo = stages[warp][buf];
    const uint4* hi = lo + S::kStepBlocks * S::kRowChunks;
    float acc[S::kTiles][NT][4];
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[tau][nt][i] = 0.0f;
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau) {
#pragma unroll
      for (int c = 0; c < S::kChunks; ++c) {
        const int b0 = 16 * tau + g, b1 = b0 + 8, col = t + 4 * c;
        const uint4 vl0 = lo[S::Slot(b0, col)], vl1 = lo[S::Slot(b1, col)];
        const uint4 vh0 = hi[S::Slot(b0, col)], vh1 = hi[S::Slot(b1, col)];
        const uint32_t* l0 = reinterpret_cast<const uint32_t*>(&vl0);  // block g
        const uint32_t* l1 = reinterpret_cast<const uint32_t*>(&vl1);  // block g + 8
        const uint32_t* u0 = reinterpret_cast<const uint32_t*>(&vh0);
        const uint32_t* u1 = reinterpret_cast<const uint32_t*>(&vh1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i0 = 2 * half, i1 = 2 * half + 1;
          const uint32_t x0 = MaxBf16x2(u0[i0], l0[i0]), x1 = MaxBf16x2(u1[i0], l1[i0]);
          const uint32_t x2 = MaxBf16x2(u0[i1], l0[i1]), x3 = MaxBf16x2(u1[i1], l1[i1]);
          const uint32_t y0 = MinBf16x2(u0[i0], l0[i0]), y1 = MinBf16x2(u1[i0], l1[i0]);
          const uint32_t y2 = MinBf16x2(u0[i1], l0[i1]), y3 = MinBf16x2(u1[i1], l1[i1]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            Mma(acc[tau][nt], x0, x1, x2, x3, qp[c][nt][i0], qp[c][nt][i1]);
            Mma(acc[tau][nt], y0, y1, y2, y3, qn[c][nt][i0], qn[c][nt][i1]);
          }
        }
      }
    }
    __syncwarp();  // every lane has read this stage before the next step's copies refill it
    // acc[τ][nt] = {block g: heads 8nt + 2t, +1; block g + 8: the same}. Reduce over the group.
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = p.reduce_max ? -INFINITY : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const bool head = 8 * nt + 2 * t + i < group;
            const float s = acc[tau][nt][2 * e + i];
            v = p.reduce_max ? (head ? fmaxf(v, s) : v) : v + s;  // absent heads add an exact 0
          }
        }
        v = p.reduce_max ? fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)) : v + __shfl_xor_sync(0xffffffffu, v, 1);
        v = p.reduce_max ? fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2)) : v + __shfl_xor_sync(0xffffffffu, v, 2);
        const int b = first + 16 * tau + 8 * e + g;
        if (t == e && b < w_end) p.scores[base + b] = own[tau][e] >= 0 ? v : -INFINITY;  // no summary: never chosen
      }
    }
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau) own[tau][0] = own_next[tau][0], own[tau][1] = own_next[tau][1];
  }
  // The top-K (a PDL launch) may be scheduled once every CTA is here. Earlier triggers were
  // slower: at the kernel's start its CTAs took slots before all of this grid's were resident
  // (predict 0.646 of the ceiling instead of 0.697), at each warp's last step 0.68.
  AllowDependentLaunch();
}

// Scores as order-preserving unsigned keys.
__device__ __forceinline__ uint32_t TopKKey(float s) {
  s += 0.0f;  // -0 -> +0: equal scores compare equal, like the CPU's comparison
  const uint32_t bits = __float_as_uint(s);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// ---- Top-K, rows of at most 256·kCtaTopKMaxPerThread blocks and K ≤ kCtaTopKMaxK: one 256-thread
// CTA per (row, KV head), the row's keys in registers (thread t holds blocks t + 256j). Keys are
// binned linearly between the row's smallest and largest key (-inf, a block without a summary,
// below the range: bin 0), 1,024 bins in shared memory. Binning is monotone — every key of a
// higher bin is larger, equal keys share a bin — so a suffix scan over the bin counts gives each
// bin its place in the output: the bin where the count from the top reaches `take` is the cut,
// the keys of the bins above it and of the cut bin are placed into their bins' segments, and
// each ranks itself within its segment (usually one to three keys; a row of equal keys is one
// segment, n comparisons a key, slow but exact) by (key desc, id asc); those ranked below `take`
// are written. This is a latency problem (256 rows of 1,024 blocks at batch
// 32 × 8 KV heads: 2 CTAs per SM), so the design counts barriers (five). Measured there: the
// 4-pass radix select below ~11.5 µs of the predict, a two-bits-a-round threshold search
// (16 rounds, a barrier each) ~10 µs, one histogram pass with the candidates ranked by counting
// ~6.5 µs, one warp per row ~28 µs (9,200 dependent instructions per warp, ncu), a bitonic sort
// of the row in shared memory ~16 µs (bank-bound).
constexpr int kCtaTopKThreads = 256;
constexpr int kCtaTopKWarps = kCtaTopKThreads / 32;
constexpr int kCtaTopKMaxPerThread = 16;  // rows of up to 4,096 blocks (64K tokens)
constexpr int kCtaTopKMaxK = 256;
constexpr int kCtaTopKBins = 1024;
constexpr int kCtaTopKBinsPerThread = kCtaTopKBins / kCtaTopKThreads;

template <int P>
__global__ void __launch_bounds__(kCtaTopKThreads)
    TopKCtaKernel(const float* scores, const int32_t* rows, const int32_t* num_blocks, int32_t* topk,
                  int num_kv_heads, int max_blocks, int k) {
  const int r = blockIdx.x / num_kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ uint64_t seg[kCtaTopKThreads * P];  // the placed keys, bin by bin from the top
  __shared__ int count[kCtaTopKBins], end[kCtaTopKBins];  // per bin: keys; its segment's end
  __shared__ int warp_total[kCtaTopKWarps];
  __shared__ uint32_t warp_hi[kCtaTopKWarps], warp_lo[kCtaTopKWarps];
  __shared__ int s_cut;
  // Shared state first: it reads nothing an earlier kernel writes.
#pragma unroll
  for (int i = 0; i < kCtaTopKBinsPerThread; ++i) count[tid * kCtaTopKBinsPerThread + i] = 0;
  if (tid == 0) s_cut = -1;  // no cut: every key is taken
  GridDependencyWait();  // the scores (and rows) come from the kernels before (PDL launch)
  // The row's flag, its length and its scores load together (the scores up to max_blocks are
  // in bounds whatever the length): one memory latency instead of three in a row.
  const float* s = scores + static_cast<int64_t>(blockIdx.x) * max_blocks;
  const int row = rows[r], length = num_blocks[r];
  float loaded[P];
#pragma unroll
  for (int j = 0; j < P; ++j) loaded[j] = tid + kCtaTopKThreads * j < max_blocks ? s[tid + kCtaTopKThreads * j] : 0.0f;
  if (row < 0) return;
  int32_t* out = topk + static_cast<int64_t>(blockIdx.x) * k;
  const int n = min(length, max_blocks);
  const int take = min(k, n);
  const unsigned full = 0xffffffffu;
  constexpr uint32_t kNegInfKey = 0x007FFFFFu;  // TopKKey(-inf)
  uint32_t key[P];
  uint32_t hi = 0, lo = 0xffffffffu;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const bool real = tid + kCtaTopKThreads * j < n;
    key[j] = TopKKey(loaded[j]);
    hi = real ? max(hi, key[j]) : hi;
    lo = real && key[j] > kNegInfKey ? min(lo, key[j]) : lo;
  }
  hi = __reduce_max_sync(full, hi);
  lo = __reduce_min_sync(full, lo);
  if (lane == 0) warp_hi[warp] = hi, warp_lo[warp] = lo;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCtaTopKWarps; ++w) hi = max(hi, warp_hi[w]), lo = min(lo, warp_lo[w]);
  lo = min(lo, hi);  // only -inf keys: one bin
  // Monotone bins: float(key - lo) and the product round monotonically; keys below lo go to 0.
  const float scale = static_cast<float>(kCtaTopKBins) / (static_cast<float>(hi - lo) + 1.0f);
  int bin[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    bin[j] = key[j] < lo ? 0 : min(kCtaTopKBins - 1, static_cast<int>(static_cast<float>(key[j] - lo) * scale));
    if (tid + kCtaTopKThreads * j < n) atomicAdd(&count[bin[j]], 1);
  }
  __syncthreads();
  // Thread t owns the t-th group of bins from the top; an inclusive scan over the threads.
  int mine[kCtaTopKBinsPerThread], sum = 0;
#pragma unroll
  for (int i = 0; i < kCtaTopKBinsPerThread; ++i) {
    mine[i] = count[kCtaTopKBins - 1 - (tid * kCtaTopKBinsPerThread + i)];
    sum += mine[i];
  }
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(full, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kCtaTopKWarps; ++w) incl += w < warp ? warp_total[w] : 0;
  int cum = incl - sum;  // keys in the bins above this thread's
#pragma unroll
  for (int i = 0; i < kCtaTopKBinsPerThread; ++i) {
    const int b = kCtaTopKBins - 1 - (tid * kCtaTopKBinsPerThread + i);
    end[b] = cum;  // the segment's start for now: placing a key moves it on by one
    if (n > take && cum < take && cum + mine[i] >= take) s_cut = b;  // exactly one bin
    cum += mine[i];
  }
  __syncthreads();
  const int cut = s_cut;
  int at[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int i = tid + kCtaTopKThreads * j;
    at[j] = i < n && bin[j] >= cut ? atomicAdd(&end[bin[j]], 1) : -1;
    if (at[j] >= 0) seg[at[j]] = (static_cast<uint64_t>(key[j]) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  }
  __syncthreads();
  // Each placed key's rank within its bin's segment gives its place in the output.
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (at[j] < 0) continue;
    const int e = end[bin[j]], first = e - count[bin[j]];
    const uint64_t v = seg[at[j]];
    int place = first;
    for (int f = first; f < e; ++f) place += seg[f] > v;
    if (place < take) out[place] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(v & 0xFFFFFFFFu));
  }
  for (int i = take + tid; i < k; i += kCtaTopKThreads) out[i] = -1;
}

// ---- Top-K, longer rows: one CTA per (row, KV head). The keys sit in shared memory (the first kTopKCache; any beyond are re-read); a 4-pass radix select (8-bit
// digits, warp-aggregated histogram) finds the take-th largest key T and how many keys equal to
// T are taken. Keys above T are ranked by counting on (key, id); keys equal to T follow them in
// id order (an ordered scan, needed only when T is tied across the cut).
constexpr int kTopKThreads = 256;
constexpr int kTopKMax = 1024;
constexpr int kTopKCache = 4096;

__global__ void __launch_bounds__(kTopKThreads)
    TopKBlocksKernel(const float* scores, const int32_t* rows, const int32_t* num_blocks, int32_t* topk,
                     int num_kv_heads, int max_blocks, int k) {
  GridDependencyWait();  // the scores (and rows) come from the kernels before (PDL launch)
  const int r = blockIdx.x / num_kv_heads;
  if (rows[r] < 0) return;
  const float* s = scores + static_cast<int64_t>(blockIdx.x) * max_blocks;
  int32_t* out = topk + static_cast<int64_t>(blockIdx.x) * k;
  const int n = min(num_blocks[r], max_blocks);
  const int take = min(k, n);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kTopKThreads / 32;
  __shared__ uint32_t keys[kTopKCache];
  __shared__ int hist[256];
  __shared__ uint64_t cand[kTopKMax];
  __shared__ int warp_count[kWarps];
  __shared__ int s_count, s_digit, s_remaining, s_tied;
  for (int i = tid; i < min(n, kTopKCache); i += kTopKThreads) keys[i] = TopKKey(s[i]);
  auto key_at = [&](int i) { return i < kTopKCache ? keys[i] : TopKKey(s[i]); };
  if (tid == 0) s_count = 0;
  __syncthreads();
  uint32_t threshold = 0;  // the take-th largest key (0: all keys)
  int need_eq = 0, tied = 0;  // keys equal to the threshold: taken, and present
  if (n > take) {
    uint32_t prefix = 0, mask = 0;
    if (tid == 0) s_remaining = take;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kTopKThreads) hist[i] = 0;
      __syncthreads();
      for (int i0 = 0; i0 < n; i0 += kTopKThreads) {  // every lane runs every round (the warp votes)
        const int i = i0 + tid;
        const uint32_t key = i < n ? key_at(i) : 0u;
        const bool in = i < n && (key & mask) == prefix;
        const unsigned active = __ballot_sync(0xffffffffu, in);
        if (in) {
          const int digit = (key >> shift) & 255;
          const unsigned peers = __match_any_sync(active, digit);
          if (lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
        }
      }
      __syncthreads();
      if (warp == 0) {  // the digit where the count from the top reaches `remaining`
        int mine = 0;
        for (int d = 0; d < 8; ++d) mine += hist[255 - (lane * 8 + d)];
        int incl = mine;  // inclusive prefix over lanes (lane 0 holds the top digits)
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        const int excl = incl - mine, need = s_remaining;
        __syncwarp();  // every lane has read s_remaining before the owner rewrites it
        const unsigned ballot = __ballot_sync(0xffffffffu, incl >= need);
        const int owner = __ffs(ballot) - 1;
        if (lane == owner) {
          int cum = excl;
          for (int d = 0; d < 8; ++d) {
            const int digit = 255 - (lane * 8 + d);
            if (cum + hist[digit] >= need) {
              s_digit = digit;
              s_remaining = need - cum;
              s_tied = hist[digit];
              break;
            }
            cum += hist[digit];
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(s_digit) << shift;
      mask |= 255u << shift;
      __syncthreads();  // s_digit is rewritten by the next pass
    }
    threshold = prefix;
    need_eq = s_remaining;
    tied = s_tied;  // after the last pass: the keys equal to the threshold
  }
  // Candidates ranked by counting: keys above the threshold, and the tied keys too when all of
  // them are taken (then exactly `take` candidates).
  const bool all_tied = need_eq == tied;
  for (int i0 = 0; i0 < n; i0 += kTopKThreads) {
    const int i = i0 + tid;
    const uint32_t key = i < n ? key_at(i) : 0u;
    const bool in = i < n && (key > threshold || (all_tied && key == threshold));
    const unsigned ballot = __ballot_sync(0xffffffffu, in);
    int at = 0;
    if (lane == 0 && ballot) at = atomicAdd(&s_count, __popc(ballot));
    at = __shfl_sync(0xffffffffu, at, 0) + __popc(ballot & ((1u << lane) - 1u));
    if (in) cand[at] = (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  }
  __syncthreads();
  const int count = s_count;
  for (int c = tid; c < count; c += kTopKThreads) {
    const uint64_t key = cand[c];
    int rank = 0;
    for (int j = 0; j < count; ++j) rank += cand[j] > key;
    out[rank] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFu));
  }
  if (!all_tied) {  // the first need_eq keys equal to the threshold, in id order, after the others
    int seen = 0;
    for (int i0 = 0; i0 < n && seen < need_eq; i0 += kTopKThreads) {
      const int i = i0 + tid;
      const bool eq = i < n && key_at(i) == threshold;
      const unsigned ballot = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int before = seen, total = seen;
      for (int w = 0; w < kWarps; ++w) {
        before += w < warp ? warp_count[w] : 0;
        total += warp_count[w];
      }
      const int e = before + __popc(ballot & ((1u << lane) - 1u));
      if (eq && e < need_eq) out[count + e] = i;
      seen = total;
      __syncthreads();  // warp_count is rewritten by the next round
    }
  }
  for (int i = take + tid; i < k; i += kTopKThreads) out[i] = -1;
}

// ---- Select: one CTA per (row, KV head); the rules of Backend::SelectBlocks with rank-by-count
// in shared memory (K is at most a few hundred).
constexpr int kSelectThreads = 256;

__global__ void __launch_bounds__(kSelectThreads) SelectBlocksKernel(SelectBlocksParams p) {
  const int r = blockIdx.x / p.num_kv_heads;
  const int64_t base = blockIdx.x;
  const int K = p.k, C = p.c;
  int32_t* src = p.fetch_src + base * C;
  int32_t* dst = p.fetch_dst + base * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) src[i] = dst[i] = -1;
  int32_t* rout = p.remote != nullptr ? p.remote_out + base * p.cr : nullptr;
  for (int i = threadIdx.x; rout != nullptr && i < p.cr; i += blockDim.x) rout[i] = -1;
  if (p.rows[r] < 0) return;
  __shared__ int pred[kSelectMaxK], blocks[kSelectMaxK], age[kSelectMaxK], hit[kSelectMaxK], miss_rank[kSelectMaxK];
  __shared__ int victim_at[kSelectMaxK];
  __shared__ int s_hits, s_misses, s_local, s_victims, s_resident;
  const uint8_t* rmask = p.remote != nullptr ? p.remote + base * p.max_blocks : nullptr;
  const int32_t* topk = p.topk + base * K;
  const int32_t* table = p.host_tables + base * p.max_blocks;
  const int32_t* slots = p.ws_slots + base * K;
  int32_t* g_blocks = p.ws_blocks + base * K;
  int32_t* g_age = p.ws_age + base * K;
  if (threadIdx.x == 0) s_hits = s_misses = s_local = s_victims = s_resident = 0;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    pred[j] = topk[j];
    blocks[j] = g_blocks[j];
    age[j] = g_age[j];
    hit[j] = 0;
    victim_at[j] = -1;
  }
  __syncthreads();
  // 1–3: hits mark their slot; misses are ranked in topk order (best score first).
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int b = pred[i];
    miss_rank[i] = 0;  // 1 = a miss, for now
    if (b < 0) continue;
    int at = -1;
    for (int j = 0; j < K; ++j) at = blocks[j] == b ? j : at;
    if (at >= 0) {
      hit[at] = 1;
      atomicAdd(&s_hits, 1);
    } else if (rmask != nullptr && b < p.max_blocks && rmask[b] != 0) {
      miss_rank[i] = 2;  // remote: listed, not fetched
      atomicAdd(&s_misses, 1);
    } else {
      miss_rank[i] = 1;
      atomicAdd(&s_misses, 1);
      atomicAdd(&s_local, 1);
    }
  }
  __syncthreads();
  int ranks[kSelectMaxK / kSelectThreads];
  for (int i = threadIdx.x, t = 0; i < K; i += blockDim.x, ++t) {
    int rank = -1;
    const int kind = miss_rank[i];
    if (kind != 0) {
      int before = 0;
      for (int i2 = 0; i2 < i; ++i2) before += miss_rank[i2] == kind;
      if (kind == 1) {
        rank = before;
      } else if (before < p.cr) {
        rout[before] = pred[i];
      }
    }
    ranks[t] = rank;
  }
  __syncthreads();
  for (int i = threadIdx.x, t = 0; i < K; i += blockDim.x, ++t) miss_rank[i] = ranks[t];
  __syncthreads();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    if (hit[j]) {
      age[j] = 0;
    } else if (blocks[j] >= 0) {
      age[j] = age[j] == INT_MAX ? age[j] : age[j] + 1;
    }
  }
  __syncthreads();
  // 4: victims ordered: empty slots (ascending j), then by descending age, ties ascending j.
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    const bool victim = blocks[j] < 0 || !hit[j];
    if (!victim) continue;
    atomicAdd(&s_victims, 1);
    const bool empty = blocks[j] < 0;
    int rank = 0;
    for (int j2 = 0; j2 < K; ++j2) {
      if (j2 == j || !(blocks[j2] < 0 || !hit[j2])) continue;
      const bool e2 = blocks[j2] < 0;
      bool before;
      if (e2 != empty) {
        before = e2;
      } else if (empty) {
        before = j2 < j;
      } else {
        before = age[j2] > age[j] || (age[j2] == age[j] && j2 < j);
      }
      rank += before;
    }
    if (rank < C) victim_at[rank] = j;
  }
  __syncthreads();
  // 5: admit n = min(misses, C, victims), best-scored misses first.
  const int n = min(min(s_local, C), s_victims);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int m = miss_rank[i];
    if (m < 0 || m >= n) continue;
    const int j = victim_at[m], b = pred[i];
    src[m] = b < p.max_blocks ? table[b] : -1;
    dst[m] = slots[j];
    blocks[j] = b;
    age[j] = 0;
  }
  __syncthreads();
  // 6: resident slots by ascending logical block.
  int32_t* res = p.resident_slots + base * K;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    g_blocks[j] = blocks[j];
    g_age[j] = age[j];
    res[j] = -1;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    if (blocks[j] < 0) continue;
    atomicAdd(&s_resident, 1);
    int rank = 0;
    for (int j2 = 0; j2 < K; ++j2) rank += blocks[j2] >= 0 && blocks[j2] < blocks[j];
    res[rank] = slots[j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.num_resident[base] = s_resident;
    p.stats[base * 3] += s_hits;
    p.stats[base * 3 + 1] += s_misses;
    p.stats[base * 3 + 2] += n;
  }
}

// ---- Head-block copies (the UVA gather): a grid-stride loop over (block, 16-byte vector) items,
// kCopyUnroll items per thread in flight before any store (K and V each: 8 loads of 16 bytes), so a
// few CTAs keep enough host reads outstanding to fill PCIe and leave the other SMs to the step's
// kernels (a read of mapped host memory waits microseconds; CTAs that wait hold their SM's slots).
constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;

__global__ void __launch_bounds__(kCopyThreads) CopyBlocksKernel(const bf16* src_k, const bf16* src_v,
                                                                 const int32_t* src_slots, bf16* dst_k, bf16* dst_v,
                                                                 const int32_t* dst_slots, int64_t n, int head_dim) {
  const int64_t vecs = int64_t{kBlockTokens} * head_dim / 8;  // 16-byte vectors per block
  const int64_t total = n * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const uint4* sk = reinterpret_cast<const uint4*>(src_k);
  const uint4* sv = reinterpret_cast<const uint4*>(src_v);
  uint4* dk = reinterpret_cast<uint4*>(dst_k);
  uint4* dv = reinterpret_cast<uint4*>(dst_v);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; first < total;
       first += stride * kCopyUnroll) {
    uint4 a[kCopyUnroll], b[kCopyUnroll];
    int64_t to[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int64_t item = first + u * stride;
      to[u] = -1;
      if (item >= total) continue;
      const int64_t i = item / vecs, v = item - i * vecs;
      const int64_t s = src_slots[i], d = dst_slots[i];
      if (s < 0 || d < 0) continue;
      a[u] = sk[s * vecs + v];
      b[u] = sv[s * vecs + v];
      to[u] = d * vecs + v;
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (to[u] < 0) continue;
      dk[to[u]] = a[u];
      dv[to[u]] = b[u];
    }
  }
}

// The gather through the TMA (the default): lane 0 of a one-warp CTA streams its share of the
// blocks (i = blockIdx.x + j·gridDim.x) through a ring of kTmaGatherStages shared-memory slots,
// each the K then the V of one head-block: two bulk loads from the host (one instruction per
// 16·D·2 bytes, completion counted on the slot's mbarrier), then two bulk stores to the
// destination slot; a slot is loaded again once its stores have read it. No registers hold data
// and the CTA has one warp, so beside the step's kernels it takes almost nothing from its SM:
// on the H200 the sparse step with transfers on was 2–8% faster than with the register gather
// (docs/benchmarks.md, eleventh session). Bulk copies reach mapped host memory like global
// memory (tests/kernels/test_cuda_sparse.cpp checks both directions).
constexpr int kTmaGatherStages = 2;

__global__ void __launch_bounds__(32) CopyBlocksTmaKernel(const char* src_k, const char* src_v, const int32_t* src_slots,
                                                          char* dst_k, char* dst_v, const int32_t* dst_slots, int64_t n,
                                                          int block_bytes) {
  constexpr int stages = kTmaGatherStages;
  extern __shared__ __align__(128) unsigned char ring[];  // [stages][K, V][block_bytes]
  __shared__ __align__(8) uint64_t bars[stages];
  if (threadIdx.x != 0) return;
  const uint32_t ring0 = SmemAddr(ring);
  const uint32_t bar0 = SmemAddr(bars);
  for (int st = 0; st < stages; ++st) MbarInit(bar0 + 8 * st, 1);
  FenceMbarrierInit();
  // This CTA's entries; one with a negative slot is skipped (its slot's phase completes empty).
  // Each entry's slots are read again before its stores, as in the kernel measured in
  // docs/benchmarks.md (holding them in a per-stage array was never compared on one machine).
  const int64_t mine = n > blockIdx.x ? (n - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  auto issue = [&](int64_t j) {
    const int st = static_cast<int>(j % stages);
    const int64_t i = blockIdx.x + j * gridDim.x;
    const int32_t sl = src_slots[i];
    const uint32_t bar = bar0 + 8 * st, at = ring0 + st * 2 * block_bytes;
    if (sl < 0 || dst_slots[i] < 0) {
      MbarArrive(bar);  // an empty phase
      return;
    }
    MbarArriveExpectTx(bar, 2u * block_bytes);
    BulkLoad(at, src_k + static_cast<int64_t>(sl) * block_bytes, block_bytes, bar);
    BulkLoad(at + block_bytes, src_v + static_cast<int64_t>(sl) * block_bytes, block_bytes, bar);
  };
  for (int64_t j = 0; j < mine && j < stages; ++j) issue(j);
  for (int64_t j = 0; j < mine; ++j) {
    const int st = static_cast<int>(j % stages);
    MbarWait(bar0 + 8 * st, static_cast<uint32_t>((j / stages) & 1));
    const int64_t i = blockIdx.x + j * gridDim.x;
    const int32_t d = dst_slots[i];
    if (d >= 0 && src_slots[i] >= 0) {
      const uint32_t at = ring0 + st * 2 * block_bytes;
      BulkStore(dst_k + static_cast<int64_t>(d) * block_bytes, at, block_bytes);
      BulkStore(dst_v + static_cast<int64_t>(d) * block_bytes, at + block_bytes, block_bytes);
      BulkCommit();
    }
    if (j + stages < mine) {
      BulkWaitRead();  // the slot's stores have read it
      issue(j + stages);
    }
  }
  BulkWait();
}

__global__ void CopyTokensKernel(const bf16* src_k, const bf16* src_v, const int64_t* src_index, bf16* dst_k,
                                 bf16* dst_v, const int64_t* dst_index, int64_t n, int head_dim) {
  const int vecs = head_dim / 8;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= n * vecs) return;
  const int64_t i = item / vecs, v = item % vecs;
  const int64_t s = src_index[i], d = dst_index[i];
  if (s < 0 || d < 0) return;
  reinterpret_cast<uint4*>(dst_k)[d * vecs + v] = reinterpret_cast<const uint4*>(src_k)[s * vecs + v];
  reinterpret_cast<uint4*>(dst_v)[d * vecs + v] = reinterpret_cast<const uint4*>(src_v)[s * vecs + v];
}

// One warp per (sequence, KV head): the lanes copy the row's entries (a thread per row took
// ~26 µs at 32 × 8 rows of 129 entries, on the main stream of every sparse layer).
constexpr int kAssembleWarps = 4;

__global__ void __launch_bounds__(32 * kAssembleWarps) AssembleTablesKernel(AssembleTablesParams p) {
  const int item = blockIdx.x * kAssembleWarps + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (item >= p.num_seqs * p.num_kv_heads) return;
  const int s = item / p.num_kv_heads, h = item % p.num_kv_heads;
  const int r = p.seq_rows[s];
  if (r < 0) return;
  const int tail = p.tail_lens[s];
  const int nt = (tail + kBlockTokens - 1) / kBlockTokens;
  const int n = p.num_resident[r * p.num_kv_heads + h];
  if (n + nt > p.width) return;  // the host checked the widths; never write past a row
  int32_t* row = p.block_tables + static_cast<int64_t>(item) * p.width;
  const int32_t* res = p.resident_slots + (static_cast<int64_t>(r) * p.num_kv_heads + h) * p.k;
  for (int i = lane; i < n; i += 32) row[i] = res[i];
  if (lane < nt) row[n + lane] = p.tail_slots[static_cast<int64_t>(item) * 2 + lane];
  if (lane == 0) p.kv_lens[item] = n * kBlockTokens + tail;
}

__global__ void TopKOverlapKernel(const int32_t* predicted, const int32_t* actual, const int32_t* rows,
                                  int32_t* counts, int num_kv_heads, int k) {
  const int r = blockIdx.x / num_kv_heads;
  if (rows[r] < 0) return;
  const int32_t* pr = predicted + static_cast<int64_t>(blockIdx.x) * k;
  const int32_t* ac = actual + static_cast<int64_t>(blockIdx.x) * k;
  int overlap = 0, total = 0;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    if (ac[i] < 0) continue;
    ++total;
    for (int j = 0; j < k; ++j) {
      if (pr[j] == ac[i]) {
        ++overlap;
        break;
      }
    }
  }
  __shared__ float scratch[32];
  const float o = BlockSum(static_cast<float>(overlap), scratch);
  const float t = BlockSum(static_cast<float>(total), scratch);
  if (threadIdx.x == 0) {
    counts[static_cast<int64_t>(blockIdx.x) * 2] += static_cast<int32_t>(o);
    counts[static_cast<int64_t>(blockIdx.x) * 2 + 1] += static_cast<int32_t>(t);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// OASIS_TOPK_RADIX=1 sends every top-K to the radix select (same-machine comparisons); read once.
bool TopKRadixForced() {
  static const bool forced = [] {
    const char* v = std::getenv("OASIS_TOPK_RADIX");
    return v != nullptr && std::string(v) == "1";
  }();
  return forced;
}

}  // namespace

cudaError_t LaunchBlockSummaries(const bf16* k_pool, const int32_t* src_slots, const int32_t* num_tokens,
                                 const int32_t* dst_rows, bf16* kmin, bf16* kmax, int64_t n, int head_dim,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > INT_MAX || head_dim <= 0) return cudaErrorInvalidValue;
  BlockSummariesKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(k_pool, src_slots, num_tokens, dst_rows, kmin,
                                                                     kmax, head_dim);
  return cudaGetLastError();
}

bool ScoreBlocksSupported(int head_dim, int group) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 &&
         group <= kScoreMaxGroup;
}

cudaError_t LaunchScoreBlocks(const ScoreBlocksParams& p, cudaStream_t stream) {
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0 ||
      !ScoreBlocksSupported(p.head_dim, p.num_q_heads / p.num_kv_heads) || !Aligned16(p.kmin) || !Aligned16(p.kmax) ||
      (reinterpret_cast<uintptr_t>(p.q) & 3) != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.max_blocks == 0) return cudaSuccess;
  const bool two_tiles = p.num_q_heads / p.num_kv_heads > 8;
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return cudaGetLastError();
  }
  auto launch = [&](auto kernel, auto shape) {
    using S = decltype(shape);
    // One wave: 4 CTAs per SM (48 KB of shared memory each), each warp as many steps as that takes.
    const int64_t wave_warps = int64_t{sms} * 4 * S::kWarps;
    const int64_t warp_steps = static_cast<int64_t>(p.rows) * p.num_kv_heads * CeilDiv(p.max_blocks, S::kStepBlocks);
    const int steps = static_cast<int>(std::clamp<int64_t>((warp_steps + wave_warps - 1) / wave_warps, 1, kScoreMaxSteps));
    const dim3 grid(CeilDiv(p.max_blocks, int64_t{S::kStepBlocks} * steps * S::kWarps),
                    static_cast<unsigned>(p.rows * p.num_kv_heads));
    kernel<<<grid, 32 * S::kWarps, 0, stream>>>(p, steps);
    return cudaGetLastError();
  };
  switch (p.head_dim) {
    case 32:
      return two_tiles ? launch(ScoreBlocksKernel<32, 2>, ScoreShape<32>{})
                       : launch(ScoreBlocksKernel<32, 1>, ScoreShape<32>{});
    case 64:
      return two_tiles ? launch(ScoreBlocksKernel<64, 2>, ScoreShape<64>{})
                       : launch(ScoreBlocksKernel<64, 1>, ScoreShape<64>{});
    case 128:
      return two_tiles ? launch(ScoreBlocksKernel<128, 2>, ScoreShape<128>{})
                       : launch(ScoreBlocksKernel<128, 1>, ScoreShape<128>{});
    default:
      return two_tiles ? launch(ScoreBlocksKernel<256, 2>, ScoreShape<256>{})
                       : launch(ScoreBlocksKernel<256, 1>, ScoreShape<256>{});
  }
}

cudaError_t LaunchTopKBlocks(const float* scores, const int32_t* rows, const int32_t* num_blocks, int32_t* topk,
                             int num_rows, int num_kv_heads, int max_blocks, int k, cudaStream_t stream) {
  if (k < 1 || k > kTopKMax) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  // PDL: its launch and CTA start overlap the scoring kernel's tail.
  const dim3 grid(static_cast<unsigned>(num_rows * num_kv_heads));
  if (k <= kCtaTopKMaxK && max_blocks <= kCtaTopKThreads * kCtaTopKMaxPerThread && !TopKRadixForced()) {
    auto cta = [&](auto kernel) {
      return LaunchPdl(kernel, grid, dim3(kCtaTopKThreads), 0, stream, scores, rows, num_blocks, topk, num_kv_heads,
                       max_blocks, k);
    };
    if (max_blocks <= kCtaTopKThreads) return cta(TopKCtaKernel<1>);
    if (max_blocks <= 2 * kCtaTopKThreads) return cta(TopKCtaKernel<2>);
    if (max_blocks <= 4 * kCtaTopKThreads) return cta(TopKCtaKernel<4>);
    if (max_blocks <= 8 * kCtaTopKThreads) return cta(TopKCtaKernel<8>);
    return cta(TopKCtaKernel<kCtaTopKMaxPerThread>);
  }
  return LaunchPdl(TopKBlocksKernel, grid, dim3(kTopKThreads), 0, stream, scores, rows, num_blocks, topk, num_kv_heads,
                   max_blocks, k);
}

cudaError_t LaunchSelectBlocks(const SelectBlocksParams& p, cudaStream_t stream) {
  if (p.k < 1 || p.k > kSelectMaxK || p.c < 0) return cudaErrorInvalidValue;
  if (p.rows_count == 0 || p.num_kv_heads == 0) return cudaSuccess;
  SelectBlocksKernel<<<static_cast<unsigned>(p.rows_count * p.num_kv_heads), kSelectThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

GatherConfig GatherConfigFromEnv() {
  GatherConfig c;
  if (const char* v = std::getenv("OASIS_GATHER_CTAS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 1024) {
      c.error = std::string("OASIS_GATHER_CTAS must be 1 to 1024, not '") + v + "'";
    } else {
      c.ctas = static_cast<int>(n);
    }
  }
  if (const char* v = std::getenv("OASIS_GATHER_KERNEL"); v != nullptr && *v != '\0') {
    if (std::string(v) == "registers") {
      c.kernel = GatherKernel::kRegisters;
    } else if (std::string(v) != "tma") {
      c.error = std::string("OASIS_GATHER_KERNEL must be tma or registers, not '") + v + "'";
    }
  }
  return c;
}

cudaError_t LaunchCopyBlocks(const bf16* src_k, const bf16* src_v, const int32_t* src_slots, bf16* dst_k, bf16* dst_v,
                             const int32_t* dst_slots, int64_t n, int head_dim, int max_ctas, cudaStream_t stream,
                             GatherKernel kernel) {
  if (head_dim % 8 != 0 || !Aligned16(src_k) || !Aligned16(src_v) || !Aligned16(dst_k) || !Aligned16(dst_v) ||
      max_ctas < 1) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  // The stream's priority as the launch's own: a graph that captures this launch keeps it on
  // the node (run with cudaGraphInstantiateFlagUseNodePriority), so the gather stays ahead of
  // the step's many-CTA kernels there too.
  int priority = 0;
  if (cudaStreamGetPriority(stream, &priority) != cudaSuccess) return cudaGetLastError();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributePriority;
  attr[0].val.priority = priority;
  cudaLaunchConfig_t cfg = {};
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err;
  if (kernel == GatherKernel::kTma) {
    const int block_bytes = kBlockTokens * head_dim * 2;  // a multiple of 16 (head_dim % 8 == 0)
    cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(n, max_ctas)));
    cfg.blockDim = dim3(32);
    cfg.dynamicSmemBytes = static_cast<size_t>(kTmaGatherStages) * 2 * block_bytes;  // 16 KiB at head_dim 128
    err = cudaLaunchKernelEx(&cfg, CopyBlocksTmaKernel, reinterpret_cast<const char*>(src_k),
                             reinterpret_cast<const char*>(src_v), src_slots, reinterpret_cast<char*>(dst_k),
                             reinterpret_cast<char*>(dst_v), dst_slots, n, block_bytes);
  } else {
    const int64_t vecs = int64_t{kBlockTokens} * head_dim / 8;
    const int64_t per_cta = int64_t{kCopyThreads} * kCopyUnroll;  // items one CTA has in flight
    const int64_t needed = (n * vecs + per_cta - 1) / per_cta;
    cfg.gridDim = dim3(static_cast<unsigned>(needed < max_ctas ? needed : max_ctas));
    cfg.blockDim = dim3(kCopyThreads);
    err = cudaLaunchKernelEx(&cfg, CopyBlocksKernel, src_k, src_v, src_slots, dst_k, dst_v, dst_slots, n, head_dim);
  }
  return err != cudaSuccess ? err : cudaGetLastError();
}

cudaError_t LaunchCopyTokens(const bf16* src_k, const bf16* src_v, const int64_t* src_index, bf16* dst_k, bf16* dst_v,
                             const int64_t* dst_index, int64_t n, int head_dim, cudaStream_t stream) {
  if (head_dim % 8 != 0 || !Aligned16(src_k) || !Aligned16(src_v) || !Aligned16(dst_k) || !Aligned16(dst_v)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  const int64_t items = n * (head_dim / 8);
  CopyTokensKernel<<<CeilDiv(items, 256), 256, 0, stream>>>(src_k, src_v, src_index, dst_k, dst_v, dst_index, n,
                                                            head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchAssembleSparseTables(const AssembleTablesParams& p, cudaStream_t stream) {
  const int items = p.num_seqs * p.num_kv_heads;
  if (items == 0) return cudaSuccess;
  AssembleTablesKernel<<<CeilDiv(items, kAssembleWarps), 32 * kAssembleWarps, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchTopKOverlap(const int32_t* predicted, const int32_t* actual, const int32_t* rows, int32_t* counts,
                              int num_rows, int num_kv_heads, int k, cudaStream_t stream) {
  if (k < 1) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  TopKOverlapKernel<<<static_cast<unsigned>(num_rows * num_kv_heads), 128, 0, stream>>>(predicted, actual, rows,
                                                                                        counts, num_kv_heads, k);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

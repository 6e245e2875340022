// Sparse-KV top-K (kernels/sparse_kv.h): the best blocks of every (row, KV head) by score, and
// the predictor-agreement counter that compares two top-K lists.
#include "kernels/common.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

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
    TopKCtaKernel(const float* scores, const int32_t* rows, const int32_t* num_blocks,
                  int32_t* topk, int num_kv_heads, int max_blocks, int k) {
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
  GridDependencyWait();      // the scores (and rows) come from the kernels before (PDL launch)
  // The row's flag, its length and its scores load together (the scores up to max_blocks are
  // in bounds whatever the length): one memory latency instead of three in a row.
  const float* s = scores + static_cast<int64_t>(blockIdx.x) * max_blocks;
  const int row = rows[r], length = num_blocks[r];
  float loaded[P];
#pragma unroll
  for (int j = 0; j < P; ++j)
    loaded[j] = tid + kCtaTopKThreads * j < max_blocks ? s[tid + kCtaTopKThreads * j] : 0.0f;
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
    bin[j] = key[j] < lo
                 ? 0
                 : min(kCtaTopKBins - 1, static_cast<int>(static_cast<float>(key[j] - lo) * scale));
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
    if (at[j] >= 0)
      seg[at[j]] = (static_cast<uint64_t>(key[j]) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
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
    if (place < take)
      out[place] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(v & 0xFFFFFFFFu));
  }
  for (int i = take + tid; i < k; i += kCtaTopKThreads) out[i] = -1;
}

// ---- Top-K, longer rows: one CTA per (row, KV head). The keys sit in shared memory (the first
// kTopKCache; any beyond are re-read); a 4-pass radix select (8-bit digits, warp-aggregated
// histogram) finds the take-th largest key T and how many keys equal to T are taken. Keys above T
// are ranked by counting on (key, id); keys equal to T follow them in id order (an ordered scan,
// needed only when T is tied across the cut).
constexpr int kTopKThreads = 256;
constexpr int kTopKMax = 1024;
constexpr int kTopKCache = 4096;

__global__ void __launch_bounds__(kTopKThreads)
    TopKBlocksKernel(const float* scores, const int32_t* rows, const int32_t* num_blocks,
                     int32_t* topk, int num_kv_heads, int max_blocks, int k) {
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
  uint32_t threshold = 0;     // the take-th largest key (0: all keys)
  int need_eq = 0, tied = 0;  // keys equal to the threshold: taken, and present
  if (n > take) {
    uint32_t prefix = 0, mask = 0;
    if (tid == 0) s_remaining = take;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += kTopKThreads) hist[i] = 0;
      __syncthreads();
      for (int i0 = 0; i0 < n;
           i0 += kTopKThreads) {  // every lane runs every round (the warp votes)
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
    if (in)
      cand[at] = (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
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

__global__ void TopKOverlapKernel(const int32_t* predicted, const int32_t* actual,
                                  const int32_t* rows, int32_t* counts, int num_kv_heads, int k) {
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

// One CTA per (row, head), a thread per fetch entry (C <= K is small): find the working slot the
// entry filled, then look its block up in the real top-K.
__global__ void FetchOverlapKernel(const int32_t* fetch_dst, const int32_t* ws_slots,
                                   const int32_t* ws_blocks, const int32_t* actual,
                                   const int32_t* rows, int32_t* counts, int num_kv_heads, int k,
                                   int c) {
  const int r = blockIdx.x / num_kv_heads;
  if (rows[r] < 0) return;
  const int64_t rh = blockIdx.x;
  const int32_t* dst = fetch_dst + rh * c;
  const int32_t* slots = ws_slots + rh * k;
  const int32_t* blocks = ws_blocks + rh * k;
  const int32_t* ac = actual + rh * k;
  int used = 0, fetched = 0;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    if (dst[i] < 0) continue;
    ++fetched;
    int32_t block = -1;
    for (int j = 0; j < k; ++j) {
      if (slots[j] == dst[i]) block = blocks[j];
    }
    if (block < 0) continue;
    for (int j = 0; j < k; ++j) {
      if (ac[j] == block) {
        ++used;
        break;
      }
    }
  }
  __shared__ float scratch[32];
  const float u = BlockSum(static_cast<float>(used), scratch);
  const float f = BlockSum(static_cast<float>(fetched), scratch);
  if (threadIdx.x == 0) {
    counts[rh * 2] += static_cast<int32_t>(u);
    counts[rh * 2 + 1] += static_cast<int32_t>(f);
  }
}

}  // namespace

cudaError_t LaunchTopKBlocks(const float* scores, const int32_t* rows, const int32_t* num_blocks,
                             int32_t* topk, int num_rows, int num_kv_heads, int max_blocks, int k,
                             cudaStream_t stream) {
  if (k < 1 || k > kTopKMax) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  // PDL: its launch and CTA start overlap the scoring kernel's tail. OASIS_TOPK_RADIX=1 sends
  // every row to the radix select (comparisons on one machine).
  const dim3 grid(static_cast<unsigned>(num_rows * num_kv_heads));
  if (k <= kCtaTopKMaxK && max_blocks <= kCtaTopKThreads * kCtaTopKMaxPerThread &&
      !GetTuning().topk_radix) {
    auto cta = [&](auto kernel) {
      return LaunchPdl(kernel, grid, dim3(kCtaTopKThreads), 0, stream, scores, rows, num_blocks,
                       topk, num_kv_heads, max_blocks, k);
    };
    if (max_blocks <= kCtaTopKThreads) return cta(TopKCtaKernel<1>);
    if (max_blocks <= 2 * kCtaTopKThreads) return cta(TopKCtaKernel<2>);
    if (max_blocks <= 4 * kCtaTopKThreads) return cta(TopKCtaKernel<4>);
    if (max_blocks <= 8 * kCtaTopKThreads) return cta(TopKCtaKernel<8>);
    return cta(TopKCtaKernel<kCtaTopKMaxPerThread>);
  }
  return LaunchPdl(TopKBlocksKernel, grid, dim3(kTopKThreads), 0, stream, scores, rows, num_blocks,
                   topk, num_kv_heads, max_blocks, k);
}

cudaError_t LaunchTopKOverlap(const int32_t* predicted, const int32_t* actual, const int32_t* rows,
                              int32_t* counts, int num_rows, int num_kv_heads, int k,
                              cudaStream_t stream) {
  if (k < 1) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0) return cudaSuccess;
  TopKOverlapKernel<<<static_cast<unsigned>(num_rows * num_kv_heads), 128, 0, stream>>>(
      predicted, actual, rows, counts, num_kv_heads, k);
  return cudaGetLastError();
}

cudaError_t LaunchFetchOverlap(const int32_t* fetch_dst, const int32_t* ws_slots,
                               const int32_t* ws_blocks, const int32_t* actual, const int32_t* rows,
                               int32_t* counts, int num_rows, int num_kv_heads, int k, int c,
                               cudaStream_t stream) {
  if (k < 1 || c < 0) return cudaErrorInvalidValue;
  if (num_rows == 0 || num_kv_heads == 0 || c == 0) return cudaSuccess;
  FetchOverlapKernel<<<static_cast<unsigned>(num_rows * num_kv_heads), 32, 0, stream>>>(
      fetch_dst, ws_slots, ws_blocks, actual, rows, counts, num_kv_heads, k, c);
  return cudaGetLastError();
}

}  // namespace oasis::kernels

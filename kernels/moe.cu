// MoE routing (top-k from router logits), the small-batch grouped GEMVs, the permutation plan
// of the grouped GEMM path and the weighted combine. The grouped GEMM is in moe_gemm.cu.
#include <algorithm>

#include "kernels/moe.h"
#include "kernels/moe_common.cuh"

namespace oasis::kernels {

bool MoeSupported(int64_t hidden, int64_t inter, int64_t experts, int64_t k) {
  return hidden > 0 && inter > 0 && hidden % kMoeDimMultiple == 0 && inter % kMoeDimMultiple == 0 &&
         experts >= 1 && experts <= kMoeMaxExperts && k >= 1 && k <= experts;
}

namespace {

constexpr unsigned kFull = 0xffffffffu;

// ---- top-k routing ------------------------------------------------------------------------------

constexpr int kTopKWarps = 4;  // tokens per CTA

// One warp per token (MoeTopKWarp).
__global__ void __launch_bounds__(kTopKWarps * 32)
    MoeTopKKernel(const float* __restrict__ logits, int64_t tokens, int experts, int k,
                  bool renormalize, int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float topk_smem[];  // [kTopKWarps][experts] logits, then [..] chosen ids
  const int warp = threadIdx.x >> 5;
  float* s = topk_smem + warp * experts;
  int* chosen = reinterpret_cast<int*>(topk_smem + kTopKWarps * experts) + warp * experts;
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t t = int64_t{blockIdx.x} * kTopKWarps + warp;
  if (t >= tokens) return;  // warp-uniform; no block barrier follows
  MoeTopKWarp(logits + t * experts, experts, k, renormalize, s, chosen, ids + t * k,
              weights + t * k);
}

// ---- grouped GEMV (small batches) -------------------------------------------------------------

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvTokens = 8;       // tokens of one expert per pass over its rows
constexpr int kDownRowsPerWarp = 4;  // down rows a warp computes at once (K = I is short)

struct GroupSmem {
  int flag[kMoeMaxExperts];    // expert chosen by some pair of the batch
  int list[kMoeGemvMaxPairs];  // the pairs of this CTA's expert, ascending
  int expert;
  int count;
};

// The CTA's group: the slot-th distinct expert of the batch (ascending expert index) and its
// pairs in ascending order, or -1 when the batch has no more than `slot` distinct experts.
// Every thread of the CTA calls it; it ends with a barrier.
__device__ int FindGroup(const int32_t* __restrict__ ids, int pairs, int experts, int slot,
                         GroupSmem& sm) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) sm.flag[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < experts) sm.flag[e] = 1;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int seen = 0, expert = -1;
    for (int base = 0; base < experts; base += 32) {
      const bool f = base + lane < experts && sm.flag[base + lane] != 0;
      const unsigned m = __ballot_sync(kFull, f);
      const int c = __popc(m);
      if (slot < seen + c) {
        const bool mine = f && __popc(m & LanesBelow(lane)) == slot - seen;
        expert = base + __ffs(__ballot_sync(kFull, mine)) - 1;
        break;
      }
      seen += c;
    }
    int n = 0;
    if (expert >= 0) {
      for (int base = 0; base < pairs; base += 32) {
        const int p = base + lane;
        const bool f = p < pairs && ids[p] == expert;
        const unsigned m = __ballot_sync(kFull, f);
        if (f) sm.list[n + __popc(m & LanesBelow(lane))] = p;
        n += __popc(m);
      }
    }
    if (lane == 0) sm.expert = expert, sm.count = n;
  }
  __syncthreads();
  return sm.expert;
}

// CTA (slot, row block): warp w computes intermediate row i = blockIdx.y · 8 + w of its group's
// expert — the gate row i and the up row inter + i — for every pair of the group, kGemvTokens at
// a time; lanes split the hidden dimension in 16-byte vectors, 4 K-steps of both rows in flight.
__global__ void __launch_bounds__(kGemvThreads)
    MoeGemvGateUpKernel(const bf16* __restrict__ x, const int32_t* __restrict__ ids,
                        const bf16* __restrict__ gate_up, bf16* __restrict__ h, int pairs, int k,
                        int experts, int64_t hidden, int64_t inter) {
  __shared__ GroupSmem sm;
  GridDependencyWait();
  const int e = FindGroup(ids, pairs, experts, blockIdx.x, sm);
  AllowDependentLaunch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = int64_t{blockIdx.y} * kGemvWarps + warp;
  if (e < 0 || i >= inter) return;
  const int64_t vecs = hidden / 8;
  const uint4* wg = reinterpret_cast<const uint4*>(gate_up + (int64_t{e} * 2 * inter + i) * hidden);
  const uint4* wu = wg + inter * vecs;  // row inter + i
  const int n = sm.count;
  for (int c0 = 0; c0 < n; c0 += kGemvTokens) {
    const int nt = min(kGemvTokens, n - c0);
    const uint4* xr[kGemvTokens];
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) {
      xr[j] =
          reinterpret_cast<const uint4*>(x + int64_t{sm.list[c0 + min(j, nt - 1)] / k} * hidden);
    }
    float ag[kGemvTokens], au[kGemvTokens];
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) ag[j] = au[j] = 0.0f;
    int64_t v = lane;
    for (; v + 3 * 32 < vecs; v += 4 * 32) {
      uint4 g[4], u[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) g[q] = __ldcs(wg + v + 32 * q), u[q] = __ldcs(wu + v + 32 * q);
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int j = 0; j < kGemvTokens; ++j) {
          if (j < nt) {
            const uint4 xv = __ldg(xr[j] + v + 32 * q);
            Dot8(g[q], xv, ag[j]);
            Dot8(u[q], xv, au[j]);
          }
        }
    }
    for (; v < vecs; v += 32) {
      const uint4 g = __ldcs(wg + v), u = __ldcs(wu + v);
#pragma unroll
      for (int j = 0; j < kGemvTokens; ++j) {
        if (j < nt) {
          const uint4 xv = __ldg(xr[j] + v);
          Dot8(g, xv, ag[j]);
          Dot8(u, xv, au[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) {
      if (j < nt) {  // warp-uniform
        const float sg = WarpSum(ag[j]), su = WarpSum(au[j]);
        if (lane == j) h[int64_t{sm.list[c0 + j]} * inter + i] = SiluMulRounded(sg, su);
      }
    }
  }
}

// CTA (slot, row block): warp w computes kDownRowsPerWarp rows of down_e (hidden rows of length
// inter) for every pair of the group, kGemvTokens at a time, into float y.
__global__ void __launch_bounds__(kGemvThreads)
    MoeGemvDownKernel(const bf16* __restrict__ h, const int32_t* __restrict__ ids,
                      const bf16* __restrict__ down, float* __restrict__ y, int pairs, int experts,
                      int64_t hidden, int64_t inter) {
  __shared__ GroupSmem sm;
  GridDependencyWait();
  const int e = FindGroup(ids, pairs, experts, blockIdx.x, sm);
  AllowDependentLaunch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t{blockIdx.y} * kGemvWarps + warp) * kDownRowsPerWarp;
  if (e < 0 || row0 >= hidden) return;
  const int64_t vecs = inter / 8;
  const uint4* w[kDownRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kDownRowsPerWarp; ++r) {
    const int64_t row = min(row0 + r, hidden - 1);  // clamped rows: computed, never written
    w[r] = reinterpret_cast<const uint4*>(down + (int64_t{e} * hidden + row) * inter);
  }
  const int n = sm.count;
  for (int c0 = 0; c0 < n; c0 += kGemvTokens) {
    const int nt = min(kGemvTokens, n - c0);
    const uint4* hr[kGemvTokens];
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) {
      hr[j] = reinterpret_cast<const uint4*>(h + int64_t{sm.list[c0 + min(j, nt - 1)]} * inter);
    }
    float acc[kDownRowsPerWarp][kGemvTokens];
#pragma unroll
    for (int r = 0; r < kDownRowsPerWarp; ++r)
#pragma unroll
      for (int j = 0; j < kGemvTokens; ++j) acc[r][j] = 0.0f;
#pragma unroll 2
    for (int64_t v = lane; v < vecs; v += 32) {
      uint4 wv[kDownRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kDownRowsPerWarp; ++r) wv[r] = __ldcs(w[r] + v);
#pragma unroll
      for (int j = 0; j < kGemvTokens; ++j) {
        if (j < nt) {
          const uint4 hv = __ldg(hr[j] + v);
#pragma unroll
          for (int r = 0; r < kDownRowsPerWarp; ++r) Dot8(wv[r], hv, acc[r][j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) {
      if (j < nt) {
#pragma unroll
        for (int r = 0; r < kDownRowsPerWarp; ++r) {
          const float s = WarpSum(acc[r][j]);
          if (lane == r * kGemvTokens + j && row0 + r < hidden) {
            y[int64_t{sm.list[c0 + j]} * hidden + row0 + r] = s;
          }
        }
      }
    }
  }
}

// ---- the permutation plan (large batches) -----------------------------------------------------

constexpr int kPlanWarps = 8;

// Chunk c of the pairs (kMoePlanChunk pairs from c · kMoePlanChunk): its count per expert into
// counts[c, :] (the place kernel turns them into each chunk's first row per expert).
__global__ void __launch_bounds__(kPlanWarps * 32)
    MoePlanCountKernel(const int32_t* __restrict__ ids, int pairs, int experts, int32_t* counts) {
  __shared__ int cnt[kMoeMaxExperts];
  GridDependencyWait();
  AllowDependentLaunch();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int begin = blockIdx.x * kMoePlanChunk, end = min(pairs, begin + kMoePlanChunk);
  for (int p = begin + threadIdx.x; p < end; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    counts[int64_t{blockIdx.x} * experts + e] = cnt[e];
  }
}

// One CTA per chunk of kMoePlanChunk pairs. Warp w counts, then places, the pairs of its
// contiguous segment of the chunk; the rows of expert e are its pairs in ascending order (chunks
// in order, then segments, a warp's 32-pair chunks, lanes ranked by __match_any_sync), so the
// permutation is deterministic and the same for every chunking. With several chunks the rows
// before this chunk's come from MoePlanCountKernel's counts; CTA 0 writes offsets and
// tile_start.
__global__ void __launch_bounds__(kPlanWarps * 32)
    MoePlanKernel(const int32_t* __restrict__ ids, int pairs, int experts,
                  const int32_t* __restrict__ counts, MoePlan plan) {
  __shared__ int cnt[kPlanWarps][kMoeMaxExperts];  // counts, then each warp's next row
  __shared__ int offs[kMoeMaxExperts + 1];         // experts' first rows
  __shared__ int before[kMoeMaxExperts];           // rows of each expert in earlier chunks
  __shared__ int tiles[kMoeMaxExperts + 1];
  GridDependencyWait();
  AllowDependentLaunch();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int chunk = blockIdx.x, chunks = gridDim.x;
  for (int i = threadIdx.x; i < kPlanWarps * experts; i += blockDim.x) {
    cnt[i / experts][i % experts] = 0;
  }
  __syncthreads();
  const int c_begin = chunk * kMoePlanChunk, c_end = min(pairs, c_begin + kMoePlanChunk);
  const int seg = (c_end - c_begin + kPlanWarps - 1) / kPlanWarps;
  const int begin = min(c_end, c_begin + warp * seg), end = min(c_end, begin + seg);
  for (int p = begin + lane; p < end; p += 32) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&cnt[warp][e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int total = 0, earlier = 0;
    if (chunks == 1) {
#pragma unroll
      for (int w = 0; w < kPlanWarps; ++w) total += cnt[w][e];
    } else {
      for (int c = 0; c < chunks; ++c) {
        const int n = counts[int64_t{c} * experts + e];
        total += n;
        if (c < chunk) earlier += n;
      }
    }
    offs[e] = total;
    before[e] = earlier;
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scans of the rows and the row tiles per expert
    int run_rows = 0, run_tiles = 0;
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      const int rows = e < experts ? offs[e] : 0;
      const int t = (rows + plan.tile_rows - 1) / plan.tile_rows;
      int inc_rows = rows, inc_tiles = t;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(kFull, inc_rows, o), b = __shfl_up_sync(kFull, inc_tiles, o);
        if (lane >= o) inc_rows += a, inc_tiles += b;
      }
      if (e < experts) {
        offs[e] = run_rows + inc_rows - rows;
        tiles[e] = run_tiles + inc_tiles - t;
      }
      run_rows += __shfl_sync(kFull, inc_rows, 31);
      run_tiles += __shfl_sync(kFull, inc_tiles, 31);
    }
    if (lane == 0) offs[experts] = run_rows, tiles[experts] = run_tiles;
  }
  __syncthreads();
  if (chunk == 0) {
    for (int e = threadIdx.x; e <= experts; e += blockDim.x) {
      plan.offsets[e] = offs[e];
      plan.tile_start[e] = tiles[e];
    }
  }
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int run = offs[e] + before[e];
#pragma unroll
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = cnt[w][e];
      cnt[w][e] = run;
      run += c;
    }
  }
  __syncthreads();
  for (int base = begin; base < end; base += 32) {
    const int p = base + lane;
    const bool valid = p < end;
    int e = valid ? ids[p] : -1;
    if (e >= experts) e = -1;
    const unsigned peers = __match_any_sync(kFull, e);
    if (valid) {
      if (e >= 0) {
        const int row = cnt[warp][e] + __popc(peers & LanesBelow(lane));
        plan.sorted[row] = p;
        plan.pos[p] = row;
      } else {
        plan.pos[p] = -1;
      }
    }
    __syncwarp();
    if (e >= 0 && lane == 31 - __clz(peers)) cnt[warp][e] += __popc(peers);
    __syncwarp();
  }
}

// ---- combine ----------------------------------------------------------------------------------

__device__ __forceinline__ float2 Load2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 Load2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// CTA (token, column block): each thread two adjacent columns, slots in ascending order.
template <typename Y>
__global__ void __launch_bounds__(256)
    MoeCombineKernel(const Y* __restrict__ y, const int32_t* __restrict__ pos,
                     const float* __restrict__ weights, bf16* __restrict__ out, int k,
                     int64_t hidden) {
  GridDependencyWait();
  AllowDependentLaunch();
  const int64_t t = blockIdx.x;
  const int64_t c = 2 * (int64_t{blockIdx.y} * blockDim.x + threadIdx.x);
  if (c >= hidden) return;
  float a0 = 0.0f, a1 = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int64_t pair = t * k + j;
    const int64_t row = pos != nullptr ? pos[pair] : pair;
    if (row < 0) continue;
    const float w = weights[pair];
    const float2 v = Load2(y + row * hidden + c);
    a0 = fmaf(w, v.x, a0);  // explicit: the fused down + combine sums exactly so
    a1 = fmaf(w, v.y, a1);
  }
  *reinterpret_cast<__nv_bfloat162*>(out + t * hidden + c) = __floats2bfloat162_rn(a0, a1);
}

template <typename Y>
cudaError_t LaunchCombine(const Y* y, const int32_t* pos, const float* weights, bf16* out,
                          int64_t tokens, int k, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (hidden % 2 != 0 || tokens > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tokens), CeilDiv(hidden, 2 * 256));
  return LaunchPdl(MoeCombineKernel<Y>, grid, dim3(256), 0, stream, y, pos, weights, out, k,
                   hidden);
}

}  // namespace

cudaError_t LaunchMoeTopK(const float* logits, int64_t tokens, int experts, int k, bool renormalize,
                          int32_t* ids, float* weights, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (experts < 1 || experts > kMoeMaxExperts || k < 1 || k > experts) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = size_t{kTopKWarps} * experts * (sizeof(float) + sizeof(int));
  return LaunchPdl(MoeTopKKernel, dim3(CeilDiv(tokens, kTopKWarps)), dim3(kTopKWarps * 32), smem,
                   stream, logits, tokens, experts, k, renormalize, ids, weights);
}

cudaError_t LaunchMoeGemvGateUp(const bf16* x, const int32_t* ids, const bf16* gate_up, bf16* h,
                                int64_t tokens, int k, int experts, int64_t hidden, int64_t inter,
                                cudaStream_t stream) {
  const int64_t pairs = tokens * k;
  if (pairs == 0) return cudaSuccess;
  if (pairs > kMoeGemvMaxPairs || !MoeSupported(hidden, inter, experts, k) ||
      CeilDiv(inter, kGemvWarps) > 65535u) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(experts, pairs)),
                  CeilDiv(inter, kGemvWarps));
  return LaunchPdl(MoeGemvGateUpKernel, grid, dim3(kGemvThreads), 0, stream, x, ids, gate_up, h,
                   static_cast<int>(pairs), k, experts, hidden, inter);
}

cudaError_t LaunchMoeGemvDown(const bf16* h, const int32_t* ids, const bf16* down, float* y,
                              int64_t tokens, int k, int experts, int64_t hidden, int64_t inter,
                              cudaStream_t stream) {
  const int64_t pairs = tokens * k;
  if (pairs == 0) return cudaSuccess;
  if (pairs > kMoeGemvMaxPairs || !MoeSupported(hidden, inter, experts, k) ||
      CeilDiv(hidden, kGemvWarps * kDownRowsPerWarp) > 65535u) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(experts, pairs)),
                  CeilDiv(hidden, kGemvWarps * kDownRowsPerWarp));
  return LaunchPdl(MoeGemvDownKernel, grid, dim3(kGemvThreads), 0, stream, h, ids, down, y,
                   static_cast<int>(pairs), experts, hidden, inter);
}

bool MoeGemmTileRowsValid(int tile_rows) {
  for (int c : kMoeGemmTileRowChoices) {
    if (c == tile_rows) return true;
  }
  return false;
}

int MoeGemmTileRowsFor(int64_t pairs, int experts) {
  if (const int forced = GetTuning().moe_gemm_tile_rows; MoeGemmTileRowsValid(forced)) {
    return forced;
  }
  const int64_t touched = std::max<int64_t>(1, std::min<int64_t>(experts, pairs));
  const int64_t want = (pairs + touched - 1) / touched * kMoeGemmTileRowsSlack;
  for (int c : kMoeGemmTileRowChoices) {
    if (c >= want) return c;
  }
  return kMoeGemmTileRows;
}

MoePlan MoePlanIn(int32_t* buffer, int64_t pairs, int experts, int tile_rows) {
  MoePlan p;
  p.tile_rows = tile_rows;
  p.offsets = buffer;
  p.tile_start = buffer + (experts + 1);
  p.sorted = buffer + 2 * (experts + 1);
  p.pos = p.sorted + pairs;
  p.chunk_counts = p.pos + pairs;
  return p;
}

cudaError_t LaunchMoePlan(const int32_t* ids, int64_t pairs, int experts, const MoePlan& plan,
                          cudaStream_t stream) {
  if (experts < 1 || experts > kMoeMaxExperts || pairs < 0 || pairs > 0x3fffffff ||
      !MoeGemmTileRowsValid(plan.tile_rows)) {
    return cudaErrorInvalidValue;
  }
  const int64_t chunks = std::max<int64_t>(1, (pairs + kMoePlanChunk - 1) / kMoePlanChunk);
  if (chunks > 1) {
    if (const cudaError_t err = LaunchPdl(MoePlanCountKernel, dim3(static_cast<unsigned>(chunks)),
                                          dim3(kPlanWarps * 32), 0, stream, ids,
                                          static_cast<int>(pairs), experts, plan.chunk_counts);
        err != cudaSuccess) {
      return err;
    }
  }
  return LaunchPdl(MoePlanKernel, dim3(static_cast<unsigned>(chunks)), dim3(kPlanWarps * 32), 0,
                   stream, ids, static_cast<int>(pairs), experts,
                   static_cast<const int32_t*>(plan.chunk_counts), plan);
}

cudaError_t LaunchMoeCombineF32(const float* y, const int32_t* pos, const float* weights, bf16* out,
                                int64_t tokens, int k, int64_t hidden, cudaStream_t stream) {
  return LaunchCombine(y, pos, weights, out, tokens, k, hidden, stream);
}

cudaError_t LaunchMoeCombineBf16(const bf16* y, const int32_t* pos, const float* weights, bf16* out,
                                 int64_t tokens, int k, int64_t hidden, cudaStream_t stream) {
  return LaunchCombine(y, pos, weights, out, tokens, k, hidden, stream);
}

}  // namespace oasis::kernels

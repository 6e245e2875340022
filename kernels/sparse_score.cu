// Sparse-KV scoring (kernels/sparse_kv.h): per-head-block key summaries (element-wise min and max)
// and the blocks' scores against them on the tensor cores.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/sparse_kv.h"

namespace oasis::kernels {
namespace {

// ---- Block summaries: one CTA per entry, threads over head_dim. Kv is bf16, or uint8_t (e4m3
// bytes, summarised as the stored numbers, unscaled: every e4m3 value is a bf16 value). Out is
// bf16, or uint8_t for e4m3 pools (e4m3 summaries: the chosen stored bytes themselves). Ties keep
// the earlier token, as the CPU's std::min / std::max do, so ±0 (and NaN) choose as the CPU does.
__device__ __forceinline__ float KeyValue(bf16 x) { return ToFloat(x); }
__device__ __forceinline__ float KeyValue(uint8_t x) { return E4M3ToFloat(x); }

template <typename Kv, typename Out>
__global__ void BlockSummariesKernel(const Kv* k_pool, const int32_t* src_slots,
                                     const int32_t* num_tokens, const int32_t* dst_rows, Out* kmin,
                                     Out* kmax, int head_dim) {
  static_assert(std::is_same_v<Out, bf16> || std::is_same_v<Kv, uint8_t>,
                "e4m3 summaries are of e4m3 pools only");
  const int64_t i = blockIdx.x;
  const int count = num_tokens[i], dst = dst_rows[i];
  if (count <= 0 || dst < 0) return;
  const Kv* k = k_pool + static_cast<int64_t>(src_slots[i]) * kHeadBlockTokens * head_dim;
  for (int x = threadIdx.x; x < head_dim; x += blockDim.x) {
    Kv lo_k = k[x], hi_k = lo_k;
    float lo = KeyValue(lo_k), hi = lo;
    for (int j = 1; j < count && j < kHeadBlockTokens; ++j) {
      const Kv e = k[j * head_dim + x];
      const float v = KeyValue(e);
      if (v < lo) lo = v, lo_k = e;
      if (hi < v) hi = v, hi_k = e;
    }
    if constexpr (std::is_same_v<Out, uint8_t>) {  // the stored bytes: exact
      kmin[static_cast<int64_t>(dst) * head_dim + x] = lo_k;
      kmax[static_cast<int64_t>(dst) * head_dim + x] = hi_k;
    } else {
      kmin[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(lo);  // exact: a bf16 value
      kmax[static_cast<int64_t>(dst) * head_dim + x] = ToBf16(hi);
    }
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
// e4m3 summaries (FP8 pools; Sum = uint8_t): the same warps, steps and q fragments; the stages
// hold the half-size rows (cp.async of 16-byte pieces of D-byte rows, so half the bytes per step
// and half the shared memory), and lane (g, t) reads the 8-byte halves t + 4c of them (the same d
// as a bf16 chunk t + 4c; rows swizzled so that those reads are conflict-free too). Each 4 bytes
// are widened exactly to two bf16x2 words of value · 2^-112 (E4M3x4ToBf16x2Tiny: cvt to f16, two
// integer ops), the max/min and MMAs are the bf16 ones, q⁺/q⁻ are q · 2^64 (exact for |q| < 2^64)
// and the scores are the fp32 sums · 2^48 (exact): products are still exact (≥ 2^-78 in value;
// fp32 flushes smaller ones), and only the summation order differs from the CPU's.
// Steps per warp, at most: the launcher sizes it so the grid is one wave (at batch 32 × 16K, 8
// steps made 768 CTAs for 528 slots, a second partial wave; 11 make 512).
constexpr int kScoreMaxSteps = 64;
constexpr int kScoreMaxGroup = 16;
constexpr int kScoreSmemBytes = 48 * 1024;  // per CTA (no opt-in attribute needed)
constexpr float kScoreQScale = 0x1p64f;     // e4m3 summaries: q⁺/q⁻ scale ...
constexpr float kScoreUnscale = 0x1p48f;    // ... and the sums' (2^64 · 2^48 · 2^-112 = 1)
static_assert(kScoreQScale * kScoreUnscale * kE4M3ToBf16Tiny == 1.0f);

template <int D, typename Sum = bf16>  // Sum: the summaries' element type (bf16 or e4m3 bytes)
struct ScoreShape {
  static constexpr bool kFp8 = std::is_same_v<Sum, uint8_t>;
  static constexpr int kChunks = D / 32;  // 16-byte bf16 chunks per lane and row, MMA layout
  static constexpr int kTiles = D >= 128 ? 1 : 128 / D;  // 16-block tiles per step
  static constexpr int kStepBlocks = 16 * kTiles;
  static constexpr int kRowChunks = D * int{sizeof(Sum)} / 16;  // 16-byte chunks of a summary row
  static constexpr int kRowElems = 16 / int{sizeof(Sum)};       // elements of one such chunk
  static constexpr int kStageChunks = 2 * kStepBlocks * kRowChunks;  // kmin rows, then kmax rows
  // Warps per CTA: as the bf16 stages allow, for e4m3 summaries too (their stages use half of
  // kScoreSmemBytes; more warps would not keep the 4 CTAs per SM the launcher counts on).
  static constexpr int kWarps = kScoreSmemBytes / (2 * 2 * kStepBlocks * (D / 8) * 16);  // 3, 1
  static constexpr int kTabRegs = (kStepBlocks + 31) / 32;
  // Slot of chunk `col` of row `row` in a stage. bf16 rows (2·D bytes): odd rows' chunks xor 4,
  // so the MMA-layout reads of 8 rows × 4 chunks spread over all banks; rows of 64 bytes already
  // do. e4m3 rows (D bytes), read in 8-byte halves (each half-warp: 4 rows × 32 bytes): rows r
  // take their 32 bytes at bank groups that differ for r & 3 (pairs of chunks xor (r & 3) at
  // D ≥ 128, xor 1 for rows 2, 3 at D 64; 32-byte rows at D 32 already do).
  static __device__ __forceinline__ int Slot(int row, int col) {
    if constexpr (kFp8)
      return row * kRowChunks + (D >= 128  ? col ^ ((row & 3) << 1)
                                 : D == 64 ? col ^ (row & 2)
                                           : col);
    else
      return row * kRowChunks + (D >= 64 ? col ^ ((row & 1) << 2) : col);
  }
  // e4m3 stages as 8-byte halves: half `piece` (dims 8·piece ...) of row `row`.
  static __device__ __forceinline__ int Half(int row, int piece) {
    return 2 * Slot(row, piece >> 1) + (piece & 1);
  }
};

__device__ __forceinline__ uint32_t MaxBf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmax2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t MinBf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmin2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, float b) {  // exact for b = 2^k in range
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), __float2bfloat162_rn(b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// NT: n-tiles of 8 query heads (group ≤ 8: 1, ≤ 16: 2); Sum: bf16 or uint8_t (e4m3 summaries).
// One chunk of two blocks' bf16 summary words (l0/u0: block g, l1/u1: block g + 8) against the
// query's positive and negative parts: acc += max(q+·hi, q+·lo) + min(...) as the MMAs of the
// bf16 and the widened e4m3 rows alike.
template <int NT>
__device__ __forceinline__ void ScoreChunk(float (&acc)[NT][4], const uint32_t* l0,
                                           const uint32_t* l1, const uint32_t* u0,
                                           const uint32_t* u1, const uint32_t (&qp)[NT][4],
                                           const uint32_t (&qn)[NT][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i0 = 2 * half, i1 = 2 * half + 1;
    const uint32_t x0 = MaxBf16x2(u0[i0], l0[i0]), x1 = MaxBf16x2(u1[i0], l1[i0]);
    const uint32_t x2 = MaxBf16x2(u0[i1], l0[i1]), x3 = MaxBf16x2(u1[i1], l1[i1]);
    const uint32_t y0 = MinBf16x2(u0[i0], l0[i0]), y1 = MinBf16x2(u1[i0], l1[i0]);
    const uint32_t y2 = MinBf16x2(u0[i1], l0[i1]), y3 = MinBf16x2(u1[i1], l1[i1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      Mma(acc[nt], x0, x1, x2, x3, qp[nt][i0], qp[nt][i1]);
      Mma(acc[nt], y0, y1, y2, y3, qn[nt][i0], qn[nt][i1]);
    }
  }
}

template <int D, int NT, typename Sum>
__global__ void __launch_bounds__(32 * ScoreShape<D, Sum>::kWarps)
    ScoreBlocksKernel(ScoreBlocksParams p, int steps) {
  using S = ScoreShape<D, Sum>;
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
  const Sum* kmin_rows;
  const Sum* kmax_rows;
  if constexpr (S::kFp8)
    kmin_rows = p.kmin_fp8, kmax_rows = p.kmax_fp8;
  else
    kmin_rows = p.kmin, kmax_rows = p.kmax;

  // Table entries of a step's blocks: lane i holds block first + i + 32·j (-1: none).
  auto load_tab = [&](int first, int(&tab)[S::kTabRegs]) {
#pragma unroll
    for (int j = 0; j < S::kTabRegs; ++j) {
      const int b = first + lane + 32 * j;
      tab[j] = lane + 32 * j < S::kStepBlocks && b < w_end ? __ldg(table + b) : -1;
    }
  };
  // Copies a step's summary rows into stage `buf`, lanes along the rows; returns (in `own`) the
  // rows of this lane's MMA blocks (tile τ, half e: block 16τ + 8e + g of the step).
  auto issue = [&](const int(&tab)[S::kTabRegs], int buf, int(&own)[S::kTiles][2]) {
    uint4* lo = stages[warp][buf];
    uint4* hi = lo + S::kStepBlocks * S::kRowChunks;
#pragma unroll
    for (int j = 0; j < S::kStepBlocks * S::kRowChunks / 32; ++j) {
      const int x = lane + 32 * j, blk = x / S::kRowChunks, col = x % S::kRowChunks;
      const int m = __shfl_sync(0xffffffffu, tab[(32 * j) / S::kRowChunks / 32], blk % 32);
      const int64_t at = m >= 0 ? static_cast<int64_t>(m) * D + S::kRowElems * col : 0;
      CpAsync16(SmemAddr(lo + S::Slot(blk, col)), kmin_rows + at, m >= 0 ? 16 : 0);
      CpAsync16(SmemAddr(hi + S::Slot(blk, col)), kmax_rows + at, m >= 0 ? 16 : 0);
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
  // bf16 pairs (pairs 0, 1 feed the chunk's first MMA, pairs 2, 3 its second); · 2^64 for e4m3
  // summaries.
  uint32_t qp[S::kChunks][NT][4], qn[S::kChunks][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int n = g + 8 * nt;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(
        p.q + (static_cast<int64_t>(row) * p.num_q_heads + h * group + min(n, group - 1)) * D +
        8 * t);
#pragma unroll
    for (int c = 0; c < S::kChunks; ++c) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t v = n < group ? __ldg(qrow + 16 * c + i) : 0u;
        qp[c][nt][i] = MaxBf16x2(v, 0u);
        qn[c][nt][i] = MinBf16x2(v, 0u);
        if constexpr (S::kFp8) {
          qp[c][nt][i] = MulBf16x2(qp[c][nt][i], kScoreQScale);
          qn[c][nt][i] = MulBf16x2(qn[c][nt][i], kScoreQScale);
        }
      }
    }
  }

  int buf = 0;
  for (int first = w_begin; first < w_end; first += S::kStepBlocks, buf ^= 1) {
    if (first + S::kStepBlocks < w_end) issue(tab, buf ^ 1, own_next);
    CpAsyncCommit();  // possibly empty: one group per step either way
    load_tab(first + 2 * S::kStepBlocks, tab);
    CpAsyncWait<1>();  // this step's rows (this lane's copies) have landed
    __syncwarp();      // ... and every lane's
    const uint4* lo = stages[warp][buf];
    const uint4* hi = lo + S::kStepBlocks * S::kRowChunks;
    float acc[S::kTiles][NT][4];
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[tau][nt][i] = 0.0f;
    if constexpr (!S::kFp8) {
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
          ScoreChunk<NT>(acc[tau], l0, l1, u0, u1, qp[c], qn[c]);
        }
      }
    } else {  // e4m3 rows: 8-byte halves, widened exactly
#pragma unroll
      for (int tau = 0; tau < S::kTiles; ++tau) {
#pragma unroll
        for (int c = 0; c < S::kChunks; ++c) {
          const int b0 = 16 * tau + g, b1 = b0 + 8, piece = t + 4 * c;
          const uint2* lo2 = reinterpret_cast<const uint2*>(lo);
          const uint2* hi2 = reinterpret_cast<const uint2*>(hi);
          const uint2 vl0 = lo2[S::Half(b0, piece)], vl1 = lo2[S::Half(b1, piece)];
          const uint2 vh0 = hi2[S::Half(b0, piece)], vh1 = hi2[S::Half(b1, piece)];
          // bf16x2 words of value · 2^-112: word i = dims 8·piece + 2i, + 1 (as in a bf16 chunk).
          uint32_t l0[4], l1[4], u0[4], u1[4];
          E4M3x4ToBf16x2Tiny(vl0.x, l0[0], l0[1]);  // block g
          E4M3x4ToBf16x2Tiny(vl0.y, l0[2], l0[3]);
          E4M3x4ToBf16x2Tiny(vl1.x, l1[0], l1[1]);  // block g + 8
          E4M3x4ToBf16x2Tiny(vl1.y, l1[2], l1[3]);
          E4M3x4ToBf16x2Tiny(vh0.x, u0[0], u0[1]);
          E4M3x4ToBf16x2Tiny(vh0.y, u0[2], u0[3]);
          E4M3x4ToBf16x2Tiny(vh1.x, u1[0], u1[1]);
          E4M3x4ToBf16x2Tiny(vh1.y, u1[2], u1[3]);
          ScoreChunk<NT>(acc[tau], l0, l1, u0, u1, qp[c], qn[c]);
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
        v = p.reduce_max ? fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1))
                         : v + __shfl_xor_sync(0xffffffffu, v, 1);
        v = p.reduce_max ? fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2))
                         : v + __shfl_xor_sync(0xffffffffu, v, 2);
        if constexpr (S::kFp8) v *= kScoreUnscale;  // exact
        const int b = first + 16 * tau + 8 * e + g;
        if (t == e && b < w_end)
          p.scores[base + b] = own[tau][e] >= 0 ? v : -INFINITY;  // no summary: never chosen
      }
    }
#pragma unroll
    for (int tau = 0; tau < S::kTiles; ++tau)
      own[tau][0] = own_next[tau][0], own[tau][1] = own_next[tau][1];
  }
  // The top-K (a PDL launch) may be scheduled once every CTA is here. Earlier triggers were
  // slower: at the kernel's start its CTAs took slots before all of this grid's were resident
  // (predict 0.646 of the ceiling instead of 0.697), at each warp's last step 0.68.
  AllowDependentLaunch();
}

}  // namespace

cudaError_t LaunchBlockSummaries(const bf16* k_pool, const int32_t* src_slots,
                                 const int32_t* num_tokens, const int32_t* dst_rows, bf16* kmin,
                                 bf16* kmax, int64_t n, int head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > INT_MAX || head_dim <= 0) return cudaErrorInvalidValue;
  BlockSummariesKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      k_pool, src_slots, num_tokens, dst_rows, kmin, kmax, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchBlockSummariesFp8(const uint8_t* k_pool, const int32_t* src_slots,
                                    const int32_t* num_tokens, const int32_t* dst_rows, bf16* kmin,
                                    bf16* kmax, int64_t n, int head_dim, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > INT_MAX || head_dim <= 0) return cudaErrorInvalidValue;
  BlockSummariesKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      k_pool, src_slots, num_tokens, dst_rows, kmin, kmax, head_dim);
  return cudaGetLastError();
}

cudaError_t LaunchBlockSummariesFp8(const uint8_t* k_pool, const int32_t* src_slots,
                                    const int32_t* num_tokens, const int32_t* dst_rows,
                                    uint8_t* kmin, uint8_t* kmax, int64_t n, int head_dim,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > INT_MAX || head_dim <= 0) return cudaErrorInvalidValue;
  BlockSummariesKernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      k_pool, src_slots, num_tokens, dst_rows, kmin, kmax, head_dim);
  return cudaGetLastError();
}

bool ScoreBlocksSupported(int head_dim, int group) {
  return (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 &&
         group <= kScoreMaxGroup;
}

cudaError_t LaunchScoreBlocks(const ScoreBlocksParams& p, cudaStream_t stream) {
  // Summaries: bf16 (kmin, kmax) or e4m3 (kmin_fp8, kmax_fp8), one pair given.
  const bool fp8 = p.kmin_fp8 != nullptr || p.kmax_fp8 != nullptr;
  const bool summaries_ok =
      fp8 ? p.kmin_fp8 != nullptr && p.kmax_fp8 != nullptr && p.kmin == nullptr &&
                p.kmax == nullptr && Aligned16(p.kmin_fp8) && Aligned16(p.kmax_fp8)
          : p.kmin != nullptr && p.kmax != nullptr && Aligned16(p.kmin) && Aligned16(p.kmax);
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0 ||
      !ScoreBlocksSupported(p.head_dim, p.num_q_heads / p.num_kv_heads) || !summaries_ok ||
      (reinterpret_cast<uintptr_t>(p.q) & 3) != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.max_blocks == 0) return cudaSuccess;
  const bool two_tiles = p.num_q_heads / p.num_kv_heads > 8;
  const int sms = DeviceSmCount();  // cached per device
  if (sms == 0) return cudaErrorInvalidDevice;
  auto launch = [&](auto kernel, auto shape) {
    using S = decltype(shape);
    // One wave: 4 CTAs per SM (48 KB of shared memory each), each warp as many steps as that takes.
    const int64_t wave_warps = int64_t{sms} * 4 * S::kWarps;
    const int64_t warp_steps =
        static_cast<int64_t>(p.rows) * p.num_kv_heads * CeilDiv(p.max_blocks, S::kStepBlocks);
    const int steps = static_cast<int>(
        std::clamp<int64_t>((warp_steps + wave_warps - 1) / wave_warps, 1, kScoreMaxSteps));
    const dim3 grid(CeilDiv(p.max_blocks, int64_t{S::kStepBlocks} * steps * S::kWarps),
                    static_cast<unsigned>(p.rows * p.num_kv_heads));
    kernel<<<grid, 32 * S::kWarps, 0, stream>>>(p, steps);
    return cudaGetLastError();
  };
  // Sum: the summaries' element type; the same grid for both (ScoreShape: same warps and steps).
  auto dispatch = [&](auto sum) {
    using Sum = decltype(sum);
    switch (p.head_dim) {
      case 32:
        return two_tiles ? launch(ScoreBlocksKernel<32, 2, Sum>, ScoreShape<32, Sum>{})
                         : launch(ScoreBlocksKernel<32, 1, Sum>, ScoreShape<32, Sum>{});
      case 64:
        return two_tiles ? launch(ScoreBlocksKernel<64, 2, Sum>, ScoreShape<64, Sum>{})
                         : launch(ScoreBlocksKernel<64, 1, Sum>, ScoreShape<64, Sum>{});
      case 128:
        return two_tiles ? launch(ScoreBlocksKernel<128, 2, Sum>, ScoreShape<128, Sum>{})
                         : launch(ScoreBlocksKernel<128, 1, Sum>, ScoreShape<128, Sum>{});
      default:
        return two_tiles ? launch(ScoreBlocksKernel<256, 2, Sum>, ScoreShape<256, Sum>{})
                         : launch(ScoreBlocksKernel<256, 1, Sum>, ScoreShape<256, Sum>{});
    }
  };
  return fp8 ? dispatch(uint8_t{}) : dispatch(bf16{});
}

}  // namespace oasis::kernels

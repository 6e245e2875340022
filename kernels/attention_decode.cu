// Split-K flash-decoding over head-level block tables (see attention_decode.h and
// docs/kernels/decode_attention.md).
//
// MMA roles are swapped so the few query rows are the MMA's N (8 per n-tile) instead of padding
// its M: S^T = K·Q^T (M = 16 tokens of a head-block, N = 8 query rows, K = head_dim) and
// O^T = V^T·P^T (M = 16 output columns, N = 8 rows, K = 16 tokens). Fragment layouts
// (PTX mma.m16n8k16, bf16 in, f32 accumulate; lane = 4·r + c):
//   A (16×16, row):  reg0 = A[r][2c..2c+1]  reg1 = A[r+8][2c..]  reg2 = A[r][2c+8..]  reg3 =
//   A[r+8][2c+8..] B (16×8, col):   reg0 = B[2c..2c+1][r]  reg1 = B[2c+8..2c+9][r] C (16×8): c0,c1
//   = C[r][2c..2c+1]  c2,c3 = C[r+8][2c..2c+1]
// K·Q^T: the dot product does not care about the order of head_dim, so lane (r, c) loads 16
// contiguous bytes K[token r (and r+8)][32b + 8c .. +8] and uses words x,y as k-step 2b and z,w as
// k-step 2b+1; Q[row r][32b + 8c .. +8] gives the B registers of the same two k-steps.
// P^T: S^T's accumulators hold (token r, rows 2c, 2c+1); packed to bf16 they are an 8×8 matrix
// fragment, and movmatrix.trans turns them into B's (tokens 2c, 2c+1; row r).
// V^T·P^T: lane (r, c) loads V[token 2c, 2c+1, 2c+8, 2c+9][64g + 8r .. +8]; m-tile 4g + f uses
// column d = 64g + 8r + 2f as its row r and d + 1 as its row r + 8, paired over tokens with a byte
// permute. The accumulators then hold O[row 2c, 2c+1][64g + 8r + 2f, +1].
//
// K/V reach shared memory through cp.async (16 bytes per lane, L1 bypassed) into a per-warp ring
// of kStages head-blocks: every warp-wide cp.async copies 512 contiguous bytes (4 whole 128-byte
// lines) of a head-block; a head-block's K (then V) lands as 16 token rows of U = D/8 16-byte
// units, unit u of token t stored at t·U + (u ^ Swz(t)), a swizzle that makes the fragment reads
// below conflict-free. Lanes read pieces other lanes copied: a __syncwarp after the wait, and one
// before a stage is overwritten. The ring is "wide": 2 head-blocks per warp (3 at head_dim 64),
// 3 CTAs = 12 warps per SM at head_dim 128. (The kernels this one was chosen over — a deeper
// ring, and per-lane copies — are measured in docs/kernels/decode_attention.md.)
#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <mutex>

#include "kernels/attention_decode.h"
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"

namespace oasis::kernels {
namespace {

constexpr int kPage = 16;  // tokens per head-block (kKvBlockSize)
constexpr int kWarps = 4;  // warps per split CTA; each streams every 4th head-block of the split
constexpr int kThreads = 32 * kWarps;
constexpr int kMinPagesPerSplit = 8;  // automatic plans: at least 2 head-blocks per warp
constexpr int kMaxDevices = 64;
constexpr float kLog2e = 1.4426950408889634f;

// How the KV range of every (sequence, KV head) is cut. The grid has `splits` CTAs per (pair,
// row chunk); the cut itself is made on the device from the real kv_len (PagesPerSplit), so a
// large host bound (CUDA graphs) leaves the unused CTAs empty instead of making the splits short.
struct SplitPlan {
  int splits = 1;
  int min_pages = 1;   // a split covers max(min_pages, ceil(pages / splits)) head-blocks
  int row_tiles = 1;   // 8-row MMA n-tiles per CTA (1 or 2)
  int row_chunks = 1;  // ceil(group · max_query_len / (8 · row_tiles))
};

__host__ __device__ inline int PagesPerSplit(int pages, const SplitPlan& plan) {
  const int even = (pages + plan.splits - 1) / plan.splits;
  return even > plan.min_pages ? even : plan.min_pages;
}

// Splits that hold head-blocks of a (sequence, KV head) of `pages` head-blocks; 1 also when
// there are none (split 0 then writes zeros). With 1 the split kernel writes the output directly.
__host__ __device__ inline int UsedSplits(int pages, const SplitPlan& plan) {
  const int pps = PagesPerSplit(pages, plan);
  return pages <= pps ? 1 : (pages + pps - 1) / pps;
}

// Ring depth in head-blocks per warp: 16 KB (12 KB at head_dim 64, 32 KB at 256) per warp, 3 CTAs
// (4 at 64, 1 at 256) per SM. FP8 head-blocks are half the bytes: twice the depth in the same
// bytes (4, 6 at head_dim 64), so as many bytes stay in flight per SM.
constexpr int StagesFor(int head_dim, bool fp8) {
  return fp8 ? (head_dim == 64 ? 6 : 4) : (head_dim == 64 ? 3 : 2);
}
// Bytes of one head-block's K and V.
constexpr int PageBytes(int head_dim, bool fp8) { return head_dim * (fp8 ? 32 : 64); }
constexpr int RingBytes(int head_dim, int stages, bool fp8) {
  return kWarps * stages * PageBytes(head_dim, fp8);
}
constexpr int CtasPerSmFor(int ring_bytes) {  // by shared memory (227 KB, 1 KB reserved per CTA)
  const int n = 232448 / (ring_bytes + 1024);
  return n < 1 ? 1 : n > 4 ? 4 : n;
}

template <int D, bool kFp8 = false>
struct Shape {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim");
  static constexpr int kKB = D / 32;      // 16-byte K pieces per token row per lane (bf16)
  static constexpr int kGroups = D / 64;  // 64-column groups of V and of the output
  static constexpr int kU = kFp8 ? D / 16 : D / 8;  // 16-byte units per token row
  static constexpr int kPieces = kU;      // 16-byte units per lane per head-block (K then V)
  static constexpr int kMTiles = D / 16;  // P·V m-tiles
  static constexpr int kStages = StagesFor(D, kFp8);
  static constexpr int kRingBytes = RingBytes(D, kStages, kFp8);
  static constexpr int kMinCtasPerSm = CtasPerSmFor(kRingBytes);
};

// Swizzle of a token row's 16-byte units in the coalesced layout: the K reads (tokens r, r+1 of a
// quarter-warp, units 4b + c) and the V reads (tokens 2c + δ, units 8g + r) hit 8 distinct
// 16-byte bank groups per quarter-warp.
__device__ __forceinline__ int Swz(int t) { return (t & 6) ^ ((t & 1) << 2); }

// FP8 head-blocks: a token row is kU = D/16 units; unit L = t·kU + u of the K (or V) region sits
// at L ^ SwzFp8(t). The XOR reads only bits of L above bit 2 (t >> 1 at head_dim 64, where two
// rows share 128 bytes) and writes bits 0-2, so it permutes each 8-unit line. The K reads
// (16 bytes: tokens r, r+1 of a quarter-warp, units 4b + c) and the V reads (8 bytes: tokens
// 2c + δ, unit 4g + r/2, half r & 1) then hit distinct banks per phase.
template <int kU>
__device__ __forceinline__ int SwzFp8(int t) {
  return (kU >= 8 ? (t & 1) << 2 : 0) ^ (((t >> 1) & 3) << 1);
}
template <int kU>
__device__ __forceinline__ int PosFp8(int t, int u) {
  return (t * kU + u) ^ SwzFp8<kU>(t);
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The V tokens a lane loads, relative to 2c: the B rows k = 2c, 2c+1, 2c+8, 2c+9.
__device__ __forceinline__ constexpr int VTok(int i) { return (i & 1) + 8 * (i >> 1); }

// One CTA of kWarps warps: rows [R·chunk, R·chunk + R) (R = 8·NT) of the (sequence, KV head)
// group's G·q_len query rows, head-blocks of split `sp`, every kWarps-th one per warp.
// The warps' states are combined in shared memory; the CTA writes the output (when it is the
// pair's only split) or its normalised partial output and log2-sum-exp.
// kFp8: e4m3 pools; the ring holds the bytes, fragments are widened to f16 when read (f16 MMAs,
// q converted to f16 once), k_scale[h] scales the scores and v_scale[h] the output.
template <int D, int NT, bool kFp8>
__global__ void __launch_bounds__(kThreads, (Shape<D, kFp8>::kMinCtasPerSm))
    DecodeSplitKernel(const DecodeAttentionParams p, const SplitPlan plan,
                      float* __restrict__ part_o,      // [tokens, num_q_heads, splits, D]
                      float* __restrict__ part_lse) {  // [tokens, num_q_heads, splits]
  using S = Shape<D, kFp8>;
  constexpr int kRows = 8 * NT;
  extern __shared__ uint4 ring[];  // [kWarps][kStages][kPieces][32]; reused by the combine
  // q and the query tokens' K/V come from the kernel before (PDL launch). With p.after_append
  // everything else was written before that kernel: the tables are read and the first
  // head-blocks of older tokens requested before the wait (below); otherwise it waits here.
  if (!p.after_append) GridDependencyWait();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  int64_t cta = blockIdx.x;
  const int chunk = static_cast<int>(cta % plan.row_chunks);
  cta /= plan.row_chunks;
  const int sp = static_cast<int>(cta % plan.splits);
  cta /= plan.splits;
  const int h = static_cast<int>(cta % p.num_kv_heads);
  const int s = static_cast<int>(cta / p.num_kv_heads);

  const int group = p.num_q_heads / p.num_kv_heads;
  const int q0 = p.query_start[s], q_len = p.query_start[s + 1] - q0;
  const int rows = q_len * group;
  if (chunk * kRows >= rows) return;
  const int kv_len = p.kv_lens[static_cast<int64_t>(s) * p.num_kv_heads + h];
  const int pages = max(0, (kv_len + kPage - 1) / kPage);
  const int pps = PagesPerSplit(pages, plan);
  const bool direct = UsedSplits(pages, plan) == 1;
  const int pb = sp * pps, pe = min(pages, pb + pps);
  if (sp > 0 && pb >= pe) return;  // an empty split (split 0 always writes, zeros if need be)
  // Warp w takes head-blocks pb + w, pb + w + 4, ...: the CTA's warps read neighbouring blocks
  // together (one contiguous stream per head when the slots are a run; see HeadBlockTable).
  const int wb = pb + warp;

  // Visible keys of this lane's softmax rows 8j + 2c + e; padding rows act like the last token.
  int vis[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int m = chunk * kRows + 8 * j + 2 * c + e;
      vis[j][e] = kv_len - q_len + (m < rows ? m / group : q_len - 1) + 1;
    }
  const int min_vis = kv_len - q_len + 1;  // every row sees tokens [0, min_vis)

  // Block table, 32 entries per warp-wide load (the next 32 already in flight).
  const int32_t* table =
      p.block_tables + (static_cast<int64_t>(s) * p.num_kv_heads + h) * p.max_blocks;
  int tbl_base = wb;
  int tbl = wb + lane < pe ? __ldg(table + wb + lane) : 0;
  int tbl_next = wb + 32 + lane < pe ? __ldg(table + wb + 32 + lane) : 0;
  auto slot_of = [&](int page) -> int64_t {  // warp-uniform, non-decreasing page
    if (page - tbl_base >= 32) {
      tbl_base += 32;
      tbl = tbl_next;
      tbl_next = tbl_base + 32 + lane < pe ? __ldg(table + tbl_base + 32 + lane) : 0;
    }
    return __shfl_sync(0xffffffffu, tbl, page - tbl_base);
  };

  uint4* warp_ring =
      ring + warp * (S::kStages * S::kPieces * 32);  // stage st: [st·P·32, (st+1)·P·32)
  const uint32_t warp_ring_s = SmemAddr(warp_ring);
  auto issue = [&](int page,
                   int stage) {  // head-block `page` into `stage`; always one commit group
    if (page < pe) {
      const int64_t slot = slot_of(page);
      const uint32_t dst = warp_ring_s + stage * (S::kPieces * 32 * 16);
      if constexpr (kFp8) {
        const uint8_t* kb = p.k_pool_fp8 + slot * (kPage * D) + 16 * lane;
        const uint8_t* vb = p.v_pool_fp8 + slot * (kPage * D) + 16 * lane;
#pragma unroll
        for (int i = 0; i < S::kU / 2; ++i) {  // unit n = 32i + lane of the 16·U units of K, V
          const int n = 32 * i + lane;
          const uint32_t off = 16u * static_cast<uint32_t>(n ^ SwzFp8<S::kU>(n / S::kU));
          CpAsync16(dst + off, kb + 512 * i);
          CpAsync16(dst + kPage * S::kU * 16 + off, vb + 512 * i);
        }
      } else {
        const bf16* kb = p.k_pool + slot * (kPage * D) + 8 * lane;
        const bf16* vb = p.v_pool + slot * (kPage * D) + 8 * lane;
#pragma unroll
        for (int i = 0; i < S::kU / 2; ++i) {  // unit n = 32i + lane of the 16·U units of K, V
          const int n = 32 * i + lane, t = n / S::kU, u = n % S::kU;
          const uint32_t off = 16u * static_cast<uint32_t>(t * S::kU + (u ^ Swz(t)));
          CpAsync16(dst + off, kb + 256 * i);
          CpAsync16(dst + kPage * S::kU * 16 + off, vb + 256 * i);
        }
      }
    }
    CpAsyncCommit();
  };

  float o[NT][S::kMTiles][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int t = 0; t < S::kMTiles; ++t) o[j][t][0] = o[j][t][1] = o[j][t][2] = o[j][t][3] = 0.0f;
  float m_run[NT][2], l_run[NT][2];  // log2 domain; l per lane (its tokens only) until the end
#pragma unroll
  for (int j = 0; j < NT; ++j)
    m_run[j][0] = m_run[j][1] = -INFINITY, l_run[j][0] = l_run[j][1] = 0.0f;
  // The ring's first head-blocks. After an append (p.after_append), those holding only tokens
  // before the query run (older steps' K/V) are requested before the wait, in order.
  int first_late = 0;
  if (p.after_append) {
    const int settled_pages = (kv_len - q_len) / kPage;
    while (first_late < S::kStages - 1 && wb + first_late * kWarps < settled_pages) {
      issue(wb + first_late * kWarps, first_late);
      ++first_late;
    }
    GridDependencyWait();
  }
#pragma unroll
  for (int i = 0; i < S::kStages - 1; ++i) {
    if (i >= first_late) issue(wb + i * kWarps, i);
  }
  // Q^T's B fragments (row r of each n-tile), with the head_dim order of the K pieces.
  // bf16: qf[j][b] = Q[32b + 8c .. +8] (k-steps 2b, 2b+1). FP8: qh[j][8b + w] = f16x2 of
  // Q[64b + 16c + 2w, +1] (k-step 4b + w/2 takes words 2f, 2f+1 as its B registers).
  uint4 qf[kFp8 ? 1 : NT][kFp8 ? 1 : S::kKB];
  uint32_t qh[kFp8 ? NT : 1][kFp8 ? D / 8 : 1];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int m = chunk * kRows + 8 * j + r;
    const bf16* qrow =
        p.q + (static_cast<int64_t>(q0 + m / group) * p.num_q_heads + h * group + m % group) * D;
    if constexpr (kFp8) {
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
        if (m < rows) {
          x0 = __ldg(reinterpret_cast<const uint4*>(qrow + 64 * b + 16 * c));
          x1 = __ldg(reinterpret_cast<const uint4*>(qrow + 64 * b + 16 * c + 8));
        }
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          qh[j][8 * b + w] = Bf16x2ToF16x2(Word(x0, w));
          qh[j][8 * b + 4 + w] = Bf16x2ToF16x2(Word(x1, w));
        }
      }
    } else {
#pragma unroll
      for (int b = 0; b < S::kKB; ++b)
        qf[j][b] = m < rows ? __ldg(reinterpret_cast<const uint4*>(qrow + 32 * b + 8 * c))
                            : make_uint4(0, 0, 0, 0);
    }
  }
  float scale_log2 = p.scale * kLog2e, out_scale = 1.0f;
  if constexpr (kFp8) scale_log2 = p.scale * p.k_scale[h] * kLog2e, out_scale = p.v_scale[h];

  int stage = 0;
  // This lane's K units (token r (+8), unit (4b + c) ^ Swz(r)) and V units.
  const int k_unit0 = r * S::kU, k_sw = c ^ Swz(r);
  for (int page = wb; page < pe; page += kWarps) {
    __syncwarp();  // every lane is done reading the stage refilled next
    issue(page + (S::kStages - 1) * kWarps,
          stage == 0 ? S::kStages - 1 : stage - 1);  // the stage read last time
    CpAsyncWait<S::kStages - 1>();                   // this thread's pieces of `page` have landed
    __syncwarp();                                    // ... and every other lane's
    const uint4* stw = warp_ring + stage * (S::kPieces * 32);

    // S^T = K·Q^T for the 16 tokens of this head-block (two accumulator chains).
    float sc[NT][4], sc2[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) sc[j][i] = sc2[j][i] = 0.0f;
    if constexpr (kFp8) {
      // Lane (r, c): 16 bytes of tokens r and r + 8 at head_dim 64b + 16c; word f is k-step
      // 4b + f (positions +4f, +4f+1 as k 2c, 2c+1; +4f+2, +4f+3 as k 2c+8, 2c+9).
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        const uint4 kw = stw[PosFp8<S::kU>(r, 4 * b + c)];
        const uint4 ku = stw[PosFp8<S::kU>(r + 8, 4 * b + c)];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          uint32_t a0, a1, a2, a3;
          E4M3x4ToF16x2(Word(kw, f), a0, a2);
          E4M3x4ToF16x2(Word(ku, f), a1, a3);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            MmaF16(f & 1 ? sc2[j] : sc[j], a0, a1, a2, a3, qh[j][8 * b + 2 * f],
                   qh[j][8 * b + 2 * f + 1]);
        }
      }
    } else {
#pragma unroll
      for (int b = 0; b < S::kKB; ++b) {
        uint4 kw, ku;  // tokens r and r + 8
        const int u = (4 * b) ^ k_sw;
        kw = stw[k_unit0 + u], ku = stw[k_unit0 + 8 * S::kU + u];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          Mma(sc[j], kw.x, ku.x, kw.y, ku.y, qf[j][b].x, qf[j][b].y);
          Mma(sc2[j], kw.z, ku.z, kw.w, ku.w, qf[j][b].z, qf[j][b].w);
        }
      }
    }

    // Mask (causal among this step's tokens, and the unwritten tail), online softmax per row.
    // Row 8j + 2c + e has tokens r (sc[j][e]) and r + 8 (sc[j][e + 2]) here; the other tokens
    // sit in the lanes with the same c (xor 4, 8, 16).
    const int tok0 = page * kPage;
    const bool masked = tok0 + kPage > min_vis;
    uint32_t pb0[NT], pb1[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float pr[4];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float s0 = (sc[j][e] + sc2[j][e]) * scale_log2,
              s1 = (sc[j][e + 2] + sc2[j][e + 2]) * scale_log2;
        if (masked) {
          if (tok0 + r >= vis[j][e]) s0 = -INFINITY;
          if (tok0 + r + 8 >= vis[j][e]) s1 = -INFINITY;
        }
        float mx = fmaxf(s0, s1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float m_new = fmaxf(m_run[j][e], mx);
        const float m_base = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep zeros
        const float alpha = Ex2(m_run[j][e] - m_base);
        m_run[j][e] = m_new;
        pr[e] = Ex2(s0 - m_base);
        pr[e + 2] = Ex2(s1 - m_base);
        l_run[j][e] = l_run[j][e] * alpha + pr[e] + pr[e + 2];
#pragma unroll
        for (int t = 0; t < S::kMTiles; ++t) o[j][t][e] *= alpha, o[j][t][e + 2] *= alpha;
      }
      if constexpr (kFp8) {
        pb0[j] = Transpose8x8(PackF16(pr[0], pr[1]));
        pb1[j] = Transpose8x8(PackF16(pr[2], pr[3]));
      } else {
        pb0[j] = Transpose8x8(PackBf16(pr[0], pr[1]));  // tokens 2c, 2c+1 of row r
        pb1[j] = Transpose8x8(PackBf16(pr[2], pr[3]));  // tokens 2c+8, 2c+9
      }
    }

    // O^T += V^T·P^T. Tokens past kv_len may hold anything (NaN): zero their V so 0·V stays 0.
    const bool tail = tok0 + kPage > kv_len;
    if constexpr (kFp8) {
      // Lane (r, c): 8 bytes V[token 2c + VTok(i)][64g + 8r .. +8]; byte e of word hh is column
      // d = 64g + 8r + 4hh + e. m-tile 4g + 2hh (+1) takes columns e = 0, 1 (2, 3) as its rows
      // r, r + 8, as in the bf16 path, so the output layout is the same. The bytes of the token
      // pairs are interleaved first (byte_perm), then widened pairwise.
      const unsigned char* vring = reinterpret_cast<const unsigned char*>(stw) + kPage * S::kU * 16;
#pragma unroll
      for (int g = 0; g < S::kGroups; ++g) {
        uint2 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = 2 * c + VTok(i);
          v[i] = *reinterpret_cast<const uint2*>(vring + 16 * PosFp8<S::kU>(t, 4 * g + (r >> 1)) +
                                                 8 * (r & 1));
          if (tail && tok0 + t >= kv_len) v[i] = make_uint2(0, 0);
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t w0 = hh ? v[0].y : v[0].x, w1 = hh ? v[1].y : v[1].x;
          const uint32_t w2 = hh ? v[2].y : v[2].x, w3 = hh ? v[3].y : v[3].x;
          uint32_t a0, a1, a2, a3;
          E4M3x4ToF16x2(__byte_perm(w0, w1, 0x5140), a0, a1);
          E4M3x4ToF16x2(__byte_perm(w2, w3, 0x5140), a2, a3);
#pragma unroll
          for (int j = 0; j < NT; ++j) MmaF16(o[j][4 * g + 2 * hh], a0, a1, a2, a3, pb0[j], pb1[j]);
          E4M3x4ToF16x2(__byte_perm(w0, w1, 0x7362), a0, a1);
          E4M3x4ToF16x2(__byte_perm(w2, w3, 0x7362), a2, a3);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            MmaF16(o[j][4 * g + 2 * hh + 1], a0, a1, a2, a3, pb0[j], pb1[j]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < (kFp8 ? 0 : S::kGroups); ++g) {
      uint4 v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = 2 * c + VTok(i);
        v[i] = stw[kPage * S::kU + t * S::kU + ((8 * g + r) ^ Swz(t))];
        if (tail && tok0 + 2 * c + VTok(i) >= kv_len) v[i] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const uint32_t w0 = Word(v[0], f), w1 = Word(v[1], f), w2 = Word(v[2], f),
                       w3 = Word(v[3], f);
        const uint32_t a0 = __byte_perm(w0, w1, 0x5410), a1 = __byte_perm(w0, w1, 0x7632);
        const uint32_t a2 = __byte_perm(w2, w3, 0x5410), a3 = __byte_perm(w2, w3, 0x7632);
#pragma unroll
        for (int j = 0; j < NT; ++j) Mma(o[j][4 * g + f], a0, a1, a2, a3, pb0[j], pb1[j]);
      }
    }
    stage = stage + 1 == S::kStages ? 0 : stage + 1;
    // The next kernel (the merge, or o_proj's GEMV, which loads its weights before it waits)
    // may launch once this warp's first head-block is in: launched at the CTA's start, its
    // weight loads queue ahead of the attention's few dependent loads (batch-1 decode at a
    // 128-token context: 4.175 vs 4.215 ms per step; larger batches unchanged).
    if (page == wb) AllowDependentLaunch();
  }
  if (wb >= pe) AllowDependentLaunch();  // a warp without head-blocks

    // Combine the warps in shared memory (the ring is free once every warp is past its loop).
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_run[j][e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l_run[j][e] = l + __shfl_xor_sync(0xffffffffu, l, 16);
    }
  CpAsyncWait<0>();  // only empty groups can be left
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(ring);  // [kWarps][kRows][D]
  float* m_s = o_s + kWarps * kRows * D;        // [kWarps][kRows]
  float* l_s = m_s + kWarps * kRows;            // [kWarps][kRows]
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = 8 * j + 2 * c + e;
      float* dst = o_s + (warp * kRows + row) * D + 8 * r;
#pragma unroll
      for (int g = 0; g < S::kGroups; ++g) {
        reinterpret_cast<float4*>(dst + 64 * g)[0] = make_float4(
            o[j][4 * g][e], o[j][4 * g][e + 2], o[j][4 * g + 1][e], o[j][4 * g + 1][e + 2]);
        reinterpret_cast<float4*>(dst + 64 * g)[1] = make_float4(
            o[j][4 * g + 2][e], o[j][4 * g + 2][e + 2], o[j][4 * g + 3][e], o[j][4 * g + 3][e + 2]);
      }
      if (r == 0) m_s[warp * kRows + row] = m_run[j][e], l_s[warp * kRows + row] = l_run[j][e];
    }
  __syncthreads();
  for (int item = threadIdx.x; item < kRows * (D / 8); item += kThreads) {
    const int row = item / (D / 8), col = 8 * (item % (D / 8));
    const int m = chunk * kRows + row;
    if (m >= rows) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w * kRows + row]);
    float wt[kWarps], l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      wt[w] = mx == -INFINITY ? 0.0f : Ex2(m_s[w * kRows + row] - mx);
      l += wt[w] * l_s[w * kRows + row];
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if constexpr (kFp8) inv *= out_scale;
    float v[8] = {};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4* src = reinterpret_cast<const float4*>(o_s + (w * kRows + row) * D + col);
      const float4 x = src[0], y = src[1];
      v[0] += wt[w] * x.x, v[1] += wt[w] * x.y, v[2] += wt[w] * x.z, v[3] += wt[w] * x.w;
      v[4] += wt[w] * y.x, v[5] += wt[w] * y.y, v[6] += wt[w] * y.z, v[7] += wt[w] * y.w;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] *= inv;
    const int64_t out_row =
        static_cast<int64_t>(q0 + m / group) * p.num_q_heads + h * group + m % group;
    if (direct) {
      *reinterpret_cast<uint4*>(p.out + out_row * D + col) = make_uint4(
          PackBf16(v[0], v[1]), PackBf16(v[2], v[3]), PackBf16(v[4], v[5]), PackBf16(v[6], v[7]));
    } else {
      float4* dst = reinterpret_cast<float4*>(part_o + (out_row * plan.splits + sp) * D + col);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
      if (col == 0) part_lse[out_row * plan.splits + sp] = l > 0.0f ? mx + __log2f(l) : -INFINITY;
    }
  }
}

// One CTA of 4 warps per (sequence, query token, query head) whose pair used more than one split:
// out = Σ 2^(lse_i - M) · o_i / Σ 2^(lse_i - M), the splits dealt round-robin to the warps.
// Launched as a programmatic dependent of the split kernel: it waits for it before reading.
template <int D>
__global__ void __launch_bounds__(128)
    DecodeMergeKernel(const DecodeAttentionParams p, const SplitPlan plan,
                      const float* __restrict__ part_o, const float* __restrict__ part_lse) {
  constexpr int kVec = D / 32;  // floats per lane: 2, 4 or 8
  __shared__ float acc_s[4][D];
  __shared__ float wsum_s[4];
  int64_t item = blockIdx.x;
  const int j = static_cast<int>(item % p.num_q_heads);
  item /= p.num_q_heads;
  const int qi = static_cast<int>(item % p.max_query_len);
  const int s = static_cast<int>(item / p.max_query_len);
  const int q0 = p.query_start[s],
            q_len = p.query_start[s + 1] - q0;  // inputs of the split kernel too
  const int h = j / (p.num_q_heads / p.num_kv_heads);
  const int kv_len = p.kv_lens[static_cast<int64_t>(s) * p.num_kv_heads + h];
  const int n = UsedSplits(max(0, (kv_len + kPage - 1) / kPage), plan);
  // Every CTA waits, so that this grid never completes before the split kernel does.
  GridDependencyWait();
  if (qi >= q_len || n <= 1) return;  // no such token, or the split kernel wrote this row itself

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t out_row = static_cast<int64_t>(q0 + qi) * p.num_q_heads + j;
  const float* lse = part_lse + out_row * plan.splits;
  float mx = -INFINITY;
  for (int i = lane; i < n; i += 32) mx = fmaxf(mx, lse[i]);
  mx = WarpMax(mx);
  float acc[kVec] = {};
  float wsum = 0.0f;
  const float* po = part_o + out_row * plan.splits * D;
  auto add = [&](int i) {
    const float w = mx == -INFINITY ? 0.0f : Ex2(lse[i] - mx);
    wsum += w;
    const float* src = po + static_cast<int64_t>(i) * D;
    if constexpr (kVec == 2) {
      const float2 x = *reinterpret_cast<const float2*>(src + 2 * lane);
      acc[0] += w * x.x, acc[1] += w * x.y;
    } else {
#pragma unroll
      for (int k = 0; k < kVec / 4; ++k) {
        const float4 x = *reinterpret_cast<const float4*>(src + 128 * k + 4 * lane);
        acc[4 * k] += w * x.x, acc[4 * k + 1] += w * x.y, acc[4 * k + 2] += w * x.z,
            acc[4 * k + 3] += w * x.w;
      }
    }
  };
#pragma unroll 4
  for (int i = warp; i < n; i += 4) add(i);
    // Lane `lane` holds columns 2·lane (kVec 2) or 128k + 4·lane .. +4 (kVec 4, 8).
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    acc_s[warp][kVec == 2 ? 2 * lane + k : 128 * (k / 4) + 4 * lane + k % 4] = acc[k];
  if (lane == 0) wsum_s[warp] = wsum;
  __syncthreads();
  const float inv_total = 1.0f / fmaxf(wsum_s[0] + wsum_s[1] + wsum_s[2] + wsum_s[3], FLT_MIN);
  for (int d = threadIdx.x * 2; d < D; d += 256) {
    const float x = (acc_s[0][d] + acc_s[1][d] + acc_s[2][d] + acc_s[3][d]) * inv_total;
    const float y =
        (acc_s[0][d + 1] + acc_s[1][d + 1] + acc_s[2][d + 1] + acc_s[3][d + 1]) * inv_total;
    *reinterpret_cast<__nv_bfloat162*>(p.out + out_row * D + d) = __floats2bfloat162_rn(x, y);
  }
}

// Per device and kernel instance: the SM count and the resident split CTAs per SM, after raising
// the instance's dynamic shared-memory limit (which is per device, hence the per-device cache).
struct DeviceFacts {
  int sms = 0;
  int ctas_per_sm = 0;
};

template <int D, int NT, bool kFp8>
DeviceFacts FactsFor() {
  static std::array<std::atomic<int>, kMaxDevices> packed{};  // sms << 8 | ctas_per_sm; 0: not yet
  static std::mutex mu;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return {132, 1};
  }
  int v = packed[dev].load(std::memory_order_acquire);
  if (v == 0) {
    std::lock_guard<std::mutex> lock(mu);
    v = packed[dev].load(std::memory_order_relaxed);
    if (v == 0) {
      int sms = 0, per_sm = 0;
      const auto kernel = DecodeSplitKernel<D, NT, kFp8>;
      constexpr int kBytes = Shape<D, kFp8>::kRingBytes;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) !=
              cudaSuccess ||
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kBytes) !=
              cudaSuccess) {
        (void)cudaGetLastError();
        return {132, 1};  // not cached: the launch will report the error
      }
      v = std::max(1, std::min(sms, 1 << 22)) << 8 | std::clamp(per_sm, 1, 255);
      packed[dev].store(v, std::memory_order_release);
    }
  }
  return {v >> 8, v & 255};
}

// Calls f.template operator()<D, NT, kFp8>() for the plan's kernel instance.
template <bool kFp8, typename F>
auto DispatchShape(int head_dim, int row_tiles, F&& f) {
  switch (head_dim * 2 + row_tiles) {
    case 64 * 2 + 1:
      return f.template operator()<64, 1, kFp8>();
    case 64 * 2 + 2:
      return f.template operator()<64, 2, kFp8>();
    case 128 * 2 + 1:
      return f.template operator()<128, 1, kFp8>();
    case 128 * 2 + 2:
      return f.template operator()<128, 2, kFp8>();
    default:
      return f.template operator()<256, 1, kFp8>();
  }
}
template <typename F>
auto Dispatch(int head_dim, int row_tiles, bool fp8, F&& f) {
  return fp8 ? DispatchShape<true>(head_dim, row_tiles, f)
             : DispatchShape<false>(head_dim, row_tiles, f);
}

bool IsFp8(const DecodeAttentionParams& p) { return p.kv_dtype == KvDtype::kFp8E4M3; }

struct FactsOp {
  template <int D, int NT, bool kFp8>
  DeviceFacts operator()() const {
    return FactsFor<D, NT, kFp8>();
  }
};

DeviceFacts FactsFor(int head_dim, int row_tiles, bool fp8) {
  return Dispatch(head_dim, row_tiles, fp8, FactsOp{});
}

// Estimated microseconds for a split count (host-known shapes only). The KV stream runs at
// kStreamBytesPerUs once at least one CTA per SM is streaming (a CTA keeps 4 × 2–3 head-blocks in
// flight); fewer CTAs get a proportional share. A wave of `a` CTAs with `pps` head-blocks each
// therefore takes pps · max(a, SMs) / (head-blocks per µs), but never less than its warps'
// latency-bound time; every wave pays a CTA start (dependent loads of lengths, table, first
// head-block), and more than one split pays the merge (launch, partial outputs written and read).
constexpr double kStreamBytesPerUs = 4.4e6;
constexpr double kCtaStartUs = 2.0;
constexpr double kLoadLatencyUs = 1.5;
constexpr double kMergeUs = 2.0;

double EstimateUs(const DecodeAttentionParams& p, const SplitPlan& plan, int max_pages,
                  double pairs, const DeviceFacts& facts) {
  const int stages = StagesFor(p.head_dim, IsFp8(p));
  const double page_bytes = PageBytes(p.head_dim, IsFp8(p));
  const double pages_per_us = kStreamBytesPerUs / page_bytes;
  const int pps = PagesPerSplit(max_pages, plan), used = UsedSplits(max_pages, plan);
  const double ctas = pairs * used, resident = double(facts.sms) * facts.ctas_per_sm;
  const double warp_us = std::ceil(double(pps) / kWarps) / stages * kLoadLatencyUs;
  double us = 0.0;
  for (double left = ctas; left > 0.0; left -= resident) {
    const double a = std::min(left, resident);
    us += std::max(pps * std::max(a, double(facts.sms)) / pages_per_us, warp_us) + kCtaStartUs;
  }
  if (used > 1)
    us += kMergeUs +
          2.0 * double(p.tokens) * p.num_q_heads * used * (p.head_dim + 1) * 4 / kStreamBytesPerUs;
  return us;
}

SplitPlan MakePlan(const DecodeAttentionParams& p) {
  SplitPlan plan;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = group * p.max_query_len;
  plan.row_tiles = p.head_dim <= 128 && rows > 8 ? 2 : 1;
  plan.row_chunks = (rows + 8 * plan.row_tiles - 1) / (8 * plan.row_tiles);
  const int64_t kv_bound = p.max_kv_len > 0
                               ? std::min<int64_t>(p.max_kv_len, int64_t{p.max_blocks} * kPage)
                               : int64_t{p.max_blocks} * kPage;
  const int max_pages = static_cast<int>(std::max<int64_t>(1, (kv_bound + kPage - 1) / kPage));
  // Forced by the caller, else by OASIS_DECODE_SPLITS (comparisons): exactly this cut of the
  // bound, down to one head-block per split.
  if (const int forced = p.num_splits > 0 ? p.num_splits : GetTuning().decode_splits; forced > 0) {
    plan.min_pages = 1;
    plan.splits = std::min(forced, max_pages);
    return plan;
  }
  plan.min_pages = kMinPagesPerSplit;
  const DeviceFacts facts = FactsFor(p.head_dim, plan.row_tiles, IsFp8(p));
  const double pairs = double(p.num_seqs) * p.num_kv_heads * plan.row_chunks;
  // More splits than two waves of CTAs cannot help (and this runs on every eager launch).
  const double resident = double(facts.sms) * facts.ctas_per_sm;
  const int s_max = static_cast<int>(
      std::min<double>({1024.0, std::ceil(2.0 * resident / pairs),
                        double((max_pages + kMinPagesPerSplit - 1) / kMinPagesPerSplit)}));
  double best = INFINITY;
  for (int sp = 1; sp <= s_max; ++sp) {
    SplitPlan cand = plan;
    cand.splits = sp;
    if (UsedSplits(max_pages, cand) != sp) continue;  // the same cut as a smaller count
    const double us = EstimateUs(p, cand, max_pages, pairs, facts);
    if (us < best * 0.995)
      best = us, plan.splits = sp;  // the smallest count within 0.5% of the best
  }
  return plan;
}

bool Supported(const DecodeAttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.num_kv_heads > 0 &&
         p.num_q_heads > 0 && p.num_q_heads % p.num_kv_heads == 0 && p.max_query_len >= 1 &&
         p.max_query_len <= kDecodeMaxQueryLen && p.num_seqs >= 0 && p.max_blocks >= 0 &&
         p.tokens >= 0;
}

size_t PartialOutputBytes(const DecodeAttentionParams& p, const SplitPlan& plan) {
  return static_cast<size_t>(p.tokens) * p.num_q_heads * plan.splits * p.head_dim * sizeof(float);
}

template <int D, int NT, bool kFp8>
cudaError_t Launch(const DecodeAttentionParams& p, const SplitPlan& plan, void* workspace,
                   cudaStream_t stream) {
  const int64_t ctas = int64_t{p.num_seqs} * p.num_kv_heads * plan.splits * plan.row_chunks;
  if (ctas > INT_MAX) return cudaErrorInvalidValue;
  (void)FactsFor<D, NT, kFp8>();  // raises the shared-memory limit on this device
  float* part_o = static_cast<float*>(workspace);
  float* part_lse =
      plan.splits > 1
          ? reinterpret_cast<float*>(static_cast<char*>(workspace) + PartialOutputBytes(p, plan))
          : nullptr;
  const cudaError_t split_err =
      LaunchPdl(DecodeSplitKernel<D, NT, kFp8>, dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                Shape<D, kFp8>::kRingBytes, stream, p, plan, part_o, part_lse);
  if (split_err != cudaSuccess) return split_err;
  if (plan.splits > 1) {
    const int64_t items = int64_t{p.num_seqs} * p.max_query_len * p.num_q_heads;
    if (items > INT_MAX) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(items));
    cfg.blockDim = dim3(128);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t err =
        cudaLaunchKernelEx(&cfg, DecodeMergeKernel<D>, p, plan, static_cast<const float*>(part_o),
                           static_cast<const float*>(part_lse));
    if (err != cudaSuccess) return err;
  }
  return cudaGetLastError();
}

struct LaunchOp {
  const DecodeAttentionParams& p;
  const SplitPlan& plan;
  void* workspace;
  cudaStream_t stream;
  template <int D, int NT, bool kFp8>
  cudaError_t operator()() const {
    return Launch<D, NT, kFp8>(p, plan, workspace, stream);
  }
};

}  // namespace

int DecodeAttentionNumSplits(const DecodeAttentionParams& p) {
  return Supported(p) ? MakePlan(p).splits : 1;
}

size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionParams& p) {
  if (!Supported(p)) return 0;
  const SplitPlan plan = MakePlan(p);
  if (plan.splits == 1) return 0;
  return PartialOutputBytes(p, plan) +
         static_cast<size_t>(p.tokens) * p.num_q_heads * plan.splits * sizeof(float);
}

cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream) {
  if (!Supported(p)) return cudaErrorInvalidValue;
  // (Not in Supported: the split count and workspace size follow from the shapes and kv_dtype
  // alone, so a CUDA graph can size its workspace before it has pools.)
  if (IsFp8(p) && (p.k_pool_fp8 == nullptr || p.v_pool_fp8 == nullptr || p.k_scale == nullptr ||
                   p.v_scale == nullptr))
    return cudaErrorInvalidValue;
  if (p.tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  const void* k_pool = IsFp8(p) ? static_cast<const void*>(p.k_pool_fp8) : p.k_pool;
  const void* v_pool = IsFp8(p) ? static_cast<const void*>(p.v_pool_fp8) : p.v_pool;
  if (!Aligned16(p.q) || !Aligned16(k_pool) || !Aligned16(v_pool) || !Aligned16(p.out))
    return cudaErrorInvalidValue;
  const SplitPlan plan = MakePlan(p);
  if (plan.splits > 1 && (workspace == nullptr || !Aligned16(workspace) ||
                          workspace_bytes < DecodeAttentionWorkspaceBytes(p)))
    return cudaErrorInvalidValue;
  return Dispatch(p.head_dim, plan.row_tiles, IsFp8(p), LaunchOp{p, plan, workspace, stream});
}

}  // namespace oasis::kernels

// Split-K flash-decoding over head-level block tables (see attention_decode.h and
// docs/kernels/decode_attention.md).
//
// Fragment layouts (PTX mma.m16n8k16, bf16 in, f32 accumulate; lane = 4·r + c):
//   A (16×16, row):  reg0 = A[r][2c..2c+1]  reg1 = A[r+8][2c..]  reg2 = A[r][2c+8..]  reg3 = A[r+8][2c+8..]
//   B (16×8, col):   reg0 = B[2c..2c+1][r]  reg1 = B[2c+8..2c+9][r]
//   C (16×8):        c0,c1 = C[r][2c..2c+1]  c2,c3 = C[r+8][2c..2c+1]
// Q·Kᵀ: M = query rows (row m = qi·G + g of the GQA group), N = 8 tokens, K = head_dim. The dot
// product does not care about the order of head_dim, so lane (r, c) loads 16 contiguous bytes
// K[token r][32b + 8c .. +8] and uses them as the B registers of k-steps 2b and 2b+1; Q's A
// registers are loaded with the same permutation (logical k ↔ physical d below).
// P·V: M = rows, K = the 16 tokens of a head-block (P comes straight from the Q·Kᵀ accumulators),
// N = 8 columns of head_dim. Output columns are permuted too: n-tile t = 8·grp + e, column n = r
// is d = 64·grp + 8·r + e, so lane (r, c) loads V[token][64·grp + 8r .. +8] with 16-byte loads and
// pairs tokens 2c/2c+1 (and 2c+8/2c+9) with a byte permute. Lane (r, c) ends up holding output
// columns 64·grp + 16c .. +16 of its rows, written with 16-byte stores.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/attention_decode.h"
#include "kernels/common.cuh"

namespace oasis::kernels {
namespace {

constexpr int kPage = 16;             // tokens per head-block (kKvBlockSize)
constexpr int kRowsPerChunk = 16;     // query rows per CTA: the MMA's M
constexpr int kMinPagesPerSplit = 4;  // below this a split's partial output costs too much
constexpr double kCtaStartupPages = 2.0;  // a CTA's dependent start-up loads, in head-block times
constexpr float kLog2e = 1.4426950408889634f;

// How the KV range of every (sequence, KV head) is cut: split sp covers head-blocks
// [sp·pages_per_split, (sp+1)·pages_per_split), the last split also everything after.
struct SplitPlan {
  int splits = 1;
  int pages_per_split = 1;
  int row_chunks = 1;  // ceil(group · max_query_len / 16)
};

template <int D>
struct Shape {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim");
  static constexpr int kChunks = D / 32;    // 16-byte K loads per token row per lane
  static constexpr int kSteps = D / 16;     // MMA k-steps of Q·Kᵀ
  static constexpr int kGroups = D / 64;    // 64-column groups of V and of the output
  static constexpr int kOutTiles = D / 8;   // MMA n-tiles of P·V
  // Q's fragments live in shared memory (one LDS.128 per k-step) so registers go to the output
  // accumulators and the loads in flight. head_dim <= 128 prefetches the next head-block's K and
  // V while the current one is used; 256 has no registers left for that.
  static constexpr bool kPrefetch = D <= 128;
  // Registers are split between the 4 SM sub-partitions: 12 warps/SM leave 168 per thread.
  static constexpr int kMinBlocksPerSm = D == 64 ? 16 : D == 128 ? 12 : 8;
};

// K/V are streamed once: skip L1. kOrdered pins the load where the code puts it (relative to
// the MMAs), for head_dim 256 where hoisting loads would run out of registers.
template <bool kOrdered>
__device__ __forceinline__ uint4 LoadKv(const bf16* ptr) {
  uint4 v;
  if constexpr (kOrdered) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
  } else {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(ptr));
  }
  return v;
}

__device__ __forceinline__ void Mma(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float Ex2(float x) {  // 2^x; 2^-inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The V tokens a lane loads, relative to 2c: the B rows k = 2c, 2c+1, 2c+8, 2c+9.
__device__ __forceinline__ constexpr int VTok(int i) { return (i & 1) + 8 * (i >> 1); }

__device__ __forceinline__ int SeqOfRow(const int32_t* query_start, int num_seqs, int64_t row) {
  int lo = 0, hi = num_seqs - 1;  // the last sequence whose first row is <= row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Splits that hold at least one head-block of a (sequence, KV head) of kv_len tokens.
__device__ __forceinline__ int UsedSplits(const SplitPlan& plan, int kv_len) {
  const int pages = (kv_len + kPage - 1) / kPage;
  return pages <= 0 ? 0 : min(plan.splits, (pages + plan.pages_per_split - 1) / plan.pages_per_split);
}

// One warp: rows [16·chunk, 16·chunk + 16) of the (sequence, KV head) group's G·q_len query rows,
// head-blocks of split `sp`. Writes the normalised partial output and its log2-sum-exp, or, with
// one split, the final output.
template <int D>
__global__ void __launch_bounds__(32, Shape<D>::kMinBlocksPerSm)
    DecodeSplitKernel(const DecodeAttentionParams p, const SplitPlan plan,
                      float* __restrict__ part_o,     // [tokens, num_q_heads, splits, D]
                      float* __restrict__ part_lse) {  // [tokens, num_q_heads, splits]
  using S = Shape<D>;
  const int lane = threadIdx.x, r = lane >> 2, c = lane & 3;
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
  if (chunk * kRowsPerChunk >= rows) return;
  const int kv_len = p.kv_lens[static_cast<int64_t>(s) * p.num_kv_heads + h];
  const int pages = (kv_len + kPage - 1) / kPage;
  const int pb = sp * plan.pages_per_split;
  const int pe = sp == plan.splits - 1 ? pages : min(pages, pb + plan.pages_per_split);
  if (pb >= pe) return;

  // This lane's two rows (half 0: r, half 1: r + 8): query token, head, and visible keys.
  int row_qi[2], row_head[2], vis[2];
  bool row_valid[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int m = chunk * kRowsPerChunk + r + 8 * hf;
    row_valid[hf] = m < rows;
    row_qi[hf] = row_valid[hf] ? m / group : q_len - 1;  // padding rows see what the last token sees
    row_head[hf] = h * group + m % group;
    vis[hf] = kv_len - q_len + row_qi[hf] + 1;
  }
  const int min_vis = kv_len - q_len + 1;  // every row sees tokens [0, min_vis)

  // Q's A fragments, with the head_dim permutation of the K loads (see the top of the file).
  __shared__ uint4 q_smem[S::kSteps][32];  // [k-step][lane] A registers
#pragma unroll
  for (int b = 0; b < S::kChunks; ++b) {
    uint4 w[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const bf16* qrow = p.q + (static_cast<int64_t>(q0 + row_qi[hf]) * p.num_q_heads + row_head[hf]) * D;
      w[hf] = row_valid[hf] ? __ldg(reinterpret_cast<const uint4*>(qrow + 32 * b + 8 * c)) : make_uint4(0, 0, 0, 0);
    }
    const uint4 f0 = make_uint4(w[0].x, w[1].x, w[0].y, w[1].y), f1 = make_uint4(w[0].z, w[1].z, w[0].w, w[1].w);
    q_smem[2 * b][lane] = f0;  // each lane reads back only its own entries: no barrier needed
    q_smem[2 * b + 1][lane] = f1;
  }

  // Block table, 32 entries per warp-wide load (the next 32 already in flight).
  const int32_t* table = p.block_tables + (static_cast<int64_t>(s) * p.num_kv_heads + h) * p.max_blocks;
  int tbl_base = pb;
  int tbl = pb + lane < pe ? __ldg(table + pb + lane) : 0;
  int tbl_next = pb + 32 + lane < pe ? __ldg(table + pb + 32 + lane) : 0;
  auto slot_of = [&](int page) -> int64_t {  // warp-uniform page
    if (page - tbl_base >= 32) {
      tbl_base += 32;
      tbl = tbl_next;
      tbl_next = tbl_base + 32 + lane < pe ? __ldg(table + tbl_base + 32 + lane) : 0;
    }
    return __shfl_sync(0xffffffffu, tbl, page - tbl_base);
  };

  uint4 kf[2][S::kChunks];  // K[token 8·nt + r][32b + 8c .. +8]
  uint4 vf[4][S::kGroups];  // V[token 2c + {0, 1, 8, 9}][64·grp + 8r .. +8]
  auto load_k = [&](int64_t slot) {
    const bf16* base = p.k_pool + slot * (kPage * D) + r * D + 8 * c;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int b = 0; b < S::kChunks; ++b) kf[nt][b] = LoadKv<!S::kPrefetch>(base + nt * 8 * D + 32 * b);
  };
  auto load_v = [&](int64_t slot) {
    const bf16* base = p.v_pool + slot * (kPage * D) + 2 * c * D + 8 * r;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int g = 0; g < S::kGroups; ++g) vf[i][g] = LoadKv<!S::kPrefetch>(base + VTok(i) * D + 64 * g);
  };

  float o[S::kOutTiles][4];
#pragma unroll
  for (int t = 0; t < S::kOutTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // log2 domain; l per lane
  const float scale_log2 = p.scale * kLog2e;

  int64_t slot = slot_of(pb);
  load_k(slot);
  if constexpr (S::kPrefetch) load_v(slot);
  for (int page = pb; page < pe; ++page) {
    // S = Q·Kᵀ for the 16 tokens of this head-block.
    float sc[2][4] = {};
#pragma unroll
    for (int b = 0; b < S::kChunks; ++b) {
      const uint4 a0 = q_smem[2 * b][lane], a1 = q_smem[2 * b + 1][lane];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        Mma(sc[nt], a0.x, a0.y, a0.z, a0.w, kf[nt][b].x, kf[nt][b].y);
        Mma(sc[nt], a1.x, a1.y, a1.z, a1.w, kf[nt][b].z, kf[nt][b].w);
      }
    }
    const bool more = page + 1 < pe;
    const int64_t next_slot = more ? slot_of(page + 1) : 0;
    if constexpr (S::kPrefetch) {
      if (more) load_k(next_slot);  // in flight during the softmax and P·V
    } else {
      load_v(slot);
    }

    // Mask (causal among this step's tokens, and the unwritten tail of the last head-block).
    const int tok0 = page * kPage;
    const bool masked = tok0 + kPage > min_vis;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tok = tok0 + 8 * nt + 2 * c + (i & 1);
        sc[nt][i] *= scale_log2;
        if (masked && tok >= vis[i >> 1]) sc[nt][i] = -INFINITY;
      }
    // Online softmax per row; a row's 16 scores sit in the 4 lanes of a quad.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = fmaxf(fmaxf(sc[0][2 * hf], sc[0][2 * hf + 1]), fmaxf(sc[1][2 * hf], sc[1][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hf], mx);
      const float m_base = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep zeros
      const float alpha = Ex2(m_run[hf] - m_base);
      m_run[hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          sc[nt][2 * hf + j] = Ex2(sc[nt][2 * hf + j] - m_base);
          sum += sc[nt][2 * hf + j];
        }
      l_run[hf] = l_run[hf] * alpha + sum;
#pragma unroll
      for (int t = 0; t < S::kOutTiles; ++t) o[t][2 * hf] *= alpha, o[t][2 * hf + 1] *= alpha;
    }
    const uint32_t pa0 = PackBf16(sc[0][0], sc[0][1]), pa1 = PackBf16(sc[0][2], sc[0][3]);
    const uint32_t pa2 = PackBf16(sc[1][0], sc[1][1]), pa3 = PackBf16(sc[1][2], sc[1][3]);

    // Tokens past kv_len may hold anything (NaN): zero their V so 0·V stays 0.
    if (tok0 + kPage > kv_len) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (tok0 + 2 * c + VTok(i) >= kv_len)
#pragma unroll
          for (int g = 0; g < S::kGroups; ++g) vf[i][g] = make_uint4(0, 0, 0, 0);
    }
    // O += P·V.
#pragma unroll
    for (int g = 0; g < S::kGroups; ++g) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t v0, v1, v2, v3;
        if (w == 0) v0 = vf[0][g].x, v1 = vf[1][g].x, v2 = vf[2][g].x, v3 = vf[3][g].x;
        if (w == 1) v0 = vf[0][g].y, v1 = vf[1][g].y, v2 = vf[2][g].y, v3 = vf[3][g].y;
        if (w == 2) v0 = vf[0][g].z, v1 = vf[1][g].z, v2 = vf[2][g].z, v3 = vf[3][g].z;
        if (w == 3) v0 = vf[0][g].w, v1 = vf[1][g].w, v2 = vf[2][g].w, v3 = vf[3][g].w;
        Mma(o[8 * g + 2 * w], pa0, pa1, pa2, pa3, __byte_perm(v0, v1, 0x5410), __byte_perm(v2, v3, 0x5410));
        Mma(o[8 * g + 2 * w + 1], pa0, pa1, pa2, pa3, __byte_perm(v0, v1, 0x7632), __byte_perm(v2, v3, 0x7632));
      }
    }
    if (more) {
      if constexpr (S::kPrefetch) {
        load_v(next_slot);  // in flight during the next Q·Kᵀ
      } else {
        load_k(next_slot);
      }
    }
    slot = next_slot;
  }

  // Each row's total over its quad, then write the rows this lane owns.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = l_run[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid[hf]) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t out_row = static_cast<int64_t>(q0 + row_qi[hf]) * p.num_q_heads + row_head[hf];
#pragma unroll
    for (int g = 0; g < S::kGroups; ++g) {
      float v[16];  // columns 64·g + 16c .. +16
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = o[8 * g + e][2 * hf] * inv, v[8 + e] = o[8 * g + e][2 * hf + 1] * inv;
      if (plan.splits == 1) {
        uint4* dst = reinterpret_cast<uint4*>(p.out + out_row * D + 64 * g + 16 * c);
        dst[0] = make_uint4(PackBf16(v[0], v[1]), PackBf16(v[2], v[3]), PackBf16(v[4], v[5]), PackBf16(v[6], v[7]));
        dst[1] = make_uint4(PackBf16(v[8], v[9]), PackBf16(v[10], v[11]), PackBf16(v[12], v[13]),
                            PackBf16(v[14], v[15]));
      } else {
        float4* dst = reinterpret_cast<float4*>(part_o + (out_row * plan.splits + sp) * D + 64 * g + 16 * c);
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
      }
    }
    if (plan.splits > 1 && c == 0) part_lse[out_row * plan.splits + sp] = l > 0.0f ? m_run[hf] + __log2f(l) : -INFINITY;
  }
}

// One warp per (query row, query head): out = Σ 2^(lse_i - M) · o_i / Σ 2^(lse_i - M).
template <int D>
__global__ void __launch_bounds__(128) DecodeMergeKernel(const DecodeAttentionParams p, const SplitPlan plan,
                                                         const float* __restrict__ part_o,
                                                         const float* __restrict__ part_lse) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (item >= p.tokens * p.num_q_heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = item / p.num_q_heads;
  const int j = static_cast<int>(item % p.num_q_heads);
  const int s = SeqOfRow(p.query_start, p.num_seqs, t);
  const int h = j / (p.num_q_heads / p.num_kv_heads);
  const int n = UsedSplits(plan, p.kv_lens[static_cast<int64_t>(s) * p.num_kv_heads + h]);
  const float* lse = part_lse + item * plan.splits;
  float mx = -INFINITY;
  for (int i = lane; i < n; i += 32) mx = fmaxf(mx, lse[i]);
  mx = WarpMax(mx);
  float2 acc[D / 64] = {};
  float wsum = 0.0f;
  const float* po = part_o + item * plan.splits * D + 2 * lane;
#pragma unroll 4
  for (int i = 0; i < n; ++i) {
    const float w = mx == -INFINITY ? 0.0f : Ex2(lse[i] - mx);
    wsum += w;
#pragma unroll
    for (int k = 0; k < D / 64; ++k) {
      const float2 x = *reinterpret_cast<const float2*>(po + static_cast<int64_t>(i) * D + 64 * k);
      acc[k].x += w * x.x, acc[k].y += w * x.y;
    }
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
  bf16* dst = p.out + item * D + 2 * lane;
#pragma unroll
  for (int k = 0; k < D / 64; ++k)
    *reinterpret_cast<__nv_bfloat162*>(dst + 64 * k) = __floats2bfloat162_rn(acc[k].x * inv, acc[k].y * inv);
}

// Resident one-warp CTAs of the split kernel on the current device (cached per head_dim).
template <int D>
int ResidentCtas() {
  static const int resident = [] {
    int dev = 0, sms = 132, per_sm = 8;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, DecodeSplitKernel<D>, 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      sms = 132, per_sm = 8;
    }
    return std::max(1, sms * std::max(1, per_sm));
  }();
  return resident;
}

int ResidentCtasFor(int head_dim) {
  switch (head_dim) {
    case 64: return ResidentCtas<64>();
    case 128: return ResidentCtas<128>();
    case 256: return ResidentCtas<256>();
    default: return 1;
  }
}

// Chooses the split count by an estimated time, in units of "one head-block per resident CTA":
// every resident CTA streams at about the same rate (latency-bound loads), so a launch takes
// waves × (blocks per split + a CTA's start-up latency), times the bytes the partial results add
// (written once, read once by the merge) relative to the KV bytes.
SplitPlan MakePlan(const DecodeAttentionParams& p) {
  SplitPlan plan;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = group * p.max_query_len;
  plan.row_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t kv_bound = p.max_kv_len > 0 ? std::min<int64_t>(p.max_kv_len, int64_t{p.max_blocks} * kPage)
                                            : int64_t{p.max_blocks} * kPage;
  const int max_pages = static_cast<int>(std::max<int64_t>(1, (kv_bound + kPage - 1) / kPage));
  int want = p.num_splits;
  if (want <= 0) {
    const double pairs = double(p.num_seqs) * p.num_kv_heads * plan.row_chunks;
    const double resident = ResidentCtasFor(p.head_dim);
    const int s_max = std::min(1024, std::max(1, max_pages / kMinPagesPerSplit));
    double best = INFINITY;
    want = 1;
    for (int sp = 1; sp <= s_max; ++sp) {
      const int pps = (max_pages + sp - 1) / sp;
      const int splits = (max_pages + pps - 1) / pps;
      if (splits != sp) continue;  // same cut as a smaller count
      const double waves = std::ceil(pairs * splits / resident);
      const double partial_bytes = splits == 1 ? 0.0 : double(std::min(rows, kRowsPerChunk)) * splits / (8.0 * max_pages);
      const double time = waves * (pps + kCtaStartupPages) * (1.0 + partial_bytes);
      if (time < best * 0.999) best = time, want = sp;
    }
  }
  want = std::clamp(want, 1, max_pages);
  plan.pages_per_split = (max_pages + want - 1) / want;
  plan.splits = (max_pages + plan.pages_per_split - 1) / plan.pages_per_split;
  return plan;
}

bool Supported(const DecodeAttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.num_kv_heads > 0 && p.num_q_heads > 0 &&
         p.num_q_heads % p.num_kv_heads == 0 && p.max_query_len >= 1 && p.max_query_len <= kDecodeMaxQueryLen &&
         p.num_seqs >= 0 && p.max_blocks >= 0 && p.tokens >= 0;
}

bool Aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

size_t PartialOutputBytes(const DecodeAttentionParams& p, const SplitPlan& plan) {
  return static_cast<size_t>(p.tokens) * p.num_q_heads * plan.splits * p.head_dim * sizeof(float);
}

template <int D>
cudaError_t Launch(const DecodeAttentionParams& p, const SplitPlan& plan, void* workspace, cudaStream_t stream) {
  const int64_t ctas = int64_t{p.num_seqs} * p.num_kv_heads * plan.splits * plan.row_chunks;
  if (ctas > INT_MAX) return cudaErrorInvalidValue;
  float* part_o = static_cast<float*>(workspace);
  float* part_lse = plan.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + PartialOutputBytes(p, plan))
                                    : nullptr;
  DecodeSplitKernel<D><<<static_cast<unsigned>(ctas), 32, 0, stream>>>(p, plan, part_o, part_lse);
  if (plan.splits > 1) {
    const int64_t items = p.tokens * p.num_q_heads;
    DecodeMergeKernel<D><<<CeilDiv(items, 4), 128, 0, stream>>>(p, plan, part_o, part_lse);
  }
  return cudaGetLastError();
}

}  // namespace

int DecodeAttentionNumSplits(const DecodeAttentionParams& p) { return Supported(p) ? MakePlan(p).splits : 1; }

size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionParams& p) {
  if (!Supported(p)) return 0;
  const SplitPlan plan = MakePlan(p);
  if (plan.splits == 1) return 0;
  return PartialOutputBytes(p, plan) + static_cast<size_t>(p.tokens) * p.num_q_heads * plan.splits * sizeof(float);
}

cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream) {
  if (!Supported(p)) return cudaErrorInvalidValue;
  if (p.tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  if (!Aligned16(p.q) || !Aligned16(p.k_pool) || !Aligned16(p.v_pool) || !Aligned16(p.out)) return cudaErrorInvalidValue;
  const SplitPlan plan = MakePlan(p);
  if (plan.splits > 1 && (workspace == nullptr || !Aligned16(workspace) || workspace_bytes < DecodeAttentionWorkspaceBytes(p)))
    return cudaErrorInvalidValue;
  switch (p.head_dim) {
    case 64: return Launch<64>(p, plan, workspace, stream);
    case 128: return Launch<128>(p, plan, workspace, stream);
    default: return Launch<256>(p, plan, workspace, stream);
  }
}

}  // namespace oasis::kernels

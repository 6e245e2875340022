// Prefill attention for Hopper (sm_90a): wgmma, warp specialisation and a K/V ring in shared
// memory, FlashAttention-3 style. Semantics: kernels/attention_prefill.h. Design, numbers and
// the reasons behind them: docs/kernels/prefill_attention.md ("The sm_90a kernel").
//
// One CTA = one query head x one tile of 128 query rows of one sequence; 384 threads:
//   warpgroup 0 (producer, 40 registers): warps 0-1 gather K tiles, warps 2-3 gather V tiles
//     (128 keys = 8 head-blocks through the block table) with 16-byte cp.async into a ring of
//     kStages shared buffers, zero-filling keys at or past kv_len; warps 0-1 also load the Q
//     tile first. Each thread waits for its own copies, fences them into the async proxy
//     (fence.proxy.async: wgmma reads shared memory through it) and arrives on the stage's
//     "full" mbarrier; it waits on the stage's "empty" mbarrier before refilling it.
//   warpgroups 1, 2 (consumers, 232 registers): 64 query rows each. Per KV tile:
//     S = Q·Kᵀ by wgmma m64n128k16 (A and B from shared memory), causal mask, online softmax
//     (base 2) with P kept in registers, O += P·V by wgmma m64nDk16 (A = P from registers,
//     B = V from shared memory, transposed by the descriptor). The softmax of tile j runs while
//     P·V of tile j-1 is in flight (intra-warpgroup overlap), and a pair of named barriers
//     makes the two consumers take turns issuing their GEMMs, so one warpgroup's softmax
//     overlaps the other's tensor-core work (inter-warpgroup ping-pong).
// KV tiles are visited from the last (the ones the causal mask cuts) to the first.
//
// FP8 pools (kFp8, explicit kSm90 / kSm90S2 tiles): each producer chain cp.asyncs the e4m3 bytes
// of the next KV tile into a 2-stage raw ring (thread-private layout: every thread later reads
// only the pieces it copied), then, once the widened stage is empty, widens its own pieces
// exactly to f16 (cvt.rn.f16x2.e4m3x2) into the same swizzled K/V ring the bf16 path fills, and
// fences/arrives as above. The K chain converts its Q chunks bf16 -> f16 in place before
// arriving on full_q. The consumers run the same schedule with f16 wgmma (P packed to f16);
// k_scale[h] joins the softmax scale, v_scale[h] the final 1/l. Ring: 2 widened stages at
// head_dim 128 (224 KiB with Q and the raw ring), 4 (kSm90) or 2 (kSm90S2) at 64.
//
// Shared layout: every tile (Q [128][D], K and V [128][D]) is stored as D/64 column panels of
// [rows][64] bf16, 128-byte rows, the 16-byte chunk c of row r at chunk c ^ (r & 7) inside each
// 1024-byte group of 8 rows: the canonical 128-byte-swizzle layout of wgmma. Q and K are read
// K-major (leading byte offset unused, stride byte offset 1024 = one 8-row group; the k-th
// 16-column step starts 32 bytes further, inside the swizzle atom). V is read MN-major
// (imm-trans-b = 1): leading byte offset = one panel (the next 64 head-dim columns), stride
// byte offset 1024 (the next 8 keys); the 16-key step starts 2048 bytes further.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention_prefill.h"
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/prefill_tiles.cuh"

namespace oasis::kernels::detail {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA: two consumer warpgroups of 64
constexpr int kBlockN = 128;  // keys per KV tile
constexpr int kHeadBlock = 16;
constexpr int kBlocksPerTile = kBlockN / kHeadBlock;  // table entries per KV tile
constexpr int kThreads = 384;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;  // 128 * 40 + 256 * 232 <= 65536
static_assert(kBlocksPerTile <= 32, "one lane per table entry of a tile");

template <int D, int kStages, bool kFp8 = false>
struct Sm90Shape {
  static constexpr int kQPanelBytes = kBlockM * 128;
  static constexpr int kKvPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKvBytes = kBlockN * D * 2;  // one K or one V stage
  // FP8: a ring of raw e4m3 tiles per chain (K, V), between the V ring and the barriers.
  static constexpr int kRawStages = kFp8 ? 2 : 0;
  static constexpr int kRawBytes = kBlockN * D;  // one raw K or V stage
  // mbarriers: full_q, full_k[S], full_v[S], empty_k[S], empty_v[S]
  static constexpr int kBarriers = 1 + 4 * kStages;
  // + 1024: the dynamic shared window is aligned up to the 1024-byte swizzle atom at run time.
  static constexpr int kSmemBytes =
      1024 + kQBytes + 2 * kStages * kKvBytes + 2 * kRawStages * kRawBytes + 8 * kBarriers;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one CTA");
};

// Byte offset of 16-byte chunk c (0 .. D/8) of row r in a swizzled tile of `rows` rows.
template <int kRows>
__device__ __forceinline__ uint32_t SwzOffset(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * (kRows * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// What one CTA works on.
struct Work {
  int qh = 0;            // query head
  int h = 0;             // its KV head
  int64_t q_begin = 0;   // first query row of the sequence
  int q_len = 0;         // query rows of the sequence
  int q0 = 0;            // first row of this tile inside the sequence
  int kv_len = 0;        // visible keys of (sequence, KV head); keys past it are zero-filled
  int ctx = 0;           // kv_len - q_len: row r sees keys <= ctx + r
  int num_kv_tiles = 0;  // KV tiles this query tile needs
  const int32_t* table = nullptr;  // block table row of (sequence, KV head)
};

// Barrier addresses: full_q, full_k[S], full_v[S], empty_k[S], empty_v[S].
template <int kStages>
struct Barriers {
  uint32_t base;
  __device__ uint32_t FullQ() const { return base; }
  __device__ uint32_t FullK(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t FullV(int s) const { return base + 8 * (1 + kStages + s); }
  __device__ uint32_t EmptyK(int s) const { return base + 8 * (1 + 2 * kStages + s); }
  __device__ uint32_t EmptyV(int s) const { return base + 8 * (1 + 3 * kStages + s); }
};

constexpr int kProducerChainThreads = 64;  // arrivals that fill a stage (one chain)
constexpr int kConsumerWarps = 8;          // arrivals that empty a stage (every consumer warp)

// ---- producer ---------------------------------------------------------------------------------
// Warps 0-1 (the K chain) load Q, then K tiles; warps 2-3 (the V chain) load V tiles. A chain
// keeps one tile in flight: it waits for its own copies before signalling, so the stage a
// consumer sees is complete, and the next tile is issued as soon as a stage is free.
template <int D, int kStages>
__device__ __forceinline__ void Producer(const PrefillAttentionParams& p, const Work& w,
                                         uint32_t sQ, uint32_t sK, uint32_t sV,
                                         const Barriers<kStages>& bar) {
  using Shape = Sm90Shape<D, kStages>;
  constexpr int kChunks = D / 8;                                 // 16-byte chunks per row
  constexpr int kRowsPerPass = kProducerChainThreads / kChunks;  // rows a chain covers per pass
  const int tid = threadIdx.x;                                   // 0 .. 127
  const bool k_chain = tid < kProducerChainThreads;
  const int lane = tid & 31;
  const int ct = tid & (kProducerChainThreads - 1);
  const int c = ct % kChunks, r0 = ct / kChunks;

  if (k_chain) {  // Q tile, rows past q_len zero-filled
    const int64_t row_stride = static_cast<int64_t>(p.num_q_heads) * D;
    const bf16* q_tile =
        p.q + (w.q_begin + w.q0) * row_stride + static_cast<int64_t>(w.qh) * D + c * 8;
#pragma unroll 4
    for (int it = 0; it < kBlockM / kRowsPerPass; ++it) {
      const int r = r0 + it * kRowsPerPass;
      const bool valid = w.q0 + r < w.q_len;
      CpAsync16(sQ + SwzOffset<kBlockM>(r, c), valid ? q_tile + r * row_stride : p.q,
                valid ? 16 : 0);
    }
    CpAsyncCommit();
  }

  const bf16* pool = k_chain ? p.k_pool : p.v_pool;
  const uint32_t ring = k_chain ? sK : sV;
  const int n = w.num_kv_tiles;
  // Keys past these are zero-filled: past kv_len, or past what the block table row can name.
  const int key_end = min(w.kv_len, p.max_blocks * kHeadBlock);
  const int num_blocks = (key_end + kHeadBlock - 1) / kHeadBlock;
  // Lane b < 8 holds the slot of head-block b of the tile being issued; the next tile's slots
  // are read one tile ahead so the table's latency hides behind the copies.
  auto read_slots = [&](int t) {
    const int idx = t * kBlocksPerTile + lane;
    return lane < kBlocksPerTile && idx < num_blocks ? __ldg(w.table + idx) : 0;
  };
  int next_slots = n > 0 ? read_slots(n - 1) : 0;
  int stage = 0;
  uint32_t phase = 0;
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    const int t = n - 1 - i;
    const int slots = next_slots;
    if (i + 1 < n) next_slots = read_slots(t - 1);
    MbarWait(k_chain ? bar.EmptyK(stage) : bar.EmptyV(stage), phase ^ 1);
    const uint32_t dst = ring + stage * Shape::kKvBytes;
    const int key0 = t * kBlockN;
#pragma unroll 1
    for (int b = 0; b < kBlocksPerTile; ++b) {  // rolled: the producer lives in 40 registers
      const int slot = __shfl_sync(0xffffffffu, slots, b);
      const bf16* src = pool + static_cast<int64_t>(slot) * (kHeadBlock * D) + c * 8;
#pragma unroll
      for (int k = 0; k < kHeadBlock / kRowsPerPass; ++k) {
        const int rb = r0 + k * kRowsPerPass;
        const int key = b * kHeadBlock + rb;
        const bool valid = key0 + key < key_end;
        CpAsync16(dst + SwzOffset<kBlockN>(key, c), valid ? src + rb * D : pool, valid ? 16 : 0);
      }
    }
    CpAsyncCommit();
    if (k_chain && i == 0) {  // Q was committed first
      CpAsyncWait<1>();
      FenceProxyAsync();
      MbarArrive(bar.FullQ());
    }
    CpAsyncWait<0>();
    FenceProxyAsync();
    MbarArrive(k_chain ? bar.FullK(stage) : bar.FullV(stage));
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  if (k_chain && n == 0) {  // nothing to attend to (kv_len < 1): Q still completes its barrier
    CpAsyncWait<0>();
    FenceProxyAsync();
    MbarArrive(bar.FullQ());
  }
}

// ---- FP8 producer ------------------------------------------------------------------------------
__device__ __forceinline__ uint4 LdShared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void StShared16(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                           uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// The chains of Producer, over e4m3 pools. Per KV tile a thread copies kPasses 16-byte pieces
// (16 e4m3 values: columns 16 c8 .. 16 c8 + 15 of key r0 + m kRowsPerPass, m < kPasses) into
// raw stage i % 2 at (m * 64 + ct) * 16 (thread-private and linear: conflict-free copies and
// reads), one tile ahead of the one it widens. Widening tile i: wait for its own copies of tile i
// (the copies of tile i + 1 stay in flight), wait for the widened stage to be empty, write each
// piece as f16 chunks 2 c8 and 2 c8 + 1 of its key in the swizzled layout, fence into the async
// proxy, arrive on full. The 8 threads of a quarter warp hold 8 consecutive keys of one c8, so
// their stores hit 8 distinct 16-byte bank groups. Raw stage (i + 1) % 2 is refilled only after
// this thread has read its pieces of tile i - 1 from it (program order: the copy is issued later).
template <int D, int kStages>
__device__ __forceinline__ void ProducerFp8(const PrefillAttentionParams& p, const Work& w,
                                            uint32_t sQ, uint32_t sK, uint32_t sV, uint32_t sRaw,
                                            const Barriers<kStages>& bar) {
  using Shape = Sm90Shape<D, kStages, true>;
  constexpr int kChunks = D / 8;                                  // 16-byte bf16 chunks per row
  constexpr int kQRowsPerPass = kProducerChainThreads / kChunks;  // Q rows a chain covers per pass
  constexpr int kChunks8 = D / 16;                                // 16-byte e4m3 chunks per row
  constexpr int kRowsPerPass = kProducerChainThreads / kChunks8;  // keys per pass: 8 or 16
  constexpr int kPassesPerBlock = kHeadBlock / kRowsPerPass;      // 2 or 1
  constexpr int kPasses = kBlockN / kRowsPerPass;                 // pieces per thread per tile
  static_assert(kRowsPerPass % 8 == 0 && kHeadBlock % kRowsPerPass == 0, "pass shape");
  const int tid = threadIdx.x;  // 0 .. 127
  const bool k_chain = tid < kProducerChainThreads;
  const int lane = tid & 31;
  const int ct = tid & (kProducerChainThreads - 1);

  if (k_chain) {  // Q tile (bf16), rows past q_len zero-filled; converted to f16 once it lands
    const int c = ct % kChunks, r0 = ct / kChunks;
    const int64_t row_stride = static_cast<int64_t>(p.num_q_heads) * D;
    const bf16* q_tile =
        p.q + (w.q_begin + w.q0) * row_stride + static_cast<int64_t>(w.qh) * D + c * 8;
#pragma unroll 4
    for (int it = 0; it < kBlockM / kQRowsPerPass; ++it) {
      const int r = r0 + it * kQRowsPerPass;
      const bool valid = w.q0 + r < w.q_len;
      CpAsync16(sQ + SwzOffset<kBlockM>(r, c), valid ? q_tile + r * row_stride : p.q,
                valid ? 16 : 0);
    }
    CpAsyncCommit();
  }
  auto convert_q = [&] {  // this thread's own Q chunks, bf16 -> f16 in place (exact in range)
    const int c = ct % kChunks, r0 = ct / kChunks;
#pragma unroll 4
    for (int it = 0; it < kBlockM / kQRowsPerPass; ++it) {
      const uint32_t a = sQ + SwzOffset<kBlockM>(r0 + it * kQRowsPerPass, c);
      const uint4 x = LdShared16(a);
      StShared16(a, Bf16x2ToF16x2(x.x), Bf16x2ToF16x2(x.y), Bf16x2ToF16x2(x.z), Bf16x2ToF16x2(x.w));
    }
  };

  const int c8 = ct / kRowsPerPass, r0 = ct % kRowsPerPass;
  const uint8_t* pool = k_chain ? p.k_pool_fp8 : p.v_pool_fp8;
  const uint32_t ring = k_chain ? sK : sV;
  const uint32_t raw = sRaw + (k_chain ? 0 : Shape::kRawStages * Shape::kRawBytes) + ct * 16;
  const int n = w.num_kv_tiles;
  const int key_end = min(w.kv_len, p.max_blocks * kHeadBlock);
  const int num_blocks = (key_end + kHeadBlock - 1) / kHeadBlock;
  auto read_slots = [&](int t) {
    const int idx = t * kBlocksPerTile + lane;
    return lane < kBlocksPerTile && idx < num_blocks ? __ldg(w.table + idx) : 0;
  };
  // Copies tile t's pieces into raw stage `rs` and commits them as one group.
  auto issue = [&](int t, int slots, int rs) {
    const uint32_t dst = raw + rs * Shape::kRawBytes;
    const int key0 = t * kBlockN;
#pragma unroll 1
    for (int b = 0; b < kBlocksPerTile; ++b) {
      const int slot = __shfl_sync(0xffffffffu, slots, b);
      const uint8_t* src = pool + static_cast<int64_t>(slot) * (kHeadBlock * D) + c8 * 16;
#pragma unroll
      for (int k = 0; k < kPassesPerBlock; ++k) {
        const int rb = r0 + k * kRowsPerPass;
        const bool valid = key0 + b * kHeadBlock + rb < key_end;
        CpAsync16(dst + (b * kPassesPerBlock + k) * (kProducerChainThreads * 16),
                  valid ? src + rb * D : pool, valid ? 16 : 0);
      }
    }
    CpAsyncCommit();
  };
  // Widens this thread's pieces in raw stage `rs` into widened stage `stage`.
  const uint32_t swz0 = SwzOffset<kBlockN>(r0, 2 * c8);  // key r0, chunk 2 c8; chunk 2 c8 + 1: ^16
  auto widen = [&](int rs, int stage) {
    const uint32_t src = raw + rs * Shape::kRawBytes;
    const uint32_t dst = ring + stage * Shape::kKvBytes + swz0;
#pragma unroll 2
    for (int m = 0; m < kPasses; ++m) {
      const uint4 x = LdShared16(src + m * (kProducerChainThreads * 16));
      uint32_t a0, a1, a2, a3;
      E4M3x4ToF16x2(x.x, a0, a1);
      E4M3x4ToF16x2(x.y, a2, a3);
      const uint32_t d = dst + m * (kRowsPerPass * 128);
      StShared16(d, a0, a1, a2, a3);
      E4M3x4ToF16x2(x.z, a0, a1);
      E4M3x4ToF16x2(x.w, a2, a3);
      StShared16(d ^ 16u, a0, a1, a2, a3);
    }
  };

  int next_slots = n > 0 ? read_slots(n - 1) : 0;
  if (n > 0) issue(n - 1, next_slots, 0);
  if (n > 1) next_slots = read_slots(n - 2);
  if (k_chain) {  // Q was committed first
    if (n > 0) {
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();  // nothing to attend to (kv_len < 1): Q still completes its barrier
    }
    convert_q();
    FenceProxyAsync();
    MbarArrive(bar.FullQ());
  }
  int stage = 0;
  uint32_t phase = 0;
#pragma unroll 1
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n) {
      issue(n - 2 - i, next_slots, (i + 1) & 1);
      if (i + 2 < n) next_slots = read_slots(n - 3 - i);
      CpAsyncWait<1>();  // tile i's copies landed; tile i + 1's stay in flight
    } else {
      CpAsyncWait<0>();
    }
    MbarWait(k_chain ? bar.EmptyK(stage) : bar.EmptyV(stage), phase ^ 1);
    widen(i & 1, stage);
    FenceProxyAsync();
    MbarArrive(k_chain ? bar.FullK(stage) : bar.FullV(stage));
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

// ---- consumer: softmax pieces -------------------------------------------------------------------
// S fragment of wgmma m64n128 (per thread, 64 floats): s[4j + e] is row g + 8 (e >> 1) of the
// warp's 16 rows, key 8 j + 2 t4 + (e & 1) of the tile (g = lane / 4, t4 = lane % 4).

// Sets to -inf every score whose key lies above the row's causal limit. `limit` is
// ctx + q0 + (first row of this thread) - key0 - 2 t4.
__device__ __forceinline__ void CausalMask(float (&s)[64], int limit) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * j + (e & 1) > limit + 8 * (e >> 1)) s[4 * j + e] = -INFINITY;
}

// Online softmax over one tile (base 2, scale folded in): turns s into unnormalised
// probabilities, updates the running max m and the per-thread partial row sums l, and returns
// in `rescale` the factor the O accumulator must be multiplied by before this tile's P·V.
__device__ __forceinline__ void OnlineSoftmax(float (&s)[64], float (&m)[2], float (&l)[2],
                                              float (&rescale)[2], float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // a row with no visible key yet
    rescale[r] = Ex2(m[r] * scale_log2 - base);                   // 0 while m[r] is -inf
    m[r] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      s[4 * j + 2 * r] = Ex2(fmaf(s[4 * j + 2 * r], scale_log2, -base));
      s[4 * j + 2 * r + 1] = Ex2(fmaf(s[4 * j + 2 * r + 1], scale_log2, -base));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    l[r] = l[r] * rescale[r] + sum;  // per-thread partial; the 4 threads of a row add up at the end
  }
}

// P (fp32 accumulator layout) -> bf16 A fragments of the P·V wgmma: for key step kk (16 keys)
// the 4 registers are rows (g, g+8) x keys (2 t4, 2 t4 + 8) of that step, which is exactly
// s[8 kk .. 8 kk + 8) of the accumulator layout.
// FP8 (kF16): f16 words instead.
template <bool kF16 = false>
__device__ __forceinline__ void ConvertP(const float (&s)[64], uint32_t (&pf)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) pf[i] = PackT<kF16>(s[2 * i], s[2 * i + 1]);
}

template <int N>
__device__ __forceinline__ void Rescale(float (&o)[N], const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] *= rescale[(i >> 1) & 1];
}

// ---- consumer ---------------------------------------------------------------------------------
template <int D, bool kF16 = false>
__device__ __forceinline__ void WgmmaPV(float (&o)[D / 2], const uint32_t* a, uint64_t desc_b) {
  if constexpr (kF16) {
    if constexpr (D == 128) {
      WgmmaRS_N128<true>(o, a, desc_b);
    } else {
      WgmmaRS_N64<true>(o, a, desc_b);
    }
  } else if constexpr (D == 128) {
    WgmmaRS_N128(o, a, desc_b);
  } else {
    WgmmaRS_N64(o, a, desc_b);
  }
}
template <bool kF16>
__device__ __forceinline__ void WgmmaQK(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                        int scale_d) {
  if constexpr (kF16) {
    WgmmaSS_N128<true>(d, desc_a, desc_b, scale_d);
  } else {
    WgmmaSS_N128(d, desc_a, desc_b, scale_d);
  }
}

// Warpgroups 1 and 2: 64 query rows each. Named barriers 1 and 2 pass the right to issue
// GEMMs back and forth (warpgroup w waits on barrier 1 + w and releases the other one);
// barriers 3 and 4 order each warpgroup's epilogue.
template <int D, int kStages, bool kFp8>
__device__ __forceinline__ void Consumer(const PrefillAttentionParams& p, const Work& w,
                                         uint32_t sQ, uint32_t sK, uint32_t sV,
                                         const Barriers<kStages>& bar, unsigned char* q_tile_smem) {
  using Shape = Sm90Shape<D, kStages, kFp8>;
  constexpr int kPairThreads = 256;  // both consumer warpgroups
  const int wg = static_cast<int>(threadIdx.x) / 128 - 1;
  const int wt = threadIdx.x & 127;
  const int lane = wt & 31, warp = wt >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 =
      wg * 64 + warp * 16 + g;  // tile row of this thread's fragment rows (row0, row0 + 8)
  const int n = w.num_kv_tiles;
  const int my_turn = 1 + wg, other_turn = 2 - wg;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, rescale[2] = {1.0f, 1.0f};
  float s[64];
  uint32_t pf[32];

  if (wg == 1) NamedBarArrive(1, kPairThreads);  // warpgroup 0 issues first
  MbarWait(bar.FullQ(), 0);

  if (n > 0) {
    float scale_log2 = p.scale * 1.4426950408889634f;
    if constexpr (kFp8) scale_log2 = p.scale * p.k_scale[w.h] * 1.4426950408889634f;
    const uint64_t q_desc = MakeDesc(sQ + wg * 64 * 128, 16, 1024);
    const uint64_t k_desc = MakeDesc(sK, 16, 1024);
    const uint64_t v_desc = MakeDesc(sV, Shape::kKvPanelBytes, 1024);
    const int diag = w.ctx + w.q0;  // tile row r sees keys <= diag + r

    auto issue_qk = [&](int stage) {
      FenceRegs(s);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t col = (kk >> 2) * Shape::kQPanelBytes + (kk & 3) * 32;
        const uint32_t kcol =
            stage * Shape::kKvBytes + (kk >> 2) * Shape::kKvPanelBytes + (kk & 3) * 32;
        WgmmaQK<kFp8>(s, DescAt(q_desc, col), DescAt(k_desc, kcol), kk > 0 ? 1 : 0);
      }
      WgmmaCommit();
      FenceRegs(s);
    };
    auto issue_pv = [&](int stage) {
      FenceRegs(pf);
      FenceRegs(o);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        WgmmaPV<D, kFp8>(o, pf + 4 * kk, DescAt(v_desc, stage * Shape::kKvBytes + kk * 16 * 128));
      }
      WgmmaCommit();
      FenceRegs(o);
      FenceRegs(pf);
    };
    auto softmax = [&](int t) {
      const int key0 = t * kBlockN;
      if (key0 + kBlockN - 1 > diag + wg * 64) CausalMask(s, diag + row0 - key0 - 2 * t4);
      OnlineSoftmax(s, m, l, rescale, scale_log2);
    };

    // The last KV tile: S only (no P·V is pending yet).
    int stage = 0;
    uint32_t phase = 0;
    MbarWait(bar.FullK(0), 0);
    NamedBarSync(my_turn, kPairThreads);
    issue_qk(0);
    NamedBarArrive(other_turn, kPairThreads);
    WgmmaWait<0>();
    FenceRegs(s);
    if (lane == 0) MbarArrive(bar.EmptyK(0));
    softmax(n - 1);
    ConvertP<kFp8>(s, pf);

#pragma unroll 1
    for (int i = 1; i < n; ++i) {
      const int prev_stage = stage;
      const uint32_t prev_phase = phase;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
      MbarWait(bar.FullK(stage), phase);
      NamedBarSync(my_turn, kPairThreads);
      issue_qk(stage);      // S_i = Q·K_iᵀ
      Rescale(o, rescale);  // O to the running max of tiles < i (while S_i runs)
      MbarWait(bar.FullV(prev_stage), prev_phase);
      issue_pv(prev_stage);  // O += P_{i-1}·V_{i-1}
      NamedBarArrive(other_turn, kPairThreads);
      WgmmaWait<1>();  // S_i done (P·V may still run)
      FenceRegs(s);
      if (lane == 0) MbarArrive(bar.EmptyK(stage));
      softmax(n - 1 - i);
      WgmmaWait<0>();  // P_{i-1}·V_{i-1} done: its A registers (pf) and V stage are free
      FenceRegs(o);
      FenceRegs(pf);
      if (lane == 0) MbarArrive(bar.EmptyV(prev_stage));
      ConvertP<kFp8>(s, pf);
    }
    Rescale(o, rescale);
    MbarWait(bar.FullV(stage), phase);
    issue_pv(stage);
    WgmmaWait<0>();
    FenceRegs(o);
    FenceRegs(pf);
    if (lane == 0) MbarArrive(bar.EmptyV(stage));
  }

  // ---- epilogue: O / l -> bf16 -> this warpgroup's rows of the Q tile in shared -> 16-byte stores
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    if constexpr (kFp8) inv[r] *= p.v_scale[w.h];
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(q_tile_smem + SwzOffset<kBlockM>(row0 + 8 * r, j) + 4 * t4) =
          PackBf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
    }
  }
  NamedBarSync(3 + wg, 128);
  constexpr int kChunks = D / 8;
  const int64_t row_stride = static_cast<int64_t>(p.num_q_heads) * D;
  bf16* out = p.out + (w.q_begin + w.q0) * row_stride + static_cast<int64_t>(w.qh) * D;
#pragma unroll
  for (int i = wt; i < 64 * kChunks; i += 128) {
    const int r = wg * 64 + i / kChunks, c = i % kChunks;
    if (w.q0 + r < w.q_len) {
      *reinterpret_cast<uint4*>(out + r * row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(q_tile_smem + SwzOffset<kBlockM>(r, c));
    }
  }
}

template <int D, int kStages, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillAttentionSm90Kernel(const PrefillAttentionParams p, int num_tiles_per_head) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = Sm90Shape<D, kStages, kFp8>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t sQ = (raw + 1023) & ~1023u;  // swizzle atoms are 1024-byte aligned
  const uint32_t sK = sQ + Shape::kQBytes;
  const uint32_t sV = sK + kStages * Shape::kKvBytes;
  const uint32_t sRaw = sV + kStages * Shape::kKvBytes;  // FP8 only: raw K ring, raw V ring
  const Barriers<kStages> bar{sRaw + 2 * Shape::kRawStages * Shape::kRawBytes};

  Work w;
  int seq = 0, q_tile = 0;
  if (!prefill::CtaTile<kBlockM>(p, num_tiles_per_head, w.qh, seq, q_tile)) return;
  w.h = w.qh / (p.num_q_heads / p.num_kv_heads);
  w.q_begin = p.query_start[seq];
  w.q_len = static_cast<int>(p.query_start[seq + 1] - w.q_begin);
  w.q0 = q_tile * kBlockM;
  w.kv_len = p.kv_lens[seq * p.num_kv_heads + w.h];
  w.ctx = w.kv_len - w.q_len;
  const int kv_end = min(w.kv_len, w.ctx + w.q0 + kBlockM);
  w.num_kv_tiles = kv_end > 0 ? (kv_end + kBlockN - 1) / kBlockN : 0;
  w.table = p.block_tables + (static_cast<int64_t>(seq) * p.num_kv_heads + w.h) * p.max_blocks;

  if (threadIdx.x == 0) {
    MbarInit(bar.FullQ(), kProducerChainThreads);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(bar.FullK(s), kProducerChainThreads);
      MbarInit(bar.FullV(s), kProducerChainThreads);
      MbarInit(bar.EmptyK(s), kConsumerWarps);
      MbarInit(bar.EmptyV(s), kConsumerWarps);
    }
    FenceMbarrierInit();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    SetMaxNRegDec<kProducerRegs>();
    if constexpr (kFp8) {
      ProducerFp8<D, kStages>(p, w, sQ, sK, sV, sRaw, bar);
    } else {
      Producer<D, kStages>(p, w, sQ, sK, sV, bar);
    }
  } else {
    SetMaxNRegInc<kConsumerRegs>();
    Consumer<D, kStages, kFp8>(p, w, sQ, sK, sV, bar, smem_raw + (sQ - raw));
  }
#else
  __trap();  // built without sm_90a code: LaunchPrefillAttention only selects this kernel on CC 9.0
#endif
}

template <int D, int kStages, bool kFp8 = false>
cudaError_t LaunchSm90(const PrefillAttentionParams& p, cudaStream_t stream) {
  using Shape = Sm90Shape<D, kStages, kFp8>;
  return prefill::LaunchTiles<PrefillAttentionSm90Kernel<D, kStages, kFp8>>(
      p, kBlockM, kThreads, Shape::kSmemBytes, stream);
}

}  // namespace

cudaError_t LaunchPrefillAttentionSm90(const PrefillAttentionParams& p, int stages,
                                       cudaStream_t stream) {
  if (p.kv_dtype == KvDtype::kFp8E4M3) {
    // Widened stages (plus the 2-stage raw ring): 2 at head_dim 128 whatever `stages` says
    // (32 KiB Q + 2 x 64 KiB + 2 x 32 KiB raw = 224 KiB; a third widened stage does not fit);
    // 4 or 2 at 64.
    switch (p.head_dim) {
      case 128:
        return LaunchSm90<128, 2, true>(p, stream);
      case 64:
        return stages == 2 ? LaunchSm90<64, 2, true>(p, stream)
                           : LaunchSm90<64, 4, true>(p, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  // stages 0 = the deepest ring that fits: 3 at head_dim 128 (225 KiB), 4 at 64 (145 KiB).
  switch (p.head_dim) {
    case 128:
      return stages == 2 ? LaunchSm90<128, 2>(p, stream) : LaunchSm90<128, 3>(p, stream);
    case 64:
      return stages == 2 ? LaunchSm90<64, 2>(p, stream) : LaunchSm90<64, 4>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace oasis::kernels::detail

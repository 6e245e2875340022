// Prefill attention on tensor cores: see attention_prefill.h for the semantics and
// docs/kernels/prefill_attention.md for the design and the measurements.
//
// Data flow of one CTA (one query head, one tile of kBlockM query rows of one sequence):
//   Q tile -> shared (cp.async, zero-filled past q_len)
//   for each KV tile j of 64 tokens (= 4 head-blocks found through the block table):
//     K_j, V_j were gathered into shared buffer j%2 during tile j-1 (cp.async, zero-filled
//     past kv_len, so stale or poisoned pool contents never reach the math);
//     S = Q·K_jᵀ (mma.sync m16n8k16 bf16, fp32 accumulators), causal mask near the diagonal,
//     online softmax in base 2, O += P·V_j with P rounded to bf16.
//   O / l -> shared (swizzled) -> 16-byte stores.
// Every warp owns kRowsPerWarp contiguous query rows, so softmax state never leaves a warp and
// one __syncthreads per KV tile is the only CTA-wide synchronisation.
//
// Shared tiles are row-major [rows][head_dim] bf16 with the 16-byte chunks of row r XOR-ed by
// (r & 7): the 8 rows an ldmatrix phase reads hit 8 distinct bank groups.
//
// FP8 pools (kFp8): K/V tile j's e4m3 bytes are gathered (cp.async, zero-filled past kv_len) into
// staging buffer j%2, one tile ahead as above; at the top of iteration j each thread waits for its
// own copies and widens exactly those pieces to f16 into the swizzled tile buffer j%2 (Q is
// converted bf16 -> f16 in place the same way before the first tile), and the existing
// __syncthreads publishes them. The MMAs then run on f16 operands (P packed to f16).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/attention_prefill.h"
#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/prefill_tiles.cuh"

namespace oasis::kernels {
namespace {

constexpr int kKvTile = 64;  // keys per KV tile
constexpr int kHeadBlock = 16;
constexpr int kBlocksPerKvTile = kKvTile / kHeadBlock;
static_assert(kBlocksPerKvTile == 4, "the slot ring below holds 4 table entries per tile");
constexpr int kSlotRingBytes = 2 * kBlocksPerKvTile * 4;

// ---- tile shapes ------------------------------------------------------------------------------
template <int D, int kWarps, int kMTiles, bool kFp8 = false>
struct Tile {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = D * 2;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKvBytes = kKvTile * kRowBytes;  // one K or one V tile
  // FP8 staging: [2][K, V][kKvTile][D] e4m3 bytes, after the slot ring.
  static constexpr int kStageBytes = kFp8 ? 2 * 2 * kKvTile * D : 0;
  static constexpr int kSmemBytes =
      kQBytes + 4 * kKvBytes + kSlotRingBytes + kStageBytes;  // Q, K[2], V[2], slots, staging
  static constexpr int kChunks8 = D / 16;                     // 16-byte chunks per FP8 row
  static constexpr int kKv8ChunksPerThread = kFp8 ? kKvTile * kChunks8 / kThreads : 0;
  static constexpr bool kQInRegs = kMTiles == 1;
  static constexpr int kKvChunksPerThread = kKvTile * kChunks / kThreads;
  static constexpr int kMinBlocks = kThreads == 128 ? 2 : 1;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kKvTile * kChunks % kThreads == 0, "KV tile chunks split evenly over threads");
  static_assert(!kFp8 || kKvTile * kChunks8 % kThreads == 0, "FP8 chunks split evenly");
};

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][D] bf16 tile.
template <int D>
__device__ __forceinline__ uint32_t Swz(int r, int c) {
  return static_cast<uint32_t>(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

template <int D, int kWarps, int kMTiles, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32, (Tile<D, kWarps, kMTiles, kFp8>::kMinBlocks))
    PrefillAttentionKernel(const PrefillAttentionParams p, int num_tiles_per_head) {
  using T = Tile<D, kWarps, kMTiles, kFp8>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  int qh = 0, seq = 0, q_tile = 0;
  if (!prefill::CtaTile<T::kBlockM>(p, num_tiles_per_head, qh, seq, q_tile)) return;

  const int h = qh / (p.num_q_heads / p.num_kv_heads);
  const int64_t q_begin = p.query_start[seq];
  const int q_len = static_cast<int>(p.query_start[seq + 1] - q_begin);
  const int q0 = q_tile * T::kBlockM;
  const int kv_len = p.kv_lens[seq * p.num_kv_heads + h];
  const int ctx =
      kv_len - q_len;  // keys before this chunk's first query: row r sees keys <= ctx + r
  const int kv_end = min(kv_len, ctx + q0 + T::kBlockM);
  const int num_kv_tiles = kv_end > 0 ? (kv_end + kKvTile - 1) / kKvTile : 0;
  const int num_blocks = min((kv_len + kHeadBlock - 1) / kHeadBlock, p.max_blocks);
  const int32_t* table =
      p.block_tables + (static_cast<int64_t>(seq) * p.num_kv_heads + h) * p.max_blocks;
  const int64_t row_stride = static_cast<int64_t>(p.num_q_heads) * D;  // q and out

  const uint32_t sQ = SmemAddr(smem);
  const uint32_t sK = sQ + T::kQBytes;       // K buffers 0, 1
  const uint32_t sV = sK + 2 * T::kKvBytes;  // V buffers 0, 1

  // Q tile -> shared, rows past q_len zero-filled.
  {
    const bf16* q_tile_ptr = p.q + (q_begin + q0) * row_stride + static_cast<int64_t>(qh) * D;
    for (int i = tid; i < T::kBlockM * T::kChunks; i += T::kThreads) {
      const int r = i / T::kChunks, c = i % T::kChunks;
      const bool valid = q0 + r < q_len;
      CpAsync16(sQ + Swz<D>(r, c), valid ? q_tile_ptr + r * row_stride + c * 8 : p.q,
                valid ? 16 : 0);
    }
  }

  // The 4 slots of KV tile j sit in shared ring entry j % 2: copied (cp.async) one tile ahead,
  // in the same group as the previous KV tile, so the table's latency is never exposed.
  const uint32_t s_slots = sV + 2 * T::kKvBytes;
  const int* slot_ring = reinterpret_cast<const int*>(smem + T::kQBytes + 4 * T::kKvBytes);
  // FP8 staging buffers: K of buffer b at b * 2 * kKvTile * D, V kKvTile * D after it.
  constexpr int kStageBuf = 2 * kKvTile * D;
  const int stage_off = T::kQBytes + 4 * T::kKvBytes + kSlotRingBytes;
  auto copy_slots = [&](int j) {  // warp 0's lanes 0..3
    if (tid < kBlocksPerKvTile) {
      const int idx = j * kBlocksPerKvTile + tid;
      const bool valid = idx < num_blocks;
      CpAsync4(s_slots + ((j & 1) * kBlocksPerKvTile + tid) * 4, valid ? table + idx : table,
               valid ? 4 : 0);
    }
  };
  auto load_kv = [&](int j, const int(&slots)[kBlocksPerKvTile]) {
    if constexpr (kFp8) {
      const uint32_t sk8 = sQ + stage_off + (j & 1) * kStageBuf, sv8 = sk8 + kKvTile * D;
#pragma unroll
      for (int it = 0; it < T::kKv8ChunksPerThread; ++it) {
        const int i = tid + it * T::kThreads;
        const int tok = i / T::kChunks8, c = i % T::kChunks8;
        const int blk = tok / kHeadBlock;
        const int slot = blk == 0 ? slots[0] : blk == 1 ? slots[1] : blk == 2 ? slots[2] : slots[3];
        const bool valid = j * kKvTile + tok < kv_len;
        const int64_t off =
            valid ? (static_cast<int64_t>(slot) * kHeadBlock + (tok % kHeadBlock)) * D + c * 16 : 0;
        CpAsync16(sk8 + i * 16, p.k_pool_fp8 + off, valid ? 16 : 0);
        CpAsync16(sv8 + i * 16, p.v_pool_fp8 + off, valid ? 16 : 0);
      }
      return;
    }
    const uint32_t buf = (j & 1) * T::kKvBytes;
#pragma unroll
    for (int it = 0; it < T::kKvChunksPerThread; ++it) {
      const int i = tid + it * T::kThreads;
      const int tok = i / T::kChunks, c = i % T::kChunks;
      const int blk = tok / kHeadBlock;
      const int slot = blk == 0 ? slots[0] : blk == 1 ? slots[1] : blk == 2 ? slots[2] : slots[3];
      const bool valid = j * kKvTile + tok < kv_len;
      const int64_t off =
          valid ? (static_cast<int64_t>(slot) * kHeadBlock + (tok % kHeadBlock)) * D + c * 8 : 0;
      const uint32_t dst = buf + Swz<D>(tok, c);
      CpAsync16(sK + dst, p.k_pool + off, valid ? 16 : 0);
      CpAsync16(sV + dst, p.v_pool + off, valid ? 16 : 0);
    }
  };
  auto load_kv_from_ring = [&](int j) {
    const int4 ring = *reinterpret_cast<const int4*>(slot_ring + (j & 1) * kBlocksPerKvTile);
    const int slots[kBlocksPerKvTile] = {ring.x, ring.y, ring.z, ring.w};
    load_kv(j, slots);
  };

  if (num_kv_tiles > 0) {
    int slots[kBlocksPerKvTile];
#pragma unroll
    for (int b = 0; b < kBlocksPerKvTile; ++b) slots[b] = b < num_blocks ? __ldg(table + b) : 0;
    load_kv(0, slots);
  }
  if (num_kv_tiles > 1) copy_slots(1);
  CpAsyncCommit();

  float scale_log2 = p.scale * 1.4426950408889634f, out_scale = 1.0f;
  if constexpr (kFp8) {
    scale_log2 = p.scale * p.k_scale[h] * 1.4426950408889634f;
    out_scale = p.v_scale[h];
  }
  // FP8: this thread's staged pieces of tile j -> f16 K/V tiles j % 2 (16 e4m3 -> two 16-byte
  // f16 chunks of the same row); before the first tile, its Q chunks bf16 -> f16 in place.
  auto widen_kv = [&](int j) {
#pragma unroll
    for (int it = 0; it < T::kKv8ChunksPerThread; ++it) {
      const int i = tid + it * T::kThreads;
      const int tok = i / T::kChunks8, c = i % T::kChunks8;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        const uint4 x = *reinterpret_cast<const uint4*>(smem + stage_off + (j & 1) * kStageBuf +
                                                        kv * kKvTile * D + i * 16);
        uint4 lo, hi;
        E4M3x4ToF16x2(x.x, lo.x, lo.y);
        E4M3x4ToF16x2(x.y, lo.z, lo.w);
        E4M3x4ToF16x2(x.z, hi.x, hi.y);
        E4M3x4ToF16x2(x.w, hi.z, hi.w);
        unsigned char* tile = smem + T::kQBytes + (2 * kv + (j & 1)) * T::kKvBytes;
        *reinterpret_cast<uint4*>(tile + Swz<D>(tok, 2 * c)) = lo;
        *reinterpret_cast<uint4*>(tile + Swz<D>(tok, 2 * c + 1)) = hi;
      }
    }
  };
  auto widen_q = [&] {
    for (int i = tid; i < T::kBlockM * T::kChunks; i += T::kThreads) {
      uint4* q = reinterpret_cast<uint4*>(smem + Swz<D>(i / T::kChunks, i % T::kChunks));
      uint4 x = *q;
      x.x = Bf16x2ToF16x2(x.x), x.y = Bf16x2ToF16x2(x.y);
      x.z = Bf16x2ToF16x2(x.z), x.w = Bf16x2ToF16x2(x.w);
      *q = x;
    }
  };
  const int warp_row0 = warp * T::kRowsPerWarp;
  const int diag0 = ctx + q0 + warp_row0;  // last key the warp's first row sees
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment coordinates
  // Byte offsets of the 16-byte row piece this lane hands to ldmatrix (fragment layouts of
  // m16n8k16), at k-chunk pair 0. Every row it names is == lane (mod 8), so the swizzle of
  // chunk pair kk is a compile-time XOR: Swz(row, 2kk + c) == Swz(row, c) ^ (kk << 5).
  const uint32_t a_off =
      Swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);  // Q (A), V (B, trans)
  const uint32_t k_off = Swz<D>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);  // K (B)
  const uint32_t q_off = sQ + warp_row0 * T::kRowBytes;

  float o[kMTiles][D / 8][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.0f;
    }
  }
  uint32_t q_frag[T::kQInRegs ? kMTiles : 1][T::kQInRegs ? D / 16 : 1][4];

  for (int j = 0; j < num_kv_tiles; ++j) {
    CpAsyncWait<0>();
    if constexpr (kFp8) {
      // Buffer j % 2 was last read in iteration j - 2; every warp passed iteration j - 1's
      // barrier after that. Staging j % 2 holds only this thread's own landed copies.
      if (j == 0) widen_q();
      widen_kv(j);
    }
    __syncthreads();  // tile j visible to all; every warp is done with buffer (j + 1) % 2
    if (j + 1 < num_kv_tiles) load_kv_from_ring(j + 1);
    if (j + 2 < num_kv_tiles) copy_slots(j + 2);
    CpAsyncCommit();

    if constexpr (T::kQInRegs) {
      if (j == 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk)
            Ldmatrix4(q_off + mt * 16 * T::kRowBytes + (a_off ^ (kk << 5)), q_frag[mt][kk]);
      }
    }
    const int key0 = j * kKvTile;
    if (key0 > diag0 + T::kRowsPerWarp - 1)
      continue;  // the whole tile is above this warp's diagonal

    const uint32_t k_buf = sK + (j & 1) * T::kKvBytes, v_buf = sV + (j & 1) * T::kKvBytes;
    // ---- S = Q · Kᵀ
    float s[kMTiles][kKvTile / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kKvTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (T::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[mt][kk][e];
        } else {
          Ldmatrix4(q_off + mt * 16 * T::kRowBytes + (a_off ^ (kk << 5)), a[mt]);
        }
      }
#pragma unroll
      for (int np = 0; np < kKvTile / 16; ++np) {
        uint32_t b[4];
        Ldmatrix4(k_buf + np * 16 * T::kRowBytes + (k_off ^ (kk << 5)), b);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          MmaT<kFp8>(s[mt][2 * np], a[mt], b[0], b[1]);
          MmaT<kFp8>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // ---- causal mask (only tiles that cross this warp's diagonal; also hides keys >= kv_len
    // from real rows, since ctx + r < kv_len for r < q_len)
    if (key0 + kKvTile - 1 > diag0) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kKvTile / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = warp_row0 + mt * 16 + g + (e >> 1) * 8;
            const int key = key0 + nt * 8 + t4 * 2 + (e & 1);
            if (key > ctx + q0 + row) s[mt][nt][e] = -INFINITY;
          }
    }
    // ---- online softmax (base 2); row r of the fragment pair is row g + 8r
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < kKvTile / 8; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // a row with no key yet
        const float correction = Ex2(row_max[mt][r] * scale_log2 - base);
        row_max[mt][r] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kKvTile / 8; ++nt) {
          s[mt][nt][2 * r] = Ex2(fmaf(s[mt][nt][2 * r], scale_log2, -base));
          s[mt][nt][2 * r + 1] = Ex2(fmaf(s[mt][nt][2 * r + 1], scale_log2, -base));
          sum += s[mt][nt][2 * r] + s[mt][nt][2 * r + 1];
        }
        row_sum[mt][r] =
            row_sum[mt][r] * correction + sum;  // per-thread partial; reduced at the end
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[mt][dt][2 * r] *= correction;
          o[mt][dt][2 * r + 1] *= correction;
        }
      }
    }
    // ---- O += P · V (P's accumulator layout is the A-fragment layout of the next mma)
#pragma unroll
    for (int kk = 0; kk < kKvTile / 16; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        a[mt][0] = PackT<kFp8>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = PackT<kFp8>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = PackT<kFp8>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = PackT<kFp8>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        Ldmatrix4Trans(v_buf + kk * 16 * T::kRowBytes + (a_off ^ (dp << 5)), b);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          MmaT<kFp8>(o[mt][2 * dp], a[mt], b[0], b[1]);
          MmaT<kFp8>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  // ---- epilogue: O / l -> this warp's rows of the Q tile in shared -> 16-byte global stores
  CpAsyncWait<0>();  // (only matters when there was no KV tile: Q's copy may still be in flight)
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      if constexpr (kFp8) inv *= out_scale;
      const int row = warp_row0 + mt * 16 + g + 8 * r;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        *reinterpret_cast<uint32_t*>(smem + Swz<D>(row, dt) + t4 * 4) =
            PackBf16(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      }
    }
  }
  __syncwarp();
  bf16* out_tile = p.out + (q_begin + q0) * row_stride + static_cast<int64_t>(qh) * D;
#pragma unroll
  for (int i = lane; i < T::kRowsPerWarp * T::kChunks; i += 32) {
    const int row = warp_row0 + i / T::kChunks, c = i % T::kChunks;
    if (q0 + row < q_len) {
      *reinterpret_cast<uint4*>(out_tile + row * row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(smem + Swz<D>(row, c));
    }
  }
}

template <int D, int kWarps, int kMTiles>
cudaError_t LaunchConfig(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.kv_dtype == KvDtype::kFp8E4M3) {
    using T = Tile<D, kWarps, kMTiles, true>;
    return prefill::LaunchTiles<PrefillAttentionKernel<D, kWarps, kMTiles, true>>(
        p, T::kBlockM, T::kThreads, T::kSmemBytes, stream);
  }
  using T = Tile<D, kWarps, kMTiles, false>;
  return prefill::LaunchTiles<PrefillAttentionKernel<D, kWarps, kMTiles, false>>(
      p, T::kBlockM, T::kThreads, T::kSmemBytes, stream);
}

template <int D>
cudaError_t LaunchHeadDim(const PrefillAttentionParams& p, cudaStream_t stream) {
  PrefillTileConfig tile = p.tile;
  if (tile == PrefillTileConfig::kAuto) {
    // Short chunks: 64-row tiles waste less. Long ones: 128-row tiles halve the K/V traffic per
    // FLOP. At head_dim 128 the 32-rows-per-warp layout needs more than 255 registers (ptxas
    // spills ~110 bytes), so 8 warps of 16 rows is the default there until measured otherwise.
    if (p.max_query_len > 0 && p.max_query_len <= 64) {
      tile = PrefillTileConfig::kM64W4;
    } else {
      tile = D == 128 ? PrefillTileConfig::kM128W8 : PrefillTileConfig::kM128W4;
    }
  }
  switch (tile) {
    case PrefillTileConfig::kM128W8:
      return LaunchConfig<D, 8, 1>(p, stream);
    case PrefillTileConfig::kM64W4:
      return LaunchConfig<D, 4, 1>(p, stream);
    default:
      return LaunchConfig<D, 4, 2>(p, stream);
  }
}

}  // namespace

bool PrefillAttentionSm90Available() {
  // Per device: bit d of `known` says device d was queried, bit d of `sm90` holds the answer.
  static std::atomic<uint64_t> known{0}, sm90{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (!(known.load(std::memory_order_acquire) & bit)) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      return false;
    }
    if (major == 9 && minor == 0) sm90.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
  }
  return (sm90.load(std::memory_order_relaxed) & bit) != 0;
}

cudaError_t LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.num_seqs == 0) return cudaSuccess;
  if (p.num_q_heads <= 0 || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0 ||
      p.max_blocks <= 0) {
    return cudaErrorInvalidValue;
  }
  const bool fp8 = p.kv_dtype == KvDtype::kFp8E4M3;
  if (fp8 && (p.k_pool_fp8 == nullptr || p.v_pool_fp8 == nullptr || p.k_scale == nullptr ||
              p.v_scale == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const void* k_pool = fp8 ? static_cast<const void*>(p.k_pool_fp8) : p.k_pool;
  const void* v_pool = fp8 ? static_cast<const void*>(p.v_pool_fp8) : p.v_pool;
  if (!Aligned16(p.q) || !Aligned16(k_pool) || !Aligned16(v_pool) || !Aligned16(p.out)) {
    return cudaErrorInvalidValue;
  }
  if (!PrefillAttentionSupportsHeadDim(p.head_dim)) return cudaErrorInvalidValue;
  const bool sm90 = PrefillAttentionSm90Available();
  // kAuto takes the wgmma kernel on CC 9.0 for FP8 pools too (its producer widens the e4m3
  // bytes): on the H200 it runs 444 TFLOP/s at 1x8192 (1.00x bf16) where the mma.sync FP8
  // kernel runs 271 (test_gpu_fp8_kv, bench_prefill_attention --kv-dtype fp8; docs/fp8.md).
  if (p.tile == PrefillTileConfig::kSm90 || p.tile == PrefillTileConfig::kSm90S2 ||
      (p.tile == PrefillTileConfig::kAuto && sm90)) {
    if (!sm90) return cudaErrorInvalidValue;
    return detail::LaunchPrefillAttentionSm90(p, p.tile == PrefillTileConfig::kSm90S2 ? 2 : 0,
                                              stream);
  }
  switch (p.head_dim) {
    case 64:
      return LaunchHeadDim<64>(p, stream);
    case 128:
      return LaunchHeadDim<128>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace oasis::kernels

// The MoE grouped GEMM (large batches): C[rows of expert e] = A[rows] · W_eᵀ over the permuted
// rows of MoePlan, bf16 tensor cores (mma.sync m16n8k16, float accumulation).
//
// Tiles: BM rows × 128 weight rows × 64 K, BM the plan's tile_rows (kMoeGemmTileRowChoices):
// 128 rows take 8 warps (2 × 4, a warp 64 × 32) and a 3-stage pipeline, two CTAs per SM (the
// prefill tile); 16, 32 and 64 rows take 4 warps (1 × 4, a warp BM × 32) and 4 stages — the
// decode-batch tiles, where an expert has a few rows and a 128-row tile would spend most of its
// tensor work on zero rows while the weights stream. cp.async through XOR-swizzled shared memory
// (16-byte chunk c of row r at c ^ (r & 7): ldmatrix reads 8 rows of one chunk from 8 distinct
// bank groups). Every tile size runs the same MMAs over K in the same order for an output
// element, so the result does not depend on the tile (test_cuda_moe checks it bit for bit).
// The grid's y dimension is an upper bound of the row tiles, ceil(pairs / BM) + min(experts,
// pairs) (every expert adds at most one partial tile); a CTA finds its expert by a binary search
// of the plan's tile_start on the device and leaves when it is past the last tile. So no size
// goes back to the host and the launch is graph-capturable.
//
// Gate/up: the CTA covers 64 intermediate indices; each warp's 32 weight rows are 16 gate rows
// and the 16 up rows of the same indices, so a thread holds the gate and up products of the same
// (row, index) and the SiLU·mul epilogue needs no exchange. Rows (M), weight rows (N) and K past
// the ends are zero-filled by cp.async (src-size 0) and not written.
#include <algorithm>
#include <mutex>

#include "kernels/attention_prefill.h"
#include "kernels/moe.h"
#include "kernels/moe_common.cuh"

namespace oasis::kernels {
namespace {

constexpr int kBN = 128;
constexpr int kBK = 64;  // 8 chunks of 16 bytes: rows of 128 bytes

template <int BM>
struct Tile {
  static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "a tile of kMoeGemmTileRowChoices");
  static constexpr int kWarpsM = BM == 128 ? 2 : 1;
  static constexpr int kThreads = kWarpsM * 4 * 32;
  static constexpr int kWarpRows = BM / kWarpsM;
  static constexpr int kMI = kWarpRows / 16;  // 16-row MMA tiles per warp
  static constexpr int kStages = BM == 128 ? 3 : 4;
  static constexpr int kRowStep = kThreads / 8;   // tile rows one pass of the copies covers
  static constexpr int kACopies = BM / kRowStep;  // 16-byte copies per thread and stage
  static constexpr int kBCopies = kBN / kRowStep;
  static constexpr int kATileBytes = BM * kBK * 2;
  static constexpr int kStageBytes = kATileBytes + kBN * kBK * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // 96, 96, 80, 72 KiB
  static constexpr int kMinBlocks = BM == 16 ? 3 : 2;
  static_assert(kACopies >= 1, "every thread copies A");
};

struct GemmArgs {
  const bf16* a;          // gate/up: x [tokens, K]; down: hp [pairs, K] (permuted rows)
  const int32_t* sorted;  // gate/up: the pair of each permuted row (token = pair / top_k)
  int top_k;
  const bf16* w;  // [experts, w_rows, K]
  const int32_t* offsets;
  const int32_t* tile_start;
  bf16* out;      // [pairs, n_out]
  int64_t K;      // hidden (gate/up) or inter (down)
  int64_t n_out;  // inter (gate/up: w_rows = 2 · inter) or hidden (down: w_rows = hidden)
  int experts;
};

__device__ __forceinline__ uint32_t Swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * (kBK * 2) + ((chunk ^ (row & 7)) << 4));
}

// The CTA's row tile (blockIdx.y) of BM rows: its expert (a binary search of the plan's
// tile_start), first permuted row and row count; false past the last tile.
struct RowTile {
  int expert, row_begin, rows;
};
template <int BM>
__device__ __forceinline__ bool FindRowTile(const GemmArgs& args, RowTile& t) {
  const int mt = blockIdx.y;
  const int32_t* ts = args.tile_start;
  if (mt >= ts[args.experts]) return false;
  int lo = 0, hi = args.experts;  // ts[lo] <= mt < ts[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (ts[mid] <= mt) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  t.expert = lo;
  t.row_begin = args.offsets[lo] + (mt - ts[lo]) * BM;
  t.rows = min(BM, args.offsets[lo + 1] - t.row_begin);
  return true;
}

// Where tile row r of A is read from (args.a itself, with ok = false, past the tile's rows):
// gate/up gathers the token of the permuted pair, down reads the permuted row.
template <bool kGateUp>
__device__ __forceinline__ const bf16* ARow(const GemmArgs& args, const RowTile& t, int r,
                                            bool& ok) {
  ok = r < t.rows;
  if (!ok) return args.a;
  const int64_t row = kGateUp ? args.sorted[t.row_begin + r] / args.top_k : t.row_begin + r;
  return args.a + row * args.K;
}

// Where tile row r of B (the expert's weights) is read from, ok = false past the weight's rows.
// Gate/up interleaves the gate and up rows in groups of kHalf: rows 2·kHalf·m + j (j < kHalf) are
// gate rows of intermediate index n_base + kHalf·m + j, the next kHalf their up rows.
template <bool kGateUp, int kHalf>
__device__ __forceinline__ const bf16* BRow(const GemmArgs& args, int expert, int64_t n_base, int r,
                                            bool& ok) {
  const int64_t n_out = args.n_out, w_rows = kGateUp ? 2 * n_out : n_out;
  int64_t wrow;
  if constexpr (kGateUp) {
    const int64_t idx = n_base + (r / (2 * kHalf)) * kHalf + (r % kHalf);  // intermediate index
    ok = idx < n_out;
    wrow = (r % (2 * kHalf)) < kHalf ? idx : n_out + idx;
  } else {
    wrow = n_base + r;
    ok = wrow < n_out;
  }
  return args.w + (int64_t{expert} * w_rows + (ok ? wrow : 0)) * args.K;
}

template <bool kGateUp, int BM>
__global__ void __launch_bounds__(Tile<BM>::kThreads, Tile<BM>::kMinBlocks)
    MoeGemmKernel(GemmArgs args) {
  using T = Tile<BM>;
  extern __shared__ __align__(128) char gemm_smem[];
  GridDependencyWait();
  RowTile tile;
  if (!FindRowTile<BM>(args, tile)) return;
  const int row_begin = tile.row_begin, rows = tile.rows;
  const int64_t K = args.K, n_out = args.n_out;
  const int64_t n_base = int64_t{blockIdx.x} * (kGateUp ? kBN / 2 : kBN);

  // This thread's copies: chunk `chunk` of rows r0 + kRowStep i of the A and B tiles.
  const int tid = threadIdx.x, chunk = tid & 7, r0 = tid >> 3;
  const bf16* a_src[T::kACopies];
  const bf16* b_src[T::kBCopies];
  bool a_ok[T::kACopies], b_ok[T::kBCopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    a_src[i] = ARow<kGateUp>(args, tile, r0 + T::kRowStep * i, a_ok[i]);
  }
#pragma unroll
  for (int i = 0; i < T::kBCopies; ++i) {  // a warp's 32 weight rows: 16 gate + their 16 up
    b_src[i] = BRow<kGateUp, 16>(args, tile.expert, n_base, r0 + T::kRowStep * i, b_ok[i]);
  }
  const uint32_t smem0 = SmemAddr(gemm_smem);
  auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = smem0 + stage * T::kStageBytes, sb = sa + T::kATileBytes;
    const int64_t kcol = int64_t{kt} * kBK + chunk * 8;
    const bool k_ok = kcol < K;
    const int64_t kc = k_ok ? kcol : 0;
#pragma unroll
    for (int i = 0; i < T::kBCopies; ++i) {  // the weights first: they are what streams
      CpAsync16(sb + Swizzled(r0 + T::kRowStep * i, chunk), b_src[i] + kc,
                b_ok[i] && k_ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      CpAsync16(sa + Swizzled(r0 + T::kRowStep * i, chunk), a_src[i] + kc,
                a_ok[i] && k_ok ? 16 : 0);
    }
  };

  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    CpAsyncCommit();
  }
  const int warp = tid >> 5, lane = tid & 31, wm = warp >> 2, wn = warp & 3;
  float acc[T::kMI][4][4];
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<T::kStages - 2>();  // k-tile kt has landed (for this thread) ...
    __syncthreads();                // ... for every thread; stage (kt - 1) % kStages is free
    const int next = kt + T::kStages - 1;
    if (next < k_tiles) load_stage(next % T::kStages, next);
    CpAsyncCommit();
    const uint32_t sa = smem0 + (kt % T::kStages) * T::kStageBytes, sb = sa + T::kATileBytes;
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[T::kMI][4], bfr[2][4];
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi) {
        const int row = wm * T::kWarpRows + mi * 16 + (lane & 15);
        Ldmatrix4(sa + Swizzled(row, ks * 2 + (lane >> 4)), af[mi]);
      }
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        const int row = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        Ldmatrix4(sb + Swizzled(row, ks * 2 + ((lane >> 3) & 1)), bfr[nj]);
      }
#pragma unroll
      for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          Mma(acc[mi][ni], af[mi], bfr[ni >> 1][(ni & 1) * 2], bfr[ni >> 1][(ni & 1) * 2 + 1]);
        }
    }
  }
  CpAsyncWait<0>();
  AllowDependentLaunch();

  // Epilogue: thread (g, tq) holds rows g and g + 8 of each 16-row tile, columns 2 tq, 2 tq + 1
  // of each 8-column tile.
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int mi = 0; mi < T::kMI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * T::kWarpRows + mi * 16 + g + half * 8;
      if (r >= rows) continue;
      bf16* out_row = args.out + int64_t{row_begin + r} * n_out;
      if constexpr (kGateUp) {
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const int64_t idx = n_base + wn * 16 + ni * 8 + tq * 2;
          if (idx >= n_out) continue;  // n_out % 8 == 0: idx + 1 < n_out too
          const bf16 h0 = SiluMulRounded(acc[mi][ni][half * 2], acc[mi][ni + 2][half * 2]);
          const bf16 h1 = SiluMulRounded(acc[mi][ni][half * 2 + 1], acc[mi][ni + 2][half * 2 + 1]);
          __nv_bfloat162 v;
          v.x = h0;
          v.y = h1;
          *reinterpret_cast<__nv_bfloat162*>(out_row + idx) = v;
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int64_t col = n_base + wn * 32 + ni * 8 + tq * 2;
          if (col >= n_out) continue;
          *reinterpret_cast<__nv_bfloat162*>(out_row + col) =
              __floats2bfloat162_rn(acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1]);
        }
      }
    }
}

template <bool kGateUp, int BM>
cudaError_t LaunchTile(const GemmArgs& args, int64_t pairs, cudaStream_t stream) {
  using T = Tile<BM>;
  const int64_t tile_bound = (pairs + BM - 1) / BM + std::min<int64_t>(args.experts, pairs);
  if (tile_bound > 65535) return cudaErrorInvalidValue;
  static std::once_flag once;
  static cudaError_t attr = cudaSuccess;
  std::call_once(once, [] {
    attr = cudaFuncSetAttribute(MoeGemmKernel<kGateUp, BM>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
  });
  if (attr != cudaSuccess) return attr;
  const dim3 grid(CeilDiv(args.n_out, kGateUp ? kBN / 2 : kBN), static_cast<unsigned>(tile_bound));
  return LaunchPdl(MoeGemmKernel<kGateUp, BM>, grid, dim3(T::kThreads), T::kSmemBytes, stream,
                   args);
}

// ---- the sm_90a prefill tile: 128 rows × 128 weight rows through wgmma
// --------------------------- The same copies, swizzle and edge handling as MoeGemmKernel<128> (the
// XOR swizzle over 128-byte rows in 1024-byte groups of 8 rows is wgmma's canonical
// 128-byte-swizzle K-major layout, so the tiles need a 1024-byte aligned base and nothing else);
// the two warpgroups each run m64n128k16 wgmma over their 64 rows, A and B from shared memory. A
// k-tile's wgmmas complete before the next barrier, so the stage the copies refill after it is
// free. Gate/up interleaves the weight rows by 8 (rows 16 m .. 16 m + 7: gate of indices 8 m .. 8 m
// + 7, the next 8: their up rows), so a thread's accumulator columns j (even, gate) and j + 1 (up)
// hold the same (row, index). The float sums differ from the mma.sync tiles' only in accumulation
// order.
constexpr int kWgStages = 3;
constexpr int kWgThreads = 256;
constexpr int kWgTileBytes = 128 * kBK * 2;  // A or B, 16 KiB
constexpr int kWgStageBytes = 2 * kWgTileBytes;
constexpr int kWgSmemBytes = 1024 + kWgStages * kWgStageBytes;  // + run-time 1024-byte alignment

template <bool kGateUp>
__global__ void __launch_bounds__(kWgThreads, 2) MoeGemmWgmmaKernel(GemmArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = 128;
  extern __shared__ unsigned char wg_smem[];
  GridDependencyWait();
  RowTile tile;
  if (!FindRowTile<BM>(args, tile)) return;
  const int row_begin = tile.row_begin, rows = tile.rows;
  const int64_t K = args.K, n_out = args.n_out;
  const int64_t n_base = int64_t{blockIdx.x} * (kGateUp ? kBN / 2 : kBN);

  const int tid = threadIdx.x, chunk = tid & 7, r0 = tid >> 3;  // rows r0 + 32 i
  const bf16* a_src[4];
  const bf16* b_src[4];
  bool a_ok[4], b_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a_src[i] = ARow<kGateUp>(args, tile, r0 + 32 * i, a_ok[i]);
    b_src[i] = BRow<kGateUp, 8>(args, tile.expert, n_base, r0 + 32 * i, b_ok[i]);
  }
  const uint32_t smem0 = (SmemAddr(wg_smem) + 1023) & ~1023u;
  auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = smem0 + stage * kWgStageBytes, sb = sa + kWgTileBytes;
    const int64_t kcol = int64_t{kt} * kBK + chunk * 8;
    const bool k_ok = kcol < K;
    const int64_t kc = k_ok ? kcol : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t off = Swizzled(r0 + 32 * i, chunk);
      CpAsync16(sb + off, b_src[i] + kc, b_ok[i] && k_ok ? 16 : 0);
      CpAsync16(sa + off, a_src[i] + kc, a_ok[i] && k_ok ? 16 : 0);
    }
  };

  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    CpAsyncCommit();
  }
  const int wg = tid >> 7;
  const uint64_t a_desc = MakeDesc(smem0 + wg * 64 * 128, 16, 1024);
  const uint64_t b_desc = MakeDesc(smem0 + kWgTileBytes, 16, 1024);
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kWgStages - 2>();  // k-tile kt has landed (for this thread) ...
    FenceProxyAsync();             // ... is visible to the async proxy (wgmma) ...
    __syncthreads();               // ... for every thread; k-tile kt - 1's wgmmas are complete
    const int next = kt + kWgStages - 1;
    if (next < k_tiles) load_stage(next % kWgStages, next);
    CpAsyncCommit();
    const uint32_t so = (kt % kWgStages) * kWgStageBytes;
    FenceRegs(d);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      WgmmaSS_N128(d, DescAt(a_desc, so + kk * 32), DescAt(b_desc, so + kk * 32), 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceRegs(d);
  }
  CpAsyncWait<0>();
  AllowDependentLaunch();

  // Epilogue: d[4 j + c] of thread (warp w of the warpgroup, lane g·4 + tq) is row
  // 16 w + g (+ 8 for c >= 2), column 8 j + 2 tq (+ 1 for odd c).
  const int lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int wrow0 = wg * 64 + ((tid >> 5) & 3) * 16 + g;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wrow0 + half * 8;
    if (r >= rows) continue;
    bf16* out_row = args.out + int64_t{row_begin + r} * n_out;
    if constexpr (kGateUp) {
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const int64_t idx = n_base + m * 8 + tq * 2;
        if (idx >= n_out) continue;  // n_out % 8 == 0: idx + 1 < n_out too
        const float* gate = d + (2 * m) * 4 + half * 2;
        const float* up = d + (2 * m + 1) * 4 + half * 2;
        __nv_bfloat162 v;
        v.x = SiluMulRounded(gate[0], up[0]);
        v.y = SiluMulRounded(gate[1], up[1]);
        *reinterpret_cast<__nv_bfloat162*>(out_row + idx) = v;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t col = n_base + j * 8 + tq * 2;
        if (col >= n_out) continue;
        *reinterpret_cast<__nv_bfloat162*>(out_row + col) =
            __floats2bfloat162_rn(d[j * 4 + half * 2], d[j * 4 + half * 2 + 1]);
      }
    }
  }
#else
  __trap();  // launched only where PrefillAttentionSm90Available() (an sm_90 device)
#endif
}

template <bool kGateUp>
cudaError_t LaunchWgmma(const GemmArgs& args, int64_t pairs, cudaStream_t stream) {
  const int64_t tile_bound = (pairs + 127) / 128 + std::min<int64_t>(args.experts, pairs);
  if (tile_bound > 65535) return cudaErrorInvalidValue;
  static std::once_flag once;
  static cudaError_t attr = cudaSuccess;
  std::call_once(once, [] {
    attr = cudaFuncSetAttribute(MoeGemmWgmmaKernel<kGateUp>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmemBytes);
  });
  if (attr != cudaSuccess) return attr;
  const dim3 grid(CeilDiv(args.n_out, kGateUp ? kBN / 2 : kBN), static_cast<unsigned>(tile_bound));
  return LaunchPdl(MoeGemmWgmmaKernel<kGateUp>, grid, dim3(kWgThreads), kWgSmemBytes, stream, args);
}

template <bool kGateUp>
cudaError_t Launch(const GemmArgs& args, int tile_rows, int64_t pairs, cudaStream_t stream) {
  if (pairs == 0) return cudaSuccess;
  const int64_t hidden = kGateUp ? args.K : args.n_out, inter = kGateUp ? args.n_out : args.K;
  if (!MoeSupported(hidden, inter, args.experts, 1)) return cudaErrorInvalidValue;
  switch (tile_rows) {
    case 16:
      return LaunchTile<kGateUp, 16>(args, pairs, stream);
    case 32:
      return LaunchTile<kGateUp, 32>(args, pairs, stream);
    case 64:
      return LaunchTile<kGateUp, 64>(args, pairs, stream);
    case 128:
      if (MoeGemmWgmma()) return LaunchWgmma<kGateUp>(args, pairs, stream);
      return LaunchTile<kGateUp, 128>(args, pairs, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool MoeGemmWgmma() { return GetTuning().moe_gemm_wgmma && PrefillAttentionSm90Available(); }

cudaError_t LaunchMoeGemmGateUp(const bf16* x, const MoePlan& plan, int k, const bf16* gate_up,
                                bf16* hp, int64_t pairs, int experts, int64_t hidden, int64_t inter,
                                cudaStream_t stream) {
  GemmArgs a;
  a.a = x;
  a.sorted = plan.sorted;
  a.top_k = k;
  a.w = gate_up;
  a.offsets = plan.offsets;
  a.tile_start = plan.tile_start;
  a.out = hp;
  a.K = hidden;
  a.n_out = inter;
  a.experts = experts;
  return Launch<true>(a, plan.tile_rows, pairs, stream);
}

cudaError_t LaunchMoeGemmDown(const bf16* hp, const MoePlan& plan, const bf16* down, bf16* yp,
                              int64_t pairs, int experts, int64_t hidden, int64_t inter,
                              cudaStream_t stream) {
  GemmArgs a;
  a.a = hp;
  a.sorted = plan.sorted;
  a.top_k = 1;
  a.w = down;
  a.offsets = plan.offsets;
  a.tile_start = plan.tile_start;
  a.out = yp;
  a.K = inter;
  a.n_out = hidden;
  a.experts = experts;
  return Launch<false>(a, plan.tile_rows, pairs, stream);
}

}  // namespace oasis::kernels

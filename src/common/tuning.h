// Tuning knobs: every OASIS_* environment variable that changes how the kernels and the CUDA
// backend run (comparisons on the GPU machine, fallbacks), parsed once per process into one
// struct. docs/kernels/README.md ("Tuning knobs") lists them with defaults and measurements.
// Nothing here changes results beyond floating-point summation order; none is a server option.
#pragma once

#include <functional>
#include <string>

namespace oasis {

// How the UVA gather (kernels::LaunchCopyBlocks) moves head-blocks: bulk copies through the TMA
// (one-warp CTAs, two head-blocks in flight each; the default), or loads and stores through
// registers (256-thread CTAs, a grid-stride loop over 16-byte items).
enum class GatherKernel : int { kTma = 0, kRegisters = 1 };

// CTAs of the UVA gather: enough host reads in flight to fill PCIe, few enough to leave the other
// SMs to the step's kernels. The register gather was tuned at 32.
inline constexpr int kDefaultGatherCtas = 48;

// The knobs and their defaults. A plain value: copy it freely.
struct Tuning {
  // OASIS_FUSE_QKV (set and not "0": on). The QKV GEMV with the norm/RoPE/append epilogue; off:
  // its per-group arrival (fence + atomic + barrier) made a batch-1 step 0.45 ms slower.
  bool fuse_qkv = false;
  // OASIS_FUSE_SILU ("0": off). SiLU·mul folded into the gate/up GEMV (4.23 -> 4.18 ms per
  // Qwen3-8B batch-1 step on the H200).
  bool fuse_silu = true;
  // OASIS_HOST_REGISTER ("0": off). The host KV store as a huge-page mapping registered with
  // cudaHostRegister (fast start-up) instead of one cudaHostAlloc.
  bool host_register = true;
  // OASIS_SPARSE_GRAPHS ("0": off). Sparse decode steps as CUDA graphs too (docs/sparse.md §10).
  bool sparse_graphs = true;
  // OASIS_PROFILE_DRAFT (set, to anything: on). The EAGLE-3 draft runner synchronises between
  // its phases and reports their mean times at exit.
  bool profile_draft = false;
  // OASIS_PDL ("0": off). Programmatic dependent launch for the kernels launched with LaunchPdl.
  bool pdl = true;
  // OASIS_TOPK_RADIX ("1": on). Every sparse top-K through the radix select (comparisons).
  bool topk_radix = false;
  // OASIS_FP8_PREFILL (wgmma or mma). Prefill chunks over FP8 KV pools on CC 9.0: the sm_90a
  // wgmma kernel's FP8 variant (the default: 1.6x the mma.sync kernel's TFLOP/s at 1x8192 on
  // the H200) or the mma.sync kernel (docs/fp8.md).
  bool fp8_prefill_wgmma = true;
  // OASIS_GEMV_NORM_CTAS_PER_SM (an integer >= 1; else 0). Caps the CTAs per SM of the persistent
  // norm-fused GEMVs below what fits (0: what fits), so the next kernel's CTAs become resident
  // early under PDL.
  int gemv_norm_ctas_per_sm = 0;
  // OASIS_GEMV_NARROW_K (>= 1). One-row GEMVs (plain and norm-fused) over fewer input features
  // than this take the 8-feature × 128-thread configuration: the 4 × 256 one loads a single
  // 16-byte vector per feature and thread below 4,096 (no K-steps in flight).
  int64_t gemv_narrow_below = 4096;
  // OASIS_GEMV_NARROW_NORM ("0": off). One-row norm-fused GEMVs below gemv_narrow_below take 4
  // features × 256 threads × 1 K-step (the whole row loaded before the PDL wait) instead of
  // 8 × 128 × 2 (H200, forty-first session: 30B-A3B batch 1 2.680 -> 2.608 ms a step).
  bool gemv_narrow_norm = true;
  // OASIS_MOE_GEMM_TILE_ROWS (16, 32, 64 or 128; else 0: chosen by the rows per touched expert,
  // kernels::MoeGemmTileRowsFor). The MoE grouped GEMM's row tile, for comparisons.
  int moe_gemm_tile_rows = 0;
  // OASIS_MOE_GEMM_WGMMA ("0": off). The MoE grouped GEMM's 128-row tile through sm_90a wgmma
  // (else mma.sync, as the smaller tiles).
  bool moe_gemm_wgmma = true;
  // OASIS_MOE_DOWN_ONE_WAVE ("0": off). The fused down + combine GEMV bounded to 64 registers
  // (4 CTAs per SM) with 2 K-steps in flight instead of 3 where that makes its grid one wave:
  // Qwen3-30B-A3B's 512 row blocks at batch 1 (bit-identical; H200, forty-first session: batch
  // 1 -0.5%, -0.6% with the narrow norm; batch 8, 8 waves either way, +2.4%, so not there).
  bool moe_down_one_wave = true;
  // OASIS_DECODE_SPLITS (1 to 1024; else 0: chosen by the cost model). Every decode attention
  // launch that does not force its own split count cuts each (sequence, KV head) into this many
  // splits (at most one per head-block), for comparisons.
  int decode_splits = 0;
  // OASIS_GATHER_CTAS (1 to 1024). CTAs of the UVA gather.
  int gather_ctas = kDefaultGatherCtas;
  // OASIS_GATHER_KERNEL (tma or registers). The UVA gather's kernel.
  GatherKernel gather_kernel = GatherKernel::kTma;
  // Says which gather value is invalid (the last one found; empty when both are valid). The CUDA
  // backend fails on it when it first launches the gather; the others' invalid values give the
  // default, as they always did.
  std::string gather_error;
};

// The knobs as `env` (name -> value or nullptr) gives them, over the defaults.
Tuning ParseTuning(const std::function<const char*(const char*)>& env);

// The process's knobs: the environment, parsed on the first call (thread-safe).
const Tuning& GetTuning();

// Tests only: replaces the process's knobs. Not thread-safe against concurrent GetTuning() readers;
// call it before the code under test runs.
void SetTuningForTesting(const Tuning& tuning);

}  // namespace oasis

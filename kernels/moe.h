// Mixture-of-experts kernels (Qwen3-MoE, docs/moe.md): top-k routing from float router logits,
// and the experts of every (token, slot) pair by two paths, both graph-capturable (no host
// synchronisation, sizes the host does not know are read on the device):
//  - small batches (decode): grouped GEMVs. A CTA takes one distinct expert of the batch
//    (found on the device from expert_ids) and a block of its rows, and applies them to every
//    token that chose that expert, so each touched expert's weights are read once per step;
//  - large batches (prefill): a device counting sort of the pairs by expert (MoePlan), then
//    tensor-core grouped GEMMs (mma.sync m16n8k16) whose tiles walk the device-side expert
//    offsets, gate/up with SiLU·mul fused in the epilogue.
// Both end with a combine in slot order, out[t] = Σ_j w[t, j] · y[pair (t, j)] in float: no
// atomics, so the result is deterministic and a token's output does not depend on the batch
// beyond the path choice. Every launcher takes raw device pointers, sizes and an explicit
// stream and returns the launch error; kernels are launched with PDL (LaunchPdl).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

inline constexpr int kMoeMaxExperts = 1024;  // shared-memory tables of the plan and GEMV prologue
inline constexpr int kMoeDimMultiple = 8;    // hidden and I: rows of 16-byte vectors
// Batches of at most this many token-expert pairs take the GEMV path by default (per-pair
// gate/up + fused down-combine); larger ones the permuted grouped GEMM. Measured on the H200
// (bench_moe, 30B-A3B's experts: 128 x 8, I 768, hidden 2048; 2026-12-04): 1 token 23 us
// (per-pair GEMVs) vs 33 us (GEMM, 16-row tile); 8 tokens 121 vs 129; 16 tokens: grouped GEMV
// 345 us vs GEMM 207 — the GEMVs re-read a weight row per pair (per 8 tokens of a group), so
// they pay off only near one token per touched expert.
inline constexpr int64_t kMoeGemvAutoPairs = 64;
inline constexpr int64_t kMoeGemvMaxPairs = 1024;  // the GEMV prologue's pair list (4 KiB)
// The grouped GEMM's row tiles (rows of one expert per CTA tile): 128 for prefill-sized groups,
// 16 / 32 / 64 for decode batches, where an expert has a few rows and the weights stream.
inline constexpr int kMoeGemmTileRowChoices[] = {16, 32, 64, 128};
inline constexpr int kMoeGemmTileRows = 128;  // the largest
bool MoeGemmTileRowsValid(int tile_rows);
// The tile for `pairs` pairs over `experts` experts: the smallest choice holding the mean rows
// of a touched expert (pairs / min(experts, pairs)) times kMoeGemmTileRowsSlack, so a skewed
// expert spills into a second tile rarely. OASIS_MOE_GEMM_TILE_ROWS (a valid choice) overrides it
// (comparisons; the result does not depend on the tile).
inline constexpr int kMoeGemmTileRowsSlack = 2;
int MoeGemmTileRowsFor(int64_t pairs, int experts);
// Whether the 128-row tile runs the sm_90a wgmma kernel (an sm_90 device, OASIS_MOE_GEMM_WGMMA
// not "0") rather than mma.sync.
bool MoeGemmWgmma();

// Whether the MoE kernels compute these sizes (hidden and I multiples of 8, 1 <= k <= E <=
// kMoeMaxExperts).
bool MoeSupported(int64_t hidden, int64_t inter, int64_t experts, int64_t k);
// Whether MoeExperts of `tokens` tokens takes the grouped GEMV (else the grouped GEMM).
inline bool MoeUseGemv(int64_t tokens, int64_t k) { return tokens * k <= kMoeGemvAutoPairs; }

// Top-k routing of every token from its router logits, as CpuBackend::MoeRoute: the k experts
// of largest logit (softmax is monotone) in descending order, equal logits -> lower expert
// index first; weights[t, j] = softmax(logits[t])[ids[t, j]] in float, divided by their sum
// (j ascending) when `renormalize`. One warp per token.
cudaError_t LaunchMoeTopK(const float* logits,  // [tokens, experts]
                          int64_t tokens, int experts, int k, bool renormalize,
                          int32_t* ids,    // [tokens, k]
                          float* weights,  // [tokens, k]
                          cudaStream_t stream);

// ---- small batches: grouped GEMV (pairs = tokens · k <= kMoeGemvMaxPairs) ----

// h[p, i] = bf16(silu(bf16(gate_e[i] · x[p / k])) rounded to bf16 · bf16(up_e[i] · x[p / k]))
// for every pair p with e = ids[p] (the dense GEMV's SiLU·mul rounding).
cudaError_t LaunchMoeGemvGateUp(const __nv_bfloat16* x,        // [tokens, hidden]
                                const int32_t* ids,            // [tokens * k] in [0, experts)
                                const __nv_bfloat16* gate_up,  // [experts, 2 * inter, hidden]
                                __nv_bfloat16* h,              // [tokens * k, inter]
                                int64_t tokens, int k, int experts, int64_t hidden, int64_t inter,
                                cudaStream_t stream);
// y[p, :] = down_e · h[p] in float for every pair p with e = ids[p].
cudaError_t LaunchMoeGemvDown(const __nv_bfloat16* h,     // [tokens * k, inter]
                              const int32_t* ids,         // [tokens * k]
                              const __nv_bfloat16* down,  // [experts, hidden, inter]
                              float* y,                   // [tokens * k, hidden]
                              int64_t tokens, int k, int experts, int64_t hidden, int64_t inter,
                              cudaStream_t stream);

// Gate/up for the fewest pairs (pairs <= kMoeGemvPairGateUpPairs by default): h exactly as
// LaunchMoeGemvGateUp computes it (bit-identical), one CTA per (pair, block of 8 intermediate
// rows), without the grouped kernel's expert-finding prologue; an expert chosen by several pairs
// is read once per pair. bench_moe's "gemvp" rows against "gemvf" (grouped gate/up + fused
// down): 1 token 23 vs 31 us, 8 tokens 121 vs 167 us (H200) — so every GEMV-path batch takes it.
inline constexpr int64_t kMoeGemvPairGateUpPairs = kMoeGemvAutoPairs;
inline bool MoeUsePairGateUp(int64_t tokens, int64_t k) {
  return tokens * k <= kMoeGemvPairGateUpPairs;
}
cudaError_t LaunchMoeGemvGateUpPairs(const __nv_bfloat16* x,        // [tokens, hidden]
                                     const int32_t* ids,            // [tokens * k]
                                     const __nv_bfloat16* gate_up,  // [experts, 2 * inter, hidden]
                                     __nv_bfloat16* h,              // [tokens * k, inter]
                                     int64_t tokens, int k, int experts, int64_t hidden,
                                     int64_t inter, cudaStream_t stream);

// The fused down + combine (small batches, LaunchMoeGemvDownCombine) for at most this many pairs.
inline constexpr int64_t kMoeFusedDownPairs = 64;
inline bool MoeUseFusedDown(int64_t tokens, int64_t k) { return tokens * k <= kMoeFusedDownPairs; }

// out[t, :] = bf16(Σ_{j ascending} weights[t, j] · (down_e · h[t·k + j])) with e = ids[t·k + j],
// in float: LaunchMoeGemvDown followed by LaunchMoeCombineF32 in one launch, bit-identical to
// them (the same dot-product and slot orders; ids outside [0, experts) contribute nothing).
// Token-major: a CTA takes one token and a block of hidden rows and reads the rows of that
// token's k experts, so an expert chosen by several tokens is read once per token — meant for
// pairs <= kMoeFusedDownPairs (takes up to kMoeGemvMaxPairs). A PDL launch that reads ids (and
// loads the weights they choose) before it waits: ids must not be written by the kernel launched
// right before it (the gate/up GEMV that comes before it in a MoE layer writes only h).
cudaError_t LaunchMoeGemvDownCombine(const __nv_bfloat16* h,     // [tokens * k, inter]
                                     const int32_t* ids,         // [tokens * k]
                                     const float* weights,       // [tokens, k]
                                     const __nv_bfloat16* down,  // [experts, hidden, inter]
                                     __nv_bfloat16* out,         // [tokens, hidden]
                                     int64_t tokens, int k, int experts, int64_t hidden,
                                     int64_t inter, cudaStream_t stream);

// ---- large batches: permutation by expert + grouped GEMM ----

// The permutation of the pairs by expert, a stable counting sort (a CTA per kMoePlanChunk pairs,
// after a count launch when there are several): offsets[e] = first
// permuted row of expert e (offsets[experts] = pairs), tile_start[e] = its first row tile of
// tile_rows rows (tile_start[experts] = tiles), sorted[row] = pair, pos[pair] = row.
// Pairs with an id outside [0, experts) get no row (pos = -1). The GEMMs run the plan's tile.
struct MoePlan {
  int32_t* offsets = nullptr;        // [experts + 1]
  int32_t* tile_start = nullptr;     // [experts + 1]
  int32_t* sorted = nullptr;         // [pairs]
  int32_t* pos = nullptr;            // [pairs]
  int32_t* chunk_counts = nullptr;   // [chunks, experts] scratch (pairs per chunk and expert)
  int tile_rows = kMoeGemmTileRows;  // one of kMoeGemmTileRowChoices
};
inline constexpr int kMoePlanChunk = 2048;  // pairs per CTA of the plan
// The int32 elements of a plan for `pairs` pairs (one buffer: offsets, tile_start, sorted, pos,
// chunk_counts).
inline int64_t MoePlanInts(int64_t pairs, int experts) {
  const int64_t chunks = (pairs + kMoePlanChunk - 1) / kMoePlanChunk;
  return 2 * (experts + 1) + 2 * pairs + (chunks > 1 ? chunks * experts : 0);
}
MoePlan MoePlanIn(int32_t* buffer, int64_t pairs, int experts, int tile_rows);
cudaError_t LaunchMoePlan(const int32_t* ids,  // [pairs]
                          int64_t pairs, int experts, const MoePlan& plan, cudaStream_t stream);

// Gate/up of every permuted row: hp[row, i] as LaunchMoeGemvGateUp's h, for the token of
// sorted[row] (x row sorted[row] / k).
cudaError_t LaunchMoeGemmGateUp(const __nv_bfloat16* x,  // [tokens, hidden]
                                const MoePlan& plan, int k,
                                const __nv_bfloat16* gate_up,  // [experts, 2 * inter, hidden]
                                __nv_bfloat16* hp,             // [pairs, inter] permuted rows
                                int64_t pairs, int experts, int64_t hidden, int64_t inter,
                                cudaStream_t stream);
// yp[row, :] = bf16(down_e · hp[row]) for every permuted row of expert e.
cudaError_t LaunchMoeGemmDown(const __nv_bfloat16* hp,  // [pairs, inter] permuted rows
                              const MoePlan& plan,
                              const __nv_bfloat16* down,  // [experts, hidden, inter]
                              __nv_bfloat16* yp,          // [pairs, hidden] permuted rows
                              int64_t pairs, int experts, int64_t hidden, int64_t inter,
                              cudaStream_t stream);

// ---- the weighted combine, in slot order ----
// out[t, :] = bf16(Σ_{j ascending} weights[t, j] · y[row(t, j), :]) in float, row(t, j) =
// pos[t·k + j] when `pos` is given (rows < 0 are skipped), else t·k + j. y is float
// (LaunchMoeCombineF32) or bf16 (LaunchMoeCombineBf16).
cudaError_t LaunchMoeCombineF32(const float* y,        // [tokens * k, hidden]
                                const int32_t* pos,    // [tokens * k] or nullptr
                                const float* weights,  // [tokens, k]
                                __nv_bfloat16* out,    // [tokens, hidden]
                                int64_t tokens, int k, int64_t hidden, cudaStream_t stream);
cudaError_t LaunchMoeCombineBf16(const __nv_bfloat16* y,  // [tokens * k, hidden]
                                 const int32_t* pos,      // [tokens * k] or nullptr
                                 const float* weights,    // [tokens, k]
                                 __nv_bfloat16* out,      // [tokens, hidden]
                                 int64_t tokens, int k, int64_t hidden, cudaStream_t stream);

}  // namespace oasis::kernels

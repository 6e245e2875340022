// SparseConfig: the knobs of lookahead sparse KV (docs/sparse.md), as the server flags set them
// (--topk-blocks, --fetch-ratio, --sparse-threshold, --dense-layers, --host-kv-gib,
// --sparse-predictor, --sparse-group-reduce, --sparse-budget). Plain values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "oasis/status.h"

namespace oasis {

// Which query predicts the next step's top-K blocks (docs/sparse.md §5).
enum class SparsePredictor : uint8_t {
  kDraft,          // lookahead: the query of the stacked draft token x̂_{t+1} (the method)
  kPreviousQuery,  // the current step's real query x_t (the common proxy)
  kOracle,         // the true query of the step itself, selected just before its attention
                   // (measurement only: on-demand selection, transfers on the critical path)
};

// Where a sparse request's full KV lives (docs/sparse.md §12).
enum class KvHome : uint8_t {
  kHost,  // the host KV store: each step fetches its working set's misses over PCIe
  kHbm,   // the GPU pool (in place): each step reads its selected blocks where they are
  kAuto,  // HBM while the GPU pool has room for the whole request, else the host store
};

// How many misses a (layer, KV head) may fetch per step (docs/sparse.md §13).
enum class SparseBudget : uint8_t {
  kFixed,     // every sparse layer admits up to C = ceil(fetch_ratio * K) misses per head per step
  kAdaptive,  // FetchBudgetController sets a cap per layer in [1, C] from measured misses,
              // fetches and transfer waits (kvcache/fetch_budget.h)
};

struct SparseConfig {
  int32_t topk_blocks = 128;     // K: selected blocks per (request, layer, KV head)
  double fetch_ratio = 0.05;     // C = ceil(fetch_ratio * K) blocks admitted per head per step
  int64_t sparse_threshold = 0;  // a request switches once its context exceeds this; 0 = never
  int32_t dense_layers = 0;      // the first N layers stay dense for sparse requests
  double host_kv_gib = 0;        // host KV store size (sparse layers' K and V)
  SparsePredictor predictor = SparsePredictor::kDraft;
  GroupReduce group_reduce = GroupReduce::kSum;
  int32_t max_sparse_seqs = 64;    // R: sparse requests at once (rows of the device state)
  int64_t max_seq_len = 32768;     // longest context (prompt + output) a sparse request may reach
  int32_t agreement_interval = 0;  // measure top-K agreement with the step's real query every
                                   // N steps (0 = never; draft / previous-query only)
  // Predictor kDraft under speculate chains (docs/sparse.md §5): the queries of the first Q
  // draft tokens of a step predict together — scored as one GQA group of Q x G query heads
  // (the group reduce applies across the chain too: a scored merge), top-K, under the same
  // fetch cap. 1 = the first draft alone. Set by the engine: min(k, 16 / G) (the CUDA score
  // kernel takes groups of up to 16).
  int32_t chain_queries = 1;
  // false: a measurement mode: predict and select run (and count fetches) but no block is
  // copied into the working set, so attention reads stale slots and outputs are wrong; the
  // time saved is what the transfers cost on the critical path (issue 8's overhead bench).
  bool transfers = true;
  // Disaggregation's decode side (docs/disaggregation.md §5): > 0 lets requests hold *remote*
  // blocks (K/V still on the prefill instance); select lists up to this many remote misses
  // per (request, layer, KV head) per step for the engine to fetch. 0: every block is local.
  int32_t remote_fetch_cap = 0;
  // The decode side's summary-only rows (--remote-kv-gib): remote blocks of this many GiB of
  // host KV (as the host store counts it) can be tracked without a host slot; each costs 1/16
  // of its KV in device summaries. 0: remote blocks hold host slots.
  double remote_kv_gib = 0;
  // --kv-home: where a sparse request's KV lives. Disaggregated requests (handoffs, imports)
  // always use the host store.
  KvHome home = KvHome::kHost;
  // Logical blocks (every KV head and sparse layer) a request moving from the GPU pool to the
  // host store copies per engine step, on the background stream beside the next step. Qwen3-8B:
  // 2.4 MB a block, so 32 are 75 MB a move (four at once: ~10 ms of copies at the ~31 GB/s the
  // H200 measured, within a decode step of 64 sparse requests; at 16 a 32K request took ~130
  // steps to move and 4 of 16 moves were still under way at the end of a 32K x 64 run).
  int32_t move_blocks_per_step = 32;
  // --sparse-switch pressure: a request past the threshold stays dense while the pool has room;
  // when it runs short the longest switches to the host store (instead of switching every
  // request at the threshold: --sparse-switch threshold).
  bool switch_on_pressure = false;
  // The pressure policy with the HBM home (hbm or auto): dense decodes may hold this many tokens
  // of KV together before the longest switch to sparse in place. 0: as many tokens as make the
  // model's weight bytes (their attention then reads at most as much as the weights per step).
  int64_t dense_read_tokens = 0;
  // --sparse-budget: fixed caps C, or per-layer caps in [1, C] that follow the measured misses
  // and transfer waits (adaptive). Bounds are always C and K.
  SparseBudget budget = SparseBudget::kFixed;

  // C = ceil(fetch_ratio * K), at least 1.
  int32_t max_fetch() const;
  // Logical blocks per sequence: ceil(max_seq_len / kBlockSize) (MB of the op shapes).
  int64_t max_blocks_per_seq() const;
  // InvalidArgument naming the bad knob.
  Status Validate(int64_t num_layers) const;
};

std::string_view SparsePredictorName(SparsePredictor p);
StatusOr<SparsePredictor> ParseSparsePredictor(
    std::string_view name);                                     // draft|previous-query|oracle
StatusOr<GroupReduce> ParseGroupReduce(std::string_view name);  // sum|max
std::string_view SparseBudgetName(SparseBudget b);
StatusOr<SparseBudget> ParseSparseBudget(std::string_view name);  // fixed|adaptive
std::string_view KvHomeName(KvHome h);
StatusOr<KvHome> ParseKvHome(std::string_view name);  // host|hbm|auto

}  // namespace oasis

// FetchBudgetController: the adaptive prefetch budget of lookahead sparse KV
// (--sparse-budget adaptive, docs/sparse.md §13). It decides, per sparse layer, how many of a
// KV head's misses select may admit per step — a cap c_l in [1, C] with C = ceil(fetch_ratio·K)
// the fixed flag's cap — from the counters the pipeline already measures, every metrics
// interval (a few steps). It only decides how much to fetch: a miss it does not admit is
// handled exactly as one above the fixed cap C (the step attends to the resident set).
//
// The rule (AIMD — additive increase, multiplicative decrease — on the interval's counter
// deltas; deterministic, a pure function of them):
//   pressure = transfer-wait seconds / interval seconds (how much of the steps the transfers
//              did not hide: CUDA measures it at each step's closing join; 0 on the CPU)
//   if pressure > pressure_limit:       c_l = max(1, c_l / 2) for every layer   (back off)
//   else, per layer with misses m and fetched f in the interval:
//     use = sampled fetched blocks found in the real query's top-K when read / sampled fetched
//           blocks, over the intervals since the last judgement, judged once at least
//           use_min_samples fetched blocks were sampled (SparseLayerMetrics::fetch_used)
//     use judged and use < use_target:    c_l = max(1, floor(3 c_l / 4))        (shrink: most
//                                         fetches are wasted, the prediction of new blocks does
//                                         not pay for their bytes)
//     unserved u = (m - f) / m            (the share of predicted blocks left out; 0 if m = 0)
//     u > unserved_target:                c_l = min(C, c_l + 1)                 (grow; not in an
//                                         interval whose use was judged below the target)
//     u < unserved_target / 2:            c_l = max(1, floor(3 c_l / 4))        (shrink)
//     otherwise:                          c_l unchanged                         (dead band)
// Caps start at C, so the first interval is the fixed budget's. A miss left out now is a miss
// again next step if it is still predicted (best-scored misses are admitted first), so a cap
// below the peak demand serves the persistent misses and drops the transient ones — the
// fetches the issue calls wasted — and grows back when the unserved share stays high.
//
// Plain host logic, no device types. Not thread-safe: the engine loop thread.
#pragma once

#include <cstdint>
#include <vector>

namespace oasis {

// One layer's select counters over an interval (SparseLayerMetrics' hits / misses / fetched).
struct FetchLayerCounts {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t fetched = 0;
  // Sampled (SparseLayerMetrics::fetch_used / fetch_sampled): fetched blocks found in the real
  // query's top-K when read, of the fetched blocks at the sampled steps.
  int64_t fetch_used = 0;
  int64_t fetch_sampled = 0;
};

struct FetchBudgetInput {
  std::vector<FetchLayerCounts> layers;  // [num_layers]; dense layers are ignored
  double transfer_wait_seconds = 0;      // the interval's step ends waiting on transfers
  double interval_seconds = 0;           // wall time of the interval; 0 = unknown (no pressure)
};

struct FetchBudgetRule {
  double unserved_target = 0.5;  // grow above this share of unfetched misses, shrink below half
  double pressure_limit = 0.05;  // back off when transfer waits exceed this share of the interval
  double use_target = 0.5;       // shrink when fewer of the sampled fetched blocks were used
  int64_t use_min_samples = 32;  // sampled fetched blocks (per layer) before use is judged
};

class FetchBudgetController {
 public:
  // Caps for layers [first_sparse_layer, num_layers), each in [1, max_cap], starting at max_cap.
  FetchBudgetController(int64_t num_layers, int64_t first_sparse_layer, int32_t max_cap,
                        FetchBudgetRule rule = {});

  // One interval's signals -> new caps. Returns whether any cap changed.
  bool Update(const FetchBudgetInput& in);

  // [num_layers]: the cap each layer uses now (0 for dense layers).
  const std::vector<int32_t>& caps() const { return caps_; }
  int32_t max_cap() const { return max_cap_; }
  int64_t backoffs() const { return backoffs_; }        // intervals that halved the caps
  int64_t use_shrinks() const { return use_shrinks_; }  // layer updates shrunk for unused fetches

 private:
  int64_t first_sparse_layer_;
  int32_t max_cap_;
  FetchBudgetRule rule_;
  std::vector<int32_t> caps_;
  std::vector<int64_t> used_, sampled_;  // [num_layers] fetch use not judged yet
  int64_t backoffs_ = 0, use_shrinks_ = 0;
};

}  // namespace oasis

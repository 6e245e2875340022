// Sparse KV over the ranks of a ModelRunner (docs/parallel.md §6): what every user of a
// SparseKvManager with one device side per rank needs — the ranks' backends and pools, a
// SparseSideRunner that runs a side's work on its rank's thread, and one
// SparseAttentionPipeline per rank (built, used and destroyed on its rank's thread). A single
// runner is its own rank 0 and runs everything inline.
//
// Used by SparseDecoding (the engine), bench_sparse_decode and the GPU tests.
#pragma once

#include <memory>
#include <vector>

#include "engine/model_runner.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"

namespace oasis {

// Rank r's backend / KV pools at index r.
std::vector<Backend*> RankBackends(ModelRunner& runner);
std::vector<std::vector<LayerKvPool>*> RankKvPools(ModelRunner& runner);

// Runs a side's work on its rank (ModelRunner::ForEachRank). With `teardown` non-null, *teardown
// is read at each call: its owner sets it before destroying the manager, so the sides are then
// released in the form that also runs on a failed group.
SparseSideRunner RankSideRunner(ModelRunner& runner, const bool* teardown = nullptr);

// One pipeline per rank over `manager`'s side r, with the rank's backend, local query heads and
// stage sync. Destroys them on their ranks' threads (before the manager goes: declare it
// after the manager). Not thread-safe: the thread that drives the runner.
class RankPipelines {
 public:
  RankPipelines(ModelRunner& runner, SparseKvManager& manager);
  ~RankPipelines();
  RankPipelines(const RankPipelines&) = delete;
  RankPipelines& operator=(const RankPipelines&) = delete;

  // pipelines[r]: rank r's (what ModelRunner::ExecuteSparseStepRanks takes).
  const std::vector<SparseAttentionPipeline*>& get() const { return ptrs_; }
  SparseAttentionPipeline& operator[](size_t r) const { return *ptrs_.at(r); }
  // Each rank's counters since the last collection (each on its rank's thread), and their sum
  // over the ranks (SparseMetrics::MergeRank).
  std::vector<SparseMetrics> CollectEach();
  SparseMetrics Collect();

 private:
  ModelRunner& runner_;
  std::vector<std::unique_ptr<SparseAttentionPipeline>> owned_;
  std::vector<SparseAttentionPipeline*> ptrs_;
};

}  // namespace oasis

// Sparse KV over the ranks of a ModelRunner (docs/parallel.md §6): what building a
// SparseKvManager with one device side per rank needs — the ranks' backends and pools, and a
// SparseSideRunner that runs a side's work on its rank's thread, and the scope of the runner's
// pipelines over those sides (ModelRunner::AttachSparse). A single runner is its own rank 0
// and runs everything inline.
//
// Used by SparseDecoding (the engine), bench_sparse_decode and the GPU tests.
#pragma once

#include <vector>

#include "kvcache/sparse_kv_manager.h"
#include "runner/model_runner.h"

namespace oasis {

// Rank r's backend / KV pools at index r.
std::vector<Backend*> RankBackends(ModelRunner& runner);
std::vector<std::vector<LayerKvPool>*> RankKvPools(ModelRunner& runner);

// Runs a side's work on its rank (ModelRunner::ForEachRank). With `teardown` non-null, *teardown
// is read at each call: its owner sets it before destroying the manager, so the sides are then
// released in the form that also runs on a failed group.
SparseSideRunner RankSideRunner(ModelRunner& runner, const bool* teardown = nullptr);

// Attaches `manager` to `runner` (ModelRunner::AttachSparse) for its lifetime: detaches on
// destruction, on the ranks' threads, also on a failed group (declare it after the manager,
// so that it goes first). A failed attach detaches the ranks that got a pipeline. Not
// thread-safe: the thread that drives the runner.
class SparseAttachment {
 public:
  SparseAttachment(ModelRunner& runner, SparseKvManager& manager);
  ~SparseAttachment();
  SparseAttachment(const SparseAttachment&) = delete;
  SparseAttachment& operator=(const SparseAttachment&) = delete;

 private:
  ModelRunner& runner_;
};

}  // namespace oasis

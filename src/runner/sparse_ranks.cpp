#include "runner/sparse_ranks.h"

namespace oasis {

std::vector<Backend*> RankBackends(ModelRunner& runner) {
  std::vector<Backend*> backends(static_cast<size_t>(runner.num_ranks()), nullptr);
  runner.ForEachRank(
      [&](int r, ModelRunner& rank) { backends.at(static_cast<size_t>(r)) = &rank.backend(); });
  return backends;
}

std::vector<std::vector<LayerKvPool>*> RankKvPools(ModelRunner& runner) {
  std::vector<std::vector<LayerKvPool>*> pools(static_cast<size_t>(runner.num_ranks()), nullptr);
  runner.ForEachRank(
      [&](int r, ModelRunner& rank) { pools.at(static_cast<size_t>(r)) = &rank.kv_pools(); });
  return pools;
}

SparseSideRunner RankSideRunner(ModelRunner& runner, const bool* teardown) {
  return [&runner, teardown](const std::function<void(int)>& fn) {
    runner.ForEachRank([&](int r, ModelRunner&) { fn(r); }, teardown != nullptr && *teardown);
  };
}

SparseAttachment::SparseAttachment(ModelRunner& runner, SparseKvManager& manager)
    : runner_(runner) {
  try {
    runner_.AttachSparse(manager);
  } catch (...) {
    runner_.DetachSparse(true);
    throw;
  }
}

SparseAttachment::~SparseAttachment() { runner_.DetachSparse(true); }

}  // namespace oasis

#include "engine/sparse_ranks.h"

namespace oasis {

std::vector<Backend*> RankBackends(ModelRunner& runner) {
  std::vector<Backend*> backends(static_cast<size_t>(runner.num_ranks()), nullptr);
  runner.ForEachRank([&](int r, ModelRunner& rank) { backends.at(static_cast<size_t>(r)) = &rank.backend(); });
  return backends;
}

std::vector<std::vector<LayerKvPool>*> RankKvPools(ModelRunner& runner) {
  std::vector<std::vector<LayerKvPool>*> pools(static_cast<size_t>(runner.num_ranks()), nullptr);
  runner.ForEachRank([&](int r, ModelRunner& rank) { pools.at(static_cast<size_t>(r)) = &rank.kv_pools(); });
  return pools;
}

SparseSideRunner RankSideRunner(ModelRunner& runner, const bool* teardown) {
  return [&runner, teardown](const std::function<void(int)>& fn) {
    runner.ForEachRank([&](int r, ModelRunner&) { fn(r); }, teardown != nullptr && *teardown);
  };
}

RankPipelines::RankPipelines(ModelRunner& runner, SparseKvManager& manager) : runner_(runner) {
  owned_.resize(static_cast<size_t>(runner.num_ranks()));
  runner.ForEachRank([&](int r, ModelRunner& rank) {
    owned_.at(static_cast<size_t>(r)) = std::make_unique<SparseAttentionPipeline>(
        manager, rank.backend(), rank.model().config().num_attention_heads, rank.sparse_stage_sync(), r);
  });
  for (const auto& p : owned_) ptrs_.push_back(p.get());
}

RankPipelines::~RankPipelines() {
  runner_.ForEachRank([&](int r, ModelRunner&) { owned_[static_cast<size_t>(r)].reset(); }, true);
}

std::vector<SparseMetrics> RankPipelines::CollectEach() {
  std::vector<SparseMetrics> per_rank(owned_.size());
  runner_.ForEachRank([&](int r, ModelRunner&) {
    per_rank[static_cast<size_t>(r)] = owned_[static_cast<size_t>(r)]->CollectMetrics();
  });
  return per_rank;
}

SparseMetrics RankPipelines::Collect() {
  std::vector<SparseMetrics> per_rank = CollectEach();
  for (size_t r = 1; r < per_rank.size(); ++r) per_rank[0].MergeRank(per_rank[r]);
  return per_rank[0];
}

}  // namespace oasis

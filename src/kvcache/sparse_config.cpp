#include "kvcache/sparse_config.h"

#include "kvcache/sparse_step_plan.h"

#include <cmath>

namespace oasis {

int32_t SparseConfig::max_fetch() const {
  const double c = std::ceil(fetch_ratio * static_cast<double>(topk_blocks) - 1e-9);
  return static_cast<int32_t>(std::max(1.0, std::min(c, static_cast<double>(topk_blocks))));
}

int64_t SparseConfig::max_blocks_per_seq() const {
  return (max_seq_len + kBlockSize - 1) / kBlockSize;
}

Status SparseConfig::Validate(int64_t num_layers) const {
  if (topk_blocks < 1) return InvalidArgument("--topk-blocks must be at least 1");
  if (!(fetch_ratio > 0.0 && fetch_ratio <= 1.0))
    return InvalidArgument("--fetch-ratio must be in (0, 1]");
  if (sparse_threshold < 0) return InvalidArgument("--sparse-threshold must not be negative");
  if (dense_layers < 0 || dense_layers >= num_layers) {
    return InvalidArgument("--dense-layers must be in [0, " + std::to_string(num_layers) + ")");
  }
  if (host_kv_gib < 0) return InvalidArgument("--host-kv-gib must not be negative");
  if (remote_kv_gib < 0) return InvalidArgument("--remote-kv-gib must not be negative");
  if (max_sparse_seqs < 1) return InvalidArgument("max sparse sequences must be at least 1");
  if (max_seq_len < kBlockSize) return InvalidArgument("max sequence length below one block");
  if (agreement_interval < 0) return InvalidArgument("agreement interval must not be negative");
  if (chain_queries < 1 || chain_queries > kMaxSparseDraftTokens)
    return InvalidArgument("chain queries must be in [1, " + std::to_string(kMaxSparseDraftTokens) +
                           "]");
  if (remote_fetch_cap < 0 || remote_fetch_cap > topk_blocks) {
    return InvalidArgument("--remote-fetch-cap must be in [0, --topk-blocks]");
  }
  return Status::Ok();
}

std::string_view SparseBudgetName(SparseBudget b) {
  switch (b) {
    case SparseBudget::kFixed:
      return "fixed";
    case SparseBudget::kAdaptive:
      return "adaptive";
  }
  return "?";
}

StatusOr<SparseBudget> ParseSparseBudget(std::string_view name) {
  for (SparseBudget b : {SparseBudget::kFixed, SparseBudget::kAdaptive}) {
    if (name == SparseBudgetName(b)) return b;
  }
  return InvalidArgument("--sparse-budget must be one of fixed, adaptive; got '" +
                         std::string(name) + "'");
}

std::string_view KvHomeName(KvHome h) {
  switch (h) {
    case KvHome::kHost:
      return "host";
    case KvHome::kHbm:
      return "hbm";
    case KvHome::kAuto:
      return "auto";
  }
  return "?";
}

StatusOr<KvHome> ParseKvHome(std::string_view name) {
  for (KvHome h : {KvHome::kHost, KvHome::kHbm, KvHome::kAuto}) {
    if (name == KvHomeName(h)) return h;
  }
  return InvalidArgument("--kv-home must be one of host, hbm, auto; got '" + std::string(name) +
                         "'");
}

std::string_view SparsePredictorName(SparsePredictor p) {
  switch (p) {
    case SparsePredictor::kDraft:
      return "draft";
    case SparsePredictor::kPreviousQuery:
      return "previous-query";
    case SparsePredictor::kOracle:
      return "oracle";
  }
  return "?";
}

StatusOr<SparsePredictor> ParseSparsePredictor(std::string_view name) {
  if (name == "draft") return SparsePredictor::kDraft;
  if (name == "previous-query") return SparsePredictor::kPreviousQuery;
  if (name == "oracle") return SparsePredictor::kOracle;
  return InvalidArgument("unknown sparse predictor '" + std::string(name) +
                         "' (draft, previous-query, oracle)");
}

StatusOr<GroupReduce> ParseGroupReduce(std::string_view name) {
  if (name == "sum") return GroupReduce::kSum;
  if (name == "max") return GroupReduce::kMax;
  return InvalidArgument("unknown group reduction '" + std::string(name) + "' (sum, max)");
}

}  // namespace oasis

#include "kvcache/fetch_budget.h"

#include <algorithm>

#include "common/check.h"

namespace oasis {

FetchBudgetController::FetchBudgetController(int64_t num_layers, int64_t first_sparse_layer,
                                             int32_t max_cap, FetchBudgetRule rule)
    : first_sparse_layer_(first_sparse_layer), max_cap_(max_cap), rule_(rule) {
  OASIS_CHECK(num_layers > 0 && first_sparse_layer >= 0 && first_sparse_layer < num_layers &&
              max_cap >= 1)
      << "fetch budget: layers " << num_layers << ", first sparse " << first_sparse_layer
      << ", cap " << max_cap;
  OASIS_CHECK(rule.unserved_target > 0 && rule.unserved_target < 1 && rule.pressure_limit > 0 &&
              rule.use_target >= 0 && rule.use_target <= 1 && rule.use_min_samples >= 1)
      << "fetch budget rule: unserved target " << rule.unserved_target << ", pressure limit "
      << rule.pressure_limit << ", use target " << rule.use_target << " after "
      << rule.use_min_samples;
  caps_.assign(static_cast<size_t>(num_layers), 0);
  used_.assign(static_cast<size_t>(num_layers), 0);
  sampled_.assign(static_cast<size_t>(num_layers), 0);
  for (int64_t l = first_sparse_layer; l < num_layers; ++l) caps_[static_cast<size_t>(l)] = max_cap;
}

bool FetchBudgetController::Update(const FetchBudgetInput& in) {
  const std::vector<int32_t> before = caps_;
  const int64_t n = static_cast<int64_t>(caps_.size());
  const bool pressure = in.interval_seconds > 0 &&
                        in.transfer_wait_seconds > rule_.pressure_limit * in.interval_seconds;
  if (pressure) ++backoffs_;
  for (int64_t l = first_sparse_layer_; l < n; ++l) {
    int32_t& c = caps_[static_cast<size_t>(l)];
    if (pressure) {
      c = std::max(1, c / 2);
      continue;
    }
    if (l >= static_cast<int64_t>(in.layers.size())) continue;
    const FetchLayerCounts& k = in.layers[static_cast<size_t>(l)];
    int64_t& used = used_[static_cast<size_t>(l)];
    int64_t& sampled = sampled_[static_cast<size_t>(l)];
    used += k.fetch_used;
    sampled += k.fetch_sampled;
    if (sampled >= rule_.use_min_samples) {
      const bool wasted =
          static_cast<double>(used) < rule_.use_target * static_cast<double>(sampled);
      used = sampled = 0;
      if (wasted) {
        const int32_t was = c;
        c = std::max(1, c * 3 / 4);
        if (c != was) ++use_shrinks_;
        continue;
      }
    }
    const double unserved =
        k.misses > 0 ? static_cast<double>(k.misses - k.fetched) / static_cast<double>(k.misses)
                     : 0.0;
    if (unserved > rule_.unserved_target) {
      c = std::min(max_cap_, c + 1);
    } else if (unserved < rule_.unserved_target / 2) {
      c = std::max(1, c * 3 / 4);  // multiplicative: 16 -> 12 -> 9 -> 6 -> 4 -> 3 -> 2 -> 1
    }
  }
  return caps_ != before;
}

}  // namespace oasis

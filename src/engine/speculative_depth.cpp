#include "engine/speculative_depth.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>
#include <tuple>

#include "common/check.h"

namespace oasis {

const char* SpeculativeDepthName(SpeculativeDepth depth) {
  switch (depth) {
    case SpeculativeDepth::kFixed:
      return "fixed";
    case SpeculativeDepth::kAdaptive:
      return "adaptive";
  }
  return "?";
}

StatusOr<SpeculativeDepth> ParseSpeculativeDepth(std::string_view name) {
  for (SpeculativeDepth d : {SpeculativeDepth::kFixed, SpeculativeDepth::kAdaptive}) {
    if (name == SpeculativeDepthName(d)) return d;
  }
  return InvalidArgument("--speculative-depth must be one of fixed, adaptive; got '" +
                         std::string(name) + "'");
}

SpeculativeDepthController::SpeculativeDepthController(int32_t max_depth, SpeculativeDepthRule rule)
    : max_depth_(max_depth), rule_(rule), buckets_(2 * kBatchBuckets) {
  OASIS_CHECK(max_depth >= 1 && max_depth <= kMaxDepth)
      << "speculative depth bound " << max_depth << " outside 1.." << kMaxDepth;
  OASIS_CHECK(rule.acceptance_decay > 0 && rule.acceptance_decay <= 1) << "acceptance_decay";
  OASIS_CHECK(rule.prior_weight > 0) << "prior_weight";
  OASIS_CHECK(rule.level_smoothing > 0 && rule.level_smoothing <= 1) << "level_smoothing";
  OASIS_CHECK(rule.ratio_smoothing > 0 && rule.ratio_smoothing <= 1) << "ratio_smoothing";
  OASIS_CHECK_GT(rule.explore_interval, 0) << "explore_interval";
}

int SpeculativeDepthController::BucketOf(int64_t batch, bool sparse) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(batch, 1));
  const int log2 = static_cast<int>(std::bit_width(n)) - 1;
  return std::min(log2, kBatchBuckets - 1) + (sparse ? kBatchBuckets : 0);
}

void SpeculativeDepthController::ObserveDraft(int32_t position, bool accepted) {
  if (position < 0 || position >= max_depth_) return;  // (a fixed engine's deeper chains)
  const auto p = static_cast<size_t>(position);
  accepted_[p] = rule_.acceptance_decay * accepted_[p] + (accepted ? 1.0 : 0.0);
  verified_[p] = rule_.acceptance_decay * verified_[p] + 1.0;
}

void SpeculativeDepthController::Record(PartCost& part, int32_t depth, double seconds) {
  const auto d = static_cast<size_t>(depth - 1);
  if (!part.seen[d]) {    // one-time costs (graph capture): not the depth's cost
    part.seen[d] = true;  // (the next sample at this depth is still a switch if it was one)
    return;
  }
  seconds = std::max(seconds, 1e-9);
  const int64_t n = ++part.samples[d];
  part.last_observed[d] = observations_;
  if (part.level <= 0) {  // the first sample: the unit
    part.level = seconds;
    part.ratio[d] = 1.0;
  } else {
    if (depth != part.previous) {  // a switch: against the level of the moment
      double sample = seconds / part.level;
      if (n > kMinSamples) {  // one stalled step must not make a depth look much dearer
        sample =
            std::clamp(sample, part.ratio[d] / kRatioStepLimit, part.ratio[d] * kRatioStepLimit);
      }
      const double alpha = std::max(rule_.ratio_smoothing, 1.0 / static_cast<double>(n));
      part.ratio[d] += alpha * (sample - part.ratio[d]);  // n = 1: the sample
    }
    part.level += rule_.level_smoothing * (seconds / part.ratio[d] - part.level);
  }
  part.previous = depth;
}

void SpeculativeDepthController::ObserveStep(int64_t batch, bool sparse, int32_t verified_depth,
                                             double verify_seconds, int32_t proposed_depth,
                                             double propose_seconds) {
  Bucket& b = buckets_[static_cast<size_t>(BucketOf(batch, sparse))];
  verified_depth = std::min(verified_depth, max_depth_);
  proposed_depth = std::min(proposed_depth, max_depth_);
  if (verified_depth < 1 && proposed_depth < 1) return;
  ++observations_;
  if (verified_depth >= 1) Record(b.verify, verified_depth, std::max(verify_seconds, 0.0));
  if (proposed_depth >= 1) Record(b.propose, proposed_depth, std::max(propose_seconds, 0.0));
}

double SpeculativeDepthController::Acceptance(int32_t position) const {
  OASIS_CHECK(position >= 0 && position < max_depth_) << "draft position " << position;
  double prior = rule_.initial_acceptance;
  double a = prior;
  for (int32_t j = 0; j <= position; ++j) {
    const auto p = static_cast<size_t>(j);
    a = (accepted_[p] + rule_.prior_weight * prior) / (verified_[p] + rule_.prior_weight);
    prior = a;
  }
  return a;
}

double SpeculativeDepthController::ExpectedTokens(int32_t depth) const {
  double tokens = 1.0, all_accepted = 1.0;
  for (int32_t j = 0; j < std::min(depth, max_depth_); ++j) {
    all_accepted *= Acceptance(j);
    tokens += all_accepted;
  }
  return tokens;
}

bool SpeculativeDepthController::PartEstimate(const PartCost& part, int32_t depth,
                                              double* seconds) const {
  // Measured, else the nearest shorter depth measured (a deeper chain is never cheaper: the
  // optimistic guess that gets it tried), else the nearest longer one.
  for (int32_t d = depth; d >= 1; --d) {
    if (part.samples[static_cast<size_t>(d - 1)] > 0) {
      *seconds = part.level * part.ratio[static_cast<size_t>(d - 1)];
      return true;
    }
  }
  for (int32_t d = depth + 1; d <= max_depth_; ++d) {
    if (part.samples[static_cast<size_t>(d - 1)] > 0) {
      *seconds = part.level * part.ratio[static_cast<size_t>(d - 1)];
      return true;
    }
  }
  return false;
}

double SpeculativeDepthController::PartCostAt(int bucket, bool verify, int32_t depth) const {
  // This bucket, else the nearest one of the same kind (dense / with sparse sequences), else
  // the nearest of the other kind; nothing measured anywhere: every depth the same.
  const int half = bucket / kBatchBuckets, index = bucket % kBatchBuckets;
  for (int kind : {half, 1 - half}) {
    for (int dist = 0; dist < kBatchBuckets; ++dist) {
      for (int sign : {-1, 1}) {
        const int i = index + sign * dist;
        if ((dist == 0 && sign > 0) || i < 0 || i >= kBatchBuckets) continue;
        const Bucket& b = buckets_[static_cast<size_t>(kind * kBatchBuckets + i)];
        double seconds = 0;
        if (PartEstimate(verify ? b.verify : b.propose, depth, &seconds)) return seconds;
      }
    }
  }
  return verify ? 1.0 : 0.0;
}

double SpeculativeDepthController::Cost(int bucket, int32_t depth) const {
  return PartCostAt(bucket, true, depth) + PartCostAt(bucket, false, depth);
}

bool SpeculativeDepthController::MeasuredIn(int bucket, int32_t depth) const {
  const Bucket& b = buckets_[static_cast<size_t>(bucket)];
  const auto d = static_cast<size_t>(depth - 1);
  return std::min(b.verify.samples[d], b.propose.samples[d]) >= kMinSamples;
}

int32_t SpeculativeDepthController::Best(int bucket) const {
  std::array<double, kMaxDepth> value{};
  double best = 0;
  for (int32_t d = 1; d <= max_depth_; ++d) {
    value[static_cast<size_t>(d - 1)] = ExpectedTokens(d) / std::max(Cost(bucket, d), 1e-12);
    best = std::max(best, value[static_cast<size_t>(d - 1)]);
  }
  for (int32_t d = 1; d <= max_depth_; ++d) {
    if (value[static_cast<size_t>(d - 1)] >= (1.0 - rule_.shorter_margin) * best) return d;
  }
  return max_depth_;
}

SpeculativeDepthController::Choice SpeculativeDepthController::Choose(int64_t batch, bool sparse) {
  const int bucket = BucketOf(batch, sparse);
  Bucket& b = buckets_[static_cast<size_t>(bucket)];
  const int32_t best = Best(bucket);
  bool all_measured = true;
  for (int32_t d = 1; d <= max_depth_; ++d) all_measured = all_measured && MeasuredIn(bucket, d);
  const int64_t interval = all_measured ? rule_.explore_interval : kUnmeasuredExploreInterval;
  // Explorations start once the best depth itself is measured; the count of choices starts
  // there too, so the first exploration comes `interval` choices later.
  if (!MeasuredIn(bucket, best)) return {best, false};
  const bool explore = max_depth_ > 1 && ++b.choices % interval == 0;
  if (!explore) return {best, false};
  // The depth other than the best with the fewest samples (below kMinSamples), else measured
  // longest ago; nearest the best.
  int32_t pick = 0;
  std::tuple<int64_t, int64_t, int32_t> pick_key{};
  for (int32_t d = 1; d <= max_depth_; ++d) {
    if (d == best) continue;
    const auto i = static_cast<size_t>(d - 1);
    const int64_t samples = std::min({b.verify.samples[i], b.propose.samples[i], kMinSamples});
    const int64_t last = std::min(b.verify.last_observed[i], b.propose.last_observed[i]);
    const std::tuple<int64_t, int64_t, int32_t> key{samples, last, std::abs(d - best)};
    if (pick == 0 || key < pick_key) {
      pick = d;
      pick_key = key;
    }
  }
  return {pick, true};
}

double SpeculativeDepthController::EstimatedCost(int64_t batch, bool sparse, int32_t depth) const {
  return Cost(BucketOf(batch, sparse), depth);
}

bool SpeculativeDepthController::Measured(int64_t batch, bool sparse, int32_t depth) const {
  return MeasuredIn(BucketOf(batch, sparse), depth);
}

int32_t SpeculativeDepthController::BestDepth(int64_t batch, bool sparse) const {
  return Best(BucketOf(batch, sparse));
}

}  // namespace oasis

// SpeculativeDepthController: the adaptive draft-chain depth of speculate
// (--speculative-depth adaptive, docs/lookahead.md "Adaptive depth"). With chains of up to k
// drafts (--num-speculative-tokens k), it picks, per engine step and for the whole batch (a
// decode graph's query count is the batch's longest chain + 1), the depth d in 1..k that the
// head proposes for the next step: the one maximizing expected tokens per second of step time,
//
//   value(d) = E[tokens | d] / cost(d),   E[tokens | d] = 1 + sum_{i=1..d} prod_{j<=i} a_j,
//
// a_j the conditional acceptance at chain position j (j-th draft accepted given the ones before
// it were), and cost(d) the step's wall time with chains of d drafts. Both are measured online:
//   - a_j: exponentially weighted over the recent drafts verified at position j (each verified
//     draft is one observation, weight decaying by acceptance_decay per newer one), shrunk
//     towards a_{j-1} (a_1 towards initial_acceptance) by prior_weight pseudo-observations — so
//     a deep position that is rarely verified (its earlier drafts are rarely accepted) follows
//     the shallower ones instead of keeping a stale value;
//   - cost(d): decode-only steps' wall time split in two parts, each kept per coarse bucket
//     (floor(log2(batch)), apart for steps with sparse sequences) and keyed by the depth that
//     part ran: the step without the draft head (the target verifying chains of the step's
//     longest verified chain) and the draft head's step (proposing chains of the longest chain
//     it proposed). cost(d) = verify(d) + propose(d): a step's head runs at the depth chosen now,
//     its target at the one chosen the step before, so the split keeps changes of depth exact.
//     Each part is a level times a ratio per depth, part(d) = level * ratio[d]: step costs
//     drift (contexts grow) while the depth in use is measured every step and the others only
//     when explored, so comparing raw averages would favour whichever depth was measured
//     longest ago. The level follows every sample quickly (EWMA level_smoothing of
//     sample / ratio[d]). Ratios are learnt only where they are observable: from a sample whose
//     depth differs from the part's previous sample's (a switch: an exploration and the return
//     from it), as the sample over the level of that moment (weight max(ratio_smoothing, 1/n);
//     past kMinSamples clamped to kRatioStepLimit of the ratio, so that one stalled step does
//     not keep a depth away for an exploration interval); a run of samples at one depth moves
//     the level alone. A depth not yet measured in
//     its bucket takes the nearest shorter depth's cost (optimistic: a deeper chain is never
//     cheaper), else the nearest longer one's; with nothing measured in the bucket, the nearest
//     bucket's; with nothing at all, every depth costs the same.
// The first sample of each depth in each part and bucket is dropped: the first step at a depth
// pays its one-time costs (the capture of its CUDA graph, lazy allocations), tens of times a
// step, which would make that depth look dear until many samples wash it out.
// The choice is the shortest depth whose value is within shorter_margin of the best (noise in
// the costs never buys a longer chain for nothing). A bucket starts at the best depth (with
// nothing measured, the bound: every depth costs the same and deeper chains carry more
// expected tokens) and explores only once that depth is measured (kMinSamples samples of both
// parts), so the warm-up runs the chains the user asked for and backs off from there. Then,
// every explore_interval choices in a bucket (every kUnmeasuredExploreInterval while some depth
// there has fewer than kMinSamples samples of either part: a single noisy sample must not keep
// a depth away) one choice explores instead: the depth other than the best with the fewest samples
// below kMinSamples, else measured longest ago, nearest the best — so the controller cannot lock
// itself at a bad depth when the costs drift (contexts grow) or the deeper drafts get better.
//
// The choice only decides how many drafts are proposed and verified; acceptance stays the
// engine's (lossless) rule. Plain host logic, no device types. Not thread-safe: the engine loop
// thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "oasis/status.h"

namespace oasis {

// --speculative-depth: kFixed (every speculate step proposes chains of k drafts, the default),
// kAdaptive (SpeculativeDepthController picks the depth in 1..k per step).
enum class SpeculativeDepth { kFixed, kAdaptive };
const char* SpeculativeDepthName(SpeculativeDepth depth);  // "fixed", "adaptive"
StatusOr<SpeculativeDepth> ParseSpeculativeDepth(std::string_view name);

struct SpeculativeDepthRule {
  double acceptance_decay = 0.995;  // per newer observation at the same position (~200 drafts)
  double prior_weight = 4.0;        // pseudo-observations of a_j's prior (a_{j-1}; a_1: below)
  double initial_acceptance = 0.5;  // a_1's prior before any draft was verified
  double level_smoothing = 0.3;     // EWMA weight of a step in a cost part's level
  double ratio_smoothing = 0.3;     // least weight of a switch sample in its depth's cost ratio
  int64_t explore_interval = 32;    // choices per bucket between explorations, all measured
  double shorter_margin = 0.01;     // a longer chain must be worth this much more (relative)
};

class SpeculativeDepthController {
 public:
  static constexpr int32_t kMaxDepth = 4;  // = kMaxDraftTokens (engine/lookahead.h)
  static constexpr int64_t kUnmeasuredExploreInterval = 4;
  static constexpr int64_t kMinSamples = 3;
  // Past kMinSamples, a switch sample counts as at most this factor off its depth's ratio.
  static constexpr double kRatioStepLimit = 1.25;
  static constexpr int kBatchBuckets = 12;  // floor(log2(batch)) capped at 11 (2048+)

  // Depths 1..max_depth (1..kMaxDepth).
  explicit SpeculativeDepthController(int32_t max_depth, SpeculativeDepthRule rule = {});

  // One draft verified at chain position `position` (0 = right after the real token).
  void ObserveDraft(int32_t position, bool accepted);
  // One decode-only step of `batch` sequences (`sparse`: some of them sparse): the target part
  // (the whole step without the draft head's) verified chains of at most `verified_depth`
  // drafts (0: none stacked, not recorded), the head part proposed chains of at most
  // `proposed_depth` (0: none, not recorded).
  void ObserveStep(int64_t batch, bool sparse, int32_t verified_depth, double verify_seconds,
                   int32_t proposed_depth, double propose_seconds);

  struct Choice {
    int32_t depth = 1;
    bool explored = false;  // an exploration, not the best estimate
  };
  // The depth for the next step's proposals, the batch holding `batch` sequences.
  Choice Choose(int64_t batch, bool sparse);

  int32_t max_depth() const { return max_depth_; }
  // a_j, conditional acceptance at `position` (0-based) as the controller estimates it.
  double Acceptance(int32_t position) const;
  // E[tokens | depth] of one request-step.
  double ExpectedTokens(int32_t depth) const;
  // cost(depth) in the bucket of (batch, sparse): measured, or the prior above.
  double EstimatedCost(int64_t batch, bool sparse, int32_t depth) const;
  // Whether both parts of cost(depth) have kMinSamples samples in that bucket.
  bool Measured(int64_t batch, bool sparse, int32_t depth) const;
  // The depth maximizing value (shortest within shorter_margin), no exploration.
  int32_t BestDepth(int64_t batch, bool sparse) const;

  static int BucketOf(int64_t batch, bool sparse);

 private:
  // One part of a step's cost: level * ratio[depth - 1] seconds.
  struct PartCost {
    double level = 0;      // 0: nothing measured
    int32_t previous = 0;  // the depth of the last sample
    std::array<double, kMaxDepth> ratio{};
    std::array<int64_t, kMaxDepth> samples{};
    std::array<int64_t, kMaxDepth> last_observed{};  // observation counter when last sampled
    std::array<bool, kMaxDepth> seen{};  // the depth's first sample came (and was dropped)
  };
  struct Bucket {
    PartCost verify, propose;
    int64_t choices = 0;
  };
  void Record(PartCost& part, int32_t depth, double seconds);
  // The part's cost at `depth` in bucket `b` (measured or its prior); false when the bucket
  // measured nothing of that part.
  bool PartEstimate(const PartCost& part, int32_t depth, double* seconds) const;
  double PartCostAt(int bucket, bool verify, int32_t depth) const;
  double Cost(int bucket, int32_t depth) const;
  bool MeasuredIn(int bucket, int32_t depth) const;
  int32_t Best(int bucket) const;

  int32_t max_depth_;
  SpeculativeDepthRule rule_;
  // Per position: decayed sums of accepted drafts and of verified ones.
  std::array<double, kMaxDepth> accepted_{};
  std::array<double, kMaxDepth> verified_{};
  std::vector<Bucket> buckets_;
  int64_t observations_ = 0;  // ObserveStep calls that recorded something
};

}  // namespace oasis

// The adaptive draft-chain depth of speculate (--speculative-depth adaptive, docs/lookahead.md
// "Adaptive depth"), the controller as a unit (SpeculativeDepthController, engine/
// speculative_depth.h), fed acceptance and step-cost histories: it picks the depth with the
// most tokens per second, per batch bucket, explores the others now and then, and follows
// acceptance down and back up. Through the engine: test_lookahead_depth_engine.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <span>

#include "engine/speculative_depth.h"

using namespace oasis;

namespace {

using Controller = SpeculativeDepthController;

// n drafts at `position`, a share `rate` of them accepted, spread evenly.
void FeedAcceptance(Controller& c, int32_t position, double rate, int n) {
  for (int i = 0; i < n; ++i) {
    const bool accepted = std::floor((i + 1) * rate) > std::floor(i * rate);
    c.ObserveDraft(position, accepted);
  }
}

// Step costs (seconds) of a batch bucket: verify(d) for the target part, propose(d) for the head's.
struct Costs {
  std::vector<double> verify, propose;  // index depth - 1
  double At(int32_t d) const { return verify[d - 1] + propose[d - 1]; }
};

void FeedCosts(Controller& c, int64_t batch, const Costs& costs, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    for (int32_t d = 1; d <= c.max_depth(); ++d) {
      c.ObserveStep(batch, false, d, costs.verify[d - 1], d, costs.propose[d - 1]);
    }
  }
}

// The best depth by the formula, from the controller's own acceptance estimates: the most
// tokens per second, the shortest within shorter_margin of it.
int32_t BestByFormula(const Controller& c, const Costs& costs) {
  double best = 0;
  for (int32_t d = 1; d <= c.max_depth(); ++d) best = std::max(best, c.ExpectedTokens(d) / costs.At(d));
  int32_t d = 1;
  while (c.ExpectedTokens(d) / costs.At(d) < (1 - SpeculativeDepthRule{}.shorter_margin) * best) ++d;
  return d;
}

// A simulated engine: each step verifies the depth chosen the step before and proposes the one
// chosen now; drafts at position j are accepted with probability rates[j] (conditional);
// costs get 10% noise. Returns the depths chosen, in order.
std::vector<int32_t> Simulate(Controller& c, int64_t batch, const std::vector<double>& rates,
                              const Costs& costs, int steps, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> chosen;
  int32_t verifying = 0;
  for (int t = 0; t < steps; ++t) {
    const int32_t d = c.Choose(batch, false).depth;
    chosen.push_back(d);
    for (int64_t r = 0; r < batch; ++r) {
      for (int32_t j = 0; j < verifying; ++j) {
        const bool accepted = u(rng) < rates[static_cast<size_t>(j)];
        c.ObserveDraft(j, accepted);
        if (!accepted) break;
      }
    }
    const double noise = 0.9 + 0.2 * u(rng);
    c.ObserveStep(batch, false, verifying, verifying > 0 ? costs.verify[verifying - 1] * noise : 0,
                  d, costs.propose[d - 1] * noise);
    verifying = d;
  }
  return chosen;
}

int64_t Count(std::span<const int32_t> v, int32_t d) { return std::count(v.begin(), v.end(), d); }

}  // namespace

TEST_CASE("speculative depth names parse", "[lookahead][depth]") {
  CHECK(*ParseSpeculativeDepth("fixed") == SpeculativeDepth::kFixed);
  CHECK(*ParseSpeculativeDepth("adaptive") == SpeculativeDepth::kAdaptive);
  const auto bad = ParseSpeculativeDepth("auto");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "--speculative-depth must be one of fixed, adaptive; got 'auto'");
  CHECK(std::string(SpeculativeDepthName(SpeculativeDepth::kAdaptive)) == "adaptive");
}

TEST_CASE("depth controller: acceptance by position and expected tokens", "[lookahead][depth]") {
  Controller c(4);
  // Nothing verified: every position the prior 0.5.
  CHECK(c.Acceptance(0) == Approx(0.5));
  CHECK(c.Acceptance(3) == Approx(0.5));
  CHECK(c.ExpectedTokens(2) == Approx(1 + 0.5 + 0.25));
  FeedAcceptance(c, 0, 0.8, 400);
  FeedAcceptance(c, 1, 0.25, 400);
  CHECK(c.Acceptance(0) == Approx(0.8).margin(0.03));
  CHECK(c.Acceptance(1) == Approx(0.25).margin(0.03));
  // Position 2 never verified: it follows position 1 (not a stale or optimistic value).
  CHECK(c.Acceptance(2) == Approx(c.Acceptance(1)));
  const double a0 = c.Acceptance(0), a1 = c.Acceptance(1), a2 = c.Acceptance(2),
               a3 = c.Acceptance(3);
  CHECK(c.ExpectedTokens(1) == Approx(1 + a0));
  CHECK(c.ExpectedTokens(4) == Approx(1 + a0 + a0 * a1 + a0 * a1 * a2 + a0 * a1 * a2 * a3));
  // Recent drafts weigh more: after 600 rejections position 0 is near 0.
  FeedAcceptance(c, 0, 0.0, 600);
  CHECK(c.Acceptance(0) < 0.1);
}

TEST_CASE("depth controller: the depth with the most tokens per second", "[lookahead][depth]") {
  const Costs flat{{1.00, 1.01, 1.02, 1.03}, {0.005, 0.01, 0.015, 0.02}};  // batch 1: cheap rows
  const Costs steep{{1.00, 1.30, 1.60, 1.90}, {0.05, 0.10, 0.15, 0.20}};  // batch 64: costly
  struct Case {
    const char* name;
    std::vector<double> rates;
    int32_t want_flat, want_steep;
  };
  const Case cases[] = {
      {"never accepted", {0.0, 0.0, 0.0, 0.0}, 1, 1},
      {"always accepted", {1.0, 1.0, 1.0, 1.0}, 4, 4},
      {"half accepted", {0.5, 0.5, 0.5, 0.5}, 4, 1},
      {"first draft good, chained ones poor", {0.8, 0.6, 0.02, 0.02}, 2, 1},
  };
  for (const Case& cs : cases) {
    DYNAMIC_SECTION(cs.name) {
      Controller c(4);
      for (int32_t j = 0; j < 4; ++j) FeedAcceptance(c, j, cs.rates[static_cast<size_t>(j)], 400);
      FeedCosts(c, 1, flat, 5);
      FeedCosts(c, 64, steep, 5);
      for (int32_t d = 1; d <= 4; ++d) {
        CHECK(c.Measured(1, false, d));
        CHECK(c.EstimatedCost(1, false, d) == Approx(flat.At(d)));
        CHECK(c.EstimatedCost(64, false, d) == Approx(steep.At(d)));
      }
      CHECK(c.BestDepth(1, false) == cs.want_flat);
      CHECK(c.BestDepth(64, false) == cs.want_steep);
      CHECK(c.BestDepth(1, false) == BestByFormula(c, flat));
      CHECK(c.BestDepth(64, false) == BestByFormula(c, steep));
      // Batches 2..3 share no bucket with 1 or 64: the nearest bucket's costs (batch 1's).
      CHECK_FALSE(c.Measured(3, false, 1));
      CHECK(c.BestDepth(3, false) == cs.want_flat);
      // The bound k caps the choice.
      Controller two(2);
      for (int32_t j = 0; j < 2; ++j) FeedAcceptance(two, j, cs.rates[static_cast<size_t>(j)], 400);
      FeedCosts(two, 1, flat, 5);
      CHECK(two.BestDepth(1, false) <= 2);
    }
  }
}

TEST_CASE("depth controller: unmeasured depths, priors and exploration", "[lookahead][depth]") {
  Controller c(3);
  // Nothing measured: every depth costs the same; with the prior acceptance the deepest wins.
  CHECK(c.EstimatedCost(8, false, 1) == c.EstimatedCost(8, false, 3));
  CHECK(c.BestDepth(8, false) == 3);
  // A depth's first sample carries one-time costs (its graph's capture): it is dropped.
  c.ObserveStep(8, false, 1, 50.0, 1, 20.0);
  CHECK(c.EstimatedCost(8, false, 1) == c.EstimatedCost(8, false, 3));
  CHECK(c.EstimatedCost(8, false, 1) == Approx(1.0));  // still the unmeasured prior
  // Depth 1 measured: deeper ones are guessed no costlier (optimistic), so they get tried.
  c.ObserveStep(8, false, 1, 2.0, 1, 0.5);
  CHECK(c.EstimatedCost(8, false, 1) == Approx(2.5));
  CHECK(c.EstimatedCost(8, false, 3) == Approx(2.5));
  CHECK_FALSE(c.Measured(8, false, 3));
  // Only depth 3 measured elsewhere: a shorter depth takes the nearest longer one's cost.
  c.ObserveStep(256, true, 3, 40.0, 3, 10.0);
  c.ObserveStep(256, true, 3, 4.0, 3, 1.0);
  CHECK(c.EstimatedCost(256, true, 1) == Approx(5.0));

  // Exploration: none until the best depth is measured (the warm-up runs it), then every
  // kUnmeasuredExploreInterval-th choice while a depth has fewer than kMinSamples samples, then
  // every explore_interval-th; each explores the depth other than the best with the fewest
  // samples, else measured longest ago.
  SpeculativeDepthRule rule;
  rule.explore_interval = 10;
  Controller e(3, rule);
  FeedAcceptance(e, 0, 0.0, 200);
  const Costs costs{{1.0, 1.2, 1.4}, {0.1, 0.2, 0.3}};
  std::vector<Controller::Choice> choices;
  int32_t verifying = 0;
  for (int t = 0; t < 100; ++t) {
    const Controller::Choice ch = e.Choose(4, false);
    choices.push_back(ch);
    e.ObserveStep(4, false, verifying, verifying > 0 ? costs.verify[verifying - 1] : 0, ch.depth,
                  costs.propose[ch.depth - 1]);
    verifying = ch.depth;
  }
  // The best (depth 1: nothing is accepted) runs until measured: its first sample dropped,
  // then kMinSamples of each part (the verify part one step behind the proposal).
  const int64_t warm_up = 1 + Controller::kMinSamples + 1;
  for (int64_t t = 0; t < warm_up; ++t) {
    CHECK_FALSE(choices[static_cast<size_t>(t)].explored);
    CHECK(choices[static_cast<size_t>(t)].depth == 1);
  }
  CHECK(choices[static_cast<size_t>(warm_up - 1 + Controller::kUnmeasuredExploreInterval)].explored);
  for (int32_t d = 1; d <= 3; ++d) CHECK(e.Measured(4, false, d));
  int explorations = 0;
  std::vector<int32_t> explored_depths;
  for (size_t t = 0; t < choices.size(); ++t) {
    if (choices[t].explored) {
      ++explorations;
      explored_depths.push_back(choices[t].depth);
      CHECK(choices[t].depth != 1);  // never the best
    } else {
      if (t > 20) CHECK(choices[t].depth == 1);
    }
  }
  // Measured after a few (3 samples each of 2 and 3): then 1 in 10 explores, alternating the
  // stalest of 2 and 3.
  CHECK(explorations >= 12);
  CHECK(explorations <= 16);
  CHECK(Count(explored_depths, 2) >= 4);
  CHECK(Count(explored_depths, 3) >= 4);
  // k = 1: nothing to choose, nothing explored.
  Controller one(1);
  for (int t = 0; t < 10; ++t) {
    const Controller::Choice ch = one.Choose(1, false);
    CHECK(ch.depth == 1);
    CHECK_FALSE(ch.explored);
  }
}

TEST_CASE("depth controller: settles, and follows acceptance down and back up", "[lookahead][depth]") {
  std::mt19937_64 rng(17);
  // GPU-like costs at batch 64: each extra draft costs 15% of a step.
  const Costs costs{{1.00, 1.15, 1.30, 1.45}, {0.05, 0.10, 0.15, 0.20}};
  Controller c(4);
  // Drafts never accepted: depth 1 almost always (explorations aside).
  std::vector<int32_t> a = Simulate(c, 64, {0, 0, 0, 0}, costs, 400, rng);
  std::span<const int32_t> late(a.begin() + 100, a.end());
  CHECK(Count(late, 1) >= static_cast<int64_t>(0.9 * late.size()));
  // Acceptance rises to 0.95: within a few dozen steps the full depth.
  std::vector<int32_t> b = Simulate(c, 64, {0.95, 0.95, 0.95, 0.95}, costs, 400, rng);
  const auto first4 = std::find(b.begin(), b.end(), 4) - b.begin();
  CHECK(first4 < 40);
  std::span<const int32_t> late_b(b.begin() + 100, b.end());
  CHECK(Count(late_b, 4) >= static_cast<int64_t>(0.9 * late_b.size()));
  // The chained drafts get poor: depth 2 (2.44 tokens / 1.25 beats 1.9 / 1.05 by 8%, and
  // 2.47 / 1.45 for depth 3).
  std::vector<int32_t> m = Simulate(c, 64, {0.9, 0.6, 0.05, 0.05}, costs, 400, rng);
  std::span<const int32_t> late_m(m.begin() + 100, m.end());
  CHECK(Count(late_m, 2) >= static_cast<int64_t>(0.85 * late_m.size()));
  // And down again.
  std::vector<int32_t> z = Simulate(c, 64, {0.02, 0.0, 0.0, 0.0}, costs, 400, rng);
  std::span<const int32_t> late_z(z.begin() + 100, z.end());
  CHECK(Count(late_z, 1) >= static_cast<int64_t>(0.9 * late_z.size()));
}

// FetchBudgetController (--sparse-budget adaptive, docs/sparse.md §13): per-layer caps stay in
// [1, C], start at C, grow by one while misses go unfetched, shrink by a quarter while they are
// served, hold in the dead band, halve under transfer pressure, and are a pure function of their
// inputs.
#include <catch2/catch.hpp>

#include <random>

#include "kvcache/fetch_budget.h"

using namespace oasis;

namespace {

// One interval where every sparse layer saw `misses` and fetched `fetched`.
FetchBudgetInput Uniform(int64_t layers, int64_t misses, int64_t fetched, double wait = 0,
                         double seconds = 1.0) {
  FetchBudgetInput in;
  in.layers.assign(static_cast<size_t>(layers), FetchLayerCounts{100, misses, fetched});
  in.transfer_wait_seconds = wait;
  in.interval_seconds = seconds;
  return in;
}

}  // namespace

TEST_CASE("fetch budget: caps start at C on sparse layers, 0 on dense ones", "[kvcache][budget]") {
  const FetchBudgetController c(4, 1, 7);
  REQUIRE(c.caps() == std::vector<int32_t>{0, 7, 7, 7});
  REQUIRE(c.max_cap() == 7);
  REQUIRE(c.backoffs() == 0);
}

TEST_CASE("fetch budget: shrinks to 1 while every miss is fetched, grows back to C under misses",
          "[kvcache][budget]") {
  FetchBudgetController c(3, 0, 5);
  // No unserved misses: a quarter less per interval (at least one block), never below 1.
  const std::vector<int32_t> down = {3, 2, 1};
  for (int32_t want : down) {
    REQUIRE(c.Update(Uniform(3, 10, 10)));
    REQUIRE(c.caps() == std::vector<int32_t>{want, want, want});
  }
  REQUIRE_FALSE(c.Update(Uniform(3, 10, 10)));
  REQUIRE_FALSE(c.Update(Uniform(3, 0, 0)));  // no misses at all: stays at the floor
  REQUIRE(c.caps() == std::vector<int32_t>{1, 1, 1});
  // Most misses left out (90% unserved > the 50% target): one more per interval, up to C.
  for (int i = 0; i < 4; ++i) REQUIRE(c.Update(Uniform(3, 100, 10)));
  REQUIRE(c.caps() == std::vector<int32_t>{5, 5, 5});
  REQUIRE_FALSE(c.Update(Uniform(3, 100, 10)));  // at the bound
  REQUIRE(c.caps() == std::vector<int32_t>{5, 5, 5});
}

TEST_CASE("fetch budget: from C = 16 to 1 in seven intervals of served misses", "[kvcache][budget]") {
  FetchBudgetController c(1, 0, 16);
  std::vector<int32_t> seen;
  while (c.Update(Uniform(1, 4, 4))) seen.push_back(c.caps()[0]);
  REQUIRE(seen == std::vector<int32_t>{12, 9, 6, 4, 3, 2, 1});
}

TEST_CASE("fetch budget: layers move independently; the dead band holds", "[kvcache][budget]") {
  FetchBudgetController c(3, 0, 4);
  FetchBudgetInput in;
  in.interval_seconds = 1;
  in.layers = {{50, 10, 10},   // all served: shrink
               {50, 10, 6},    // 40% unserved: between 25% and 50%, hold
               {50, 10, 2}};   // 80% unserved: grow (already at C: stays)
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{3, 4, 4});
  in.layers[2] = {50, 10, 10};
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{2, 4, 3});
  in.layers = {{50, 10, 1}, {50, 10, 6}, {50, 10, 8}};  // grow, hold, shrink (20% < 25%)
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{3, 4, 2});
}

TEST_CASE("fetch budget: backs off under transfer pressure instead of growing", "[kvcache][budget]") {
  FetchBudgetController c(2, 0, 16);
  // Transfers stalled 10% of the interval (> 5%): every cap halves although misses go unfetched.
  REQUIRE(c.Update(Uniform(2, 100, 10, /*wait=*/0.1, /*seconds=*/1.0)));
  REQUIRE(c.caps() == std::vector<int32_t>{8, 8});
  REQUIRE(c.Update(Uniform(2, 100, 10, 0.5, 1.0)));
  REQUIRE(c.caps() == std::vector<int32_t>{4, 4});
  for (int i = 0; i < 5; ++i) c.Update(Uniform(2, 100, 10, 0.5, 1.0));
  REQUIRE(c.caps() == std::vector<int32_t>{1, 1});  // never below 1
  REQUIRE(c.backoffs() == 7);
  // Waits under the limit are no pressure: the unserved misses grow the caps again.
  REQUIRE(c.Update(Uniform(2, 100, 10, 0.04, 1.0)));
  REQUIRE(c.caps() == std::vector<int32_t>{2, 2});
  // An interval of unknown length carries no pressure signal.
  REQUIRE(c.Update(Uniform(2, 100, 10, 5.0, 0.0)));
  REQUIRE(c.caps() == std::vector<int32_t>{3, 3});
  REQUIRE(c.backoffs() == 7);
}

TEST_CASE("fetch budget: shrinks when most sampled fetches go unused, judged once enough are sampled",
          "[kvcache][budget]") {
  FetchBudgetController c(2, 0, 8);  // use target 0.5 after 32 sampled fetches
  FetchBudgetInput in;
  in.interval_seconds = 1;
  // Most misses unserved (90%): the unserved rule grows (at C: holds) unless the fetches that
  // were made go unused. Layer 0: 10 of 20 sampled used (not yet 32: not judged); layer 1: 20
  // of 20 used.
  in.layers = {{50, 100, 10, 10, 20}, {50, 100, 10, 20, 20}};
  REQUIRE_FALSE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{8, 8});
  // Next interval: layer 0 reaches 40 sampled with 15 used (0.375 < 0.5): shrinks by a quarter
  // although its misses go unserved; layer 1 reaches 40 with 40 used: the unserved rule (at C).
  in.layers = {{50, 100, 10, 5, 20}, {50, 100, 10, 20, 20}};
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{6, 8});
  REQUIRE(c.use_shrinks() == 1);
  // Judged: the counts start again. Half used (16 of 32) is not below the target: layer 0
  // grows again under its unserved misses.
  in.layers = {{50, 100, 10, 16, 32}, {50, 100, 10, 0, 0}};
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{7, 8});
  // Nothing sampled (sampling off): the unserved rule alone, as without the signal.
  in.layers = {{50, 100, 100, 0, 0}, {50, 100, 100, 0, 0}};
  REQUIRE(c.Update(in));
  REQUIRE(c.caps() == std::vector<int32_t>{5, 6});
  // Unused fetches drive a layer to the floor, never below it.
  for (int i = 0; i < 10; ++i) {
    in.layers = {{50, 100, 10, 0, 64}, {50, 100, 10, 64, 64}};
    c.Update(in);
  }
  REQUIRE(c.caps() == std::vector<int32_t>{1, 8});
}

TEST_CASE("fetch budget: random signals keep every cap in [1, C]; equal inputs, equal caps",
          "[kvcache][budget]") {
  std::mt19937 rng(std::random_device{}());
  const int32_t max_cap = 1 + static_cast<int32_t>(rng() % 12);
  FetchBudgetController a(6, 2, max_cap), b(6, 2, max_cap);
  for (int i = 0; i < 500; ++i) {
    FetchBudgetInput in;
    in.interval_seconds = 0.01 * static_cast<double>(rng() % 100);
    in.transfer_wait_seconds = 0.001 * static_cast<double>(rng() % 20);
    for (int l = 0; l < 6; ++l) {
      const int64_t misses = static_cast<int64_t>(rng() % 50);
      const int64_t fetched = misses > 0 ? static_cast<int64_t>(rng() % (misses + 1)) : 0;
      const int64_t sampled = fetched > 0 ? static_cast<int64_t>(rng() % (fetched + 1)) : 0;
      in.layers.push_back({static_cast<int64_t>(rng() % 100), misses, fetched,
                           sampled > 0 ? static_cast<int64_t>(rng() % (sampled + 1)) : 0, sampled});
    }
    a.Update(in);
    b.Update(in);
    REQUIRE(a.caps() == b.caps());
    REQUIRE(a.caps()[0] == 0);
    REQUIRE(a.caps()[1] == 0);
    for (int l = 2; l < 6; ++l) REQUIRE((a.caps()[l] >= 1 && a.caps()[l] <= max_cap));
  }
}

// Sparse KV through the ENGINE on the CPU backend (docs/sparse.md §9), with the tiny fixture
// target qwen3-tiny: with K >= the number of blocks, sparse decoding equals dense decoding
// exactly (tokens and logprobs) for many concurrent requests of different lengths, for every
// predictor (draft with the reference EAGLE-3 head under reject, and with the copy head under
// speculate; previous-query; oracle), with dense layers, and with preemptions; dense and
// sparse requests share batches; with a small K at most C blocks per (row, layer, KV head)
// are fetched per step and the metrics count exactly those; finished requests return every
// GPU and host head-block; the same under tensor parallelism over two CPU ranks.
#include <catch2/catch.hpp>

#include <numeric>

#include "lookahead_test_util.h"
#include "runner/tp/cpu_tp_runner.h"
#include "sparse_engine_test_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

constexpr int64_t kSlots =
    2048;  // roomy: 16 sparse requests x (K + 2) x 2 heads and the dense ones

std::vector<Collected> DenseOutputs(const std::vector<EngineRequest>& reqs) {
  TinyModel tm(kSlots);
  return RunEngine(*tm.runner, nullptr, {}, reqs).out;
}

enum class Head { kNone, kFixture, kCopy };

struct Variant {
  const char* name;
  SparsePredictor predictor;
  LookaheadMode lookahead;
  Head head;
  int32_t dense_layers;
  int64_t slots, max_seqs;
  bool expect_preemption;
  int64_t num_speculative_tokens = 1;
  SpeculativeDepth depth = SpeculativeDepth::kFixed;
};

const Variant kVariants[] = {
    {"previous-query", SparsePredictor::kPreviousQuery, LookaheadMode::kOff, Head::kNone, 0, kSlots,
     256, false},
    {"oracle, 1 dense layer", SparsePredictor::kOracle, LookaheadMode::kOff, Head::kNone, 1, kSlots,
     256, false},
    {"draft, reject, fixture head", SparsePredictor::kDraft, LookaheadMode::kReject, Head::kFixture,
     0, kSlots, 256, false},
    {"draft, speculate, copy head", SparsePredictor::kDraft, LookaheadMode::kSpeculate, Head::kCopy,
     0, kSlots, 256, false},
    {"draft, reject, 1 dense layer", SparsePredictor::kDraft, LookaheadMode::kReject,
     Head::kFixture, 1, kSlots, 256, false},
    {"previous-query, small pool: preemptions", SparsePredictor::kPreviousQuery,
     LookaheadMode::kOff, Head::kNone, 0, 260, 12, true},
    {"draft, reject, small pool: preemptions", SparsePredictor::kDraft, LookaheadMode::kReject,
     Head::kFixture, 0, 260, 12, true},
    // Sparse requests accept drafts: positions advance by 1 + the accepted ones.
    {"draft, speculate, copy head, 1 dense layer", SparsePredictor::kDraft,
     LookaheadMode::kSpeculate, Head::kCopy, 1, kSlots, 256, false},
    {"previous-query, speculate, copy head", SparsePredictor::kPreviousQuery,
     LookaheadMode::kSpeculate, Head::kCopy, 0, kSlots, 256, false},
    {"draft, speculate, copy head, small pool: preemptions", SparsePredictor::kDraft,
     LookaheadMode::kSpeculate, Head::kCopy, 0, 260, 12, true},
    // Chains of k drafts: the chain's queries predict together (K >= blocks: all of them).
    {"draft, speculate k 2, copy head", SparsePredictor::kDraft, LookaheadMode::kSpeculate,
     Head::kCopy, 0, kSlots, 256, false, 2},
    {"draft, speculate k 4, copy head", SparsePredictor::kDraft, LookaheadMode::kSpeculate,
     Head::kCopy, 0, kSlots, 256, false, 4},
    {"previous-query, speculate k 3, copy head, 1 dense layer", SparsePredictor::kPreviousQuery,
     LookaheadMode::kSpeculate, Head::kCopy, 1, kSlots, 256, false, 3},
    {"draft, speculate k 3, copy head, small pool: preemptions", SparsePredictor::kDraft,
     LookaheadMode::kSpeculate, Head::kCopy, 0, 260, 12, true, 3},
    // The adaptive chain depth (made to change often): chains shorter than the Q queries the
    // prediction reads repeat their last one.
    {"draft, speculate k 4 adaptive depth, copy head", SparsePredictor::kDraft,
     LookaheadMode::kSpeculate, Head::kCopy, 0, kSlots, 256, false, 4, SpeculativeDepth::kAdaptive},
    {"draft, speculate k 3 adaptive depth, copy head, small pool: preemptions",
     SparsePredictor::kDraft, LookaheadMode::kSpeculate, Head::kCopy, 0, 260, 12, true, 3,
     SpeculativeDepth::kAdaptive},
};

}  // namespace

TEST_CASE(
    "with K >= the number of blocks, sparse decoding through the engine equals dense decoding",
    "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(16, 3);
  const std::vector<Collected> dense = DenseOutputs(reqs);
  for (const Variant& v : kVariants) {
    DYNAMIC_SECTION(v.name) {
      TinyModel tm(v.slots);
      RecordingRunner runner(*tm.model, tm.backend, v.slots);
      EngineOptions opt;
      opt.lookahead = v.lookahead;
      opt.num_speculative_tokens = v.num_speculative_tokens;
      opt.speculative_depth = v.depth;
      opt.speculative_depth_rule.explore_interval = 2;
      const bool adaptive = v.depth == SpeculativeDepth::kAdaptive;
      opt.max_num_seqs = v.max_seqs;
      // K = 24 blocks >= the longest context (330 tokens = 21 blocks): every block stays resident.
      opt.sparse = TinySparse(24, 0.05, v.predictor, 4096, v.dense_layers);
      std::unique_ptr<Eagle3Head> head;
      std::unique_ptr<DraftRunner> draft;
      if (v.head != Head::kNone) {
        head = v.head == Head::kFixture ? FixtureHead(tm) : CopyHead(tm);
        draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, v.slots, tm.config.num_key_value_heads);
      }
      opt.sparse_metrics_interval = 5;
      REQUIRE(Engine::CheckOptions(opt, runner, draft.get()).ok());
      const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
      CheckSameOutputs(reqs, run.out, dense);
      const EngineStats& st = run.stats;
      const SparseStepLog& log = runner.log;
      // Most requests pass the threshold of 64 (fewer switch in time when preempted requests
      // finish fast with accepted drafts).
      CHECK(st.sparse.switches_total >= (v.expect_preemption ? 8 : 12));
      CHECK(log.sparse_steps > 20);
      CHECK(log.mixed_steps > 0);        // dense and sparse sequences shared batches
      CHECK(log.max_new_per_head <= 2);  // C = ceil(0.05 x 24) = 2
      CHECK(log.slots_as_expected);
      CHECK(log.sync_is_runners);
      CHECK(log.host_summaries_consistent);
      CHECK(log.summaries_checked > 0);
      const bool stacks = v.predictor == SparsePredictor::kDraft ||
                          v.lookahead == LookaheadMode::kSpeculate;
      if (adaptive) {
        CHECK(log.max_tokens_sparse >= 2);
        CHECK(log.max_tokens_sparse <= 1 + v.num_speculative_tokens);
        int used = 0;
        for (int64_t n : st.lookahead.depth_steps_total) used += n > 0 ? 1 : 0;
        CHECK(used >= 2);
      } else {
        CHECK(log.max_tokens_sparse == (stacks ? 1 + v.num_speculative_tokens : 1));
      }
      // Metrics: collected when the last sparse request went.
      CHECK(st.sparse.steps_total == log.sparse_steps);
      CHECK(st.sparse.blocks_fetched_total == log.new_blocks);
      CHECK(st.sparse.h2d_bytes_total == st.sparse.blocks_fetched_total * 2 * 16 * 32 * 4);
      CHECK(st.sparse.hits_total > 0);
      CHECK(st.sparse.hit_rate() > 0.9);
      CHECK(st.sparse.transfer_wait_seconds_total == 0.0);  // the CPU runs everything in order
      if (v.predictor != SparsePredictor::kOracle) {
        // Sampled agreement with the real query's top-K: with K >= blocks both are "all".
        REQUIRE(st.sparse.agree_total.size() == 3);
        CHECK(st.sparse.agree_total[2] > 0);
        CHECK(st.sparse.topk_agreement() == 1.0);
        CHECK(st.sparse.agree_total[0] == (v.dense_layers > 0 ? 0 : st.sparse.agree_total[2]));
      }
      if (v.expect_preemption) {
        CHECK(st.requests.preemptions_total > 0);
      }
      if (v.num_speculative_tokens > 1) {
        // Deeper drafts are verified and accepted in sparse steps too.
        CHECK(st.lookahead.position_accepted_total[1] > 0);
        if (!adaptive) CHECK(st.lookahead.sparse_tokens_per_step() > 1.8);
      }
      if (v.lookahead == LookaheadMode::kSpeculate) {
        CHECK(st.lookahead.draft_accepted_total > 0);
        // Sparse steps emit accepted drafts too (the copy head is right most of the time).
        CHECK(st.lookahead.sparse_steps_total > 0);
        CHECK(st.lookahead.sparse_tokens_total > st.lookahead.sparse_steps_total);
        CHECK(st.lookahead.steps_total > st.lookahead.sparse_steps_total);
        if (v.head == Head::kCopy) CHECK(st.lookahead.sparse_tokens_per_step() > 1.3);
      } else {
        CHECK(st.lookahead.sparse_tokens_total == st.lookahead.sparse_steps_total);
      }
      if (v.lookahead == LookaheadMode::kReject && v.predictor == SparsePredictor::kDraft) {
        // Under reject only sparse sequences stack the draft (their predictor reads it); the
        // dense ones run their own token alone, though the head keeps a draft ready for them.
        CHECK(st.lookahead.draft_tokens_total > 0);
        CHECK(st.lookahead.draft_tokens_total <= log.sparse_drafts);
        CHECK(st.lookahead.draft_tokens_proposed_total > log.sparse_drafts);
      }
      // Everything came back.
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
      CHECK(st.sparse.gpu_slots == 0);
      if (draft) CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
    }
  }
}

TEST_CASE("HBM home: with K >= the number of blocks, sparse requests read in place equal dense decoding",
          "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(16, 5);
  const std::vector<Collected> dense = DenseOutputs(reqs);
  struct Case {
    const char* name;
    KvHome home;
    SparsePredictor predictor;
    Head head;
    int32_t dense_layers;
    int64_t slots;
    bool both_homes, preempts;
    LookaheadMode lookahead = LookaheadMode::kReject;
    int64_t num_speculative_tokens = 1;
  };
  for (const Case& c :
       {Case{"hbm, previous-query", KvHome::kHbm, SparsePredictor::kPreviousQuery, Head::kNone, 0, kSlots, false,
             false},
        Case{"hbm, draft, reject", KvHome::kHbm, SparsePredictor::kDraft, Head::kFixture, 0, kSlots, false, false},
        Case{"hbm, oracle, 1 dense layer", KvHome::kHbm, SparsePredictor::kOracle, Head::kNone, 1, kSlots, false,
             false},
        Case{"hbm, small pool: preemptions", KvHome::kHbm, SparsePredictor::kPreviousQuery, Head::kNone, 0, 200,
             false, true},
        // 16 requests of up to 21 blocks x 2 heads: the pool holds about four whole.
        Case{"auto, both homes", KvHome::kAuto, SparsePredictor::kDraft, Head::kFixture, 0, 200, true, false},
        // Accepted drafts in place, and across moves to the host store mid-decode.
        Case{"hbm, draft, speculate, copy head", KvHome::kHbm, SparsePredictor::kDraft, Head::kCopy, 0, kSlots,
             false, false, LookaheadMode::kSpeculate},
        Case{"auto, both homes, speculate, copy head", KvHome::kAuto, SparsePredictor::kDraft, Head::kCopy, 0,
             200, true, false, LookaheadMode::kSpeculate},
        Case{"hbm, speculate k 3, copy head", KvHome::kHbm, SparsePredictor::kDraft, Head::kCopy, 0, kSlots,
             false, false, LookaheadMode::kSpeculate, 3},
        Case{"auto, both homes, speculate k 4, copy head", KvHome::kAuto, SparsePredictor::kDraft, Head::kCopy,
             0, 200, true, false, LookaheadMode::kSpeculate, 4}}) {
    DYNAMIC_SECTION(c.name) {
      TinyModel tm(c.slots);
      RecordingRunner runner(*tm.model, tm.backend, c.slots);
      EngineOptions opt;
      opt.max_num_seqs = c.preempts ? 12 : 256;
      opt.sparse = TinySparse(24, 0.05, c.predictor, 4096, c.dense_layers);
      opt.sparse->home = c.home;
      opt.sparse_metrics_interval = 5;
      std::unique_ptr<Eagle3Head> head;
      std::unique_ptr<DraftRunner> draft;
      if (c.head != Head::kNone) {
        head = c.head == Head::kCopy ? CopyHead(tm) : FixtureHead(tm);
        draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, c.slots, tm.config.num_key_value_heads);
        opt.lookahead = c.lookahead;
        opt.num_speculative_tokens = c.num_speculative_tokens;
      }
      REQUIRE(Engine::CheckOptions(opt, runner, draft.get()).ok());
      const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
      CheckSameOutputs(reqs, run.out, dense);
      const EngineStats& st = run.stats;
      const SparseStepLog& log = runner.log;
      CHECK(st.sparse.switches_total >= 12);
      CHECK(log.max_in_place > 0);
      CHECK(log.slots_as_expected);
      CHECK(log.host_summaries_consistent);
      if (c.both_homes) {
        CHECK(log.max_host_home > 0);
        CHECK(st.sparse.moves_started_total > 0);  // the pool ran short: in-place requests moved
        CHECK(st.sparse.moves_total > 0);
      } else {
        CHECK(log.max_host_home == 0);
        CHECK(st.sparse.blocks_fetched_total == 0);  // nothing crosses PCIe
        CHECK(log.new_blocks == 0);
      }
      if (c.preempts) CHECK(st.requests.preemptions_total > 0);
      if (c.lookahead == LookaheadMode::kSpeculate) {
        CHECK(st.lookahead.sparse_tokens_per_step() > 1.3);
      }
      CHECK((c.both_homes || st.sparse.hit_rate() == 1.0));
      if (c.predictor != SparsePredictor::kOracle) CHECK(st.sparse.topk_agreement() == 1.0);
      // Everything came back.
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
      CHECK(st.sparse.num_in_place == 0);
      CHECK(st.sparse.gpu_slots == 0);
      if (draft) CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
    }
  }
}

TEST_CASE("pressure policy: dense while the pool has room, the longest switch when it runs short",
          "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(16, 7);
  const std::vector<Collected> dense = DenseOutputs(reqs);
  for (const auto& [name, slots] : {std::pair{"roomy pool: nobody switches", kSlots},
                                    std::pair{"short pool: the longest switch", int64_t{200}}}) {
    DYNAMIC_SECTION(name) {
      TinyModel tm(slots);
      RecordingRunner runner(*tm.model, tm.backend, slots);
      EngineOptions opt;
      // Roomy: K >= blocks (nobody switches anyway: exact). Short: K 4, so that a switch frees
      // blocks (a table past K + 2 blocks per head); the outputs are then sparse ones.
      const bool roomy = slots == kSlots;
      opt.sparse = TinySparse(roomy ? 24 : 4, roomy ? 0.05 : 0.5, SparsePredictor::kPreviousQuery);
      opt.sparse->switch_on_pressure = true;
      opt.sparse_metrics_interval = 5;
      REQUIRE(Engine::CheckOptions(opt, runner, nullptr).ok());
      const SparseRun run = RunEngine(runner, nullptr, opt, reqs);
      if (roomy) CheckSameOutputs(reqs, run.out, dense);
      for (size_t i = 0; i < reqs.size(); ++i) {
        CHECK(run.out[i].error.ok());
        if (reqs[i].ignore_eos) CHECK(run.out[i].tokens.size() == dense[i].tokens.size());
      }
      const EngineStats& st = run.stats;
      if (slots == kSlots) {
        CHECK(st.sparse.switches_total == 0);
        CHECK(st.sparse.pressure_switches_total == 0);
        CHECK(runner.log.sparse_steps == 0);
      } else {
        CHECK(st.sparse.pressure_switches_total > 0);
        CHECK(st.sparse.switches_total >= st.sparse.pressure_switches_total);
        // Near pressure, long requests admitted took their host home at once and switched at
        // the threshold (neither a pressure switch nor an in-place one).
        CHECK(st.sparse.switches_total >
              st.sparse.pressure_switches_total + st.sparse.in_place_switches_total);
        CHECK(runner.log.sparse_steps > 0);
        // The same workload dense on this pool preempts; switching the longest avoids most.
        TinyModel dm(slots);
        const SparseRun plain = RunEngine(*dm.runner, nullptr, {}, reqs);
        CHECK(plain.stats.requests.preemptions_total > st.requests.preemptions_total);
      }
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
    }
  }
}

TEST_CASE("pressure policy with the draft predictor: no draft far from pressure, a switch without one",
          "[engine][sparse]") {
  // Far from pressure a dense request cannot switch at the next step, so the head's step only
  // appends its K/V (no draft); when the pool runs short the longest switches, its first sparse
  // step predicting from its real query if no draft was ready (docs/sparse.md §5).
  const std::vector<EngineRequest> reqs = LongWorkload(16, 5);
  const std::vector<Collected> dense = DenseOutputs(reqs);
  for (const auto& [name, slots] : {std::pair{"roomy pool: no drafts", kSlots},
                                    std::pair{"short pool: switches", int64_t{200}}}) {
    DYNAMIC_SECTION(name) {
      TinyModel tm(slots);
      RecordingRunner runner(*tm.model, tm.backend, slots);
      EngineOptions opt;
      opt.lookahead = LookaheadMode::kReject;
      const bool roomy = slots == kSlots;
      opt.sparse = TinySparse(roomy ? 24 : 4, roomy ? 0.05 : 0.5, SparsePredictor::kDraft);
      opt.sparse->switch_on_pressure = true;
      opt.sparse_metrics_interval = 5;
      std::unique_ptr<Eagle3Head> head = FixtureHead(tm);
      std::unique_ptr<DraftRunner> draft =
          MakeSparseDraftRunner(tm, *head, *opt.sparse, slots, tm.config.num_key_value_heads);
      REQUIRE(Engine::CheckOptions(opt, runner, draft.get()).ok());
      const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
      const EngineStats& st = run.stats;
      for (size_t i = 0; i < reqs.size(); ++i) {
        CHECK(run.out[i].error.ok());
        if (reqs[i].ignore_eos) CHECK(run.out[i].tokens.size() == dense[i].tokens.size());
      }
      if (roomy) {
        CheckSameOutputs(reqs, run.out, dense);
        CHECK(st.sparse.switches_total == 0);
        CHECK(st.lookahead.draft_tokens_proposed_total == 0);
      } else {
        CHECK(st.sparse.pressure_switches_total > 0);
        CHECK(runner.log.sparse_steps > 0);
        CHECK(st.lookahead.draft_tokens_proposed_total > 0);  // sparse requests and those near it
      }
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
    }
  }
}

TEST_CASE("pressure policy with the HBM home: over the read budget the longest switch in place",
          "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(16, 11);
  const std::vector<Collected> dense = DenseOutputs(reqs);
  for (KvHome home : {KvHome::kHbm, KvHome::kAuto}) {
    DYNAMIC_SECTION("home " << KvHomeName(home)) {
      TinyModel tm(kSlots);
      RecordingRunner runner(*tm.model, tm.backend, kSlots);
      EngineOptions opt;
      opt.sparse = TinySparse(24, 0.05, SparsePredictor::kPreviousQuery);  // K >= blocks: exact
      opt.sparse->switch_on_pressure = true;
      opt.sparse->home = home;
      opt.sparse->dense_read_tokens = 300;  // about two decodes past the threshold
      opt.sparse_metrics_interval = 5;
      REQUIRE(Engine::CheckOptions(opt, runner, nullptr).ok());
      const SparseRun run = RunEngine(runner, nullptr, opt, reqs);
      CheckSameOutputs(reqs, run.out, dense);
      const EngineStats& st = run.stats;
      CHECK(st.sparse.in_place_switches_total > 0);  // the pool had room: only in place
      CHECK(st.sparse.switches_total == st.sparse.in_place_switches_total);
      CHECK(st.sparse.pressure_switches_total == 0);
      CHECK(st.sparse.moves_started_total == 0);
      CHECK(runner.log.sparse_steps > 0);
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
    }
  }
  SECTION("once one request is sparse, the others past the threshold join it") {
    // Three prompts of 100 ids (threshold 64), 20 new tokens each: together 300+ tokens of KV,
    // over a budget of 250, so the longest switches in place; the two left hold at most 240,
    // under the budget, but the sparse step already runs, so they switch too.
    std::vector<EngineRequest> three;
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt(100);
      for (size_t j = 0; j < prompt.size(); ++j)
        prompt[j] = static_cast<int32_t>(3 + (j * 7 + static_cast<size_t>(i) * 13) % 500);
      EngineRequest r = Request("three-" + std::to_string(i), std::move(prompt), 20);
      r.ignore_eos = true;
      three.push_back(std::move(r));
    }
    const std::vector<Collected> three_dense = DenseOutputs(three);
    TinyModel tm(kSlots);
    RecordingRunner runner(*tm.model, tm.backend, kSlots);
    EngineOptions opt;
    opt.sparse = TinySparse(24, 0.05, SparsePredictor::kPreviousQuery);  // K >= blocks: exact
    opt.sparse->switch_on_pressure = true;
    opt.sparse->home = KvHome::kAuto;
    opt.sparse->dense_read_tokens = 250;
    const SparseRun run = RunEngine(runner, nullptr, opt, three);
    CheckSameOutputs(three, run.out, three_dense);
    CHECK(run.stats.sparse.in_place_switches_total == 3);
    CHECK(run.stats.sparse.switches_total == 3);
    CHECK(run.stats.kv.num_free_slots == run.stats.kv.num_slots);
  }
  SECTION("a budget no batch reaches keeps every request dense") {
    TinyModel tm(kSlots);
    RecordingRunner runner(*tm.model, tm.backend, kSlots);
    EngineOptions opt;
    opt.sparse = TinySparse(24, 0.05, SparsePredictor::kPreviousQuery);
    opt.sparse->switch_on_pressure = true;
    opt.sparse->home = KvHome::kAuto;
    opt.sparse->dense_read_tokens = 1 << 20;
    const SparseRun run = RunEngine(runner, nullptr, opt, reqs);
    CheckSameOutputs(reqs, run.out, dense);
    CHECK(run.stats.sparse.switches_total == 0);
    CHECK(runner.log.sparse_steps == 0);
  }
}

TEST_CASE("small K: at most C new blocks per head per step, counted by the metrics",
          "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(10, 9, 400);
  for (SparsePredictor predictor :
       {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery, SparsePredictor::kOracle}) {
    for (GroupReduce reduce : {GroupReduce::kSum, GroupReduce::kMax}) {
      DYNAMIC_SECTION(SparsePredictorName(predictor)
                      << (reduce == GroupReduce::kSum ? " sum" : " max")) {
        TinyModel tm(kSlots);
        RecordingRunner runner(*tm.model, tm.backend, kSlots);
        auto head = FixtureHead(tm);
        EngineOptions opt;
        opt.lookahead = LookaheadMode::kReject;
        opt.sparse = TinySparse(4, 0.25, predictor);  // C = 1
        opt.sparse->group_reduce = reduce;
        auto draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots, tm.config.num_key_value_heads);
        const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          INFO(reqs[i].id);
          CHECK(run.out[i].error.ok());
          if (reqs[i].ignore_eos) CHECK(run.out[i].reason == FinishReasonKind::kLength);
        }
        const EngineStats& st = run.stats;
        const SparseStepLog& log = runner.log;
        CHECK(log.max_new_per_head == 1);  // fetches happen, never more than C = 1 per head
        CHECK(log.slots_as_expected);      // the working set stays K + 2 slots per head
        CHECK(st.sparse.blocks_fetched_total == log.new_blocks);
        CHECK(st.sparse.misses_total >= st.sparse.blocks_fetched_total);
        CHECK(st.sparse.hit_rate() > 0.0);
        CHECK(st.sparse.hit_rate() < 1.0);
        CHECK(st.sparse.fetched_per_step() > 0.0);
        CHECK(st.sparse.h2d_bytes_per_step() == Approx(st.sparse.fetched_per_step() * 4096));
        if (predictor != SparsePredictor::kOracle) {
          CHECK(st.sparse.topk_agreement() > 0.3);
          CHECK(st.sparse.topk_agreement() <= 1.0);
          CHECK(st.sparse.topk_agreement(1) > 0.0);
        }
        CHECK(st.kv.num_free_slots == st.kv.num_slots);
        CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
        CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
      }
    }
  }
}

// Speculate with chains of 3 drafts and small K: the chain's queries predict as one GQA group
// (SparseConfig::chain_queries = 3 on qwen3-tiny, G = 2), the cap still holds per head and
// step, sparse steps advance by several tokens, the host store stays consistent.
TEST_CASE("small K with draft chains: one scored prediction per step under the same cap",
          "[engine][sparse]") {
  const std::vector<EngineRequest> reqs = LongWorkload(10, 9, 400);
  struct Case {
    GroupReduce reduce;
    SpeculativeDepth depth;
  };
  for (Case c : {Case{GroupReduce::kSum, SpeculativeDepth::kFixed},
                 Case{GroupReduce::kMax, SpeculativeDepth::kFixed},
                 Case{GroupReduce::kSum, SpeculativeDepth::kAdaptive}}) {
    const GroupReduce reduce = c.reduce;
    const bool adaptive = c.depth == SpeculativeDepth::kAdaptive;
    DYNAMIC_SECTION((reduce == GroupReduce::kSum ? "sum" : "max") << (adaptive ? ", adaptive depth" : "")) {
      TinyModel tm(kSlots);
      RecordingRunner runner(*tm.model, tm.backend, kSlots);
      auto head = CopyHead(tm);
      EngineOptions opt;
      opt.lookahead = LookaheadMode::kSpeculate;
      opt.num_speculative_tokens = 3;
      opt.speculative_depth = c.depth;  // adaptive: chains of 1..3, shorter ones repeat a query
      opt.speculative_depth_rule.explore_interval = 2;
      opt.sparse = TinySparse(4, 0.25, SparsePredictor::kDraft);  // C = 1
      opt.sparse->group_reduce = reduce;
      auto draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots, tm.config.num_key_value_heads);
      const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO(reqs[i].id);
        CHECK(run.out[i].error.ok());
        if (reqs[i].ignore_eos) CHECK(run.out[i].reason == FinishReasonKind::kLength);
      }
      const EngineStats& st = run.stats;
      const SparseStepLog& log = runner.log;
      if (adaptive) {
        CHECK(log.max_tokens_sparse >= 2);
        CHECK(log.max_tokens_sparse <= 4);
        CHECK(st.lookahead.depth_steps_total[0] + st.lookahead.depth_steps_total[1] > 0);
      } else {
        CHECK(log.max_tokens_sparse == 4);
      }
      CHECK(log.max_new_per_head == 1);
      CHECK(log.slots_as_expected);
      CHECK(log.host_summaries_consistent);
      CHECK(log.summaries_checked > 0);
      CHECK(st.sparse.blocks_fetched_total == log.new_blocks);
      CHECK(st.sparse.hit_rate() > 0.0);
      CHECK(st.sparse.hit_rate() < 1.0);
      CHECK(st.sparse.topk_agreement() > 0.3);
      CHECK(st.lookahead.sparse_tokens_per_step() > 1.5);
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
    }
  }
}

// The adaptive fetch budget (--sparse-budget adaptive, docs/sparse.md §13). With K >= the
// number of blocks a head misses at most the one block completed since the last step, so any
// cap >= 1 serves it: outputs equal dense decoding while the caps fall to 1. With fetch ratio 1
// (C = K = 4) the fixed budget fetches every miss at once; the adaptive one drops the misses
// that do not persist: fewer blocks and bytes, every step within the cap its layer had.
TEST_CASE("adaptive fetch budget: dense outputs with K >= blocks, fewer bytes where fixed over-fetches",
          "[engine][sparse][budget]") {
  SECTION("K >= blocks: equal to dense decoding, caps down to 1") {
    const std::vector<EngineRequest> reqs = LongWorkload(12, 3);
    const std::vector<Collected> dense = DenseOutputs(reqs);
    TinyModel tm(kSlots);
    RecordingRunner runner(*tm.model, tm.backend, kSlots);
    EngineOptions opt;
    opt.sparse = TinySparse(24, 1.0, SparsePredictor::kPreviousQuery);  // C = 24
    opt.sparse->budget = SparseBudget::kAdaptive;
    opt.sparse_metrics_interval = 2;
    const SparseRun run = RunEngine(runner, nullptr, opt, reqs);
    CheckSameOutputs(reqs, run.out, dense);
    CHECK(runner.log.sparse_steps > 20);
    CHECK(runner.log.within_fetch_caps);
    CHECK(runner.log.min_fetch_cap == 1);
    CHECK(run.stats.sparse.blocks_fetched_total == runner.log.new_blocks);
    CHECK(run.stats.sparse.fetch_budget_backoffs_total == 0);  // the CPU never waits on transfers
    // The real top-K is every block, so every fetched block is read by it (agreement sampled
    // every second step): the "fetched block used" signal counts all of them.
    const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
    CHECK(sum(run.stats.sparse.fetch_sampled) > 0);
    CHECK(sum(run.stats.sparse.fetch_used) == sum(run.stats.sparse.fetch_sampled));
  }
  SECTION("C = K = 4: fewer bytes than the fixed budget") {
    const std::vector<EngineRequest> reqs = LongWorkload(10, 9, 400);
    EngineStats stats[2];
    SparseStepLog logs[2];
    for (SparseBudget budget : {SparseBudget::kFixed, SparseBudget::kAdaptive}) {
      TinyModel tm(kSlots);
      RecordingRunner runner(*tm.model, tm.backend, kSlots);
      auto head = FixtureHead(tm);
      EngineOptions opt;
      opt.lookahead = LookaheadMode::kReject;
      opt.sparse = TinySparse(4, 1.0, SparsePredictor::kDraft);  // C = 4
      opt.sparse->budget = budget;
      opt.sparse_metrics_interval = 2;
      auto draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots, tm.config.num_key_value_heads);
      const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO(SparseBudgetName(budget) << " " << reqs[i].id);
        CHECK(run.out[i].error.ok());
        if (reqs[i].ignore_eos) CHECK(run.out[i].reason == FinishReasonKind::kLength);
      }
      const size_t i = budget == SparseBudget::kFixed ? 0 : 1;
      stats[i] = run.stats;
      logs[i] = runner.log;
      CHECK(runner.log.within_fetch_caps);
      CHECK(runner.log.slots_as_expected);
      CHECK(run.stats.sparse.blocks_fetched_total == runner.log.new_blocks);
      REQUIRE(run.stats.sparse.fetch_caps.size() == 3);
      for (int32_t c : run.stats.sparse.fetch_caps) CHECK((c >= 1 && c <= 4));
      CHECK(run.stats.kv.num_free_slots == run.stats.kv.num_slots);
      CHECK(run.stats.sparse.num_free_host_kv_slots == run.stats.sparse.num_host_kv_slots);
    }
    CHECK(logs[0].max_new_per_head > 1);  // the fixed budget fetches several misses at once
    CHECK(logs[0].min_fetch_cap == 4);
    CHECK(stats[0].sparse.fetch_caps == std::vector<int32_t>{4, 4, 4});
    CHECK(logs[1].min_fetch_cap < 4);  // the controller lowered caps
    // K = 4 of up to 25 blocks: some fetched blocks are not in the real top-K when read.
    for (const EngineStats& s : stats) {
      const int64_t used = std::accumulate(s.sparse.fetch_used.begin(), s.sparse.fetch_used.end(), int64_t{0}),
                    sampled = std::accumulate(s.sparse.fetch_sampled.begin(), s.sparse.fetch_sampled.end(), int64_t{0});
      INFO("fetched blocks used " << used << " of " << sampled << " sampled");
      CHECK(sampled > 0);
      CHECK(used > 0);
      CHECK(used < sampled);
    }
    INFO("blocks fetched: fixed " << stats[0].sparse.blocks_fetched_total << ", adaptive "
                                  << stats[1].sparse.blocks_fetched_total);
    CHECK(stats[1].sparse.blocks_fetched_total < stats[0].sparse.blocks_fetched_total);
    CHECK(stats[1].sparse.h2d_bytes_total < stats[0].sparse.h2d_bytes_total);
    CHECK(stats[1].sparse.misses_total > 0);
  }
  SECTION("simulated transfer pressure: every cap backs off to 1") {
    const std::vector<EngineRequest> reqs = LongWorkload(10, 9, 400);
    TinyModel tm(kSlots);
    RecordingRunner runner(*tm.model, tm.backend, kSlots);
    // 10 s of transfer wait per interval of a few milliseconds: far over the 5% limit.
    runner.simulated_sync = std::make_unique<WaitingStageSync>(10.0);
    auto head = FixtureHead(tm);
    EngineOptions opt;
    opt.lookahead = LookaheadMode::kReject;
    opt.sparse = TinySparse(4, 1.0, SparsePredictor::kDraft);  // C = 4
    opt.sparse->budget = SparseBudget::kAdaptive;
    opt.sparse_metrics_interval = 2;
    auto draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots, tm.config.num_key_value_heads);
    const SparseRun run = RunEngine(runner, draft.get(), opt, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO(reqs[i].id);
      CHECK(run.out[i].error.ok());
      if (reqs[i].ignore_eos) CHECK(run.out[i].reason == FinishReasonKind::kLength);
    }
    CHECK(runner.log.sync_is_runners);
    CHECK(runner.log.within_fetch_caps);
    CHECK(run.stats.sparse.fetch_budget_backoffs_total > 2);
    CHECK(run.stats.sparse.fetch_caps == std::vector<int32_t>{1, 1, 1});
    // From the third interval on at most one block per head and step: under two thirds of the
    // fixed budget's blocks on this workload (2,097; measured 1,297).
    CHECK(run.stats.sparse.blocks_fetched_total * 3 < 2097 * 2);
    CHECK(run.stats.sparse.blocks_fetched_total == runner.log.new_blocks);
  }
}

TEST_CASE("sparse KV with a threshold no request reaches is dense decoding", "[engine][sparse]") {
  std::vector<EngineRequest> reqs = LongWorkload(8, 4, 60);
  for (auto& r : reqs)
    r.max_tokens = std::min<int64_t>(r.max_tokens, 64 - static_cast<int64_t>(r.prompt.size()));
  const std::vector<Collected> dense = DenseOutputs(reqs);
  TinyModel tm(kSlots);
  RecordingRunner runner(*tm.model, tm.backend, kSlots);
  EngineOptions opt;
  opt.sparse = TinySparse(8, 0.25, SparsePredictor::kPreviousQuery);
  const SparseRun run = RunEngine(runner, nullptr, opt, reqs);
  CheckSameOutputs(reqs, run.out, dense);
  CHECK(runner.log.sparse_steps == 0);
  CHECK(run.stats.sparse.switches_total == 0);
  CHECK(run.stats.sparse.num_host_kv_slots == 4096);
}

// Tensor parallelism (docs/parallel.md §6): two CPU ranks, each with its own device side of
// the sparse manager (host store share, summaries, state) and its own pipeline, driven by the
// TpModelRunner the GPUs use. Compared with the same TP runner decoding densely (the ranks'
// float all-reduce makes TP differ from one rank in the last bits, so TP=1 is not the
// reference here; tests/e2e/test_server_tp.sh compares with TP=1 within 1e-3). Predictors
// previous-query, oracle and draft (reject, the fixture head), with and without a dense layer.
TEST_CASE("sparse KV under tensor parallelism (2 CPU ranks) equals dense TP decoding and keeps the fetch cap",
          "[engine][sparse][parallel]") {
  const std::vector<EngineRequest> reqs = LongWorkload(10, 5);
  TinyModel tm(16);  // config and weights for the ranks
  const auto make = [&] {
    auto r = CreateCpuTpRunner(tm.config, {.size = 2, .threads_per_rank = 1, .num_kv_slots = kSlots},
                               [&](Backend& backend, const TensorParallel& tp) {
                                 return DecoderLM::Create(tm.config, *tm.weights, backend, tp);
                               });
    REQUIRE(r.ok());
    return std::move(*r);
  };
  std::unique_ptr<TpModelRunner> dense_runner = make();
  const std::vector<Collected> dense = RunEngine(*dense_runner, nullptr, {}, reqs).out;
  dense_runner.reset();
  struct Case {
    const char* name;
    SparsePredictor predictor;
    int32_t k;
    double fetch_ratio;
    bool equal;  // K >= every request's blocks: sparse must equal dense
    int32_t dense_layers = 0;
    int64_t speculate = 0;  // > 0: speculate with chains of this many drafts (copy head)
  };
  for (const Case& c : {Case{"previous-query, K 24", SparsePredictor::kPreviousQuery, 24, 0.05, true},
                        Case{"oracle, K 24", SparsePredictor::kOracle, 24, 0.05, true},
                        Case{"draft (reject, the fixture head on rank 0), K 24", SparsePredictor::kDraft, 24, 0.05, true},
                        Case{"previous-query, K 24, 1 dense layer", SparsePredictor::kPreviousQuery, 24, 0.05, true, 1},
                        Case{"previous-query, K 4, C 2", SparsePredictor::kPreviousQuery, 4, 0.5, false},
                        Case{"draft, K 4, C 2", SparsePredictor::kDraft, 4, 0.5, false},
                        Case{"draft (speculate, chains of 3, the copy head), K 24", SparsePredictor::kDraft, 24,
                             0.05, true, 0, 3},
                        Case{"draft (speculate, chains of 2), K 4, C 2", SparsePredictor::kDraft, 4, 0.5, false, 0,
                             2}}) {
    DYNAMIC_SECTION(c.name) {
      std::unique_ptr<TpModelRunner> runner = make();
      REQUIRE(runner->num_ranks() == 2);
      // The draft head runs on one backend (the server puts it on rank 0's): the capture it
      // reads is the target's residual stream, the same on every rank.
      std::unique_ptr<Eagle3Head> head;
      std::unique_ptr<DraftRunner> draft;
      EngineOptions opt;
      opt.sparse = TinySparse(c.k, c.fetch_ratio, c.predictor, 4096, c.dense_layers);
      if (c.predictor == SparsePredictor::kDraft) {
        head = c.speculate > 0 ? CopyHead(tm) : FixtureHead(tm);
        // A pool as large in tokens as a rank's pool and host share (kSlots head-blocks of one
        // local KV head each).
        draft = MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots,
                                      runner->model().config().num_key_value_heads, 2);
        opt.lookahead = c.speculate > 0 ? LookaheadMode::kSpeculate : LookaheadMode::kReject;
        opt.num_speculative_tokens = std::max<int64_t>(1, c.speculate);
      }
      opt.sparse_metrics_interval = 5;
      REQUIRE(Engine::CheckOptions(opt, *runner, draft.get()).ok());
      const SparseRun run = RunEngine(*runner, draft.get(), opt, reqs);
      if (c.equal) CheckSameOutputs(reqs, run.out, dense);
      for (const Collected& col : run.out) CHECK(col.error.ok());
      const EngineStats& st = run.stats;
      CHECK(st.sparse.switches_total >= 6);
      CHECK(st.sparse.steps_total > 20);
      // Both ranks' fetches: at most C per (sequence, layer, KV head) per step, 2 KV heads in all.
      const int64_t cap = opt.sparse->max_fetch() * 2 * (3 - c.dense_layers);
      CHECK(st.sparse.blocks_fetched_total <= cap * st.sparse.seq_steps_total);
      if (!c.equal) CHECK(st.sparse.blocks_fetched_total > 0);
      if (c.equal) CHECK(st.sparse.hit_rate() > 0.9);
      if (c.speculate > 0) CHECK(st.lookahead.sparse_tokens_per_step() > 1.3);
      // Everything came back, on every rank's side.
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.sparse.num_requests == 0);
      CHECK(st.sparse.gpu_slots == 0);
      if (draft) CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
    }
  }
}

// Prefix caching with sparse KV (docs/prefix_caching.md): requests adopt a shared system
// prompt's cached blocks, then switch to sparse. A switch never writes a block the cache or
// another request holds (kvcache/sparse_switch_plan.h SharedSlots): a shared block chosen for
// the working set is copied into a slot of the request's own. So the outputs equal caching
// off, and a second round of the same prompts — hitting blocks that sat in switched requests'
// tables — still equals a fresh engine's. Host home (threshold switches) and HBM home (in
// place) with a small K; and the pressure policy in a short pool, in-place switches over a
// small read budget and moves to the host, with K >= every request's blocks, where sparse
// decoding is exact and every output must equal plain dense decoding's whatever the timing.
TEST_CASE("prefix caching with sparse KV: switches never write a shared block", "[engine][sparse][prefix]") {
  std::mt19937_64 rng(2025);
  std::vector<int32_t> system(120);  // 7 full blocks and 8 tokens
  for (auto& t : system) t = static_cast<int32_t>(3 + rng() % 500);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt = system;
    const int64_t own = 5 + static_cast<int64_t>(rng() % 90);
    for (int64_t j = 0; j < own; ++j) prompt.push_back(static_cast<int32_t>(3 + rng() % 500));
    EngineRequest r = Request("pc-" + std::to_string(i), std::move(prompt), 20 + static_cast<int64_t>(rng() % 40));
    r.ignore_eos = true;
    r.logprobs = true;
    if (i % 3 == 1) {
      r.sampling.temperature = 5.0f;
      r.sampling.seed = 900 + static_cast<uint64_t>(i);
    }
    reqs.push_back(std::move(r));
  }
  struct Home {
    const char* name;
    KvHome home;
    bool pressure;
    int64_t slots;
    int32_t k;
  };
  for (const Home& h : {Home{"host home, threshold", KvHome::kHost, false, kSlots, 4},
                        Home{"HBM home, threshold", KvHome::kHbm, false, kSlots, 4},
                        Home{"auto homes, pressure, short pool", KvHome::kAuto, true, 200, 20}}) {
    DYNAMIC_SECTION(h.name) {
      auto options = [&](bool caching) {
        EngineOptions opt;
        opt.sparse = TinySparse(h.k, 0.5, SparsePredictor::kPreviousQuery);
        opt.sparse->home = h.home;
        opt.sparse->switch_on_pressure = h.pressure;
        if (h.pressure) opt.sparse->dense_read_tokens = 300;
        opt.enable_prefix_caching = caching;
        return opt;
      };
      // Round 1 together (siblings of one system prompt), round 2 the same prompts one by one.
      auto run = [&](bool caching, EngineStats* stats) {
        TinyModel tm(h.slots);
        const EngineOptions opt = options(caching);
        REQUIRE(Engine::CheckOptions(opt, *tm.runner, nullptr).ok());
        Engine engine(*tm.runner, nullptr, opt);
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (const EngineRequest& q : reqs) {
          auto s = engine.Submit(q);
          REQUIRE(s.ok());
          streams.push_back(*s);
        }
        engine.Start();
        std::vector<Collected> out;
        for (const auto& s : streams) out.push_back(Collect(*s));
        for (EngineRequest q : reqs) {
          q.id += "-again";
          auto s = engine.Submit(q);
          REQUIRE(s.ok());
          out.push_back(Collect(**s));
        }
        for (const Collected& c : out) CheckCollected(c);
        *stats = WaitSparseIdle(engine);
        engine.Stop();
        return out;
      };
      EngineStats off_stats, on_stats;
      const std::vector<Collected> off = run(false, &off_stats), on = run(true, &on_stats);
      std::vector<EngineRequest> both = reqs;
      both.insert(both.end(), reqs.begin(), reqs.end());
      if (h.pressure) {  // K >= blocks: exact, so both equal plain dense decoding
        std::vector<EngineRequest> again = reqs;
        for (EngineRequest& q : again) q.id += "-again";
        std::vector<Collected> dense = DenseOutputs(reqs), dense_again = DenseOutputs(again);
        dense.insert(dense.end(), dense_again.begin(), dense_again.end());
        CheckSameOutputs(both, off, dense);
        CheckSameOutputs(both, on, dense);
        CHECK(on_stats.sparse.in_place_switches_total + on_stats.sparse.moves_total > 0);
      } else {
        CheckSameOutputs(both, on, off);
      }
      CHECK(on_stats.sparse.switches_total > 0);
      CHECK(on_stats.kv.prefix_cache_hits_total >= 9 * 112);  // round 1: the system prompt's 7 blocks
      int64_t again = 0;
      for (size_t i = reqs.size(); i < on.size(); ++i) again += on[i].cached_tokens > 112 ? 1 : 0;
      if (!h.pressure) CHECK(again > 0);  // round 2 hit blocks past the system prompt
      if (h.home == KvHome::kHbm) CHECK(on_stats.sparse.in_place_switches_total > 0);
      if (h.pressure) CHECK(on_stats.sparse.pressure_switches_total + on_stats.sparse.in_place_switches_total > 0);
      if (h.home == KvHome::kHost) {
        // One host store: round 1's switches left their dense blocks' host slots cached; round
        // 2's switches took them instead of copying and summarising those blocks again.
        CHECK(on_stats.sparse.host_prefix_given_blocks_total > 0);
        CHECK(on_stats.sparse.host_prefix_adopted_blocks_total > 0);
        CHECK(off_stats.sparse.host_prefix_adopted_blocks_total == 0);
      }
      CHECK(on_stats.kv.num_free_slots == on_stats.kv.num_slots);
      CHECK(on_stats.sparse.num_free_host_kv_slots == on_stats.sparse.num_host_kv_slots);
    }
  }
}

// The adaptive draft-chain depth (--speculative-depth adaptive, docs/lookahead.md "Adaptive
// depth") through the engine on the CPU backend: a target and heads whose drafts are never /
// always right by construction, step costs made GPU-like by a fixed wait per target and head
// step. Adaptive settles at depth 1 when nothing is accepted while fixed k = 3 always proposes
// 3, uses the full k when every draft is right, and — like every depth — leaves the output
// equal to plain decoding (greedy and seeded sampling, dense here; sparse requests in
// test_sparse_engine). The controller as a unit: test_lookahead_depth.cpp.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <thread>

#include "engine/engine.h"
#include "engine/speculative_depth.h"
#include "lookahead_test_util.h"
#include "test_engine_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

// Makes tm's target repeat its input token greedily, exactly: every layer's output projections
// zeroed (the residual stream stays the token's embedding), unit-norm embedding rows (tied
// lm_head) and a unit final norm, so the logits e_v . e_x peak at v = x. Then the copy head
// (CopyHead(tm), built after this) proposes x again: its drafts are right by construction.
void MakeRepeatingTarget(TinyModel& tm, int64_t num_kv_slots) {
  auto w = std::make_unique<HostWeights>();
  for (const WeightSpec& spec : DecoderLM::ExpectedWeights(tm.config)) {
    const std::string& name = spec.name;
    if (!tm.weights->Has(name)) continue;  // (optional ones)
    auto t = tm.weights->Load(name, DType::kF32);
    INFO(name << ": " << t.status().ToString());
    REQUIRE(t.ok());
    Tensor x = std::move(*t);
    float* v = x.data<float>();
    const auto n = static_cast<size_t>(x.numel());
    if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) {
      std::fill(v, v + n, 0.0f);
    } else if (name == "model.norm.weight") {
      std::fill(v, v + n, 1.0f);
    } else if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      const auto H = static_cast<size_t>(x.dim(1));
      for (size_t r = 0; r < n / H; ++r) {
        double sq = 0;
        for (size_t i = 0; i < H; ++i) sq += v[r * H + i] * v[r * H + i];
        for (size_t i = 0; i < H; ++i) v[r * H + i] = static_cast<float>(v[r * H + i] / std::sqrt(sq));
      }
    }
    w->Set(name, std::move(x));
  }
  tm.runner.reset();
  auto m = DecoderLM::Create(tm.config, *w, tm.backend);
  REQUIRE(m.ok());
  tm.model = std::move(*m);
  tm.weights = std::move(w);
  tm.runner = std::make_unique<ModelRunner>(*tm.model, tm.backend, num_kv_slots);
}

// GPU-like step costs on the CPU: a fixed wait per target step (a decode step reads every
// weight whatever its few query rows) and per head step (its launches), so the step time
// grows with the chain depth by the head's chained steps (and the extra rows' compute).
class WaitingRunner final : public ModelRunner {
 public:
  WaitingRunner(DecoderLM& model, Backend& backend, int64_t slots, std::chrono::microseconds wait)
      : ModelRunner(model, backend, slots), wait_(wait) {}
  std::vector<SampleResult> Run(const StepInputs& step) override {
    std::this_thread::sleep_for(wait_);
    return ModelRunner::Run(step);
  }

 private:
  std::chrono::microseconds wait_;
};

// The head with a wait per step; `shift` != 0 adds it to every draft (mod the vocabulary), so
// that the copy head over the repeating target is never right.
class WaitingDraftRunner final : public DraftRunner {
 public:
  WaitingDraftRunner(Eagle3Head& head, Backend& backend, int64_t slots,
                     std::chrono::microseconds wait, int32_t shift, int32_t vocab)
      : DraftRunner(head, backend, slots), wait_(wait), shift_(shift), vocab_(vocab) {}
  std::vector<int32_t> Propose(const ForwardInput& in, const Tensor& aux,
                               std::span<const int32_t> aux_rows) override {
    std::this_thread::sleep_for(wait_);
    return Shift(DraftRunner::Propose(in, aux, aux_rows));
  }
  ChainStep ProposeWithFeatures(const ForwardInput& in, const Tensor& aux,
                                std::span<const int32_t> aux_rows) override {
    std::this_thread::sleep_for(wait_);
    ChainStep s = DraftRunner::ProposeWithFeatures(in, aux, aux_rows);
    s.drafts = Shift(std::move(s.drafts));
    return s;
  }
  ChainStep ProposeFromFeatures(const ForwardInput& in, const Tensor& features,
                                std::span<const int32_t> rows) override {
    std::this_thread::sleep_for(wait_);
    ChainStep s = DraftRunner::ProposeFromFeatures(in, features, rows);
    s.drafts = Shift(std::move(s.drafts));
    return s;
  }

 private:
  std::vector<int32_t> Shift(std::vector<int32_t> drafts) const {
    for (int32_t& d : drafts) d = (d + shift_) % vocab_;
    return drafts;
  }
  std::chrono::microseconds wait_;
  int32_t shift_, vocab_;
};

struct DepthRun {
  std::vector<Collected> out;
  EngineStats stats;
};

DepthRun RunRequests(ModelRunner& runner, DraftRunner* draft, EngineOptions opt,
                     const std::vector<EngineRequest>& reqs) {
  Engine engine(runner, nullptr, opt, draft);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& q : reqs) {
    auto s = engine.Submit(q);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  engine.Start();
  DepthRun r;
  for (const auto& s : streams) r.out.push_back(Drain(*s));
  r.stats = WaitIdle(engine);
  engine.Stop();
  return r;
}

int64_t DepthSteps(const EngineStats& st) {
  const auto& d = st.lookahead.depth_steps_total;
  return std::accumulate(d.begin(), d.end(), int64_t{0});
}

// Four greedy requests decoding `tokens` each on the repeating target, with the copy head
// shifted by `shift` (0: every draft right; 1: none), a wait per target step (default 3 ms) and
// per head step (default 1 ms); speculate k = 3, fixed or adaptive. Plain decoding's tokens to
// compare with.
DepthRun RunRepeating(int32_t shift, SpeculativeDepth depth, int64_t tokens,
                      std::chrono::microseconds target_wait = std::chrono::microseconds(3000),
                      std::chrono::microseconds head_wait = std::chrono::microseconds(1000)) {
  constexpr int64_t kSlots = 512;
  TinyModel tm(kSlots);
  MakeRepeatingTarget(tm, kSlots);
  auto head = CopyHead(tm);
  const int64_t head_slots = DraftKvSlotsFor(kSlots, tm.config.num_key_value_heads,
                                             head->config().num_key_value_heads);
  WaitingRunner runner(*tm.model, tm.backend, kSlots, target_wait);
  WaitingDraftRunner draft(*head, tm.backend, head_slots, head_wait, shift,
                           static_cast<int32_t>(tm.config.vocab_size));
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = Request("r" + std::to_string(i), {11, 12, 20 + 7 * i}, tokens);
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  EngineOptions opt;
  opt.lookahead = LookaheadMode::kSpeculate;
  opt.num_speculative_tokens = 3;
  opt.speculative_depth = depth;
  DepthRun run = RunRequests(runner, &draft, opt, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    // The target repeats the last prompt token: plain decoding's output, known exactly.
    CHECK(run.out[i].tokens == std::vector<int32_t>(static_cast<size_t>(tokens), 20 + 7 * static_cast<int32_t>(i)));
  }
  CHECK(run.stats.kv.num_free_draft_slots == run.stats.kv.num_draft_slots);
  return run;
}

}  // namespace

TEST_CASE("adaptive depth settles at 1 when no draft is accepted while fixed k = 3 always drafts 3",
          "[engine][lookahead][depth]") {
  const DepthRun fixed = RunRepeating(1, SpeculativeDepth::kFixed, 150);
  const DepthRun adaptive = RunRepeating(1, SpeculativeDepth::kAdaptive, 150);
  const EngineStats::Lookahead &f = fixed.stats.lookahead, &a = adaptive.stats.lookahead;
  CHECK(f.draft_accepted_total == 0);
  CHECK(a.draft_accepted_total == 0);
  REQUIRE(DepthSteps(fixed.stats) > 100);
  CHECK(f.depth_steps_total[2] == DepthSteps(fixed.stats));
  CHECK(f.depth_explorations_total == 0);
  CHECK(f.depth == 3);
  const int64_t n = DepthSteps(adaptive.stats);
  REQUIRE(n > 100);
  INFO("adaptive depths " << a.depth_steps_total[0] << " " << a.depth_steps_total[1] << " "
                          << a.depth_steps_total[2] << " " << a.depth_steps_total[3]);
  // The choice follows measured step times: on a loaded 2-core CI machine noisy times kept it
  // at depth 2-3 for 28% of the steps once (0.8 failed there); most steps at depth 1 still
  // shows it settled (a controller that never settles spends ~1/3 at each depth).
  CHECK(a.depth_steps_total[0] >= 0.6 * static_cast<double>(n));
  CHECK(a.depth_steps_total[1] + a.depth_steps_total[2] > 0);  // explored
  CHECK(a.depth_steps_total[3] == 0);                          // never past k
  CHECK(a.depth_explorations_total > 0);
  CHECK(a.depth_explorations_total <= a.depth_steps_total[1] + a.depth_steps_total[2]);
  // Far fewer drafts proposed (and stacked) for the same tokens, and less time per step.
  CHECK(a.draft_tokens_proposed_total < f.draft_tokens_proposed_total / 2);
  CHECK(adaptive.stats.loop.decode_step_seconds_total / adaptive.stats.loop.decode_steps_total <
        fixed.stats.loop.decode_step_seconds_total / fixed.stats.loop.decode_steps_total);
}

TEST_CASE("adaptive depth uses the full k when every draft is accepted", "[engine][lookahead][depth]") {
  // A step dominated by the target (10 ms) and a cheap head step (0.3 ms), as an 8B model's
  // decode on a GPU: depth 3 is worth ~30% more tokens per second than depth 2. On the CPU
  // the verify rows' compute grows with the depth, so with 3 ms / 1 ms a loaded 2-core CI
  // machine left depth 3 only a few percent ahead, and its noise once kept the controller at 2.
  const DepthRun adaptive = RunRepeating(0, SpeculativeDepth::kAdaptive, 400,
                                         std::chrono::microseconds(10000),
                                         std::chrono::microseconds(300));
  const EngineStats::Lookahead& a = adaptive.stats.lookahead;
  CHECK(a.draft_accepted_total == a.draft_tokens_total);
  const int64_t n = DepthSteps(adaptive.stats);
  REQUIRE(n > 60);
  INFO("adaptive depths " << a.depth_steps_total[0] << " " << a.depth_steps_total[1] << " "
                          << a.depth_steps_total[2]);
  CHECK(a.depth_steps_total[2] >= 0.75 * static_cast<double>(n));
  CHECK(a.tokens_per_step() > 3.0);
}

namespace {

// 20 requests: prompts of 1..60 ids, 1..40 new tokens; a third seeded sampling at temperatures
// where the draws vary; some honour EOS, some have stop ids, min_tokens or logprobs.
std::vector<EngineRequest> MixedWorkload(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 60);
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 500);
    EngineRequest r = Request("req-" + std::to_string(i), std::move(prompt), 1 + static_cast<int64_t>(rng() % 40));
    r.ignore_eos = i % 4 != 0;
    if (i % 3 == 1) {
      r.sampling.temperature = i % 2 == 0 ? 2.0f : 8.0f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    }
    if (i % 5 == 0) r.num_top_logprobs = 2;
    if (i % 7 == 3) r.stop_token_ids = {static_cast<int32_t>(3 + rng() % 500), r.prompt.back()};
    if (i % 6 == 5) r.min_tokens = std::min<int64_t>(r.max_tokens, 3);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

}  // namespace

// Whatever depths the controller picks (here made to change often: an exploration every
// other step), the tokens, logprobs and finish reasons are plain decoding's.
TEST_CASE("adaptive depth keeps plain decoding's outputs", "[engine][lookahead][depth]") {
  const std::vector<EngineRequest> reqs = MixedWorkload(21);
  std::vector<Collected> plain;
  {
    TinyModel tm(512);
    plain = RunRequests(*tm.runner, nullptr, {}, reqs).out;
  }
  struct Config {
    const char* name;
    int64_t slots, budget, max_seqs, k;
    bool copy_head;
  };
  const Config configs[] = {
      {"roomy, copy head, k 4", 512, 2048, 256, 4, true},
      {"roomy, reference head, k 3", 512, 2048, 256, 3, false},
      {"small budget, copy head, k 3", 512, 20, 256, 3, true},
      {"small pool: preemptions, copy head, k 4", 28, 40, 16, 4, true},
  };
  for (const Config& cfg : configs) {
    DYNAMIC_SECTION(cfg.name) {
      TinyModel tm(cfg.slots);
      auto head = cfg.copy_head ? CopyHead(tm) : FixtureHead(tm);
      auto draft = MakeDraftRunner(tm, *head);
      EngineOptions opt;
      opt.lookahead = LookaheadMode::kSpeculate;
      opt.max_num_batched_tokens = cfg.budget;
      opt.max_num_seqs = cfg.max_seqs;
      opt.num_speculative_tokens = cfg.k;
      opt.speculative_depth = SpeculativeDepth::kAdaptive;
      opt.speculative_depth_rule.explore_interval = 2;
      REQUIRE(Engine::CheckOptions(opt, *tm.runner, draft.get()).ok());
      const DepthRun r = RunRequests(*tm.runner, draft.get(), opt, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO(reqs[i].id << " T " << reqs[i].sampling.temperature);
        CHECK(r.out[i].error.ok());
        CHECK(r.out[i].tokens == plain[i].tokens);
        CHECK(r.out[i].logprobs == plain[i].logprobs);
        CHECK(r.out[i].top_logprobs == plain[i].top_logprobs);
        CHECK(r.out[i].reason == plain[i].reason);
        CHECK(r.out[i].stop_reason == plain[i].stop_reason);
      }
      const EngineStats& st = r.stats;
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
      if (cfg.slots < 100) CHECK(st.requests.preemptions_total > 0);
      // Several depths were used, none past k; drafts by position stay consistent.
      int used = 0;
      for (size_t d = 0; d < kMaxDraftTokens; ++d) {
        used += st.lookahead.depth_steps_total[d] > 0 ? 1 : 0;
        if (static_cast<int64_t>(d) >= cfg.k) {
          CHECK(st.lookahead.depth_steps_total[d] == 0);
          CHECK(st.lookahead.position_drafts_total[d] == 0);
        }
        if (d > 0) CHECK(st.lookahead.position_drafts_total[d] <= st.lookahead.position_accepted_total[d - 1]);
      }
      CHECK(st.lookahead.depth_steps_total[static_cast<size_t>(cfg.k - 1)] > 0);  // the bound
      // With a 20-token budget most steps carry prefill chunks and the batch changes bucket
      // often: few buckets get their best depth measured, so the warm-up (the bound) is most
      // of the run and explorations are rare.
      if (cfg.budget >= 100) {
        CHECK(used >= 2);
        CHECK(st.lookahead.depth_explorations_total > 0);
      }
      CHECK(st.lookahead.tokens_total == st.lookahead.steps_total + st.lookahead.draft_accepted_total);
    }
  }
}

TEST_CASE("the adaptive depth's rule is checked", "[engine][lookahead][depth]") {
  TinyModel tm(64);
  auto head = CopyHead(tm);
  auto draft = MakeDraftRunner(tm, *head);
  EngineOptions opt;
  opt.lookahead = LookaheadMode::kSpeculate;
  opt.num_speculative_tokens = 3;
  opt.speculative_depth = SpeculativeDepth::kAdaptive;
  CHECK(Engine::CheckOptions(opt, *tm.runner, draft.get()).ok());
  opt.speculative_depth_rule.explore_interval = 0;
  const Status st = Engine::CheckOptions(opt, *tm.runner, draft.get());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("explore_interval") != std::string::npos);
  opt.speculative_depth = SpeculativeDepth::kFixed;  // the rule only matters when adaptive
  CHECK(Engine::CheckOptions(opt, *tm.runner, draft.get()).ok());
}

// TpModelRunner over CPU-reference ranks (CreateCpuTpRunner): the runner the engine sees
// under tensor parallelism must reproduce TP=1, for rank-local tables (what the engine
// builds from model().config()) and for whole-model tables sliced per rank; it rejects
// batches with another head count and checks sizes before loading anything.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "runner/batch_builder.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "kvcache/host_prefix_tier.h"
#include "loader/weights.h"
#include "runner/tp/cpu_tp_runner.h"
#include "parallel/thread_communicator.h"
#include "fixture_model.h"
#include "test_support.h"

using namespace oasis;

namespace {

using Checkpoint = testing::FixtureCheckpoint;
constexpr auto Open = testing::OpenFixtureModel;
using testing::NormalizedError;

std::unique_ptr<TpModelRunner> MakeTp(const Checkpoint& ck, int size, int64_t slots) {
  auto runner = CreateCpuTpRunner(ck.config, {.size = size, .threads_per_rank = 1, .num_kv_slots = slots},
                                  [&](Backend& backend, const TensorParallel& tp) {
                                    return DecoderLM::Create(ck.config, *ck.weights, backend, tp);
                                  });
  REQUIRE(runner.ok());
  return std::move(*runner);
}

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 300, 11};

// Submits `prompts` one after another (6 tokens each, ignoring EOS; temperature `temperature(i)`,
// seed `seed(i)`), returning each one's tokens and cached prompt tokens, then waits for every
// block to be back and returns the engine's stats.
struct InTurn {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> cached;
  EngineStats stats;
};
InTurn RunInTurn(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                 const std::function<float(size_t)>& temperature, const std::function<uint64_t(size_t)>& seed,
                 const std::string& id_prefix) {
  InTurn out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.id = id_prefix + std::to_string(i);
    r.prompt = prompts[i];
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.detokenize = false;
    r.sampling.temperature = temperature(i);
    r.sampling.seed = seed(i);
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    std::vector<int32_t> got;
    int64_t cached = -1;
    while (auto ev = (*s)->Next(std::chrono::seconds(60))) {
      for (const GeneratedToken& g : ev->tokens) got.push_back(g.token);
      if (ev->finished) {
        cached = ev->cached_tokens;
        break;
      }
    }
    out.tokens.push_back(got);
    out.cached.push_back(cached);
  }
  out.stats = engine.Stats();
  for (int i = 0; i < 200 && out.stats.kv.num_free_slots != out.stats.kv.num_slots; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    out.stats = engine.Stats();
  }
  return out;
}

}  // namespace

TEST_CASE("SliceKvHeads takes each rank's columns of the head-level batch", "[parallel]") {
  BlockAllocator allocator(256);
  HeadBlockTable a(4), b(4);
  REQUIRE(a.Reserve(40, allocator).ok());
  REQUIRE(b.Reserve(7, allocator).ok());
  const ForwardInput in = BuildHostForwardInput(
      {StepSequence{&a, 0, std::vector<int32_t>(40, 3)}, StepSequence{&b, 0, std::vector<int32_t>(7, 5)}},
      LogitsFor::kLastTokenOfEachSequence);
  const ForwardInput half = SliceKvHeads(in, 2, 2);
  const int64_t W = in.attention.block_tables.dim(2);
  REQUIRE(half.attention.block_tables.shape() == std::vector<int64_t>{2, 2, W});
  REQUIRE(half.slot_mapping.shape() == std::vector<int64_t>{47, 2});
  REQUIRE(half.attention.kv_lens.shape() == std::vector<int64_t>{2, 2});
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t h = 0; h < 2; ++h) {
      CHECK(half.attention.kv_lens.data<int32_t>()[s * 2 + h] == in.attention.kv_lens.data<int32_t>()[s * 4 + 2 + h]);
      for (int64_t w = 0; w < W; ++w) {
        CHECK(half.attention.block_tables.data<int32_t>()[(s * 2 + h) * W + w] ==
              in.attention.block_tables.data<int32_t>()[(s * 4 + 2 + h) * W + w]);
      }
    }
  }
  for (int64_t t = 0; t < 47; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      CHECK(half.slot_mapping.data<int64_t>()[t * 2 + h] == in.slot_mapping.data<int64_t>()[t * 4 + 2 + h]);
    }
  }
  CHECK(half.token_ids.raw() == in.token_ids.raw());  // shared, not copied
  CHECK(half.attention.max_kv_len == in.attention.max_kv_len);
  a.Release(allocator);
  b.Release(allocator);
}

TEST_CASE("CheckTensorParallelSize names what does not divide", "[parallel]") {
  Checkpoint ck = Open("qwen3-tiny");  // 4 query heads, 2 KV heads
  CHECK(CheckTensorParallelSize(ck.config, 1).ok());
  CHECK(CheckTensorParallelSize(ck.config, 2).ok());
  const Status three = CheckTensorParallelSize(ck.config, 3);
  CHECK(three.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(three.message(), Catch::Contains("num_attention_heads") && Catch::Contains("--tensor-parallel-size 3"));
  const Status four = CheckTensorParallelSize(ck.config, 4);
  CHECK_THAT(four.message(), Catch::Contains("num_key_value_heads"));
  CHECK(CheckTensorParallelSize(ck.config, 0).code() == StatusCode::kInvalidArgument);
  auto bad = CreateCpuTpRunner(ck.config, {.size = 3, .num_kv_slots = 64},
                               [](Backend&, const TensorParallel&) -> StatusOr<std::unique_ptr<DecoderLM>> {
                                 FAIL("nothing is loaded for a size that does not divide");
                                 return Internal("unreachable");
                               });
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("TpModelRunner (TP=2 on CPU ranks) equals TP=1", "[parallel][models]") {
  for (const char* name : {"qwen3-tiny", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    DYNAMIC_SECTION(name) {
      Checkpoint ck = Open(name);
      CpuBackend backend(1);
      auto single = DecoderLM::Create(ck.config, *ck.weights, backend);
      REQUIRE(single.ok());
      ModelRunner one(**single, backend, 256);
      auto tp = MakeTp(ck, 2, 256);
      REQUIRE(tp->size() == 2);
      CHECK(tp->model().config().num_key_value_heads == ck.config.num_key_value_heads / 2);
      CHECK(tp->model().full_config().num_key_value_heads == ck.config.num_key_value_heads);
      CHECK(tp->num_kv_slots() == 256);
      CHECK(tp->kv_pools().empty());  // the ranks hold the pools
      CHECK(tp->sparse_stage_sync() == nullptr);

      // Rank-local tables (the engine's view): prefill in one step, then one token per step.
      for (int64_t chunk : {512, 1}) {
        INFO("prefill chunk " << chunk);
        Generator g1(one, {.max_step_tokens = chunk});
        Generator g2(*tp, {.max_step_tokens = chunk});
        auto want = g1.PromptLogits(kPrompt);
        auto got = g2.PromptLogits(kPrompt);
        REQUIRE(want.ok());
        REQUIRE(got.ok());
        CHECK(NormalizedError(*got, *want) <= 1e-5);
      }
      GenerationRequest req;
      req.prompt = kPrompt;
      req.max_tokens = 12;
      req.ignore_eos = true;
      req.sampling.temperature = 0;
      GenerationRequest sampled = req;
      sampled.sampling.temperature = 0.9f;
      sampled.sampling.seed = 7;
      Generator g1(one, {.max_step_tokens = 512});
      Generator g2(*tp, {.max_step_tokens = 512});
      auto want = g1.Generate({req, sampled});
      auto got = g2.Generate({req, sampled});
      REQUIRE(want.ok());
      REQUIRE(got.ok());
      CHECK((*got)[0].tokens == (*want)[0].tokens);
      CHECK((*got)[1].tokens == (*want)[1].tokens);  // same seeds, same logits (1e-5)
      CHECK(tp->sample_mismatches() == 0);

      // Whole-model tables: each rank receives its own heads' columns.
      BlockAllocator allocator(256);
      HeadBlockTable table(static_cast<int32_t>(ck.config.num_key_value_heads));
      REQUIRE(table.Reserve(static_cast<int64_t>(kPrompt.size()), allocator).ok());
      const ForwardInput whole = BuildHostForwardInput({StepSequence{&table, 0, kPrompt}}, LogitsFor::kEveryToken);
      const Tensor a = one.Execute(whole);
      const Tensor b = tp->Execute(whole);
      CHECK(NormalizedError(b, a) <= 1e-5);
      table.Release(allocator);
    }
  }
}

TEST_CASE("TpModelRunner rejects a batch with another KV head count", "[parallel]") {
  Checkpoint ck = Open("qwen3-tiny");  // 2 KV heads: 1 per rank
  auto tp = MakeTp(ck, 2, 64);
  BlockAllocator allocator(64);
  HeadBlockTable table(3);
  REQUIRE(table.Reserve(4, allocator).ok());
  const ForwardInput in = BuildHostForwardInput({StepSequence{&table, 0, {1, 2, 3, 4}}}, LogitsFor::kLastTokenOfEachSequence);
  CHECK_THROWS_AS(tp->Execute(in), std::invalid_argument);
  // The group is still usable: that batch never reached the ranks.
  HeadBlockTable ok_table(1);
  REQUIRE(ok_table.Reserve(4, allocator).ok());
  const ForwardInput ok = BuildHostForwardInput({StepSequence{&ok_table, 0, {1, 2, 3, 4}}}, LogitsFor::kLastTokenOfEachSequence);
  CHECK(tp->Execute(ok).shape() == std::vector<int64_t>{1, ck.config.vocab_size});
  table.Release(allocator);
  ok_table.Release(allocator);
}

namespace {

// Stands for a collective a rank waits in until its peer joins or the group is aborted.
struct AbortGate {
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  void Abort() {
    std::lock_guard<std::mutex> lock(mu);
    aborted = true;
    cv.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return aborted; });
  }
};

// Rank 1's step fails; rank 0's waits for a peer that never comes, until aborted.
class FailingRunner final : public ModelRunner {
 public:
  FailingRunner(DecoderLM& m, Backend& b, int rank, AbortGate& gate) : ModelRunner(m, b, 16), rank_(rank), gate_(gate) {}
  std::vector<SampleResult> Run(const StepInputs& step) override {
    if (rank_ == 1) throw std::runtime_error("device lost on purpose");
    gate_.Wait();
    return std::vector<SampleResult>(step.rows.size());
  }

 private:
  int rank_;
  AbortGate& gate_;
};

class FailingRank final : public TpRank {
 public:
  FailingRank(const ModelConfig& config, int rank, Communicator& comm) : gate_(std::make_shared<AbortGate>()) {
    auto m = DecoderLM::CreateDummy(config, backend_, 3, TensorParallel{rank, 2, &comm});
    REQUIRE(m.ok());
    model_ = std::move(*m);
    runner_ = std::make_unique<FailingRunner>(*model_, backend_, rank, *gate_);
  }
  Backend& backend() override { return backend_; }
  DecoderLM& model() override { return *model_; }
  ModelRunner& runner() override { return *runner_; }
  std::function<void()> AbortFunction() override {
    return [g = gate_] { g->Abort(); };
  }

 private:
  std::shared_ptr<AbortGate> gate_;
  CpuBackend backend_{1};
  std::unique_ptr<DecoderLM> model_;
  std::unique_ptr<FailingRunner> runner_;
};

}  // namespace

TEST_CASE("TpModelRunner: a failing rank fails the call, aborts the waiting rank, and the group stays failed",
          "[parallel]") {
  Checkpoint ck = Open("qwen3-tiny");
  ThreadCommGroup comms(2);
  std::vector<std::unique_ptr<TpRank>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<FailingRank>(ck.config, r, comms.rank(r)));
  auto tp = TpModelRunner::Create(std::make_unique<LockstepGroup>(2, nullptr, nullptr), std::move(ranks));
  REQUIRE(tp.ok());
  BlockAllocator allocator(16);
  HeadBlockTable table(1);
  REQUIRE(table.Reserve(4, allocator).ok());
  const ForwardInput in = BuildHostForwardInput({StepSequence{&table, 0, {1, 2, 3, 4}}}, LogitsFor::kLastTokenOfEachSequence);
  try {
    (*tp)->Run({.input = in, .rows = std::vector<SampleRow>(1)});
    FAIL("the rank's failure did not reach the caller");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 1") && Catch::Contains("device lost on purpose"));
  }
  CHECK_THROWS_WITH((*tp)->Run({.input = in, .rows = std::vector<SampleRow>(1)}), Catch::Contains("unusable"));
  table.Release(allocator);
  tp->reset();  // tears the ranks down on their threads even after the failure
}

TEST_CASE("TpModelRunner::Create checks the ranks it is given", "[parallel]") {
  Checkpoint ck = Open("qwen3-tiny");
  ThreadCommGroup comms(2);
  std::vector<std::unique_ptr<TpRank>> one;
  one.push_back(std::make_unique<FailingRank>(ck.config, 0, comms.rank(0)));
  auto missing = TpModelRunner::Create(std::make_unique<LockstepGroup>(2, nullptr, nullptr), std::move(one));
  CHECK(missing.status().code() == StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<TpRank>> swapped;
  swapped.push_back(std::make_unique<FailingRank>(ck.config, 1, comms.rank(1)));
  swapped.push_back(std::make_unique<FailingRank>(ck.config, 0, comms.rank(0)));
  auto wrong = TpModelRunner::Create(std::make_unique<LockstepGroup>(2, nullptr, nullptr), std::move(swapped));
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(wrong.status().message(), Catch::Contains("rank 0 holds shard 1 of 2"));
}

// Prompt logprobs through the engine on TP=2 CPU ranks (each rank's runner fills the ranks of
// the rows from its own full logits): the same as TP=1, chunked prefill included.
TEST_CASE("prompt logprobs on TP=2 CPU ranks equal TP=1", "[parallel][engine]") {
  Checkpoint ck = Open("qwen3-tiny");
  CpuBackend backend(1);
  auto single = DecoderLM::Create(ck.config, *ck.weights, backend);
  REQUIRE(single.ok());
  ModelRunner one(**single, backend, 256);
  auto tp = MakeTp(ck, 2, 256);
  auto run = [&](ModelRunner& runner) {
    EngineOptions o;
    o.max_num_batched_tokens = 5;  // the 13-token prompt in 3 chunks
    Engine engine(runner, nullptr, o);
    engine.Start();
    EngineRequest r;
    r.id = "plp";
    r.prompt = kPrompt;
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.detokenize = false;
    r.prompt_logprobs = 4;
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    std::vector<PromptTokenLogprob> got;
    while (auto ev = (*s)->Next(std::chrono::seconds(60))) {
      if (!ev->prompt_logprobs.empty()) got = ev->prompt_logprobs;
      if (ev->finished) break;
    }
    engine.Stop();
    return got;
  };
  const std::vector<PromptTokenLogprob> want = run(one), got = run(*tp);
  REQUIRE(want.size() == kPrompt.size() - 1);
  REQUIRE(got.size() == want.size());
  for (size_t p = 0; p < got.size(); ++p) {
    INFO("prompt position " << p + 1);
    CHECK(got[p].token == kPrompt[p + 1]);
    CHECK(got[p].logprob == Approx(want[p].logprob).margin(1e-4));
    CHECK(got[p].rank == want[p].rank);
    REQUIRE(got[p].top_logprobs.size() == 4);
    for (size_t k = 0; k < 4; ++k) CHECK(got[p].top_logprobs[k].token == want[p].top_logprobs[k].token);
  }
}

// Prefix caching under TP (issue 33): the block allocator is shared logically (one slot id
// names the same block on every rank), so a cached entry holds every rank's heads of that
// position and a hit adopts them on all ranks at once. With caching on, TP=2 answers exactly
// as TP=2 without it, the later requests reuse the earlier ones' blocks, and every slot is
// back in the pool.
TEST_CASE("prefix caching on TP=2 CPU ranks equals no caching", "[parallel][engine][prefix]") {
  Checkpoint ck = Open("qwen3-tiny");
  std::mt19937_64 rng(2033);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 400);
    return t;
  };
  const std::vector<int32_t> system = tokens(40);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = system;
    const auto own = tokens(3 + rng() % 30);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(std::move(p));
  }
  prompts.push_back(prompts[2]);  // a repeat: every full block of it is cached
  auto run = [&](bool caching) {
    auto tp = MakeTp(ck, 2, 256);
    EngineOptions o;
    o.enable_prefix_caching = caching;
    o.max_num_batched_tokens = 24;  // chunked prefill across the cached boundary
    REQUIRE(Engine::CheckOptions(o, *tp, nullptr).ok());
    Engine engine(*tp, nullptr, o);
    engine.Start();
    InTurn out = RunInTurn(
        engine, prompts, [](size_t i) { return i % 2 == 0 ? 0.0f : 5.0f; },
        [](size_t i) { return 70 + static_cast<uint64_t>(i); }, "tp");
    engine.Stop();
    return out;
  };
  const InTurn off = run(false), on = run(true);
  REQUIRE(on.tokens.size() == off.tokens.size());
  for (size_t i = 0; i < on.tokens.size(); ++i) {
    INFO("request " << i);
    CHECK(on.tokens[i].size() == 6);
    CHECK(on.tokens[i] == off.tokens[i]);
    CHECK(off.cached[i] == 0);
    CHECK(on.cached[i] == (i == 0 ? 0 : i + 1 == prompts.size()
                                            ? static_cast<int64_t>(prompts[i].size() - 1) / 16 * 16
                                            : 32));
  }
  CHECK(on.stats.kv.prefix_cache_hits_total > 0);
  CHECK(on.stats.kv.num_free_slots == on.stats.kv.num_slots);
  CHECK(off.stats.kv.num_free_slots == off.stats.kv.num_slots);
}

TEST_CASE("the prefix cache's host tier on TP=2 CPU ranks: evicted blocks come back",
          "[parallel][engine][prefix][host]") {
  // 24 slots (blocks of one local head per rank): "b" evicts what "a" left cached; "a2" (= "a"
  // + a question) reloads it from every rank's host pool.
  Checkpoint ck = Open("qwen3-tiny");
  std::mt19937_64 rng(91);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 400);
    return t;
  };
  const std::vector<int32_t> a = tokens(170), b = tokens(330);
  std::vector<int32_t> a2 = a;
  for (int32_t t : tokens(21)) a2.push_back(t);
  const std::vector<std::vector<int32_t>> prompts = {a, b, a2};
  auto run = [&](bool caching, double tier_blocks) {
    auto tp = MakeTp(ck, 2, 24);
    EngineOptions o;
    o.enable_prefix_caching = caching;
    o.max_num_batched_tokens = 64;
    const ModelConfig& c = tp->model().config();  // one rank's heads
    o.prefix_cache_host_bytes =
        tier_blocks * static_cast<double>(HostPrefixTier::BytesPerSlot(c.num_hidden_layers, c.head_dim,
                                                                       tp->backend().activation_dtype()) *
                                          static_cast<size_t>(c.num_key_value_heads) * 2);
    REQUIRE(Engine::CheckOptions(o, *tp, nullptr).ok());
    Engine engine(*tp, nullptr, o);
    engine.Start();
    InTurn out = RunInTurn(
        engine, prompts, [](size_t i) { return i == 2 ? 5.0f : 0.0f; }, [](size_t) { return uint64_t{3}; },
        "h");
    engine.Stop();
    return out;
  };
  const InTurn off = run(false, 0), gpu = run(true, 0), host = run(true, 32);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(gpu.tokens[i] == off.tokens[i]);
    CHECK(host.tokens[i] == off.tokens[i]);
  }
  CHECK(gpu.cached[2] < 160);
  CHECK(host.cached[2] == 160);
  CHECK(host.stats.kv.prefix_cache_host_hits_total == 160 - gpu.cached[2]);
  CHECK(host.stats.kv.prefix_cache_host_capacity_blocks == 32);
  CHECK(host.stats.kv.num_free_slots == host.stats.kv.num_slots);
}

// Qwen3-MoE under tensor parallelism on the CPU reference: every expert split along its
// intermediate size (gate/up rows, down columns), the router replicated, the experts' partial
// outputs all-reduced. TP=2 ranks must reproduce TP=1: DecoderLM shards joined by a
// ThreadCommunicator, and the engine over CreateCpuTpRunner (what oasis-server --backend cpu
// --tensor-parallel-size 2 runs).
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "models/decoder_lm.h"
#include "moe_checkpoint.h"
#include "parallel/thread_communicator.h"
#include "runner/model_runner.h"
#include "runner/tp/cpu_tp_runner.h"
#include "test_support.h"

using namespace oasis;
using testing::TinyMoeOptions;

namespace {

struct Loaded {
  testing::TinyMoeCheckpoint ck;
  testing::FixtureCheckpoint files;
};

Loaded WriteAndOpen(const std::string& tag, const TinyMoeOptions& o) {
  const auto dir = testing::MakeTempDir(tag);
  testing::TinyMoeCheckpoint ck = testing::WriteTinyMoe(dir, o);
  Loaded loaded{std::move(ck), testing::OpenFixtureDir(dir)};
  std::filesystem::remove_all(dir);  // the files stay mapped until the weights go
  return loaded;
}

// Greedy tokens of `prompts` through an engine over `runner`, queued before it starts.
std::vector<std::vector<int32_t>> EngineGreedy(ModelRunner& runner,
                                               const std::vector<std::vector<int32_t>>& prompts) {
  EngineOptions opt;
  opt.max_num_batched_tokens = 16;  // chunked prefill next to decodes
  Engine engine(runner, nullptr, opt);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.id = "tp-" + std::to_string(i);
    r.prompt = prompts[i];
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.detokenize = false;
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  engine.Start();
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    std::vector<int32_t> tokens;
    while (true) {
      auto ev = s->Next(std::chrono::seconds(60));
      REQUIRE(ev.has_value());
      for (const GeneratedToken& t : ev->tokens) tokens.push_back(t.token);
      if (ev->finished) {
        REQUIRE(ev->error.ok());
        break;
      }
    }
    out.push_back(tokens);
  }
  engine.Stop();
  return out;
}

}  // namespace

TEST_CASE("MoE under TP=2 equals TP=1: experts split along their intermediate size",
          "[models][moe][parallel]") {
  TinyMoeOptions o;  // attention on, so the whole layer runs sharded
  o.mlp_only_layers = {1};
  Loaded m = WriteAndOpen("moe-tp", o);
  const std::vector<int32_t> prompt = {1, 17, 42, 9, 3, 25, 7, 7, 12, 60, 5, 30, 11};
  auto run = [&](DecoderLM& model, Backend& backend, Tensor* prefill, Tensor* decode,
                 std::vector<int32_t>* greedy) {
    Generator whole(model, backend, {.num_kv_slots = 64, .max_step_tokens = 512});
    auto p = whole.PromptLogits(prompt);
    Generator stepwise(model, backend, {.num_kv_slots = 64, .max_step_tokens = 1});
    auto d = stepwise.PromptLogits(prompt);
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 10;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    auto g = whole.Generate({r});
    if (!p.ok() || !d.ok() || !g.ok()) return false;
    *prefill = *p;
    *decode = *d;
    *greedy = (*g)[0].tokens;
    return true;
  };
  CpuBackend single_backend;
  auto single = DecoderLM::Create(m.files.config, *m.files.weights, single_backend);
  REQUIRE(single.ok());
  Tensor ref_prefill, ref_decode;
  std::vector<int32_t> ref_greedy;
  REQUIRE(run(**single, single_backend, &ref_prefill, &ref_decode, &ref_greedy));

  constexpr int kRanks = 2;
  ThreadCommGroup group(kRanks);
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<DecoderLM>> shards;
  for (int r = 0; r < kRanks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>(1));
    auto shard = DecoderLM::Create(m.files.config, *m.files.weights, *backends[r],
                                   {r, kRanks, &group.rank(r)});
    REQUIRE(shard.ok());
    CHECK((*shard)->config().moe_intermediate_size == o.moe_intermediate / kRanks);
    CHECK((*shard)->config().intermediate_size == o.intermediate / kRanks);
    shards.push_back(std::move(*shard));
  }
  Tensor prefill[kRanks], decode[kRanks];
  std::vector<int32_t> greedy[kRanks];
  bool ok[kRanks] = {false, false};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back(
        [&, r] { ok[r] = run(*shards[r], *backends[r], &prefill[r], &decode[r], &greedy[r]); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(ok[r]);
    CHECK(testing::NormalizedError(prefill[r], ref_prefill) <= 1e-5);
    CHECK(testing::NormalizedError(decode[r], ref_decode) <= 1e-5);
    CHECK(greedy[r] == ref_greedy);
  }

  // An expert intermediate size that does not split is refused, naming the field.
  TinyMoeOptions odd = o;
  odd.moe_intermediate = 15;
  Loaded bad = WriteAndOpen("moe-tp-odd", odd);
  ThreadCommGroup g2(2);
  CpuBackend b;
  auto refused = DecoderLM::Create(bad.files.config, *bad.files.weights, b, {0, 2, &g2.rank(0)});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("moe_intermediate_size = 15"));
}

TEST_CASE("MoE: the engine over CPU TP=2 ranks equals TP=1", "[models][moe][parallel][engine]") {
  TinyMoeOptions o;
  o.mlp_only_layers = {0};
  o.layout = testing::ExpertLayout::kSharded;
  Loaded m = WriteAndOpen("moe-tp-engine", o);
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9},
      {1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57},
      {1, 63, 2, 60}};
  CpuBackend backend(1);
  auto single = DecoderLM::Create(m.files.config, *m.files.weights, backend);
  REQUIRE(single.ok());
  ModelRunner one(**single, backend, 64);
  const auto want = EngineGreedy(one, prompts);
  auto tp =
      CreateCpuTpRunner(m.files.config, {.size = 2, .threads_per_rank = 1, .num_kv_slots = 64},
                        [&](Backend& b, const TensorParallel& t) {
                          return DecoderLM::Create(m.files.config, *m.files.weights, b, t);
                        });
  INFO(tp.status().ToString());
  REQUIRE(tp.ok());
  CHECK(EngineGreedy(**tp, prompts) == want);
}

// FP8 checkpoints end to end on the CPU reference: tests/fixtures/models/qwen3-tiny-fp8-cpu
// (qwen3-tiny converted by tools/convert_fp8_fixture.py with 48x24 blocks, which divide none
// of its dimensions) must give bit-identical logits and greedy tokens to its dequantized/ twin
// (the same model in F32 holding float32(e4m3 * scale_inv), computed by the script), alone and
// under TP=2; and stay close to the bf16 model it was quantized from.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "parallel/thread_communicator.h"
#include "test_support.h"

using namespace oasis;
using testing::FixtureCheckpoint;
using testing::OpenFixtureDir;

namespace {

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 300, 11, 400, 2};

std::filesystem::path Fp8Dir() { return testing::FixturePath("models/qwen3-tiny-fp8-cpu"); }

struct Outputs {
  Tensor prefill;  // [n, vocab]: the prompt in one step
  Tensor decode;   // [n, vocab]: one token per step
  std::vector<int32_t> greedy;
  Status status;
};

Outputs Run(DecoderLM& model, Backend& backend) {
  Outputs o;
  Generator whole(model, backend, {.num_kv_slots = 128, .max_step_tokens = 512});
  auto prefill = whole.PromptLogits(kPrompt);
  if (!prefill.ok()) return {.status = prefill.status()};
  o.prefill = *prefill;
  Generator stepwise(model, backend, {.num_kv_slots = 128, .max_step_tokens = 1});
  auto decode = stepwise.PromptLogits(kPrompt);
  if (!decode.ok()) return {.status = decode.status()};
  o.decode = *decode;
  GenerationRequest req;
  req.prompt = kPrompt;
  req.max_tokens = 16;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto out = whole.Generate({req});
  if (!out.ok()) return {.status = out.status()};
  o.greedy = (*out)[0].tokens;
  return o;
}

Outputs RunSingle(const FixtureCheckpoint& ck) {
  CpuBackend backend;
  auto model = DecoderLM::Create(ck.config, *ck.weights, backend);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  return Run(**model, backend);
}

// TP=2 on two threads; rank 0's outputs (every rank holds the same logits).
Outputs RunTp2(const FixtureCheckpoint& ck) {
  constexpr int kRanks = 2;
  ThreadCommGroup group(kRanks);
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<DecoderLM>> shards;
  for (int r = 0; r < kRanks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>());
    auto shard =
        DecoderLM::Create(ck.config, *ck.weights, *backends[r], {r, kRanks, &group.rank(r)});
    INFO(shard.status().ToString());
    REQUIRE(shard.ok());
    shards.push_back(std::move(*shard));
  }
  std::vector<Outputs> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] { results[r] = Run(*shards[r], *backends[r]); });
  for (auto& t : threads) t.join();
  for (const Outputs& o : results) REQUIRE(o.status.ok());
  return results[0];
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void CheckIdentical(const Outputs& got, const Outputs& want) {
  REQUIRE(got.status.ok());
  REQUIRE(want.status.ok());
  CHECK(BitEqual(got.prefill, want.prefill));
  CHECK(BitEqual(got.decode, want.decode));
  CHECK(got.greedy == want.greedy);
}

}  // namespace

TEST_CASE("FP8 fixture: config and weights as converted", "[models][fp8]") {
  FixtureCheckpoint fp8 = OpenFixtureDir(Fp8Dir());
  REQUIRE(fp8.config.quantization.fp8());
  CHECK(fp8.config.quantization.block_out == 48);
  CHECK(fp8.config.quantization.block_in == 24);
  auto q = fp8.weights->Info("model.layers.0.self_attn.q_proj.weight");
  REQUIRE(q.ok());
  CHECK(q->dtype == DType::kF8E4M3);
  auto s = fp8.weights->Info("model.layers.2.mlp.down_proj.weight_scale_inv");
  REQUIRE(s.ok());
  CHECK(s->dtype == DType::kBF16);  // the last layer's scales are BF16, the others F32
  CHECK(s->shape == std::vector<int64_t>{2, 7});  // [ceil(64 / 48), ceil(160 / 24)]
  FixtureCheckpoint ref = OpenFixtureDir(Fp8Dir() / "dequantized");
  CHECK_FALSE(ref.config.quantization.fp8());
}

TEST_CASE("FP8 checkpoint: logits bit-identical to its dequantized twin", "[models][fp8]") {
  const Outputs fp8 = RunSingle(OpenFixtureDir(Fp8Dir()));
  const Outputs ref = RunSingle(OpenFixtureDir(Fp8Dir() / "dequantized"));
  CheckIdentical(fp8, ref);
}

TEST_CASE("FP8 checkpoint under TP=2: slices take their scale blocks", "[models][fp8][parallel]") {
  // Column slices of 64 and 80 rows and row slices of 64 and 80 columns against 48x24 blocks:
  // no shard starts on a block boundary.
  const Outputs fp8 = RunTp2(OpenFixtureDir(Fp8Dir()));
  const Outputs ref = RunTp2(OpenFixtureDir(Fp8Dir() / "dequantized"));
  CheckIdentical(fp8, ref);
  const Outputs single = RunSingle(OpenFixtureDir(Fp8Dir()));
  CHECK(testing::NormalizedError(fp8.prefill, single.prefill) <= 1e-5);
  CHECK(fp8.greedy == single.greedy);
}

TEST_CASE("FP8 checkpoint: close to the bf16 model it was quantized from", "[models][fp8]") {
  const Outputs fp8 = RunSingle(OpenFixtureDir(Fp8Dir()));
  const Outputs bf16 = RunSingle(testing::OpenFixtureModel("qwen3-tiny"));
  const double err = testing::NormalizedError(fp8.prefill, bf16.prefill);
  INFO("normalized logit error of e4m3 weights: " << err);
  CHECK(err > 0);     // the weights did change
  CHECK(err <= 0.1);  // e4m3 keeps 3 mantissa bits: a few percent
}

TEST_CASE("FP8 weights without an fp8 quantization_config are refused", "[models][fp8]") {
  auto config = LoadModelConfig(Fp8Dir() / "dequantized");  // no quantization_config
  auto weights = OpenSafetensorsWeights(Fp8Dir());
  REQUIRE(config.ok());
  REQUIRE(weights.ok());
  CpuBackend backend;
  auto model = DecoderLM::Create(*config, **weights, backend);
  REQUIRE_FALSE(model.ok());
  CHECK(model.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(model.status().message(),
             Catch::Matchers::Contains("is F8_E4M3 but config.json declares no FP8 quantization"));
}

TEST_CASE("FP8 config with dummy weights (--load-format dummy)", "[models][fp8]") {
  auto config = LoadModelConfig(Fp8Dir());
  REQUIRE(config.ok());
  REQUIRE(config->quantization.fp8());
  CpuBackend backend;
  auto model = DecoderLM::CreateDummy(*config, backend, 7);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
  auto logits = gen.PromptLogits({1, 2, 3});
  REQUIRE(logits.ok());
  for (int64_t i = 0; i < logits->numel(); ++i) REQUIRE(std::isfinite(logits->data<float>()[i]));
}

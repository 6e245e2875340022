// FP8 checkpoints end to end on the CPU reference: tests/fixtures/models/qwen3-tiny-fp8-cpu
// (qwen3-tiny converted by tools/convert_fp8_fixture.py with 48x24 blocks, which divide none
// of its dimensions) must give bit-identical logits and greedy tokens to its dequantized/ twin
// (the same model in F32 holding float32(e4m3 * scale_inv), computed by the script), alone and
// under TP=2; and stay close to the bf16 model it was quantized from.
// Weights kept in e4m3 (docs/fp8.md "FP8 weights"): on tests/fixtures/models/qwen3-tiny-fp8
// (128x128 blocks, every dimension a multiple of 128) the model keeping every linear weight in
// e4m3 equals, bit for bit, the model dequantizing them at load (a CpuBackend whose
// Fp8WeightSupported is false), alone and under TP=2 (a mix: intermediate 192 per rank is off
// the blocks); and dummy weights of an FP8 config are e4m3.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "parallel/thread_communicator.h"
#include "safetensors_builder.h"
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

// `counts` (optional) receives how the model loaded its FP8 weights.
Outputs RunSingle(const FixtureCheckpoint& ck, CpuFp8Weights fp8 = CpuFp8Weights::kCompute,
                  Fp8WeightCounts* counts = nullptr) {
  CpuBackend backend(0, fp8);
  auto model = DecoderLM::Create(ck.config, *ck.weights, backend);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  if (counts != nullptr) *counts = (*model)->fp8_weights();
  return Run(**model, backend);
}

// TP=2 on two threads; rank 0's outputs (every rank holds the same logits) and load counts.
Outputs RunTp2(const FixtureCheckpoint& ck, CpuFp8Weights fp8 = CpuFp8Weights::kCompute,
               Fp8WeightCounts* counts = nullptr) {
  constexpr int kRanks = 2;
  ThreadCommGroup group(kRanks);
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<DecoderLM>> shards;
  for (int r = 0; r < kRanks; ++r) {
    backends.push_back(std::make_unique<CpuBackend>(0, fp8));
    auto shard =
        DecoderLM::Create(ck.config, *ck.weights, *backends[r], {r, kRanks, &group.rank(r)});
    INFO(shard.status().ToString());
    REQUIRE(shard.ok());
    if (counts != nullptr && r == 0) *counts = (*shard)->fp8_weights();
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
  // o_proj [64, 128] and down [64, 160] are whole tensors, so kept in e4m3 (with partial last
  // blocks); q|k|v and gate|up stack parts of 128 and 160 rows, off the 48-row blocks.
  Fp8WeightCounts counts;
  const Outputs fp8 = RunSingle(OpenFixtureDir(Fp8Dir()), CpuFp8Weights::kCompute, &counts);
  CHECK(counts.kept == 6);
  CHECK(counts.off_blocks == 6);
  CHECK(counts.unsupported + counts.not_fp8 + counts.expert_tensors == 0);
  const Outputs ref = RunSingle(OpenFixtureDir(Fp8Dir() / "dequantized"));
  CheckIdentical(fp8, ref);
  const Outputs dequantized = RunSingle(OpenFixtureDir(Fp8Dir()), CpuFp8Weights::kDequantizeAtLoad);
  CheckIdentical(dequantized, ref);
}

TEST_CASE("FP8 checkpoint under TP=2: slices take their scale blocks", "[models][fp8][parallel]") {
  // Column slices of 64 and 80 rows and row slices of 64 and 80 columns against 48x24 blocks:
  // no shard starts on a block boundary.
  Fp8WeightCounts counts;
  const Outputs fp8 = RunTp2(OpenFixtureDir(Fp8Dir()), CpuFp8Weights::kCompute, &counts);
  CHECK(counts.kept == 0);
  CHECK(counts.off_blocks == 12);
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
  // As from the checkpoint: o_proj and down in e4m3 (whole tensors), q|k|v and gate|up not.
  CHECK((*model)->fp8_weights().kept == 6);
  CHECK((*model)->fp8_weights().off_blocks == 6);
  CHECK((*model)->FindWeight("model.layers.0.self_attn.o_proj.weight")->dtype() == DType::kF8E4M3);
  Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
  auto logits = gen.PromptLogits({1, 2, 3});
  REQUIRE(logits.ok());
  for (int64_t i = 0; i < logits->numel(); ++i) REQUIRE(std::isfinite(logits->data<float>()[i]));
}

// ---- Weights kept in e4m3: tests/fixtures/models/qwen3-tiny-fp8 (128x128 blocks) ----

namespace {

std::filesystem::path Fp8AlignedDir() { return testing::FixturePath("models/qwen3-tiny-fp8"); }

// The fixture with its one KV head stored twice (k_proj / v_proj rows and scale rows
// repeated; num_key_value_heads 2), written to a temporary directory: the same function,
// shardable over two ranks (each owns a query head and a KV head of 128 rows).
FixtureCheckpoint TwoKvHeads() {
  FixtureCheckpoint src = OpenFixtureDir(Fp8AlignedDir());
  std::vector<testing::RawTensor> tensors;
  for (const std::string& name : src.weights->Names()) {
    auto info = src.weights->Info(name);
    auto bytes = src.weights->RawBytes(name);
    REQUIRE(info.ok());
    REQUIRE(bytes.ok());
    testing::RawTensor t{name, std::string(DTypeName(info->dtype)), info->shape,
                         std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size())};
    const bool kv = name.find("self_attn.k_proj.") != std::string::npos ||
                    name.find("self_attn.v_proj.") != std::string::npos;
    if (kv) {
      t.shape[0] *= 2;
      t.bytes += t.bytes;
    }
    tensors.push_back(std::move(t));
  }
  const auto dir = testing::MakeTempDir("fp8-two-kv-heads");
  testing::WriteBinaryFile(dir / "model.safetensors", testing::BuildSafetensors(tensors));
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  ModelConfig config = src.config;
  config.num_key_value_heads = 2;
  return FixtureCheckpoint{config, std::move(*weights)};
}

}  // namespace

TEST_CASE("FP8 weights kept in e4m3: bit-identical to dequantizing at load", "[models][fp8]") {
  FixtureCheckpoint ck = OpenFixtureDir(Fp8AlignedDir());
  REQUIRE(ck.config.quantization.block_out == 128);
  CpuBackend backend;
  auto model = DecoderLM::Create(ck.config, *ck.weights, backend);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  const Fp8WeightCounts& counts = (*model)->fp8_weights();
  CHECK(counts.kept == 8);  // qkv, o_proj, gate_up, down of 2 layers
  CHECK(counts.dequantized() + counts.not_fp8 == 0);
  // qkv [512, 256] + o [256, 256] + gate_up [768, 256] + down [256, 384] per layer, 1 byte
  // each, plus F32 scales [4, 2] + [2, 2] + [6, 2] + [2, 3].
  CHECK(counts.kept_bytes == 2 * ((512 + 256 + 768) * 256 + 256 * 384 + 4 * (8 + 4 + 12 + 6)));
  for (const char* name :
       {"model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"}) {
    INFO(name);
    const Tensor* w = (*model)->FindWeight(name);
    REQUIRE(w != nullptr);
    CHECK(w->dtype() == DType::kF8E4M3);
    REQUIRE(w->block_scales() != nullptr);
    CHECK(w->scale_block_rows() == 128);
    CHECK(w->scale_block_cols() == 128);
    CHECK(w->block_scales()->shape() == std::vector<int64_t>{2, (w->dim(1) + 127) / 128});
  }
  const Outputs kept = Run(**model, backend);

  Fp8WeightCounts dequantized_counts;
  const Outputs dequantized = RunSingle(ck, CpuFp8Weights::kDequantizeAtLoad, &dequantized_counts);
  CHECK(dequantized_counts.kept == 0);
  CHECK(dequantized_counts.unsupported == 8);
  CheckIdentical(kept, dequantized);
}

TEST_CASE("FP8 weights kept in e4m3 under TP=2: q|k|v and o_proj kept, the MLP dequantized",
          "[models][fp8][parallel]") {
  const FixtureCheckpoint ck = TwoKvHeads();
  // Per rank: q|k|v rows [128 | 128 | 128] and o_proj columns [128r, 128r + 128) are whole
  // blocks; gate/up rows and down columns [192r, 192r + 192) are not.
  Fp8WeightCounts counts;
  const Outputs tp = RunTp2(ck, CpuFp8Weights::kCompute, &counts);
  CHECK(counts.kept == 4);
  CHECK(counts.off_blocks == 4);
  CHECK(counts.unsupported + counts.not_fp8 == 0);
  Fp8WeightCounts dequantized_counts;
  const Outputs dequantized = RunTp2(ck, CpuFp8Weights::kDequantizeAtLoad, &dequantized_counts);
  CHECK(dequantized_counts.kept == 0);
  CHECK(dequantized_counts.unsupported == 4);
  CheckIdentical(tp, dequantized);
  // The same function as one rank, and as the fixture with its single KV head.
  const Outputs single = RunSingle(ck);
  CHECK(testing::NormalizedError(tp.prefill, single.prefill) <= 1e-5);
  CHECK(tp.greedy == single.greedy);
  const Outputs original = RunSingle(OpenFixtureDir(Fp8AlignedDir()));
  CHECK(testing::NormalizedError(single.prefill, original.prefill) <= 1e-6);
  CHECK(single.greedy == original.greedy);
}

TEST_CASE("FP8 dummy weights (--load-format dummy): e4m3 with block scales", "[models][fp8]") {
  auto config = LoadModelConfig(Fp8AlignedDir());
  REQUIRE(config.ok());
  REQUIRE(config->quantization.fp8());
  CpuBackend backend;
  auto model = DecoderLM::CreateDummy(*config, backend, 11);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  CHECK((*model)->fp8_weights().kept == 8);
  const Tensor* o = (*model)->FindWeight("model.layers.1.self_attn.o_proj.weight");
  REQUIRE(o != nullptr);
  REQUIRE(o->dtype() == DType::kF8E4M3);
  REQUIRE(o->block_scales() != nullptr);
  // Real weights about normal(0, 0.02); per-block scales differ (deterministic in the seed).
  double sum2 = 0;
  const Tensor& scales = *o->block_scales();
  for (int64_t r = 0; r < o->dim(0); ++r) {
    for (int64_t c = 0; c < o->dim(1); ++c) {
      const double w = Fp8E4M3ToFloat(o->data<uint8_t>()[r * o->dim(1) + c]) *
                       scales.data<float>()[(r / 128) * scales.dim(1) + c / 128];
      sum2 += w * w;
    }
  }
  const double stddev = std::sqrt(sum2 / static_cast<double>(o->numel()));
  INFO("stddev of the dummy o_proj " << stddev);
  CHECK(stddev > 0.015);
  CHECK(stddev < 0.025);
  CHECK(scales.data<float>()[0] != scales.data<float>()[1]);
  Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
  auto logits = gen.PromptLogits({1, 2, 3, 4, 5});
  REQUIRE(logits.ok());
  for (int64_t i = 0; i < logits->numel(); ++i) REQUIRE(std::isfinite(logits->data<float>()[i]));
  // Deterministic: the same seed gives the same logits.
  auto again = DecoderLM::CreateDummy(*config, backend, 11);
  REQUIRE(again.ok());
  Generator gen2(**again, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
  auto logits2 = gen2.PromptLogits({1, 2, 3, 4, 5});
  REQUIRE(logits2.ok());
  CHECK(BitEqual(*logits, *logits2));
}

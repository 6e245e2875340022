// Our model against transformers on tests/fixtures/models/qwen3-tiny-fp8, a tiny Qwen3
// quantized to block-scaled FP8 in Qwen's layout (128x128 blocks) by tools/gen_fp8_fixtures.py
// on the GPU machine. Built twice from this file: test_fp8_transformers runs the CPU reference
// (its weights kept in e4m3, computed exactly as dequantized); test_gpu_fp8_transformers
// (OASIS_FP8_TEST_CUDA, label gpu) runs the CUDA backend, whose FP8 weights stay e4m3 where
// it supports them (docs/fp8.md "FP8 weights"). Two references:
//  - the dequantized model (float32 weights = e4m3 * weight_scale_inv, float32 math): the CPU
//    reference's logits within a normalized error of 1e-4 and greedy tokens identical up to
//    the first near-tie (margin < 1e-3); CUDA (bf16 activations) within the bf16 models'
//    normalized 2e-2 (test_gpu_models) and 1.0 max abs (logits reach |70|, where a bf16 ulp
//    is 0.5; transformers' own bf16 run of these weights is 0.53-0.62 max abs away), greedy
//    identical up to the first step whose margin is below 0.25 (a bf16 near-tie);
//  - transformers' FP8 path (manifest.json: fp8_path; its logits are bf16), which differs by
//    its rounding: prompt logits within kFp8Tolerance, and teacher-forced along its greedy path,
//    our top-1 equals its choice at every step whose margin is at least kFp8TieMargin.
// Until the fixture is generated this executable exits 77 (CTest: skipped); the CUDA one also
// without a CUDA device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#ifdef OASIS_FP8_TEST_CUDA
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "common/cuda_rt.h"
#include "safetensors_builder.h"
#endif
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "test_support.h"

using namespace oasis;

namespace {

constexpr int kPrompts = 3;
#ifdef OASIS_FP8_TEST_CUDA
#define FP8_TAGS "[gpu][models][fp8]"
constexpr double kDequantizedTolerance = 2e-2;  // normalized logit error, as test_gpu_models
constexpr double kDequantizedMaxAbs = 1.0;
constexpr float kTieMargin = 0.25f;  // a bf16 near-tie may flip
#else
#define FP8_TAGS "[models][fp8]"
constexpr double kDequantizedTolerance = 1e-4;  // normalized logit error, as the bf16 fixtures
constexpr double kDequantizedMaxAbs = 1e-2;
constexpr float kTieMargin = 1e-3f;
#endif
// transformers' FP8 path rounds activations to e4m3 (3 mantissa bits) before every quantized
// GEMM and keeps bf16 elsewhere; the generator records the error it measured against the
// dequantized model in manifest.json (fp8_vs_dequantized_logit_error).
constexpr double kFp8Tolerance = 0.1;
constexpr float kFp8TieMargin = 0.25f;

std::filesystem::path Dir() { return testing::FixturePath("models/qwen3-tiny-fp8"); }

std::vector<int32_t> Ids(const SafetensorsFile& ref, const std::string& name) {
  auto v = testing::TensorVector<int64_t>(ref, name);
  return {v.begin(), v.end()};
}

double NormalizedError(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

double MaxAbsError(const float* a, const float* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  return worst;
}

// The backend under test: the CPU reference, or the CUDA backend (OASIS_FP8_TEST_CUDA).
std::unique_ptr<Backend> MakeBackend() {
#ifdef OASIS_FP8_TEST_CUDA
  auto gpu = CudaBackend::Create();
  INFO(gpu.status().ToString());
  REQUIRE(gpu.ok());
  return std::move(*gpu);
#else
  return std::make_unique<CpuBackend>();
#endif
}

struct Fixture {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  SafetensorsFile reference;
};

Fixture Open() {
  auto config = LoadModelConfig(Dir());
  INFO(config.status().ToString());
  REQUIRE(config.ok());
  REQUIRE(config->quantization.fp8());
  REQUIRE(config->quantization.block_out == 128);
  REQUIRE(config->quantization.block_in == 128);
  auto weights = OpenSafetensorsWeights(Dir() / "model.safetensors");
  REQUIRE(weights.ok());
  auto ref = SafetensorsFile::Open(Dir() / "reference.safetensors");
  REQUIRE(ref.ok());
  return Fixture{*config, std::move(*weights), std::move(*ref)};
}

}  // namespace

TEST_CASE("qwen3-tiny-fp8: checkpoint in Qwen's FP8 layout", FP8_TAGS) {
  Fixture fx = Open();
  auto w = fx.weights->Info("model.layers.0.mlp.down_proj.weight");
  REQUIRE(w.ok());
  CHECK(w->dtype == DType::kF8E4M3);
  auto s = fx.weights->Info("model.layers.0.mlp.down_proj.weight_scale_inv");
  REQUIRE(s.ok());
  CHECK(s->shape == std::vector<int64_t>{(w->shape[0] + 127) / 128, (w->shape[1] + 127) / 128});
  auto head = fx.weights->Info("lm_head.weight");
  REQUIRE(head.ok());
  CHECK(head->dtype == DType::kBF16);
}

TEST_CASE("qwen3-tiny-fp8: logits and greedy equal the dequantized model's", FP8_TAGS) {
  Fixture fx = Open();
  std::unique_ptr<Backend> backend = MakeBackend();
  auto model = DecoderLM::Create(fx.config, *fx.weights, *backend);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  const Fp8WeightCounts& counts = (*model)->fp8_weights();
  CHECK(counts.kept + counts.dequantized() == 8);  // qkv, o_proj, gate_up, down of 2 layers
#ifdef OASIS_FP8_TEST_CUDA
  WARN("CUDA: " << counts.kept << " of 8 linear weights kept in e4m3, " << counts.unsupported
                << " dequantized at load (Fp8WeightSupported false)");
#else
  CHECK(counts.kept == 8);  // the CPU reference computes with every e4m3 weight
#endif
  Generator gen(**model, *backend, {.num_kv_slots = 512, .max_step_tokens = 512});
  for (int p = 0; p < kPrompts; ++p) {
    const std::string pre = "prompt" + std::to_string(p);
    INFO(pre);
    auto logits = gen.PromptLogits(Ids(fx.reference, pre + ".ids"));
    REQUIRE(logits.ok());
    auto want = testing::TensorVector<float>(fx.reference, pre + ".logits");
    REQUIRE(static_cast<size_t>(logits->numel()) == want.size());
    const double err = NormalizedError(logits->data<float>(), want.data(), want.size());
    const double max_abs = MaxAbsError(logits->data<float>(), want.data(), want.size());
    INFO("normalized error " << err << ", max abs " << max_abs);
#ifdef OASIS_FP8_TEST_CUDA
    WARN("CUDA " << pre << " vs the dequantized f32 reference: normalized error " << err
                 << ", max abs " << max_abs);
#endif
    CHECK(err <= kDequantizedTolerance);
    CHECK(max_abs <= kDequantizedMaxAbs);

    GenerationRequest r;
    r.prompt = Ids(fx.reference, pre + ".ids");
    r.max_tokens = 32;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    auto out = gen.Generate({r});
    REQUIRE(out.ok());
    const auto greedy = Ids(fx.reference, pre + ".greedy");
    const auto margin = testing::TensorVector<float>(fx.reference, pre + ".greedy_margin");
    for (size_t s = 0; s < greedy.size() && margin[s] >= kTieMargin; ++s) {
      INFO("greedy step " << s);
      REQUIRE((*out)[0].tokens[s] == greedy[s]);
    }
  }
}

TEST_CASE("qwen3-tiny-fp8: close to transformers' FP8 path", FP8_TAGS) {
  Fixture fx = Open();
  std::unique_ptr<Backend> backend = MakeBackend();
  auto model = DecoderLM::Create(fx.config, *fx.weights, *backend);
  REQUIRE(model.ok());
  Generator gen(**model, *backend, {.num_kv_slots = 512, .max_step_tokens = 512});
  const size_t vocab = static_cast<size_t>(fx.config.vocab_size);
  for (int p = 0; p < kPrompts; ++p) {
    const std::string pre = "prompt" + std::to_string(p);
    INFO(pre);
    const auto ids = Ids(fx.reference, pre + ".ids");
    auto logits = gen.PromptLogits(ids);
    REQUIRE(logits.ok());
    auto want = testing::TensorVector<float>(fx.reference, "fp8." + pre + ".logits");
    const double err = NormalizedError(logits->data<float>(), want.data(), want.size());
    INFO("normalized error against transformers' FP8 path " << err);
#ifdef OASIS_FP8_TEST_CUDA
    WARN("CUDA " << pre << " vs transformers' FP8 path: normalized error " << err << ", max abs "
                 << MaxAbsError(logits->data<float>(), want.data(), want.size()));
#endif
    CHECK(err <= kFp8Tolerance);

    // Teacher-forced along transformers' FP8 greedy path: logits at prompt + s tokens.
    const auto greedy = Ids(fx.reference, "fp8." + pre + ".greedy");
    const auto margin = testing::TensorVector<float>(fx.reference, "fp8." + pre + ".greedy_margin");
    std::vector<int32_t> seq = ids;
    seq.insert(seq.end(), greedy.begin(), greedy.end() - 1);
    auto forced = gen.PromptLogits(seq);
    REQUIRE(forced.ok());
    int compared = 0;
    for (size_t s = 0; s < greedy.size(); ++s) {
      if (margin[s] < kFp8TieMargin) continue;
      const float* row = forced->data<float>() + (ids.size() - 1 + s) * vocab;
      const auto top = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      INFO("step " << s << " (transformers' FP8 margin " << margin[s] << ")");
      CHECK(top == greedy[s]);
      ++compared;
    }
    CHECK(compared > 0);
  }
}

#ifdef OASIS_FP8_TEST_CUDA
namespace {

// A Qwen3 FP8 checkpoint whose linear weights the CUDA backend keeps in e4m3 (every out a
// multiple of 128, every in of 512: hidden 512, 4 query / 2 KV heads of 128, intermediate
// 1024): qwen3-tiny-fp8's config resized, random e4m3 codes (N(0, 64)) with per-block scales
// 0.02 / 64 x [0.75, 1.25], bf16 embedding and lm_head, unit norms. Written to a temp dir.
std::filesystem::path WriteAlignedFp8Checkpoint() {
  std::ifstream in(Dir() / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["hidden_size"] = 512;
  config["intermediate_size"] = 1024;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["head_dim"] = 128;
  const int64_t h = 512, inter = 1024, q = 512, kv = 256, vocab = config["vocab_size"];
  std::mt19937 rng(20261204);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> factor(0.75f, 1.25f);
  std::vector<testing::RawTensor> tensors;
  const auto bf16 = [&](const std::string& name, std::vector<int64_t> shape, float stddev) {
    std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)));
    for (float& x : v) x = stddev == 0 ? 1.0f : stddev * normal(rng);
    tensors.push_back({name, "BF16", std::move(shape), testing::Bf16BytesOf(v)});
  };
  const auto fp8 = [&](const std::string& name, int64_t out, int64_t in_features) {
    std::string codes(static_cast<size_t>(out * in_features), '\0');
    for (char& c : codes) c = static_cast<char>(FloatToFp8E4M3(64.0f * normal(rng)));
    std::vector<float> scales(
        static_cast<size_t>(((out + 127) / 128) * ((in_features + 127) / 128)));
    for (float& s : scales) s = 0.02f / 64.0f * factor(rng);
    tensors.push_back({name, "F8_E4M3", {out, in_features}, std::move(codes)});
    tensors.push_back({name + "_scale_inv",
                       "F32",
                       {(out + 127) / 128, (in_features + 127) / 128},
                       testing::BytesOf(scales)});
  };
  bf16("model.embed_tokens.weight", {vocab, h}, 0.02f);
  bf16("lm_head.weight", {vocab, h}, 0.02f);
  bf16("model.norm.weight", {h}, 0);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    bf16(p + "input_layernorm.weight", {h}, 0);
    bf16(p + "post_attention_layernorm.weight", {h}, 0);
    bf16(p + "self_attn.q_norm.weight", {128}, 0);
    bf16(p + "self_attn.k_norm.weight", {128}, 0);
    fp8(p + "self_attn.q_proj.weight", q, h);
    fp8(p + "self_attn.k_proj.weight", kv, h);
    fp8(p + "self_attn.v_proj.weight", kv, h);
    fp8(p + "self_attn.o_proj.weight", h, q);
    fp8(p + "mlp.gate_proj.weight", inter, h);
    fp8(p + "mlp.up_proj.weight", inter, h);
    fp8(p + "mlp.down_proj.weight", h, inter);
  }
  const auto dir = testing::MakeTempDir("fp8-aligned");
  testing::WriteBinaryFile(dir / "model.safetensors", testing::BuildSafetensors(tensors));
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

}  // namespace

// transformers' fixture is too small for the CUDA backend's FP8 GEMMs (in % 512), so its
// weights are dequantized at load on CUDA; this checkpoint keeps every linear weight in e4m3
// there. The reference: the CPU backend (e4m3 weights computed exactly as dequantized, f32).
// CUDA rounds activations to bf16 and, in its FP8 GEMM, to e4m3 per token: within a
// normalized logit error of kFp8Tolerance, for a prefill (GEMM path, 37 rows: multiples of 4
// and a GEMV tail) and decode steps (GEMV path).
TEST_CASE("FP8 weights kept in e4m3 on CUDA: logits near the CPU reference", FP8_TAGS) {
  const auto dir = WriteAlignedFp8Checkpoint();
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  REQUIRE(config->quantization.fp8());
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  std::unique_ptr<Backend> gpu = MakeBackend();
  auto model = DecoderLM::Create(*config, **weights, *gpu);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  CHECK((*model)->fp8_weights().kept == 8);
  const Tensor* o = (*model)->FindWeight("model.layers.0.self_attn.o_proj.weight");
  REQUIRE(o != nullptr);
  CHECK(o->dtype() == DType::kF8E4M3);
  CpuBackend cpu;
  auto ref = DecoderLM::Create(*config, **weights, cpu);
  REQUIRE(ref.ok());
  CHECK((*ref)->fp8_weights().kept == 8);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back((i * 131 + 7) % 512);
  for (int64_t step_tokens : {int64_t{512}, int64_t{1}}) {
    Generator gen(**model, *gpu, {.num_kv_slots = 512, .max_step_tokens = step_tokens});
    Generator cpu_gen(**ref, cpu, {.num_kv_slots = 512, .max_step_tokens = step_tokens});
    auto got = gen.PromptLogits(prompt);
    auto want = cpu_gen.PromptLogits(prompt);
    REQUIRE(got.ok());
    REQUIRE(want.ok());
    REQUIRE(got->numel() == want->numel());
    const size_t n = static_cast<size_t>(want->numel());
    const double err = NormalizedError(got->data<float>(), want->data<float>(), n);
    const double max_abs = MaxAbsError(got->data<float>(), want->data<float>(), n);
    WARN("CUDA e4m3 weights vs CPU, " << (step_tokens == 1 ? "decode steps" : "prefill")
                                      << ": normalized error " << err << ", max abs " << max_abs);
    CHECK(err <= kFp8Tolerance);
  }
}
#endif

int main(int argc, char* argv[]) {
#ifdef OASIS_FP8_TEST_CUDA
  if (oasis::cuda::DeviceCount() == 0) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
#endif
  if (!std::filesystem::exists(Dir() / "reference.safetensors")) {
    std::printf(
        "no tests/fixtures/models/qwen3-tiny-fp8: skipped (generate it on the GPU machine: "
        "python3 tools/gen_fp8_fixtures.py --out tests/fixtures/models)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

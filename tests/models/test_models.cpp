// The CPU reference models against transformers: the committed fixtures in
// tests/fixtures/models (tools/gen_model_fixtures.py) hold bf16 weights and transformers'
// float32 logits for the same weights; so does tests/fixtures/trained for the trained
// embedded default in models/embedded (tools/train/export_check.py, real-text prompts). Our
// float32 math must match within a normalized
// error of 1e-4, and greedy continuations must be identical.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "test_support.h"

using namespace oasis;

namespace {

struct Fixture {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  SafetensorsFile reference;
};

Fixture LoadFixture(const std::filesystem::path& dir, const std::filesystem::path& reference) {
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  auto ref = SafetensorsFile::Open(reference);
  REQUIRE(ref.ok());
  return Fixture{*config, std::move(*weights), std::move(*ref)};
}

Fixture LoadFixture(const std::string& name) {
  auto dir = testing::FixturePath("models/" + name);
  return LoadFixture(dir, dir / "reference.safetensors");
}

std::vector<int32_t> ToI32(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// ||a - b|| / ||b||
double NormalizedError(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

constexpr int kPrompts = 3;

}  // namespace

TEST_CASE("prompt logits match transformers at every position", "[models]") {
  for (const testing::ModelFixture& spec : testing::ModelFixtures()) {
    for (int64_t chunk : {int64_t{512}, int64_t{13}}) {  // whole prompt, and chunked prefill
      DYNAMIC_SECTION(spec.name << " chunk " << chunk) {
        Fixture fx = LoadFixture(spec.dir, spec.reference);
        CpuBackend backend;
        auto model = DecoderLM::Create(fx.config, *fx.weights, backend);
        REQUIRE(model.ok());
        Generator gen(**model, backend, {.num_kv_slots = 256, .max_step_tokens = chunk});
        for (int p = 0; p < kPrompts; ++p) {
          auto ids = ToI32(testing::TensorVector<int64_t>(fx.reference, "prompt" + std::to_string(p) + ".ids"));
          auto ref = testing::TensorVector<float>(fx.reference, "prompt" + std::to_string(p) + ".logits");
          auto logits = gen.PromptLogits(ids);
          REQUIRE(logits.ok());
          REQUIRE(static_cast<size_t>(logits->numel()) == ref.size());
          double err = NormalizedError(logits->data<float>(), ref.data(), ref.size());
          INFO("prompt " << p << " normalized error " << err);
          CHECK(err <= 1e-4);
        }
      }
    }
  }
}

TEST_CASE("greedy continuations equal transformers', alone and batched", "[models]") {
  for (const testing::ModelFixture& spec : testing::ModelFixtures()) {
    DYNAMIC_SECTION(spec.name) {
      Fixture fx = LoadFixture(spec.dir, spec.reference);
      CpuBackend backend;
      auto model = DecoderLM::Create(fx.config, *fx.weights, backend);
      REQUIRE(model.ok());
      Generator gen(**model, backend, {.num_kv_slots = 512, .max_step_tokens = 40});
      std::vector<GenerationRequest> requests;
      std::vector<std::vector<int32_t>> expected;
      for (int p = 0; p < kPrompts; ++p) {
        GenerationRequest r;
        r.prompt = ToI32(testing::TensorVector<int64_t>(fx.reference, "prompt" + std::to_string(p) + ".ids"));
        r.max_tokens = 32;
        r.ignore_eos = true;
        r.sampling.temperature = 0;
        requests.push_back(r);
        expected.push_back(ToI32(testing::TensorVector<int64_t>(fx.reference, "prompt" + std::to_string(p) + ".greedy")));
      }
      auto batched = gen.Generate(requests);
      REQUIRE(batched.ok());
      for (int p = 0; p < kPrompts; ++p) {
        CHECK((*batched)[p].tokens == expected[p]);
        CHECK((*batched)[p].finish_reason == FinishReason::kLength);
        auto alone = gen.Generate({requests[p]});
        REQUIRE(alone.ok());
        CHECK((*alone)[0].tokens == expected[p]);
      }
    }
  }
}

TEST_CASE("decode-step logits match transformers' greedy logits", "[models]") {
  Fixture fx = LoadFixture("qwen3-tiny");
  CpuBackend backend;
  auto model = DecoderLM::Create(fx.config, *fx.weights, backend);
  REQUIRE(model.ok());
  Generator gen(**model, backend, {.num_kv_slots = 256, .max_step_tokens = 512});
  auto ids = ToI32(testing::TensorVector<int64_t>(fx.reference, "prompt1.ids"));
  auto greedy = ToI32(testing::TensorVector<int64_t>(fx.reference, "prompt1.greedy"));
  auto ref = testing::TensorVector<float>(fx.reference, "prompt1.greedy_logits");
  const size_t vocab = static_cast<size_t>(fx.config.vocab_size);
  // Logits at the last position of prompt + k greedy tokens == transformers' k-th step.
  for (size_t k : {size_t{0}, size_t{9}, size_t{31}}) {
    std::vector<int32_t> seq = ids;
    seq.insert(seq.end(), greedy.begin(), greedy.begin() + static_cast<long>(k));
    auto logits = gen.PromptLogits(seq);
    REQUIRE(logits.ok());
    double err = NormalizedError(logits->data<float>() + (seq.size() - 1) * vocab, ref.data() + k * vocab, vocab);
    INFO("step " << k << " error " << err);
    CHECK(err <= 1e-4);
  }
}

TEST_CASE("model creation reports missing and misshapen weights", "[models]") {
  Fixture fx = LoadFixture("llama-tiny-tied");
  CpuBackend backend;
  ModelConfig wrong = fx.config;
  wrong.intermediate_size += 1;
  auto bad = DecoderLM::Create(wrong, *fx.weights, backend);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("mlp.gate_proj.weight"));

  ModelConfig untied = fx.config;
  untied.tie_word_embeddings = false;  // now lm_head.weight is required and absent
  auto missing = DecoderLM::Create(untied, *fx.weights, backend);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("lm_head.weight"));
}

TEST_CASE("dummy weights run any config at its real shapes", "[models]") {
  Fixture fx = LoadFixture("qwen3-tiny");
  auto dummy = MakeDummyWeights(DecoderLM::ExpectedWeights(fx.config), 7);
  CpuBackend backend;
  auto model = DecoderLM::Create(fx.config, *dummy, backend);
  REQUIRE(model.ok());
  Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
  GenerationRequest r;
  r.prompt = {1, 5, 9};
  r.max_tokens = 4;
  r.ignore_eos = true;
  auto out = gen.Generate({r});
  REQUIRE(out.ok());
  CHECK((*out)[0].tokens.size() == 4);
}

TEST_CASE("generation rejects bad requests without running", "[models]") {
  Fixture fx = LoadFixture("qwen3-tiny");
  CpuBackend backend;
  auto model = DecoderLM::Create(fx.config, *fx.weights, backend);
  REQUIRE(model.ok());
  Generator gen(**model, backend, {.num_kv_slots = 256, .max_step_tokens = 64});
  GenerationRequest r;
  r.prompt = {};
  CHECK(gen.Generate({r}).status().code() == StatusCode::kInvalidArgument);
  r.prompt = {1, 600};
  CHECK(gen.Generate({r}).status().code() == StatusCode::kInvalidArgument);
  r.prompt = {1, 2};
  r.max_tokens = 5000;
  CHECK(gen.Generate({r}).status().code() == StatusCode::kOutOfRange);
  r.max_tokens = 4;
  r.sampling.temperature = -1;
  CHECK(gen.Generate({r}).status().code() == StatusCode::kInvalidArgument);
  r.sampling.temperature = 0.7f;
  r.sampling.top_p = 0;
  auto e = gen.Generate({r});
  CHECK(e.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(e.status().message(), Catch::Contains("top_p"));
}

TEST_CASE("mapped checkpoints expose raw bytes; dummy weights do not", "[models][loader]") {
  Fixture fx = LoadFixture("qwen3-tiny");
  auto raw = fx.weights->RawBytes("model.layers.0.self_attn.q_proj.weight");
  REQUIRE(raw.ok());
  auto loaded = fx.weights->Load("model.layers.0.self_attn.q_proj.weight", DType::kBF16);
  REQUIRE(loaded.ok());
  REQUIRE(raw->size() == loaded->nbytes());
  CHECK(std::memcmp(raw->data(), loaded->raw(), raw->size()) == 0);
  CHECK(fx.weights->RawBytes("nope").status().code() == StatusCode::kNotFound);
  auto dummy = MakeDummyWeights(DecoderLM::ExpectedWeights(fx.config), 1);
  CHECK(dummy->RawBytes("model.norm.weight").status().code() == StatusCode::kUnimplemented);
}

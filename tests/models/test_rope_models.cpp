// The CPU reference on checkpoints with RoPE scaling (tests/fixtures/rope, written by
// tools/gen_rope_fixtures.py with transformers): yarn (Qwen3 in the legacy rope_scaling form;
// Llama with every yarn option in rope_parameters), linear and dynamic (reference: vLLM's fixed
// NTK base, see the generator), prompts and greedy steps reaching past the 64 original
// positions. The RoPE tables must equal the ones transformers built (manifest.json), logits
// must match within a normalized error of 1e-4, greedy continuations exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"
#include "engine/generator.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "test_support.h"

using namespace oasis;

namespace {

constexpr const char* kFixtures[] = {"qwen3-yarn", "llama-yarn-options", "llama-linear",
                                     "qwen3-dynamic"};
constexpr int kPrompts = 3;

std::filesystem::path RopeFixtures() {
  const auto root = testing::FixturePath("rope");
  if (!std::filesystem::exists(root / "manifest.json")) {
    FAIL("no " << root.string() << ": run python3 tools/gen_rope_fixtures.py --out "
               << root.string() << " on the GPU machine");
  }
  return root;
}

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

}  // namespace

TEST_CASE("rope fixtures: tables equal transformers', context as vLLM derives it", "[models][rope]") {
  const auto root = RopeFixtures();
  const auto manifest =
      nlohmann::json::parse(testing::ReadFileOrFail(root / "manifest.json"));
  for (const char* name : kFixtures) {
    DYNAMIC_SECTION(name) {
      auto config = LoadModelConfig(root / name);
      INFO(config.status().ToString());
      REQUIRE(config.ok());
      CHECK(config->max_position_embeddings == 256);  // 64 × 4 for every scaling type
      const RopeParams rope = ComputeRopeParams(*config);
      const auto& want = manifest["models"][name];
      const std::vector<double> inv_freq = want["inv_freq"].get<std::vector<double>>();
      REQUIRE(rope.inv_freq.size() == inv_freq.size());
      for (size_t i = 0; i < inv_freq.size(); ++i) {
        INFO("pair " << i);
        CHECK(rope.inv_freq[i] == Approx(inv_freq[i]).epsilon(2e-6));
      }
      CHECK(rope.attention_scaling == Approx(want["attention_scaling"].get<double>()).epsilon(1e-6));
    }
  }
}

TEST_CASE("rope fixtures: prompt logits and greedy continuations match transformers", "[models][rope]") {
  const auto root = RopeFixtures();
  for (const char* name : kFixtures) {
    DYNAMIC_SECTION(name) {
      const auto dir = root / name;
      auto config = LoadModelConfig(dir);
      REQUIRE(config.ok());
      auto weights = OpenSafetensorsWeights(dir);
      REQUIRE(weights.ok());
      auto ref = SafetensorsFile::Open(dir / "reference.safetensors");
      REQUIRE(ref.ok());
      CpuBackend backend;
      auto model = DecoderLM::Create(*config, **weights, backend);
      REQUIRE(model.ok());
      for (int64_t chunk : {int64_t{512}, int64_t{13}}) {  // whole prompts, and chunked prefill
        Generator gen(**model, backend, {.num_kv_slots = 512, .max_step_tokens = chunk});
        for (int p = 0; p < kPrompts; ++p) {
          const std::string pre = "prompt" + std::to_string(p);
          auto ids = Ids(*ref, pre + ".ids");
          auto want = testing::TensorVector<float>(*ref, pre + ".logits");
          auto logits = gen.PromptLogits(ids);
          REQUIRE(logits.ok());
          REQUIRE(static_cast<size_t>(logits->numel()) == want.size());
          const double err = NormalizedError(logits->data<float>(), want.data(), want.size());
          INFO(pre << " (" << ids.size() << " tokens) chunk " << chunk << " normalized error " << err);
          CHECK(err <= 1e-4);
        }
      }
      Generator gen(**model, backend, {.num_kv_slots = 512, .max_step_tokens = 40});
      std::vector<GenerationRequest> requests;
      for (int p = 0; p < kPrompts; ++p) {
        GenerationRequest r;
        r.prompt = Ids(*ref, "prompt" + std::to_string(p) + ".ids");
        r.max_tokens = 32;
        r.ignore_eos = true;
        r.sampling.temperature = 0;
        requests.push_back(r);
      }
      auto batched = gen.Generate(requests);
      REQUIRE(batched.ok());
      for (int p = 0; p < kPrompts; ++p) {
        const auto want = Ids(*ref, "prompt" + std::to_string(p) + ".greedy");
        INFO("prompt " << p);
        CHECK((*batched)[p].tokens == want);
        auto alone = gen.Generate({requests[p]});
        REQUIRE(alone.ok());
        CHECK((*alone)[0].tokens == want);
      }
    }
  }
}

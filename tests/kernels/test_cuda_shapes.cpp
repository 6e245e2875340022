// GPU: the checkpoints of unusual shapes of tests/fixtures/shapes (tools/gen_shape_fixtures.py:
// head_dim 8 and 32, 6 query heads per KV head, 3 KV heads) either load on the CUDA backend and
// generate transformers' greedy tokens (a divergence only at a bf16 near-tie), or are refused at
// load with the shape check's message (issue 29). Which one is the fixture's expect.txt,
// written by the generator, not derived from the check under test.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "loader/safetensors.h"
#include "models/decoder_lm.h"
#include "reference_greedy.h"
#include "test_support.h"

using namespace oasis;

TEST_CASE("CUDA backend: unusual shapes are computed exactly or refused at load", "[gpu][models]") {
  const auto root = testing::FixturePath("shapes");
  if (!std::filesystem::exists(root / "manifest.json")) {
    FAIL("no " << root.string() << ": run python3 tools/gen_shape_fixtures.py --out "
               << root.string() << " on the GPU machine");
  }
  int fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const auto dir = entry.path();
    if (!std::filesystem::exists(dir / "config.json")) continue;
    ++fixtures;
    const std::string name = dir.filename().string();
    DYNAMIC_SECTION(name) {
      std::string expect;
      std::ifstream(dir / "expect.txt") >> expect;
      REQUIRE((expect == "exact" || expect == "refused"));
      const testing::FixtureCheckpoint fx = testing::OpenFixtureDir(dir);
      auto gpu = CudaBackend::Create();
      REQUIRE(gpu.ok());
      auto model = DecoderLM::Create(fx.config, *fx.weights, **gpu);
      if (expect == "refused") {
        REQUIRE_FALSE(model.ok());
        INFO(model.status().ToString());
        CHECK_THAT(model.status().message(),
                   Catch::Contains("head_dim " + std::to_string(fx.config.head_dim)));
        CHECK_THAT(model.status().message(), Catch::Contains("use --backend cpu"));
        continue;
      }
      INFO(model.status().ToString());
      REQUIRE(model.ok());
      auto ref = SafetensorsFile::Open(dir / "reference.safetensors");
      REQUIRE(ref.ok());
      Generator gen(**model, **gpu, {.num_kv_slots = 512, .max_step_tokens = 24});
      testing::CheckGreedyAgainstReference(gen, *ref, "CUDA " + name, 0.25f);
    }
  }
  CHECK(fixtures >= 4);
}

TEST_CASE("CUDA backend: MoE models load within the MoE kernels' limits, others are refused",
          "[gpu][models][moe]") {
  auto base = LoadModelConfig(testing::FixturePath("models/qwen3-moe-tiny"));
  REQUIRE(base.ok());
  REQUIRE(base->HasMoeLayers());
  auto gpu = CudaBackend::Create();
  REQUIRE(gpu.ok());
  CHECK(DecoderLM::CreateDummy(*base, **gpu, 1).ok());
  ModelConfig c = *base;
  c.moe_intermediate_size = 12;  // not a multiple of 8
  auto model = DecoderLM::CreateDummy(c, **gpu, 1);
  REQUIRE_FALSE(model.ok());
  INFO(model.status().ToString());
  CHECK_THAT(model.status().message(), Catch::Contains("moe_intermediate_size 12"));
  CHECK_THAT(model.status().message(), Catch::Contains("use --backend cpu"));
  c = *base;
  c.num_experts = 1025;
  model = DecoderLM::CreateDummy(c, **gpu, 1);
  REQUIRE_FALSE(model.ok());
  CHECK_THAT(model.status().message(), Catch::Contains("num_experts 1025"));
}

// CPU: the checkpoints of unusual shapes of tests/fixtures/shapes (tools/gen_shape_fixtures.py,
// made with transformers on the GPU machine: head_dim 8 and 32, 6 query heads per KV head, 3 KV
// heads) all compute exactly on the CPU reference backend, whatever the CUDA backend refuses
// (test_gpu_shapes): logits within float tolerance of transformers', greedy tokens equal
// (a divergence only at a near-tie of the bf16 fixtures).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "loader/safetensors.h"
#include "models/decoder_lm.h"
#include "reference_greedy.h"
#include "test_support.h"

using namespace oasis;

TEST_CASE("CPU backend: every unusual shape computes transformers' greedy tokens", "[models]") {
  const auto root = testing::FixturePath("shapes");
  REQUIRE(std::filesystem::exists(root / "manifest.json"));
  int fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const auto dir = entry.path();
    if (!std::filesystem::exists(dir / "config.json")) continue;
    ++fixtures;
    const std::string name = dir.filename().string();
    DYNAMIC_SECTION(name) {
      const testing::FixtureCheckpoint fx = testing::OpenFixtureDir(dir);
      CpuBackend backend;
      auto model = DecoderLM::Create(fx.config, *fx.weights, backend);
      INFO(model.status().ToString());
      REQUIRE(model.ok());
      auto ref = SafetensorsFile::Open(dir / "reference.safetensors");
      REQUIRE(ref.ok());
      Generator gen(**model, backend, {.num_kv_slots = 512, .max_step_tokens = 64});
      testing::CheckGreedyAgainstReference(gen, *ref, "CPU " + name, 0.05f);
    }
  }
  CHECK(fixtures >= 4);
}

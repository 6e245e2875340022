// A committed fixture checkpoint (tests/fixtures/models/<name>) opened for a test, and the
// normalized error between two logits tensors. Header-only: the suites that use it link the
// loader already.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include "loader/weights.h"
#include "oasis/model_config.h"
#include "oasis/tensor.h"
#include "test_support.h"

namespace oasis::testing {

struct FixtureCheckpoint {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
};

// A checkpoint directory (config.json + *.safetensors) opened for a test.
inline FixtureCheckpoint OpenFixtureDir(const std::filesystem::path& dir) {
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  return FixtureCheckpoint{*config, std::move(*weights)};
}

inline FixtureCheckpoint OpenFixtureModel(const std::string& name) {
  return OpenFixtureDir(FixturePath("models/" + name));
}

// ||a - b|| / ||b|| over two float tensors of as many elements.
inline double NormalizedError(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

}  // namespace oasis::testing

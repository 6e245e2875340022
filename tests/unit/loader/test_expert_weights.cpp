// SplitFusedExperts (loader/expert_weights.h): transformers 5's fused MoE expert tensors
// read under the per-expert names of the Hub releases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <tuple>

#include "loader/expert_weights.h"
#include "loader/weights.h"
#include "safetensors_builder.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::testing;

namespace {

constexpr int64_t kE = 3, kI = 4, kH = 5;

std::vector<float> Iota(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A checkpoint directory holding `tensors` as bf16 (values exact in bf16: integers below 256).
std::unique_ptr<WeightSource> Open(const std::vector<RawTensor>& tensors) {
  const auto dir = MakeTempDir("expert-weights");
  WriteBinaryFile(dir / "model.safetensors", BuildSafetensors(tensors));
  auto w = OpenSafetensorsWeights(dir);
  REQUIRE(w.ok());
  std::filesystem::remove_all(dir);  // the file stays mapped until the weights go
  return std::move(*w);
}

RawTensor Bf16(const std::string& name, std::vector<int64_t> shape, float start) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, "BF16", std::move(shape), Bf16BytesOf(Iota(n, start))};
}

const std::string kGateUp = "model.layers.2.mlp.experts.gate_up_proj";
const std::string kDown = "model.layers.2.mlp.experts.down_proj";

}  // namespace

TEST_CASE("fused experts are exposed per expert, bytes and values", "[loader][moe]") {
  auto base = Open({Bf16(kGateUp, {kE, 2 * kI, kH}, 0), Bf16(kDown, {kE, kH, kI}, 128),
                    Bf16("model.norm.weight", {kH}, 7)});
  CHECK(HasFusedExperts(*base));
  auto split = SplitFusedExperts(*base);
  REQUIRE(split.ok());
  const WeightSource& w = **split;
  CHECK(w.Has("model.norm.weight"));
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = "model.layers.2.mlp.experts." + std::to_string(e) + ".";
    for (auto [proj, shape, first] :
         {std::tuple{"gate_proj", std::vector<int64_t>{kI, kH}, e * 2 * kI * kH},
          std::tuple{"up_proj", std::vector<int64_t>{kI, kH}, e * 2 * kI * kH + kI * kH},
          std::tuple{"down_proj", std::vector<int64_t>{kH, kI}, 128 + e * kH * kI}}) {
      const std::string name = p + proj + ".weight";
      INFO(name);
      REQUIRE(w.Has(name));
      auto info = w.Info(name);
      REQUIRE(info.ok());
      CHECK(info->shape == shape);
      CHECK(info->dtype == DType::kBF16);
      auto t = w.Load(name, DType::kF32);
      REQUIRE(t.ok());
      REQUIRE(t->shape() == shape);
      for (int64_t i = 0; i < t->numel(); ++i)
        CHECK(t->data<float>()[i] == static_cast<float>(first + i));
      // The mapped bytes of the same block, without a copy.
      auto raw = w.RawBytes(name);
      REQUIRE(raw.ok());
      auto as_bf16 = w.Load(name, DType::kBF16);
      REQUIRE(as_bf16.ok());
      REQUIRE(raw->size() == as_bf16->nbytes());
      CHECK(std::memcmp(raw->data(), as_bf16->raw(), raw->size()) == 0);
      // Slices for tensor parallelism equal the same part of the whole.
      for (int dim : {0, 1}) {
        auto half = w.LoadSlice(name, dim, 1, 3, DType::kF32);
        REQUIRE(half.ok());
        const int64_t cols = shape[1];
        for (int64_t r = 0; r < half->dim(0); ++r) {
          for (int64_t c = 0; c < half->dim(1); ++c) {
            const int64_t src = dim == 0 ? (r + 1) * cols + c : r * cols + (c + 1);
            CHECK(half->data<float>()[r * half->dim(1) + c] == static_cast<float>(first + src));
          }
        }
      }
      CHECK(w.LoadSlice(name, 0, 2, 9, DType::kF32).status().code() == StatusCode::kOutOfRange);
    }
  }
  CHECK_FALSE(w.Has("model.layers.2.mlp.experts.3.gate_proj.weight"));
  const auto names = w.Names();
  CHECK(std::count(names.begin(), names.end(), "model.layers.2.mlp.experts.1.up_proj.weight") == 1);
}

TEST_CASE("fused experts: inconsistent tensors are InvalidArgument naming them", "[loader][moe]") {
  auto expect = [](const std::vector<RawTensor>& tensors, const std::string& fragment) {
    auto base = Open(tensors);
    auto split = SplitFusedExperts(*base);
    REQUIRE_FALSE(split.ok());
    INFO(split.status().ToString());
    CHECK(split.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(split.status().message(), Catch::Contains(fragment));
  };
  expect({Bf16(kGateUp, {kE, 2 * kI + 1, kH}, 0), Bf16(kDown, {kE, kH, kI}, 0)}, kGateUp);
  expect({Bf16(kGateUp, {kE * 2 * kI, kH}, 0), Bf16(kDown, {kE, kH, kI}, 0)}, "[24, 5]");
  expect({Bf16(kGateUp, {kE, 2 * kI, kH}, 0), Bf16(kDown, {kE + 1, kH, kI}, 0)},
         "expected [3, 5, 4]");
  expect({Bf16(kGateUp, {kE, 2 * kI, kH}, 0)}, "need both");
  expect({Bf16(kGateUp, {kE, 2 * kI, kH}, 0), Bf16(kDown, {kE, kH, kI}, 0),
          Bf16("model.layers.2.mlp.experts.1.up_proj.weight", {kI, kH}, 0)},
         "both per expert and fused");
  // Per-expert checkpoints have nothing to split.
  auto plain = Open({Bf16("model.layers.0.mlp.experts.0.up_proj.weight", {kI, kH}, 0)});
  CHECK_FALSE(HasFusedExperts(*plain));
}

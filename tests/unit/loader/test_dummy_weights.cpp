// MakeDummyWeights: determinism, distribution, init kinds, slice consistency.
#include <catch2/catch.hpp>

#include <cmath>

#include "loader/weights.h"

using namespace oasis;
using Catch::Matchers::Contains;

namespace {

std::vector<WeightSpec> Specs() {
  return {
      {"embed", {1000, 64}, DType::kBF16, DummyInit::kNormal, 0.02f},
      {"proj", {3, 5, 7}, DType::kF32, DummyInit::kNormal, 1.0f},
      {"norm", {64}, DType::kBF16, DummyInit::kOnes, 0.0f},
      {"bias", {8}, DType::kF16, DummyInit::kZeros, 0.0f},
      {"d2t", {16}, DType::kI64, DummyInit::kZeros, 0.0f},
      {"t2d", {4}, DType::kBool, DummyInit::kOnes, 0.0f},
  };
}

std::vector<float> Floats(const Tensor& t) {
  Tensor f = t.ToFloat();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

}  // namespace

TEST_CASE("dummy weights: info and names", "[loader][dummy]") {
  auto w = MakeDummyWeights(Specs(), 7);
  CHECK(w->Names() == std::vector<std::string>{"bias", "d2t", "embed", "norm", "proj", "t2d"});
  CHECK(w->Has("embed"));
  CHECK_FALSE(w->Has("lm_head"));
  auto info = w->Info("proj");
  REQUIRE(info.ok());
  CHECK(info->shape == std::vector<int64_t>{3, 5, 7});
  CHECK(info->dtype == DType::kF32);
  auto missing = w->Load("lm_head", DType::kF32);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("'lm_head'"));
  CHECK_THAT(w->Describe(), Contains("dummy"));
}

TEST_CASE("dummy weights: deterministic in seed and name", "[loader][dummy]") {
  auto a = MakeDummyWeights(Specs(), 7);
  auto b = MakeDummyWeights(Specs(), 7);
  auto c = MakeDummyWeights(Specs(), 8);
  const auto ea = Floats(*a->Load("embed", DType::kF32));
  CHECK(ea == Floats(*b->Load("embed", DType::kF32)));
  CHECK(ea != Floats(*c->Load("embed", DType::kF32)));
  // Same shape, different names -> different values.
  auto twins = MakeDummyWeights({{"x", {64}, DType::kF32}, {"y", {64}, DType::kF32}}, 1);
  CHECK(Floats(*twins->Load("x", DType::kF32)) != Floats(*twins->Load("y", DType::kF32)));
}

TEST_CASE("dummy weights: normal values have the requested spread", "[loader][dummy]") {
  auto w = MakeDummyWeights({{"big", {200000}, DType::kF32, DummyInit::kNormal, 0.5f}}, 3);
  const auto v = Floats(*w->Load("big", DType::kF32));
  double sum = 0, sq = 0;
  size_t beyond_3sd = 0;
  for (float x : v) {
    REQUIRE(std::isfinite(x));
    sum += x;
    sq += static_cast<double>(x) * x;
    beyond_3sd += std::fabs(x) > 1.5f;
  }
  const double mean = sum / v.size();
  const double sd = std::sqrt(sq / v.size() - mean * mean);
  CHECK(std::fabs(mean) < 0.01);
  CHECK(sd == Approx(0.5).epsilon(0.01));
  // Normal: P(|z| > 3) = 0.27%.
  CHECK(beyond_3sd > 200000 * 0.0015);
  CHECK(beyond_3sd < 200000 * 0.004);
}

TEST_CASE("dummy weights: ones, zeros and integer tensors", "[loader][dummy]") {
  auto w = MakeDummyWeights(Specs(), 1);
  CHECK(Floats(*w->Load("norm", DType::kF32)) == std::vector<float>(64, 1.0f));
  auto norm_bf16 = w->Load("norm", DType::kBF16);
  REQUIRE(norm_bf16.ok());
  CHECK(norm_bf16->data<uint16_t>()[63] == 0x3f80);
  CHECK(Floats(*w->Load("bias", DType::kF32)) == std::vector<float>(8, 0.0f));
  auto d2t = w->Load("d2t", DType::kI64);
  REQUIRE(d2t.ok());
  for (int i = 0; i < 16; ++i) CHECK(d2t->data<int64_t>()[i] == 0);
  auto t2d = w->Load("t2d", DType::kBool);
  REQUIRE(t2d.ok());
  for (int i = 0; i < 4; ++i) CHECK(t2d->data<uint8_t>()[i] == 1);
  CHECK(w->Load("d2t", DType::kF32).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("dummy weights: values are rounded to the spec dtype", "[loader][dummy]") {
  auto w = MakeDummyWeights(Specs(), 5);
  auto f32 = w->Load("embed", DType::kF32);
  auto bf16 = w->Load("embed", DType::kBF16);
  REQUIRE(f32.ok());
  REQUIRE(bf16.ok());
  for (int64_t i = 0; i < f32->numel(); ++i) {
    REQUIRE(f32->data<float>()[i] == Bf16BitsToFloat(bf16->data<uint16_t>()[i]));
  }
}

TEST_CASE("dummy weights: slices equal the same part of the full tensor", "[loader][dummy]") {
  auto w = MakeDummyWeights(Specs(), 11);
  SECTION("rows and columns of a 2-D tensor, odd offsets") {
    const auto full = Floats(*w->Load("embed", DType::kF32));
    auto rows = w->LoadSlice("embed", 0, 333, 667, DType::kF32);
    REQUIRE(rows.ok());
    CHECK(rows->shape() == std::vector<int64_t>{334, 64});
    CHECK(Floats(*rows) == std::vector<float>(full.begin() + 333 * 64, full.begin() + 667 * 64));
    auto cols = w->LoadSlice("embed", 1, 13, 50, DType::kF32);
    REQUIRE(cols.ok());
    const auto c = Floats(*cols);
    for (int r = 0; r < 1000; ++r) {
      for (int k = 0; k < 37; ++k) REQUIRE(c[r * 37 + k] == full[r * 64 + 13 + k]);
    }
  }
  SECTION("every dim-0 and dim-2 slice of a 3-D tensor") {
    const auto full = Floats(*w->Load("proj", DType::kF32));
    for (int64_t b = 0; b <= 3; ++b) {
      for (int64_t e = b; e <= 3; ++e) {
        auto part = w->LoadSlice("proj", 0, b, e, DType::kF32);
        REQUIRE(part.ok());
        CHECK(Floats(*part) == std::vector<float>(full.begin() + b * 35, full.begin() + e * 35));
      }
    }
    auto last = w->LoadSlice("proj", 2, 3, 4, DType::kF32);
    REQUIRE(last.ok());
    const auto l = Floats(*last);
    REQUIRE(l.size() == 15);
    for (int i = 0; i < 15; ++i) CHECK(l[i] == full[i * 7 + 3]);
  }
  SECTION("bad slices") {
    CHECK(w->LoadSlice("embed", 0, 0, 1001, DType::kF32).status().code() == StatusCode::kOutOfRange);
    CHECK(w->LoadSlice("embed", 3, 0, 1, DType::kF32).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("dummy weights: large tensors split across threads give the same values", "[loader][dummy]") {
  // 1536 x 2048 = 3.1M elements: Load splits it into 1M-element pieces; small row slices are
  // generated in one piece each, and the odd column offset splits Box-Muller pairs.
  auto w = MakeDummyWeights({{"big", {1536, 2048}, DType::kBF16, DummyInit::kNormal, 0.02f}}, 99);
  auto full = w->Load("big", DType::kF32);
  REQUIRE(full.ok());
  const float* f = full->data<float>();
  for (int64_t b : {0, 511, 1000, 1535}) {
    auto rows = w->LoadSlice("big", 0, b, b + 1, DType::kF32);
    REQUIRE(rows.ok());
    for (int64_t k = 0; k < 2048; ++k) REQUIRE(rows->data<float>()[k] == f[b * 2048 + k]);
  }
  auto cols = w->LoadSlice("big", 1, 1023, 1537, DType::kF32);
  REQUIRE(cols.ok());
  for (int64_t r = 0; r < 1536; r += 97) {
    for (int64_t k = 0; k < 514; ++k) REQUIRE(cols->data<float>()[r * 514 + k] == f[r * 2048 + 1023 + k]);
  }
  auto wide = w->LoadSlice("big", 0, 100, 1500, DType::kBF16);
  REQUIRE(wide.ok());
  for (int64_t i = 0; i < wide->numel(); i += 4099) {
    REQUIRE(Bf16BitsToFloat(wide->data<uint16_t>()[i]) == f[100 * 2048 + i]);
  }
}

TEST_CASE("dummy weights: bytes from the specs and the host-memory check", "[loader][dummy]") {
  CHECK(WeightBytes(Specs(), 4) == 4.0 * (64000 + 105 + 64 + 8 + 16 + 4));
  // At most the spec's dtype: bf16 (2), f32 -> 2, bf16, f16, i64 -> 2, bool (1).
  CHECK(WeightBytes(Specs(), 2, true) == 2.0 * 64000 + 2 * 105 + 2 * 64 + 2 * 8 + 2 * 16 + 4);
  // No overflow for shapes far past memory.
  CHECK(WeightBytes({{"huge", {int64_t{1} << 31, int64_t{1} << 24}}}, 4) ==
        4.0 * 36028797018963968.0);
  CHECK(CheckHostMemoryForWeights(1024, "tiny weights").ok());
  const Status too_big = CheckHostMemoryForWeights(1e21, "the model's weights");
  REQUIRE_FALSE(too_big.ok());  // a zettabyte: more than any machine has available
  CHECK(too_big.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(too_big.message(), Contains("the model's weights need"));
  CHECK_THAT(too_big.message(), Contains("GiB this machine has available"));
}

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "oasis/dtype.h"

using namespace oasis;

namespace {
float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Reference f32 -> bf16 round-to-nearest-even computed with doubles.
uint16_t RefBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dlo = Bf16BitsToFloat(lo), dhi = Bf16BitsToFloat(hi), x = f;
  if (std::isinf(dhi) && !std::isinf(f)) {
    // rounding up overflows to infinity only past the halfway point
  }
  double elo = std::fabs(x - dlo), ehi = std::fabs(dhi - x);
  if (std::isinf(dhi)) ehi = std::fabs(x - dlo) < (dlo * std::ldexp(1.0, -8)) ? 1e300 : 0;
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

TEST_CASE("dtype names round-trip", "[dtype]") {
  for (auto name : {"F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"}) {
    auto d = DTypeFromName(name);
    REQUIRE(d.has_value());
    CHECK(DTypeName(*d) == name);
  }
  CHECK_FALSE(DTypeFromName("F8_E4M3").has_value());
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kI64) == 8);
}

TEST_CASE("bf16 -> f32 -> bf16 is exact for every non-NaN bf16", "[dtype]") {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = Bf16BitsToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    REQUIRE(FloatToBf16Bits(f) == b);
  }
}

TEST_CASE("f32 -> bf16 rounds to nearest even", "[dtype]") {
  CHECK(FloatToBf16Bits(BitsToFloat(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(FloatToBf16Bits(BitsToFloat(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(FloatToBf16Bits(BitsToFloat(0x3f808001u)) == 0x3f81);  // above tie
  CHECK(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(FloatToBf16Bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflow -> inf
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = BitsToFloat(bits(rng) & 0xbfffffffu);  // finite magnitudes below 2^64
    if (std::isnan(f)) continue;
    REQUIRE(FloatToBf16Bits(f) == RefBf16(f));
  }
}

TEST_CASE("f16 <-> f32 is exact for every f16 and rounds to nearest even", "[dtype]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16BitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(F16BitsToFloat(FloatToF16Bits(f))));
      continue;
    }
    REQUIRE(FloatToF16Bits(f) == h);
  }
  CHECK(F16BitsToFloat(0x3c00) == 1.0f);
  CHECK(F16BitsToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(FloatToF16Bits(65520.0f) == 0x7c00);               // rounds to inf
  CHECK(FloatToF16Bits(65504.0f) == 0x7bff);               // max finite
  CHECK(FloatToF16Bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even (0)
  CHECK(FloatToF16Bits(std::ldexp(3.0f, -25)) == 0x0002);  // tie to even (2)
  CHECK(FloatToF16Bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie, even
  CHECK(FloatToF16Bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
}

TEST_CASE("bulk conversions", "[dtype]") {
  std::vector<float> src = {1.5f, -2.25f, 3.0e-3f, 65504.0f};
  std::vector<uint16_t> bf(4), hf(4);
  ConvertFromFloat(src.data(), bf.data(), DType::kBF16, 4);
  ConvertFromFloat(src.data(), hf.data(), DType::kF16, 4);
  std::vector<float> back(4);
  ConvertToFloat(bf.data(), DType::kBF16, back.data(), 4);
  CHECK(back[0] == 1.5f);
  CHECK(back[1] == -2.25f);
  ConvertToFloat(hf.data(), DType::kF16, back.data(), 4);
  CHECK(back[3] == 65504.0f);
  std::vector<int64_t> ints = {-3, 7};
  ConvertToFloat(ints.data(), DType::kI64, back.data(), 2);
  CHECK(back[0] == -3.0f);
  CHECK(back[1] == 7.0f);
}

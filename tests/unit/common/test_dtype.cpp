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
  for (auto name : {"F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3",
                    "F8_E5M2"}) {
    auto d = DTypeFromName(name);
    REQUIRE(d.has_value());
    CHECK(DTypeName(*d) == name);
  }
  CHECK_FALSE(DTypeFromName("F8_E8M0").has_value());
  CHECK_FALSE(DTypeFromName("f8_e4m3").has_value());
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
  CHECK(FloatToF16Bits(65520.0f) == 0x7c00);                      // rounds to inf
  CHECK(FloatToF16Bits(65504.0f) == 0x7bff);                      // max finite
  CHECK(FloatToF16Bits(std::ldexp(1.0f, -25)) == 0x0000);         // tie to even (0)
  CHECK(FloatToF16Bits(std::ldexp(3.0f, -25)) == 0x0002);         // tie to even (2)
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

namespace {

// e4m3fn decoded from its fields by the format's definition (independent of the code under
// test): bias 7, subnormals at exponent 0, 0x7f / 0xff NaN, no infinities.
double E4M3Value(int code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, mant = code & 7;
  const double mag = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
  return sign ? -mag : mag;
}

}  // namespace

TEST_CASE("fp8 e4m3: every code decodes; encoding rounds to nearest even and saturates",
          "[dtype]") {
  for (int c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      CHECK(std::isnan(f));
      continue;
    }
    REQUIRE(f == static_cast<float>(E4M3Value(c)));
    if (c != 0x80) REQUIRE(FloatToFp8E4M3(f) == c);  // exact values round-trip (-0 aside)
  }
  CHECK(FloatToFp8E4M3(-0.0f) == 0x80);
  CHECK(FloatToFp8E4M3(448.0f) == 0x7e);
  CHECK(FloatToFp8E4M3(1e9f) == 0x7e);  // saturates
  CHECK(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()) == 0xfe);
  CHECK((FloatToFp8E4M3(std::nanf("")) & 0x7f) == 0x7f);
  // Brute force: the nearest finite code, ties to the even code, over many magnitudes.
  std::vector<int> finite;
  for (int c = 0; c < 0x7f; ++c) finite.push_back(c);
  uint32_t seed = 12345;
  for (int i = 0; i < 200000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float mag = std::ldexp(static_cast<float>(seed >> 8) / 16777216.0f, (i % 24) - 14);
    const float x = (i & 1) ? -mag : mag;
    int best = 0;
    double best_err = 1e300;
    for (int c : finite) {
      const double err = std::fabs(std::fabs(double{x}) - E4M3Value(c));
      if (err < best_err || (err == best_err && (c & 1) == 0)) {
        best = c;
        best_err = err;
      }
    }
    if (std::fabs(x) >= 448.0f) best = 0x7e;
    const int want = (x < 0 ? 0x80 : 0) | best;
    REQUIRE(static_cast<int>(FloatToFp8E4M3(x)) == want);
  }
  // Midpoints: 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39): even -> 0x38; 1 + 3/16 -> 0x3a.
  CHECK(FloatToFp8E4M3(1.0625f) == 0x38);
  CHECK(FloatToFp8E4M3(1.1875f) == 0x3a);
  CHECK(FloatToFp8E4M3(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest subnormal: even 0
  CHECK(FloatToFp8E4M3(std::ldexp(3.0f, -10)) == 0x02);  // 1.5 units -> 2
  CHECK(DTypeSize(DType::kF8E4M3) == 1);
  CHECK(DTypeFromName("F8_E4M3") == DType::kF8E4M3);
  CHECK(DTypeFromName("F8_E5M2") == DType::kF8E5M2);
}

TEST_CASE("fp8 e5m2 decodes as the top byte of an f16", "[dtype]") {
  CHECK(Fp8E5M2ToFloat(0x3c) == 1.0f);
  CHECK(Fp8E5M2ToFloat(0x7b) == 57344.0f);
  CHECK(std::isinf(Fp8E5M2ToFloat(0x7c)));
  CHECK(Fp8E5M2ToFloat(0x01) == std::ldexp(1.0f, -16));
  std::vector<uint8_t> b = {0x3c, 0xc0};
  std::vector<float> f(2);
  ConvertToFloat(b.data(), DType::kF8E5M2, f.data(), 2);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == -2.0f);
}

#include "oasis/dtype.h"

#include <cmath>

#include "common/check.h"

namespace oasis {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  OASIS_CHECK(false) << "unknown dtype " << static_cast<int>(dtype);
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "?";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kF16,  DType::kBF16,   DType::kF64,
                                   DType::kI64, DType::kI32,  DType::kI16,    DType::kI8,
                                   DType::kU8,  DType::kBool, DType::kF8E4M3, DType::kF8E5M2};
  for (DType d : kAll) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

float F16BitsToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t FloatToF16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    // value = abs_float; f16 subnormal unit = 2^-24
    float af;
    std::memcpy(&af, &abs, sizeof af);
    float scaled = af * 16777216.0f;   // 2^24, exact
    float r = std::nearbyint(scaled);  // round half to even (default rounding mode)
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  uint32_t exp = ((abs >> 23) - 127 + 15);
  uint32_t mant = abs & 0x7fffffu;
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(sign | half);
}

float Fp8E4M3ToFloat(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exp = (bits >> 3) & 0xfu, mant = bits & 0x7u;
  float f;
  if (exp == 0xf && mant == 0x7) {  // e4m3fn has only NaN at the top (no infinities)
    const uint32_t u = sign | 0x7fc00000u;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-9
    f = static_cast<float>(mant) * (1.0f / 512.0f);
  } else {
    const uint32_t u = ((exp + 127 - 7) << 23) | (mant << 20);
    std::memcpy(&f, &u, sizeof f);
  }
  return sign ? -f : f;
}

uint8_t FloatToFp8E4M3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  float af;
  std::memcpy(&af, &abs, sizeof af);
  if (af >= kFp8E4M3Max) return static_cast<uint8_t>(sign | 0x7eu);  // saturate (inf too)
  if (af < 0.015625f) {  // below 2^-6: subnormal unit 2^-9, round half to even
    const float r = std::nearbyint(af * 512.0f);  // 0..8 (8 = the smallest normal, 0x08)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));
  }
  const uint32_t exp = (abs >> 23) - 127 + 7;  // 1..15
  const uint32_t mant = abs & 0x7fffffu;
  uint32_t q = (exp << 3) | (mant >> 20);
  const uint32_t rest = mant & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (q & 1u))) ++q;  // may carry into the exponent
  if (q > 0x7eu) q = 0x7eu;                                    // 464 and above round to 448
  return static_cast<uint8_t>(sign | q);
}

float Fp8E5M2ToFloat(uint8_t bits) {
  // e5m2 is the top byte of an IEEE f16.
  return F16BitsToFloat(static_cast<uint16_t>(bits) << 8);
}

namespace {
template <typename T>
void IntToFloat(const void* src, float* dst, size_t n) {
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
}  // namespace

void ConvertToFloat(const void* src, DType src_dtype, float* dst, size_t n) {
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16BitsToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16BitsToFloat(s[i]);
      return;
    }
    case DType::kF64:
      IntToFloat<double>(src, dst, n);
      return;
    case DType::kI64:
      IntToFloat<int64_t>(src, dst, n);
      return;
    case DType::kI32:
      IntToFloat<int32_t>(src, dst, n);
      return;
    case DType::kI16:
      IntToFloat<int16_t>(src, dst, n);
      return;
    case DType::kI8:
      IntToFloat<int8_t>(src, dst, n);
      return;
    case DType::kU8:
    case DType::kBool:
      IntToFloat<uint8_t>(src, dst, n);
      return;
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(s[i]);
      return;
    }
    case DType::kF8E5M2: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E5M2ToFloat(s[i]);
      return;
    }
  }
  OASIS_CHECK(false) << "ConvertToFloat: unsupported dtype";
}

void ConvertFromFloat(const float* src, void* dst, DType dst_dtype, size_t n) {
  switch (dst_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBf16Bits(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToF16Bits(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToFp8E4M3(src[i]);
      return;
    }
    default:
      break;
  }
  OASIS_CHECK(false) << "ConvertFromFloat: unsupported target dtype " << DTypeName(dst_dtype);
}

}  // namespace oasis

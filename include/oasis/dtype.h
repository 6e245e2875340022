// Element types and exact conversions between bf16 / f16 / f32.
//
// bf16 -> f32 and f16 -> f32 are exact. f32 -> bf16 and f32 -> f16 round to nearest even
// (NaN stays NaN, overflow becomes infinity), matching PyTorch's `.to(dtype)`.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace oasis {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL".
std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);

inline float Bf16BitsToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, keep sign
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

float F16BitsToFloat(uint16_t bits);
uint16_t FloatToF16Bits(float f);

// Converts `count` elements of `src_dtype` to float. Supports F32, F16, BF16, F64 and the
// integer types (value-converted).
void ConvertToFloat(const void* src, DType src_dtype, float* dst, size_t count);
// Converts floats to F32, F16 or BF16.
void ConvertFromFloat(const float* src, void* dst, DType dst_dtype, size_t count);

}  // namespace oasis

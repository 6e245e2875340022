// Element types and exact conversions between bf16 / f16 / f32 / fp8.
//
// bf16 -> f32 and f16 -> f32 are exact. f32 -> bf16 and f32 -> f16 round to nearest even
// (NaN stays NaN, overflow becomes infinity), matching PyTorch's `.to(dtype)`.
// fp8 (OCP e4m3fn / e5m2) -> f32 is exact. f32 -> e4m3fn rounds to nearest even and saturates
// to ±448 (CUDA's __NV_SATFINITE, the conversion the KV cache and FP8 weights use); NaN
// becomes e4m3fn's NaN (0x7f / 0xff).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace oasis {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,  // OCP float8 e4m3fn (torch.float8_e4m3fn): no infinities, max 448
  kF8E5M2,  // OCP float8 e5m2 (torch.float8_e5m2): read only (checkpoints), never computed
};

// Largest finite e4m3fn magnitude.
inline constexpr float kFp8E4M3Max = 448.0f;

// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL",
// "F8_E4M3", "F8_E5M2".
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

float Fp8E4M3ToFloat(uint8_t bits);
// Round to nearest even, saturating to ±kFp8E4M3Max; NaN -> 0x7f with the sign.
uint8_t FloatToFp8E4M3(float f);
float Fp8E5M2ToFloat(uint8_t bits);

// Converts `count` elements of `src_dtype` to float. Supports F32, F16, BF16, F64, the FP8
// types and the integer types (value-converted).
void ConvertToFloat(const void* src, DType src_dtype, float* dst, size_t count);
// Converts floats to F32, F16, BF16 or F8E4M3 (saturating).
void ConvertFromFloat(const float* src, void* dst, DType dst_dtype, size_t count);

}  // namespace oasis

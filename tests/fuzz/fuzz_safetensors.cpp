// libFuzzer target: the safetensors header parser on arbitrary file contents.
// A successful parse must describe byte ranges that really lie inside the input: every
// tensor's bytes are read (ASan catches any out-of-bounds view) and float tensors are
// converted to f32 through the loader's conversion path.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loader/safetensors.h"
#include "loader/tensor_copy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oasis;
  auto header = ParseSafetensorsHeader(data, size, "fuzz.safetensors");
  if (!header.ok()) {
    if (header.status().message().empty()) __builtin_trap();
    return 0;
  }
  const SafetensorsHeader& h = *header;
  if (h.data_offset + h.data_size != size) __builtin_trap();
  volatile uint8_t sink = 0;
  std::vector<float> floats;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.end > h.data_size || e.begin > e.end) __builtin_trap();
    if (static_cast<uint64_t>(e.numel()) * DTypeSize(e.dtype) != e.nbytes()) __builtin_trap();
    if (h.Find(e.name) != &e) __builtin_trap();
    const uint8_t* bytes = data + h.data_offset + e.begin;
    for (uint64_t i = 0; i < e.nbytes(); ++i) sink = sink ^ bytes[i];
    if (IsFloatDType(e.dtype)) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(e.numel(), 4096));
      floats.resize(n);
      ConvertElements(bytes, e.dtype, floats.data(), DType::kF32, n);
    }
  }
  (void)sink;
  return 0;
}

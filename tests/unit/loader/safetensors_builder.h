// Test helpers: build safetensors file images in memory (good ones from tensors, bad ones
// from raw header text) and write them to disk.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "oasis/dtype.h"

namespace oasis::testing {

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors spelling
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian element bytes
};

inline std::string Le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// 8-byte length + header text + data, with no checks.
inline std::string RawImage(const std::string& header, const std::string& data = "") {
  return Le64(header.size()) + header + data;
}

// A valid file: tensors laid out back to back in the given order, header padded with spaces
// to a multiple of 8 (as the reference writer does).
inline std::string BuildSafetensors(const std::vector<RawTensor>& tensors,
                                    const nlohmann::json& metadata = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  return RawImage(text, data);
}

template <typename T>
std::string BytesOf(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(s.data(), values.data(), s.size());
  return s;
}

inline std::string Bf16BytesOf(const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(FloatToBf16Bits(v));
  return BytesOf(bits);
}

inline void WriteBinaryFile(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
}

}  // namespace oasis::testing

// Safetensors files: header parsing and validation (from memory, for the fuzzer too) and
// SafetensorsFile, a read-only mmap of one file with raw-byte views of its tensors.
//
// File layout: 8-byte little-endian header length N, N bytes of JSON header, data section.
// The header is a JSON object: tensor name -> {"dtype", "shape", "data_offsets": [begin,end]}
// (offsets relative to the data section), plus an optional "__metadata__" string->string map.
//
// Validation is complete: after a successful parse every tensor's byte range lies inside
// the data section, matches its shape and dtype exactly, and overlaps no other tensor.
// Error codes: DataLoss for a truncated or unreadable file (short file, header length past
// the end, non-JSON header, byte ranges outside the data section); InvalidArgument for a
// readable header with bad contents (unknown dtype, bad shape, size mismatch, overlapping
// tensors, bad metadata); NotFound for a missing file or tensor. Messages name the file
// and, where relevant, the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "loader/mapped_file.h"
#include "oasis/dtype.h"
#include "oasis/status.h"

namespace oasis {

// One tensor entry of a validated header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // every dim >= 0
  uint64_t begin = 0;          // byte range [begin, end) relative to the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// A validated header. Plain value type; thread-compatible.
struct SafetensorsHeader {
  uint64_t header_size = 0;               // N: length of the JSON text
  uint64_t data_offset = 0;               // 8 + N: file offset where the data section starts
  uint64_t data_size = 0;                 // bytes in the data section (file size - data_offset)
  std::vector<SafetensorsEntry> tensors;  // in header (JSON object) order
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent

  // Index into `tensors` by name.
  std::unordered_map<std::string, size_t> by_name;

  const SafetensorsEntry* Find(const std::string& name) const;
};

// Headers longer than this are rejected (as the reference implementation does).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Parses and validates the header of a safetensors file whose complete contents are
// `data[0, size)`. Never reads outside that range. `source` names the file in messages.
StatusOr<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                   std::string source);

// SafetensorsFile: one mapped, validated safetensors file.
// Owns its mapping and parsed header. Movable, not copyable. Immutable after Open, so all
// const methods are thread-safe. Tensor views point into the mapping and are valid while
// the SafetensorsFile lives.
class SafetensorsFile {
 public:
  // Maps and validates `path` (see the error codes above).
  static StatusOr<SafetensorsFile> Open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // Tensor names in header order.
  std::vector<std::string> Names() const;
  bool Has(const std::string& name) const { return header_.Find(name) != nullptr; }
  // nullptr when absent.
  const SafetensorsEntry* Find(const std::string& name) const { return header_.Find(name); }

  // The raw little-endian bytes of `entry` (which must come from this file's header).
  // Not necessarily aligned to the element size.
  std::span<const uint8_t> Bytes(const SafetensorsEntry& entry) const;
  // NotFound (naming file and tensor) when absent.
  StatusOr<std::span<const uint8_t>> TensorBytes(const std::string& name) const;

 private:
  SafetensorsFile(MappedFile file, SafetensorsHeader header)
      : file_(std::move(file)), header_(std::move(header)) {}

  MappedFile file_;
  SafetensorsHeader header_;
};

}  // namespace oasis

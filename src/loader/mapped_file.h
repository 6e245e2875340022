// MappedFile: a whole file mapped read-only into memory (mmap, MAP_PRIVATE).
//
// Owns the mapping (unmapped on destruction); the file descriptor is closed right after
// mapping. Movable, not copyable. Immutable after Open: concurrent reads are thread-safe.
// Caveat: if another process truncates the file while it is mapped, touching the lost
// pages raises SIGBUS; checkpoints are assumed not to change while the server runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "oasis/status.h"

namespace oasis {

class MappedFile {
 public:
  // NotFound when the file does not exist, InvalidArgument when it is not a regular file,
  // Internal when open/mmap fail for another reason. An empty file maps to (nullptr, 0).
  static StatusOr<MappedFile> Open(const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void Reset();

  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace oasis

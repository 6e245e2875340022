// ShortWordCache: the BPE ids of short words (<= 22 bytes, <= 6 ids) in a direct-mapped table of
// 64-byte entries shared by all threads, without locks: each entry is a seqlock (an even version
// while stable, odd while a writer fills it). A reader copies the entry and keeps it only if the
// version did not move; a writer that finds the entry busy simply skips caching. A hit costs one
// hash and one cache line, and entries are only ever overwritten (bounded memory).
//
// Owns its table (kEntries * 64 bytes). Thread-safe; all fields are atomics (no data race).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace oasis::tokenizer {

class ShortWordCache {
 public:
  static constexpr size_t kMaxWordBytes = 22;
  static constexpr size_t kMaxIds = 6;

  explicit ShortWordCache(size_t entries_log2 = 16);

  // A fast 64-bit hash of a short string (never 0).
  static uint64_t Hash(std::string_view word);

  // Appends the ids of `word` (<= kMaxWordBytes) to `out` and returns true on a hit.
  bool Lookup(std::string_view word, uint64_t hash, std::vector<int32_t>* out) const;
  // Caches ids for `word` (<= kMaxWordBytes, count <= kMaxIds); may silently skip.
  void Insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t count);

 private:
  static constexpr size_t kWords = 7;  // payload: 56 bytes
  // Payload layout (bytes): [0,8) hash, [8] word length, [9] id count, [10,32) word,
  // [32,56) ids.
  struct alignas(64) Entry {
    std::atomic<uint64_t> version{0};
    std::atomic<uint64_t> payload[kWords] = {};
  };
  static_assert(sizeof(Entry) == 64);

  size_t mask_;
  std::unique_ptr<Entry[]> entries_;
};

}  // namespace oasis::tokenizer

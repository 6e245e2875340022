#include "tokenizer/short_word_cache.h"

#include <cstring>

namespace oasis::tokenizer {
namespace {

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  return x;
}

constexpr size_t kWordOffset = 10;
constexpr size_t kIdsOffset = 32;

}  // namespace

ShortWordCache::ShortWordCache(size_t entries_log2)
    : mask_((size_t{1} << entries_log2) - 1), entries_(new Entry[size_t{1} << entries_log2]) {}

uint64_t ShortWordCache::Hash(std::string_view word) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ word.size();
  size_t i = 0;
  for (; i + 8 <= word.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, word.data() + i, 8);
    h = Mix(h ^ v) * 0x9E3779B97F4A7C15ULL;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, word.data() + i, word.size() - i);
  h = Mix(h ^ tail ^ (uint64_t{word.size() - i} << 56));
  return h | 1;
}

bool ShortWordCache::Lookup(std::string_view word, uint64_t hash, std::vector<int32_t>* out) const {
  const Entry& e = entries_[hash & mask_];
  const uint64_t before = e.version.load(std::memory_order_acquire);
  if (before & 1) return false;
  uint64_t copy[kWords];
  // Acquire loads keep the version re-check after them; a payload word written by a concurrent
  // writer (a release store after its odd version) makes the re-check see that version.
  for (size_t k = 0; k < kWords; ++k) copy[k] = e.payload[k].load(std::memory_order_acquire);
  if (e.version.load(std::memory_order_relaxed) != before) return false;
  if (copy[0] != hash) return false;
  unsigned char bytes[kWords * 8];
  std::memcpy(bytes, copy, sizeof(bytes));
  if (bytes[8] != word.size() || std::memcmp(bytes + kWordOffset, word.data(), word.size()) != 0) {
    return false;
  }
  const size_t count = bytes[9];
  const size_t at = out->size();
  out->resize(at + count);
  std::memcpy(out->data() + at, bytes + kIdsOffset, count * sizeof(int32_t));
  return true;
}

void ShortWordCache::Insert(std::string_view word, uint64_t hash, const int32_t* ids,
                            size_t count) {
  Entry& e = entries_[hash & mask_];
  uint64_t version = e.version.load(std::memory_order_relaxed);
  if ((version & 1) ||
      !e.version.compare_exchange_strong(version, version + 1, std::memory_order_relaxed)) {
    return;  // another writer is filling this entry
  }
  unsigned char bytes[kWords * 8] = {};
  std::memcpy(bytes, &hash, 8);
  bytes[8] = static_cast<unsigned char>(word.size());
  bytes[9] = static_cast<unsigned char>(count);
  std::memcpy(bytes + kWordOffset, word.data(), word.size());
  std::memcpy(bytes + kIdsOffset, ids, count * sizeof(int32_t));
  uint64_t words[kWords];
  std::memcpy(words, bytes, sizeof(words));
  for (size_t k = 0; k < kWords; ++k) e.payload[k].store(words[k], std::memory_order_release);
  e.version.store(version + 2, std::memory_order_release);
}

}  // namespace oasis::tokenizer

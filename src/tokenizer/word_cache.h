// WordCache: a bounded cache of BPE results, word bytes -> token ids. Thread-safe: 16 shards,
// each a mutex-guarded hash map; a shard that reaches its share of the capacity is cleared (so
// memory stays bounded in a long-running server while hot words quickly come back). Owns copies
// of the words and ids it stores.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace oasis::tokenizer {

class WordCache {
 public:
  // Words longer than this are never cached.
  static constexpr size_t kMaxWordBytes = 128;

  explicit WordCache(size_t capacity) : shard_capacity_(capacity / kShards + 1) {}

  // Appends the cached ids of `word` to `out`; false on a miss.
  bool Lookup(std::string_view word, size_t hash, std::vector<int32_t>* out) const {
    const Shard& shard = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out->insert(out->end(), it->second.begin(), it->second.end());
    return true;
  }

  void Insert(std::string_view word, size_t hash, const int32_t* ids, size_t count) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= shard_capacity_) shard.map.clear();
    shard.map.try_emplace(std::string(word), ids, ids + count);
  }

  static size_t Hash(std::string_view word) { return std::hash<std::string_view>{}(word); }

 private:
  static constexpr size_t kShards = 16;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };

  size_t shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace oasis::tokenizer

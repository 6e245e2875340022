// MergeTable: the BPE merge rules, (left id, right id) -> (rank, merged id), in an open-addressing
// hash table (linear probing, power-of-two capacity, load <= 1/2). Built once while loading,
// then read-only: concurrent Find calls are thread-safe. Owns its slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oasis::tokenizer {

struct MergeRule {
  int32_t rank = -1;  // lower merges first
  int32_t merged_id = -1;
};

class MergeTable {
 public:
  void Reserve(size_t rules) {
    size_t capacity = 16;
    while (capacity < rules * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    size_ = 0;
  }

  // Inserts or overwrites (a later rule for the same pair wins, as in HF tokenizers).
  void Insert(int32_t left, int32_t right, MergeRule rule) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty) {
        s.key = key;
        s.rule = rule;
        ++size_;
        return;
      }
      if (s.key == key) {
        s.rule = rule;
        return;
      }
    }
  }

  // The rule for the pair, or nullptr.
  const MergeRule* Find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.rule;
      if (s.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    MergeRule rule;
  };

  static uint64_t Key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  static size_t Hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return static_cast<size_t>(key);
  }
  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    Reserve(old.empty() ? 8 : old.size());
    for (const Slot& s : old) {
      if (s.key != kEmpty) {
        Insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu),
               s.rule);
      }
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace oasis::tokenizer

// BlockAllocator: hands out head-block slots of the paged KV cache, [0, num_slots).
// A slot id addresses the same head-block in every layer's pool (LayerKvPool).
// Owns the free list only. Not thread-safe: owned and used by the engine loop thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace oasis {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_slots);

  // `count` slots, or nullopt (nothing taken) when fewer are free. Most recently freed first; a
  // fresh pool gives ascending slots and a vector freed together comes back in its own order,
  // so reservations get contiguous runs where the pool has them.
  std::optional<std::vector<int32_t>> Allocate(int32_t count);
  // Returns slots; freeing a slot twice or one never allocated is a CHECK failure.
  void Free(const std::vector<int32_t>& slots);

  int32_t num_slots() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

 private:
  std::vector<int32_t> free_;  // LIFO: recently freed slots are reused first
  std::vector<bool> in_use_;
};

}  // namespace oasis

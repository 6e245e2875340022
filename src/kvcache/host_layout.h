// HostLayout: how one request holds its first host blocks per sparse layer, when they are not
// whole host slots (the same slot id in every layer). SparseKvManager::ReserveWith takes one
// for a reservation; the request's blocks [0, layer_blocks()) are then addressed through
// Slot(), the others are whole slots the manager allocates. The decode side of disaggregation
// builds them (disagg/kv_import.h: cells for the blocks it has, summary-only rows for the
// blocks that have not arrived yet).
//
// Owned by the manager from ReserveWith until the request's Release, which calls Release()
// on the store it was built against. Not thread-safe: the engine loop thread.
#pragma once

#include <cstdint>

#include "kvcache/host_kv_store.h"

namespace oasis {

class HostLayout {
 public:
  virtual ~HostLayout() = default;
  // Blocks [0, layer_blocks()) are held per layer.
  virtual int64_t layer_blocks() const = 0;
  // Host id of (model layer >= dense_layers, KV head, block < layer_blocks()): a cell, or a
  // summary-only row (HostKvStore::IsSlot false: its summaries go there, never K/V).
  virtual int32_t Slot(int64_t layer, int64_t head, int64_t block) const = 0;
  // Host memory (K/V storage) the layout holds in `store`: its cells.
  virtual int64_t BytesHeld(const HostKvStore& store) const = 0;
  // Returns every cell and summary-only row to `store`.
  virtual void Release(HostKvStore& store) = 0;
};

}  // namespace oasis

// HostKvStore: the full KV of sparse requests in host memory the device can read directly
// (Backend::EmptyHost: pinned + mapped), plus the block summaries kept on the device.
//
// A host slot is one head-block (kBlockSize tokens of one KV head) in EVERY sparse layer,
// like a GPU slot in the paged pools: pool(l).k[slot] holds its keys in layer l. Summaries are
// indexed by the same slot: kmin(l)[slot] / kmax(l)[slot] are the element-wise min / max of
// its (post-RoPE) keys, so one host table (logical block -> host slot) serves both the gather
// source and block scoring. Only layers >= first_sparse_layer have storage.
//
// Summary-only rows (disaggregation's decode side, docs/disaggregation.md §5): rows
// [num_slots, num_slots + num_summary_rows) of the summary tensors have no K/V storage. A
// *remote* block (its K/V still on the prefill instance) holds one, so scoring sees it while
// it costs the host store nothing; when its K/V arrives it moves to a real slot. Free() takes
// both kinds.
//
// Owns the host pools, the device summary tensors and the host-slot free list. Not
// thread-safe: owned by the engine loop thread (through SparseKvManager).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"

namespace oasis {

class HostKvStore {
 public:
  // Sizes the store to `bytes` (rounded down to whole slots) over layers
  // [first_sparse_layer, num_layers) of `head_dim` and the backend's activation dtype.
  // `summary_rows`: summary-only rows after the slots (0: none).
  HostKvStore(Backend& backend, int64_t num_layers, int64_t first_sparse_layer, int64_t head_dim, size_t bytes,
              int32_t summary_rows = 0);

  // K and V of one host slot in every sparse layer.
  static size_t BytesPerSlot(int64_t num_sparse_layers, int64_t head_dim, DType dtype);

  int64_t num_layers() const { return num_layers_; }
  int64_t first_sparse_layer() const { return first_sparse_layer_; }
  int32_t num_slots() const { return allocator_.num_slots(); }
  int32_t num_free() const { return allocator_.num_free(); }
  size_t bytes_per_slot() const { return bytes_per_slot_; }
  int32_t num_summary_rows() const { return rows_allocator_.num_slots(); }
  int32_t num_free_summary_rows() const { return rows_allocator_.num_free(); }
  // A host slot (K/V storage), not a summary-only row.
  bool IsSlot(int32_t id) const { return id >= 0 && id < num_slots(); }

  // `count` host slots, or nullopt (nothing taken).
  std::optional<std::vector<int32_t>> Allocate(int32_t count) { return allocator_.Allocate(count); }
  // `count` summary-only rows (ids >= num_slots()), or nullopt (nothing taken).
  std::optional<std::vector<int32_t>> AllocateSummaryRows(int32_t count);
  // Returns host slots and summary-only rows.
  void Free(const std::vector<int32_t>& ids);

  // Layer `layer` (>= first_sparse_layer): host pool [num_slots, kBlockSize, head_dim] (host
  // memory) and summaries [num_slots + num_summary_rows, head_dim] (device memory).
  LayerKvPool& pool(int64_t layer);
  Tensor& kmin(int64_t layer);
  Tensor& kmax(int64_t layer);

 private:
  int64_t num_layers_, first_sparse_layer_;
  size_t bytes_per_slot_;
  BlockAllocator allocator_;
  BlockAllocator rows_allocator_;  // summary-only rows, offset by num_slots
  std::vector<LayerKvPool> pools_;  // [num_layers - first_sparse_layer]
  std::vector<Tensor> kmin_, kmax_;
};

}  // namespace oasis

// HostKvStore: the full KV of sparse requests in host memory the device can read directly
// (Backend::EmptyHost: pinned + mapped), plus the block summaries kept on the device.
//
// A host slot is one head-block (kBlockSize tokens of one KV head) in EVERY sparse layer,
// like a GPU slot in the paged pools: pool(l).k[slot] holds its keys in layer l. Summaries are
// indexed by the same slot: kmin(l)[slot] / kmax(l)[slot] are the element-wise min / max of
// its (post-RoPE) keys, so one host table (logical block -> host slot) serves both the gather
// source and block scoring. Only layers >= first_sparse_layer have storage.
//
// Cells (disaggregation's decode side, docs/disaggregation.md §5): an imported request's staged
// blocks are local or remote per layer, so it holds them per layer. A *cell* is one layer's
// share of a slot. AllocateCells(l) hands out slots whose layer-l cell is free, taking a fresh
// slot (whose cells in every layer become free) when layer l has none; a slot goes back to the
// free list when its last cell is freed. Layers that use cells evenly waste little.
//
// Summary-only rows: rows [num_slots, num_slots + num_summary_rows) of each layer's summary
// tensors have no K/V storage, allocated per layer. A *remote* block (its K/V still on the
// prefill instance) holds one, so scoring sees it while it costs no host memory; when its K/V
// arrives it moves to a cell.
//
// Parked cells (disaggregation's decode side reusing a prefix, kvcache/store_prefix_cache.h):
// cells no request holds that a cache keeps for a later import of the same prompt prefix.
// They stay in use (never free cells); a slot whose every used cell is parked is *evictable*:
// num_free() counts it, and Allocate / AllocateCells that find too few free slots ask the
// CellEvictor to drop parked cells (its oldest first) until they have them. So admission sees
// parked cells as room, as the GPU pool sees cached blocks (kvcache/prefix_cache.h).
//
// Owns the host pools, the device summary tensors and the free lists. Not thread-safe: owned
// by the engine loop thread (through SparseKvManager).
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"

namespace oasis {

class HostKvStore {
 public:
  // Drops parked cells or slots when the store needs room (StorePrefixCache).
  class CellEvictor {
   public:
    virtual ~CellEvictor() = default;
    // Unparks and frees the cells of the oldest parked entry; false when none is left.
    virtual bool EvictOldest() = 0;
  };

  // Sizes the store to `bytes` (rounded down to whole slots) over layers
  // [first_sparse_layer, num_layers) of `head_dim` K/V of `kv_dtype` (the GPU pools' element
  // type; default the backend's activation dtype), with `summary_rows` summary-only rows per
  // layer after the slots and then `in_place_rows` summary rows for the GPU pool's slots
  // (in_place_base() + GPU slot: the summaries of sparse requests whose KV stays in HBM,
  // docs/sparse.md §12). Summaries have the activation dtype, or e4m3 for FP8 pools (exact:
  // the min and max of stored e4m3 values).
  HostKvStore(Backend& backend, int64_t num_layers, int64_t first_sparse_layer, int64_t head_dim,
              size_t bytes, int32_t summary_rows = 0, int32_t in_place_rows = 0,
              std::optional<DType> kv_dtype = std::nullopt);

  // K and V of one host slot in every sparse layer.
  static size_t BytesPerSlot(int64_t num_sparse_layers, int64_t head_dim, DType dtype);
  // Whole slots of `per_slot` bytes in `bytes` (at most INT32_MAX / kBlockSize: token rows
  // stay int32).
  static int32_t SlotsFor(size_t bytes, size_t per_slot);

  int64_t num_layers() const { return num_layers_; }
  int64_t first_sparse_layer() const { return first_sparse_layer_; }
  int64_t num_sparse_layers() const { return num_layers_ - first_sparse_layer_; }
  int32_t num_slots() const { return allocator_.num_slots(); }
  // Slots with no cell in use, plus the evictable ones (every used cell parked).
  int32_t num_free() const { return allocator_.num_free() + evictable_slots_ + parked_slots_; }
  size_t bytes_per_slot() const { return bytes_per_slot_; }
  size_t bytes_per_cell() const {
    return bytes_per_slot_ / static_cast<size_t>(num_sparse_layers());
  }
  int32_t num_summary_rows() const { return summary_rows_; }  // per layer
  // The summary row of GPU slot g is in_place_base() + g (g < num_in_place_rows()); table
  // entries >= in_place_base() name in-place blocks (Backend::SelectBlocks). INT32_MAX when
  // the store has no such rows.
  int32_t in_place_base() const {
    return in_place_rows_ > 0 ? num_slots() + summary_rows_ : INT32_MAX;
  }
  int32_t num_in_place_rows() const { return in_place_rows_; }
  int32_t num_free_summary_rows(int64_t layer) const;
  // A host slot (K/V storage), not a summary-only row.
  bool IsSlot(int32_t id) const { return id >= 0 && id < num_slots(); }

  // `count` whole slots (evicting parked cells when short), or nullopt (nothing taken).
  std::optional<std::vector<int32_t>> Allocate(int32_t count);
  void Free(const std::vector<int32_t>& slots);

  // Cells of layer `layer` free in slots already split into cells (not evictable ones: their
  // free cells come with the slot, which num_free() counts).
  int32_t num_free_cells(int64_t layer) const;
  // Fresh slots AllocateCells(layer, count) would take.
  int32_t FreshSlotsForCells(int64_t layer, int32_t count) const;
  // `count` cells of `layer` (slot ids), or nullopt (nothing taken).
  std::optional<std::vector<int32_t>> AllocateCells(int64_t layer, int32_t count);
  // `count` summary-only rows of `layer` (ids >= num_slots()), or nullopt (nothing taken).
  std::optional<std::vector<int32_t>> AllocateSummaryRows(int64_t layer, int32_t count);
  // Returns cells and summary-only rows of `layer`.
  void FreeCells(int64_t layer, const std::vector<int32_t>& ids);
  // Slots split into cells now.
  int32_t num_cell_slots() const { return cell_slots_; }

  // Parking: `cells` of `layer` (in use) are kept by a cache, not a request; UnparkCells gives
  // them back to a request (still in use). A cell is freed only unparked (FreeCells).
  void add_evictor(CellEvictor* evictor) { evictors_.push_back(evictor); }
  void remove_evictor(CellEvictor* evictor) { std::erase(evictors_, evictor); }
  void ParkCells(int64_t layer, std::span<const int32_t> cells);
  void UnparkCells(int64_t layer, std::span<const int32_t> cells);
  bool IsParked(int64_t layer, int32_t cell) const;
  int64_t num_parked_cells() const { return parked_cells_; }
  int32_t num_evictable_slots() const { return evictable_slots_ + parked_slots_; }
  // Whole slots (not split into cells) parked the same way: num_free() counts them, the
  // evictors free them. Free() takes a whole slot only unparked.
  void ParkSlots(std::span<const int32_t> slots);
  void UnparkSlots(std::span<const int32_t> slots);
  bool IsSlotParked(int32_t slot) const;

  // Layer `layer` (>= first_sparse_layer): host pool [num_slots, kBlockSize, head_dim] (host
  // memory) and summaries [num_slots + num_summary_rows, head_dim] (device memory).
  LayerKvPool& pool(int64_t layer);
  Tensor& kmin(int64_t layer);
  Tensor& kmax(int64_t layer);

 private:
  size_t LayerIndex(int64_t layer) const;

  int64_t num_layers_, first_sparse_layer_;
  size_t bytes_per_slot_;
  BlockAllocator allocator_;
  int32_t summary_rows_;
  int32_t in_place_rows_;
  std::vector<BlockAllocator> rows_allocators_;  // per sparse layer; ids offset by num_slots
  // Cells: per slot, the cells in use (slots split into cells only) and whether it is split;
  // per layer, whether its cell of each slot is free and a stack of candidates (may hold stale
  // or repeated ids: the flags are the truth) with the exact count.
  std::vector<int32_t> cells_used_;
  std::vector<char> split_;
  std::vector<std::vector<char>> cell_free_;
  std::vector<std::vector<int32_t>> free_cells_;
  std::vector<int32_t> num_free_cells_;
  int32_t cell_slots_ = 0;
  // Parked cells: per layer and slot a flag; per slot how many of its used cells are parked.
  std::vector<std::vector<char>> cell_parked_;
  std::vector<int32_t> parked_in_slot_;
  int64_t parked_cells_ = 0;
  int32_t evictable_slots_ = 0;    // slots with cells_used_ == parked_in_slot_ > 0
  std::vector<char> slot_parked_;  // whole slots parked
  int32_t parked_slots_ = 0;
  std::vector<CellEvictor*> evictors_;
  bool Evictable(size_t slot) const;
  // After a change of slot's parked or used cells, `was`: whether it was evictable before.
  void EvictableChanged(size_t slot, bool was);
  // Evicts parked cells until `enough()` or nothing is parked.
  template <typename F>
  void EvictUntil(F enough);
  std::vector<LayerKvPool> pools_;  // [num_layers - first_sparse_layer]
  std::vector<Tensor> kmin_, kmax_;
};

}  // namespace oasis

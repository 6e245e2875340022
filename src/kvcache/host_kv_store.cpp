#include "kvcache/host_kv_store.h"

#include <algorithm>
#include <climits>

#include "common/check.h"

namespace oasis {
int32_t HostKvStore::SlotsFor(size_t bytes, size_t per_slot) {
  const size_t n = per_slot == 0 ? 0 : bytes / per_slot;
  return static_cast<int32_t>(std::min<size_t>(n, INT32_MAX / kBlockSize));
}

size_t HostKvStore::BytesPerSlot(int64_t num_sparse_layers, int64_t head_dim, DType dtype) {
  return static_cast<size_t>(2 * kBlockSize * head_dim * num_sparse_layers) * DTypeSize(dtype);
}

HostKvStore::HostKvStore(Backend& backend, int64_t num_layers, int64_t first_sparse_layer,
                         int64_t head_dim, size_t bytes, int32_t summary_rows,
                         int32_t in_place_rows, std::optional<DType> kv_dtype)
    : num_layers_(num_layers),
      first_sparse_layer_(first_sparse_layer),
      bytes_per_slot_(BytesPerSlot(num_layers - first_sparse_layer, head_dim,
                                   kv_dtype.value_or(backend.activation_dtype()))),
      allocator_(SlotsFor(bytes, bytes_per_slot_)),
      summary_rows_(std::max<int32_t>(
          0, std::min<int32_t>(summary_rows, INT32_MAX / kBlockSize - allocator_.num_slots()))),
      in_place_rows_(std::max<int32_t>(0, in_place_rows)) {
  OASIS_CHECK_LE(static_cast<int64_t>(in_place_rows_),
                 int64_t{INT32_MAX} - allocator_.num_slots() - summary_rows_)
      << "host store: in-place summary rows past int32";
  OASIS_CHECK(first_sparse_layer >= 0 && first_sparse_layer < num_layers)
      << "first sparse layer " << first_sparse_layer << " of " << num_layers;
  const int64_t slots = allocator_.num_slots();
  const int64_t rows = slots + summary_rows_ + in_place_rows_;
  const auto ls = static_cast<size_t>(num_layers - first_sparse_layer);
  const DType dt = backend.activation_dtype(), kv = kv_dtype.value_or(dt);
  for (int64_t l = first_sparse_layer; l < num_layers; ++l) {
    pools_.push_back({backend.EmptyHost({slots, kBlockSize, head_dim}, kv),
                      backend.EmptyHost({slots, kBlockSize, head_dim}, kv)});
    // FP8 pools: e4m3 summaries (the min and max of stored e4m3 values are e4m3 values).
    const DType sdt = kv == DType::kF8E4M3 ? kv : dt;
    kmin_.push_back(backend.Empty({rows, head_dim}, sdt));
    kmax_.push_back(backend.Empty({rows, head_dim}, sdt));
    rows_allocators_.emplace_back(summary_rows_);
  }
  cells_used_.assign(static_cast<size_t>(slots), 0);
  split_.assign(static_cast<size_t>(slots), 0);
  cell_free_.assign(ls, std::vector<char>(static_cast<size_t>(slots), 0));
  free_cells_.resize(ls);
  num_free_cells_.assign(ls, 0);
  cell_parked_.assign(ls, std::vector<char>(static_cast<size_t>(slots), 0));
  parked_in_slot_.assign(static_cast<size_t>(slots), 0);
  slot_parked_.assign(static_cast<size_t>(slots), 0);
}

template <typename F>
void HostKvStore::EvictUntil(F enough) {
  while (!enough() && (parked_cells_ > 0 || parked_slots_ > 0)) {
    bool evicted = false;
    for (CellEvictor* e : evictors_) {
      if (!enough() && e->EvictOldest()) evicted = true;
    }
    if (!evicted) return;
  }
}

void HostKvStore::Free(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) {
    OASIS_CHECK(!IsSlotParked(s)) << "host store: slot " << s << " is parked (unpark it first)";
  }
  allocator_.Free(slots);
}

void HostKvStore::ParkSlots(std::span<const int32_t> slots) {
  for (int32_t s : slots) {
    OASIS_CHECK(IsSlot(s) && !split_[static_cast<size_t>(s)] &&
                !slot_parked_[static_cast<size_t>(s)])
        << "host store: park slot " << s << ": not a whole slot in use";
    slot_parked_[static_cast<size_t>(s)] = 1;
    ++parked_slots_;
  }
}

void HostKvStore::UnparkSlots(std::span<const int32_t> slots) {
  for (int32_t s : slots) {
    OASIS_CHECK(IsSlotParked(s)) << "host store: unpark slot " << s << ": not parked";
    slot_parked_[static_cast<size_t>(s)] = 0;
    --parked_slots_;
  }
}

bool HostKvStore::IsSlotParked(int32_t slot) const {
  return IsSlot(slot) && slot_parked_[static_cast<size_t>(slot)] != 0;
}

std::optional<std::vector<int32_t>> HostKvStore::Allocate(int32_t count) {
  if (count < 0 || count > num_free()) return std::nullopt;
  EvictUntil([&] { return allocator_.num_free() >= count; });
  return allocator_.Allocate(count);
}

bool HostKvStore::Evictable(size_t s) const {
  return parked_in_slot_[s] > 0 && parked_in_slot_[s] == cells_used_[s];
}

void HostKvStore::EvictableChanged(size_t s, bool was) {
  const bool now = Evictable(s);
  if (now == was) return;
  evictable_slots_ += now ? 1 : -1;
  // Its free cells leave the counts while it is evictable (they come with the slot), and come
  // back (onto the stacks too) when it is not.
  for (size_t l = 0; l < free_cells_.size(); ++l) {
    if (!cell_free_[l][s]) continue;
    num_free_cells_[l] += now ? -1 : 1;
    if (!now) free_cells_[l].push_back(static_cast<int32_t>(s));
  }
}

void HostKvStore::ParkCells(int64_t layer, std::span<const int32_t> cells) {
  const size_t li = LayerIndex(layer);
  for (int32_t id : cells) {
    const auto s = static_cast<size_t>(id);
    OASIS_CHECK(IsSlot(id) && split_[s] && !cell_free_[li][s] && !cell_parked_[li][s])
        << "host store: park cell " << id << " of layer " << layer << ": not a used cell";
    const bool was = Evictable(s);
    cell_parked_[li][s] = 1;
    ++parked_cells_;
    ++parked_in_slot_[s];
    EvictableChanged(s, was);
  }
}

void HostKvStore::UnparkCells(int64_t layer, std::span<const int32_t> cells) {
  const size_t li = LayerIndex(layer);
  for (int32_t id : cells) {
    const auto s = static_cast<size_t>(id);
    OASIS_CHECK(IsSlot(id) && cell_parked_[li][s])
        << "host store: unpark cell " << id << " of layer " << layer << ": not parked";
    const bool was = Evictable(s);
    cell_parked_[li][s] = 0;
    --parked_cells_;
    --parked_in_slot_[s];
    EvictableChanged(s, was);
  }
}

bool HostKvStore::IsParked(int64_t layer, int32_t cell) const {
  return IsSlot(cell) && cell_parked_[LayerIndex(layer)][static_cast<size_t>(cell)] != 0;
}

size_t HostKvStore::LayerIndex(int64_t layer) const {
  OASIS_CHECK(layer >= first_sparse_layer_ && layer < num_layers_)
      << "layer " << layer << " has no host store";
  return static_cast<size_t>(layer - first_sparse_layer_);
}

int32_t HostKvStore::num_free_summary_rows(int64_t layer) const {
  return rows_allocators_[LayerIndex(layer)].num_free();
}

int32_t HostKvStore::num_free_cells(int64_t layer) const {
  return num_free_cells_[LayerIndex(layer)];
}

int32_t HostKvStore::FreshSlotsForCells(int64_t layer, int32_t count) const {
  return std::max<int32_t>(0, count - num_free_cells(layer));
}

std::optional<std::vector<int32_t>> HostKvStore::AllocateCells(int64_t layer, int32_t count) {
  const size_t li = LayerIndex(layer);
  if (count < 0 || FreshSlotsForCells(layer, count) > num_free()) return std::nullopt;
  // Evicting parked cells frees cells of this layer or whole slots: until the fresh slots the
  // rest needs are free.
  EvictUntil([&] { return FreshSlotsForCells(layer, count) <= allocator_.num_free(); });
  const int32_t fresh = FreshSlotsForCells(layer, count);
  if (fresh > allocator_.num_free()) return std::nullopt;
  if (fresh > 0) {
    auto got = allocator_.Allocate(fresh);
    OASIS_CHECK(got.has_value()) << "host store: free slots counted";
    for (int32_t s : *got) {
      split_[static_cast<size_t>(s)] = 1;
      cells_used_[static_cast<size_t>(s)] = 0;
      ++cell_slots_;
      for (size_t l = 0; l < free_cells_.size(); ++l) {
        cell_free_[l][static_cast<size_t>(s)] = 1;
        free_cells_[l].push_back(s);
        ++num_free_cells_[l];
      }
    }
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(count));
  auto& stack = free_cells_[li];
  auto& flags = cell_free_[li];
  while (static_cast<int32_t>(out.size()) < count) {
    OASIS_CHECK(!stack.empty()) << "host store: free cells counted";
    const int32_t s = stack.back();
    stack.pop_back();
    if (!split_[static_cast<size_t>(s)] || !flags[static_cast<size_t>(s)]) continue;  // stale
    // An evictable slot's free cells are not counted (the slot counts as a free slot): they go
    // back on the stacks when it stops being evictable.
    if (Evictable(static_cast<size_t>(s))) continue;
    flags[static_cast<size_t>(s)] = 0;
    --num_free_cells_[li];
    ++cells_used_[static_cast<size_t>(s)];
    out.push_back(s);
  }
  return out;
}

std::optional<std::vector<int32_t>> HostKvStore::AllocateSummaryRows(int64_t layer, int32_t count) {
  auto rows = rows_allocators_[LayerIndex(layer)].Allocate(count);
  if (rows) {
    for (int32_t& r : *rows) r += num_slots();
  }
  return rows;
}

void HostKvStore::FreeCells(int64_t layer, const std::vector<int32_t>& ids) {
  const size_t li = LayerIndex(layer);
  std::vector<int32_t> rows, whole;
  for (int32_t id : ids) {
    if (!IsSlot(id)) {
      OASIS_CHECK(id >= num_slots() && id < num_slots() + summary_rows_)
          << "host store: no cell or row " << id;
      rows.push_back(id - num_slots());
      continue;
    }
    const auto s = static_cast<size_t>(id);
    OASIS_CHECK(split_[s] && !cell_free_[li][s])
        << "host store: cell " << id << " of layer " << layer << " not in use";
    OASIS_CHECK(!cell_parked_[li][s])
        << "host store: cell " << id << " of layer " << layer << " is parked (unpark it first)";
    cell_free_[li][s] = 1;
    free_cells_[li].push_back(id);
    ++num_free_cells_[li];
    if (--cells_used_[s] > 0) {
      EvictableChanged(s, false);  // only parked cells left: evictable now
      continue;
    }
    // Its last cell: the slot is whole again (its ids left on the stacks are stale now).
    split_[s] = 0;
    --cell_slots_;
    for (size_t l = 0; l < free_cells_.size(); ++l) {
      cell_free_[l][s] = 0;
      --num_free_cells_[l];
    }
    whole.push_back(id);
  }
  rows_allocators_[li].Free(rows);
  allocator_.Free(whole);
  // Stale ids pile up on a stack whose layer frees more than it takes: rebuild it from the
  // flags now and then.
  for (size_t l = 0; l < free_cells_.size(); ++l) {
    auto& stack = free_cells_[l];
    if (stack.size() <= 2 * static_cast<size_t>(num_free_cells_[l]) + 1024) continue;
    stack.clear();
    for (size_t s = 0; s < split_.size(); ++s) {
      if (split_[s] && cell_free_[l][s] && !Evictable(s)) stack.push_back(static_cast<int32_t>(s));
    }
  }
}

LayerKvPool& HostKvStore::pool(int64_t layer) { return pools_[LayerIndex(layer)]; }

Tensor& HostKvStore::kmin(int64_t layer) { return kmin_[LayerIndex(layer)]; }

Tensor& HostKvStore::kmax(int64_t layer) { return kmax_[LayerIndex(layer)]; }

}  // namespace oasis

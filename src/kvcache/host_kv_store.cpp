#include "kvcache/host_kv_store.h"

#include <algorithm>
#include <climits>

#include "common/check.h"

namespace oasis {
namespace {

int32_t SlotsFor(size_t bytes, size_t per_slot) {
  const size_t n = per_slot == 0 ? 0 : bytes / per_slot;
  return static_cast<int32_t>(std::min<size_t>(n, INT32_MAX / kBlockSize));
}

}  // namespace

size_t HostKvStore::BytesPerSlot(int64_t num_sparse_layers, int64_t head_dim, DType dtype) {
  return static_cast<size_t>(2 * kBlockSize * head_dim * num_sparse_layers) * DTypeSize(dtype);
}

HostKvStore::HostKvStore(Backend& backend, int64_t num_layers, int64_t first_sparse_layer, int64_t head_dim,
                         size_t bytes, int32_t summary_rows)
    : num_layers_(num_layers),
      first_sparse_layer_(first_sparse_layer),
      bytes_per_slot_(BytesPerSlot(num_layers - first_sparse_layer, head_dim, backend.activation_dtype())),
      allocator_(SlotsFor(bytes, bytes_per_slot_)),
      rows_allocator_(std::max<int32_t>(0, std::min<int32_t>(summary_rows, INT32_MAX / kBlockSize - allocator_.num_slots()))) {
  OASIS_CHECK(first_sparse_layer >= 0 && first_sparse_layer < num_layers)
      << "first sparse layer " << first_sparse_layer << " of " << num_layers;
  const int64_t slots = allocator_.num_slots();
  const int64_t rows = slots + rows_allocator_.num_slots();
  const DType dt = backend.activation_dtype();
  for (int64_t l = first_sparse_layer; l < num_layers; ++l) {
    pools_.push_back({backend.EmptyHost({slots, kBlockSize, head_dim}, dt), backend.EmptyHost({slots, kBlockSize, head_dim}, dt)});
    kmin_.push_back(backend.Empty({rows, head_dim}, dt));
    kmax_.push_back(backend.Empty({rows, head_dim}, dt));
  }
}

std::optional<std::vector<int32_t>> HostKvStore::AllocateSummaryRows(int32_t count) {
  auto rows = rows_allocator_.Allocate(count);
  if (rows) {
    for (int32_t& r : *rows) r += num_slots();
  }
  return rows;
}

void HostKvStore::Free(const std::vector<int32_t>& ids) {
  std::vector<int32_t> slots, rows;
  for (int32_t id : ids) {
    if (IsSlot(id)) {
      slots.push_back(id);
    } else {
      OASIS_CHECK(id >= num_slots() && id < num_slots() + num_summary_rows()) << "host store: no slot or row " << id;
      rows.push_back(id - num_slots());
    }
  }
  allocator_.Free(slots);
  rows_allocator_.Free(rows);
}

LayerKvPool& HostKvStore::pool(int64_t layer) {
  OASIS_CHECK(layer >= first_sparse_layer_ && layer < num_layers_) << "layer " << layer << " has no host store";
  return pools_[static_cast<size_t>(layer - first_sparse_layer_)];
}

Tensor& HostKvStore::kmin(int64_t layer) {
  OASIS_CHECK(layer >= first_sparse_layer_ && layer < num_layers_) << "layer " << layer << " has no summaries";
  return kmin_[static_cast<size_t>(layer - first_sparse_layer_)];
}

Tensor& HostKvStore::kmax(int64_t layer) {
  OASIS_CHECK(layer >= first_sparse_layer_ && layer < num_layers_) << "layer " << layer << " has no summaries";
  return kmax_[static_cast<size_t>(layer - first_sparse_layer_)];
}

}  // namespace oasis

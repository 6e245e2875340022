// The decode side's import into sparse KV (kv_import.h): the layout that holds an import's
// staged blocks per layer, its reservation, the switch and the remote blocks that land later.
#include <algorithm>
#include <atomic>
#include <iterator>

#include "common/check.h"
#include "disagg/kv_import.h"

namespace oasis::disagg {
namespace {

// An import's hold of blocks [0, layer_blocks) of every sparse layer and KV head: a cell
// (K/V storage) or a summary-only row (a remote block whose K/V has not landed), and the
// remote blocks left.
class ImportLayout final : public HostLayout {
 public:
  ImportLayout(int64_t first_layer, int64_t num_kv_heads, int64_t layer_blocks,
               std::vector<int32_t> ids, int64_t cells_held)
      : cells_held_(cells_held),
        first_(first_layer),
        hkv_(num_kv_heads),
        layer_blocks_(layer_blocks),
        ids_(std::move(ids)) {}

  int64_t layer_blocks() const override { return layer_blocks_; }
  int32_t Slot(int64_t layer, int64_t head, int64_t block) const override {
    return ids_[Index(layer, head, block)];
  }
  int32_t& At(int64_t layer, int64_t head, int64_t block) {
    return ids_[Index(layer, head, block)];
  }
  int64_t BytesHeld(const HostKvStore& store) const override {
    return cells_held_ * static_cast<int64_t>(store.bytes_per_cell());
  }
  void Release(HostKvStore& store) override {
    const int64_t per_layer = hkv_ * layer_blocks_;
    const auto layers = per_layer > 0 ? static_cast<int64_t>(ids_.size()) / per_layer : 0;
    for (int64_t i = 0; i < layers; ++i) {
      std::vector<int32_t> held;  // (-1: parked by ParkImportPrefix)
      std::copy_if(ids_.begin() + i * per_layer, ids_.begin() + (i + 1) * per_layer,
                   std::back_inserter(held), [](int32_t id) { return id >= 0; });
      store.FreeCells(first_ + i, held);
    }
    ids_.clear();
    cells_held_ = 0;
  }

  int64_t cells_held_ = 0;   // entries that are cells
  int64_t remote_left_ = 0;  // remote blocks (ImportSparse's `local`), until MarkLocal

 private:
  size_t Index(int64_t layer, int64_t head, int64_t block) const {
    const int64_t i = layer - first_;
    OASIS_CHECK(block >= 0 && block < layer_blocks_ && head >= 0 && head < hkv_ && i >= 0 &&
                (i * hkv_ + head) * layer_blocks_ + block < static_cast<int64_t>(ids_.size()))
        << "no cell for layer " << layer << " head " << head << " block " << block;
    return static_cast<size_t>((i * hkv_ + head) * layer_blocks_ + block);
  }

  int64_t first_, hkv_, layer_blocks_;
  std::vector<int32_t> ids_;  // [Ls * Hkv * layer_blocks]
};

ImportLayout* LayoutOf(SparseKvManager& m, uint64_t id) {
  return dynamic_cast<ImportLayout*>(m.Layout(id));
}

// Flags the blocks below ceil(num_tokens / 16) that `local` does not name remote in the
// request's row of the device state and counts them.
void MarkRemote(SparseKvManager& m, ImportLayout& layout, int64_t row, int64_t num_tokens,
                const std::vector<std::vector<int32_t>>& local) {
  const int64_t hkv = m.shape().num_kv_heads, first = m.config().dense_layers;
  const int64_t ls = m.shape().num_layers - first;
  SparseDeviceState& state = m.state(0);
  const int64_t nb = BlocksFor(num_tokens), mb = state.max_blocks();
  std::vector<char> is_local(static_cast<size_t>(nb));
  layout.remote_left_ = 0;
  for (int64_t i = 0; i < ls; ++i) {
    uint8_t* mask = state.layer(first + i).remote.data<uint8_t>();
    for (int64_t h = 0; h < hkv; ++h) {
      std::fill(is_local.begin(), is_local.end(), 0);
      for (int32_t b : local[static_cast<size_t>(i * hkv + h)]) {
        if (b >= 0 && b < nb) is_local[static_cast<size_t>(b)] = 1;
      }
      for (int64_t b = 0; b < nb && b < mb; ++b) {
        const bool remote = !is_local[static_cast<size_t>(b)];
        mask[(row * hkv + h) * mb + b] = remote ? 1 : 0;
        layout.remote_left_ += remote ? 1 : 0;
      }
    }
  }
}

}  // namespace

Status ReserveImport(SparseKvManager& m, uint64_t id, int64_t max_total_tokens,
                     int64_t layer_blocks, const std::vector<std::vector<int32_t>>* local,
                     const AdoptedPrefix* adopted) {
  OASIS_RETURN_IF_ERROR(m.CanReserve(id, max_total_tokens));
  OASIS_RETURN_IF_ERROR(CheckDisaggregation(m));
  const LayeredHold n = PlanImportHold(m, max_total_tokens, layer_blocks, local, adopted);
  HostKvStore& store = m.host_store();
  if (ImportAdmission(m, n) != HostAdmission::kFits) {
    return ResourceExhausted("host KV store full: " + std::to_string(store.num_free()) + " of " +
                             std::to_string(store.num_slots()) +
                             " head-blocks free (--host-kv-gib)");
  }
  const int64_t hkv = m.shape().num_kv_heads, first = m.config().dense_layers;
  const int64_t ls = m.shape().num_layers - first, lb = n.layer_blocks;
  std::vector<int32_t> ids(static_cast<size_t>(ls * hkv * lb), -1);
  int64_t cells_held = 0;
  for (int64_t i = 0; i < ls; ++i) {
    auto cells =
        store.AllocateCells(first + i, static_cast<int32_t>(n.cells[static_cast<size_t>(i)]));
    auto rows =
        store.AllocateSummaryRows(first + i, static_cast<int32_t>(n.rows[static_cast<size_t>(i)]));
    OASIS_CHECK(cells.has_value() && rows.has_value()) << "host store: cells and rows counted";
    size_t ci = 0, ri = 0;
    int64_t kept = 0;
    for (int64_t h = 0; h < hkv; ++h) {
      const auto& flags = n.local[static_cast<size_t>(i * hkv + h)];
      for (int64_t b = 0; b < lb; ++b) {
        int32_t& at = ids[static_cast<size_t>((i * hkv + h) * lb + b)];
        const int32_t own = adopted == nullptr ? -1 : adopted->Cell(b, i, h, ls, hkv);
        if (own >= 0) {
          at = own;
          ++kept;
        } else if (!flags[static_cast<size_t>(b)] && ri < rows->size()) {
          at = (*rows)[ri++];
        } else {
          at = (*cells)[ci++];
        }
      }
    }
    cells_held += static_cast<int64_t>(cells->size()) + kept;
  }
  // The admission counted the whole slots with the cells: ReserveWith cannot run short.
  return m.ReserveWith(id, max_total_tokens,
                       std::make_unique<ImportLayout>(first, hkv, lb, std::move(ids), cells_held));
}

Status ImportSparse(SparseKvManager& m, uint64_t id, int64_t num_tokens,
                    const std::vector<std::vector<int32_t>>& working,
                    std::vector<LayerKvPool>& gpu_pools,
                    const std::vector<std::vector<int32_t>>* local) {
  OASIS_RETURN_IF_ERROR(CheckDisaggregation(m));
  ImportLayout* layout = LayoutOf(m, id);
  if (local != nullptr) {
    const int64_t n = m.shape().num_kv_heads * (m.shape().num_layers - m.config().dense_layers);
    if (static_cast<int64_t>(local->size()) != n) {
      return InvalidArgument("import: " + std::to_string(local->size()) +
                             " local block lists for " + std::to_string(n));
    }
    if (m.config().remote_fetch_cap <= 0)
      return FailedPrecondition("import with remote blocks needs a remote fetch cap (decode role)");
    if (layout == nullptr) {
      return FailedPrecondition("request " + std::to_string(id) +
                                " has no import reservation for remote blocks");
    }
  }
  OASIS_RETURN_IF_ERROR(m.SwitchFromHost(id, num_tokens, working, gpu_pools));
  if (layout != nullptr) layout->remote_left_ = 0;
  if (local != nullptr) MarkRemote(m, *layout, m.SparseRow(id), num_tokens, *local);
  return Status::Ok();
}

namespace {

// The cells of block b (below the layout's layer blocks) whose K/V is in the store, per
// (sparse layer, head), -1 elsewhere; with `skip` (may be null) cells equal to its entries are
// left out. The request is sparse (its remote mask tells which blocks are local).
std::vector<int32_t> LocalCells(const SparseKvManager& m, const ImportLayout& layout, int64_t row,
                                int64_t b, const std::vector<int32_t>* skip) {
  const HostKvStore& store = m.host_store();
  const int64_t hkv = m.shape().num_kv_heads, first = m.config().dense_layers;
  const int64_t ls = m.shape().num_layers - first, mb = m.state(0).max_blocks();
  std::vector<int32_t> own(static_cast<size_t>(ls * hkv), -1);
  for (int64_t i = 0; i < ls; ++i) {
    const uint8_t* mask =
        layout.remote_left_ > 0 ? m.state(0).layer(first + i).remote.data<uint8_t>() : nullptr;
    for (int64_t h = 0; h < hkv; ++h) {
      const int32_t at = layout.Slot(first + i, h, b);
      if (!store.IsSlot(at)) continue;
      if (skip != nullptr && (*skip)[static_cast<size_t>(i * hkv + h)] == at) continue;
      if (mask != nullptr && (b >= mb || mask[(row * hkv + h) * mb + b] != 0)) continue;
      own[static_cast<size_t>(i * hkv + h)] = at;
    }
  }
  return own;
}

}  // namespace

int64_t PublishImportPrefix(SparseKvManager& m, uint64_t id, StorePrefixCache& cache,
                            std::span<const PrefixBlockKey> keys, AdoptedPrefix& adopted) {
  ImportLayout* layout = LayoutOf(m, id);
  const int64_t row = m.SparseRow(id);
  if (layout == nullptr || row < 0) return 0;
  const int64_t blocks =
      std::min<int64_t>(static_cast<int64_t>(keys.size()), layout->layer_blocks());
  int64_t published = 0;
  for (int64_t b = adopted.blocks; b < blocks; ++b) {
    const std::vector<int32_t> own = LocalCells(m, *layout, row, b, nullptr);
    if (!cache.Publish(keys[static_cast<size_t>(b)], own)) break;
    adopted.cells.insert(adopted.cells.end(), own.begin(), own.end());
    ++adopted.blocks;
    ++published;
  }
  return published;
}

int64_t ParkImportPrefix(SparseKvManager& m, uint64_t id, StorePrefixCache& cache,
                         std::span<const PrefixBlockKey> keys, const AdoptedPrefix& adopted,
                         bool landed) {
  ImportLayout* layout = LayoutOf(m, id);
  if (layout == nullptr) return 0;
  const int64_t hkv = m.shape().num_kv_heads, first = m.config().dense_layers;
  const int64_t ls = m.shape().num_layers - first, per = ls * hkv;
  const int64_t blocks =
      std::min<int64_t>(static_cast<int64_t>(keys.size()), layout->layer_blocks());
  const int64_t row = m.SparseRow(id);
  landed = landed && row >= 0;
  int64_t given = 0;
  for (int64_t b = 0; b < std::max(blocks, adopted.blocks); ++b) {
    const bool held = b < adopted.blocks;
    if (b >= blocks) {  // (adopted blocks are full prompt blocks: never past the layer blocks)
      cache.Release(keys[static_cast<size_t>(b)], {}, held);
      continue;
    }
    std::vector<int32_t> shared;
    if (held) shared.assign(adopted.cells.begin() + b * per, adopted.cells.begin() + (b + 1) * per);
    std::vector<int32_t> own = landed ? LocalCells(m, *layout, row, b, held ? &shared : nullptr)
                                      : std::vector<int32_t>(static_cast<size_t>(per), -1);
    // Shared cells and the ones given leave the reservation (its release frees the rest).
    int64_t n = 0;
    for (int64_t i = 0; i < ls; ++i) {
      for (int64_t h = 0; h < hkv; ++h) {
        int32_t& at = layout->At(first + i, h, b);
        const auto j = static_cast<size_t>(i * hkv + h);
        if (at < 0 || !((held && shared[j] == at) || own[j] == at)) continue;
        n += own[j] == at ? 1 : 0;
        at = -1;
        --layout->cells_held_;
      }
    }
    if (!held && n == 0) continue;
    cache.Release(keys[static_cast<size_t>(b)],
                  n > 0 ? std::span<const int32_t>(own) : std::span<const int32_t>(), held);
    given += n;
  }
  return given;
}

std::vector<int32_t> LandingSlots(SparseKvManager& m, uint64_t id,
                                  const std::vector<RemoteBlock>& blocks) {
  std::vector<Landing> all;
  all.reserve(blocks.size());
  for (const RemoteBlock& b : blocks) all.push_back({id, b});
  return LandingSlots(m, all);
}

std::vector<int32_t> LandingSlots(SparseKvManager& m, const std::vector<Landing>& blocks) {
  std::vector<int32_t> out(blocks.size(), -1);
  HostKvStore& store = m.host_store();
  SparseDeviceState& state = m.state(0);
  const int64_t first = m.config().dense_layers, hkv = m.shape().num_kv_heads,
                mb = state.max_blocks(), ls = m.shape().num_layers - first;
  // Per sparse layer: summary-only rows -> fresh cells, and the device table entries that change.
  std::vector<std::vector<int32_t>> from(static_cast<size_t>(ls)), to(static_cast<size_t>(ls));
  std::vector<std::vector<int32_t>> table_at(static_cast<size_t>(ls)),
      table_slot(static_cast<size_t>(ls));
  for (size_t i = 0; i < blocks.size(); ++i) {
    const RemoteBlock& b = blocks[i].block;
    const int32_t slot = m.HostSlotOf(blocks[i].id, b.layer, b.head, b.block);
    if (slot < 0 || b.head < 0 || b.head >= hkv) continue;  // unknown request or block
    ImportLayout* layout = LayoutOf(m, blocks[i].id);
    if (layout == nullptr || b.block >= layout->layer_blocks()) {  // a whole slot: always local
      out[i] = slot;
      continue;
    }
    int32_t& id_ref = layout->At(b.layer, b.head, b.block);
    if (!store.IsSlot(id_ref)) {
      auto cell = store.AllocateCells(b.layer, 1);
      if (!cell) continue;
      const auto li = static_cast<size_t>(b.layer - first);
      from[li].push_back(id_ref);
      to[li].push_back(cell->front());
      id_ref = cell->front();
      ++layout->cells_held_;
      const int64_t row = m.SparseRow(blocks[i].id);
      if (row >= 0 && b.block < mb) {
        table_at[li].push_back(static_cast<int32_t>((row * hkv + b.head) * mb + b.block));
        table_slot[li].push_back(id_ref);
      }
    }
    out[i] = id_ref;
  }
  // Every layer's index lists in one upload (one host sync), then views of it per layer.
  std::vector<int32_t> all;
  std::vector<int64_t> at(static_cast<size_t>(ls) + 1, 0);
  for (int64_t i = 0; i < ls; ++i) {
    const auto li = static_cast<size_t>(i);
    at[li] = static_cast<int64_t>(all.size());
    for (const auto* v : {&from[li], &to[li], &table_at[li], &table_slot[li]})
      all.insert(all.end(), v->begin(), v->end());
  }
  if (all.empty()) return out;
  Backend& be = m.backend(0);
  const Tensor idx = be.Upload(Tensor::FromInts(all));
  for (int64_t i = 0; i < ls; ++i) {
    const auto li = static_cast<size_t>(i);
    if (from[li].empty()) continue;
    const int64_t l = first + i, n = static_cast<int64_t>(from[li].size());
    const int64_t nt = static_cast<int64_t>(table_at[li].size());
    const Tensor src = idx.Slice(at[li], at[li] + n), dst = idx.Slice(at[li] + n, at[li] + 2 * n);
    for (Tensor* t : {&store.kmin(l), &store.kmax(l)}) {
      Tensor moved = be.Empty({n, t->dim(1)}, t->dtype());
      be.GatherRows(*t, src, moved);
      be.ScatterRows(moved, dst, *t);
    }
    if (nt > 0) {
      Tensor& tables = state.layer(l).host_tables;
      Tensor flat = tables.Reshape({tables.numel(), 1});
      be.ScatterRows(idx.Slice(at[li] + 2 * n + nt, at[li] + 2 * n + 2 * nt).Reshape({nt, 1}),
                     idx.Slice(at[li] + 2 * n, at[li] + 2 * n + nt), flat);
    }
    store.FreeCells(l, from[li]);  // the rows
  }
  return out;
}

void MarkLocal(SparseKvManager& m, uint64_t id, const RemoteBlock& b) {
  ImportLayout* layout = LayoutOf(m, id);
  const int64_t row = m.SparseRow(id);
  if (layout == nullptr || row < 0 || layout->remote_left_ == 0) return;
  SparseDeviceState& state = m.state(0);
  const int64_t hkv = m.shape().num_kv_heads, mb = state.max_blocks();
  if (b.head < 0 || b.head >= hkv || b.block < 0 || b.block >= mb ||
      !m.host_store().IsSlot(m.HostSlotOf(id, b.layer, b.head, b.block))) {
    return;
  }
  uint8_t& bit = state.layer(b.layer).remote.data<uint8_t>()[(row * hkv + b.head) * mb + b.block];
  if (bit == 0) return;
  // The block's K/V was written to the host store before: make that visible before the flag
  // (the device reads the flag, then, in a later kernel, the block).
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint8_t>&>(bit).store(0, std::memory_order_release);
  --layout->remote_left_;
}

int64_t RemoteBlocksLeft(const SparseKvManager& m, uint64_t id) {
  const auto* layout = dynamic_cast<const ImportLayout*>(m.Layout(id));
  return layout == nullptr ? 0 : layout->remote_left_;
}

}  // namespace oasis::disagg

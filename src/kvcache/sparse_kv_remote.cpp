// SparseKvManager's layered reservations and remote blocks (sparse_kv_manager.h): host room
// whose first blocks are held per layer, working sets filled from the host store, blocks whose
// K/V is not here yet, where they land and when they become local. The rest of the class is in
// sparse_kv_manager.cpp.
#include <algorithm>
#include <atomic>

#include "common/check.h"
#include "kvcache/sparse_kv_manager.h"

namespace oasis {

void SparseKvManager::ReserveLayered(uint64_t id, int64_t max_total_tokens, const LayeredHold& n) {
  OASIS_CHECK_OK(CanReserve(id, max_total_tokens));
  HostKvStore& store = host_store();
  const int64_t hkv = shape_.num_kv_heads, ls = shape_.num_layers - config_.dense_layers;
  const int64_t blocks = BlocksFor(max_total_tokens);
  const int64_t layer_blocks = n.layer_blocks;
  OASIS_CHECK(
      layer_blocks >= 0 && layer_blocks <= blocks && static_cast<int64_t>(n.cells.size()) == ls &&
      static_cast<int64_t>(n.rows.size()) == ls && static_cast<int64_t>(n.local.size()) == ls * hkv)
      << "layered hold of " << layer_blocks << " blocks for a reservation of " << blocks;
  auto whole = store.Allocate(static_cast<int32_t>(n.whole));
  OASIS_CHECK(whole.has_value()) << "host store: room counted";
  Request r;
  r.always_sparse = true;
  r.reserved_blocks = blocks;
  r.layer_blocks = layer_blocks;
  r.host_slots.assign(static_cast<size_t>(hkv * blocks), -1);
  size_t wi = 0;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = layer_blocks; b < blocks; ++b)
      r.host_slots[static_cast<size_t>(h * blocks + b)] = (*whole)[wi++];
  }
  r.cells.assign(static_cast<size_t>(ls * hkv * layer_blocks), -1);
  for (int64_t i = 0; i < ls; ++i) {
    const int64_t l = config_.dense_layers + i;
    auto cells = store.AllocateCells(l, static_cast<int32_t>(n.cells[static_cast<size_t>(i)]));
    auto rows = store.AllocateSummaryRows(l, static_cast<int32_t>(n.rows[static_cast<size_t>(i)]));
    OASIS_CHECK(cells.has_value() && rows.has_value()) << "host store: cells and rows counted";
    size_t ci = 0, ri = 0;
    for (int64_t h = 0; h < hkv; ++h) {
      const auto& flags = n.local[static_cast<size_t>(i * hkv + h)];
      for (int64_t b = 0; b < layer_blocks; ++b) {
        const bool on_row = !flags[static_cast<size_t>(b)] && ri < rows->size();
        r.cells[static_cast<size_t>((i * hkv + h) * layer_blocks + b)] =
            on_row ? (*rows)[ri++] : (*cells)[ci++];
      }
    }
    r.cells_held += static_cast<int64_t>(cells->size());
  }
  requests_.emplace(id, std::move(r));
}

int64_t SparseKvManager::HostBytesHeld(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return 0;
  const Request& r = it->second;
  const int64_t whole = shape_.num_kv_heads * (r.reserved_blocks - r.layer_blocks);
  return whole * static_cast<int64_t>(host_store().bytes_per_slot()) +
         r.cells_held * static_cast<int64_t>(host_store().bytes_per_cell());
}

int64_t SparseKvManager::summary_rows_held() const {
  const HostKvStore& store = host_store();
  int64_t n = 0;
  for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
    n += store.num_summary_rows() - store.num_free_summary_rows(l);
  }
  return n;
}

int32_t& SparseKvManager::CellRef(Request& r, int64_t layer, int64_t head, int64_t block) {
  const int64_t i = layer - config_.dense_layers;
  OASIS_CHECK(block >= 0 && block < r.layer_blocks && i >= 0 &&
              i < shape_.num_layers - config_.dense_layers)
      << "no cell for layer " << layer << " block " << block;
  return r.cells[static_cast<size_t>((i * shape_.num_kv_heads + head) * r.layer_blocks + block)];
}

Status SparseKvManager::CheckDisaggregation() const {
  if (num_sides() != 1) {
    return FailedPrecondition("disaggregated prefill/decode with sparse KV over " +
                              std::to_string(num_sides()) +
                              " tensor-parallel ranks is not supported (one GPU per instance)");
  }
  if (config_.dense_layers != 0) {
    return FailedPrecondition("disaggregated prefill/decode needs --sparse-dense-layers 0 (have " +
                              std::to_string(config_.dense_layers) + ")");
  }
  return Status::Ok();
}

int32_t SparseKvManager::HostSlotOf(uint64_t id, int64_t layer, int64_t head, int64_t block) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || head < 0 || head >= shape_.num_kv_heads || block < 0 ||
      block >= it->second.reserved_blocks || layer < config_.dense_layers ||
      layer >= shape_.num_layers) {
    return -1;
  }
  return HostSlot(it->second, layer, head, block);
}

Status SparseKvManager::ImportSparse(uint64_t id, int64_t num_tokens,
                                     const std::vector<std::vector<int32_t>>& working,
                                     std::vector<LayerKvPool>& gpu_pools,
                                     const std::vector<std::vector<int32_t>>* local) {
  OASIS_RETURN_IF_ERROR(CheckDisaggregation());
  auto it = requests_.find(id);
  if (it == requests_.end())
    return FailedPrecondition("request " + std::to_string(id) + " has no host KV reservation");
  Request& req = it->second;
  if (req.row >= 0)
    return FailedPrecondition("request " + std::to_string(id) + " is already sparse");
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t ls = shape_.num_layers - config_.dense_layers;
  if (static_cast<int64_t>(working.size()) != ls * hkv) {
    return InvalidArgument("import: " + std::to_string(working.size()) + " working sets for " +
                           std::to_string(ls) + " sparse layers x " + std::to_string(hkv) +
                           " KV heads");
  }
  if (num_tokens <= 0 || BlocksFor(num_tokens) > req.reserved_blocks) {
    return InvalidArgument("import of " + std::to_string(num_tokens) +
                           " tokens into a reservation of " + std::to_string(req.reserved_blocks) +
                           " blocks");
  }
  if (local != nullptr && static_cast<int64_t>(local->size()) != ls * hkv) {
    return InvalidArgument("import: " + std::to_string(local->size()) + " local block lists for " +
                           std::to_string(ls * hkv));
  }
  if (local != nullptr && config_.remote_fetch_cap <= 0) {
    return FailedPrecondition("import with remote blocks needs a remote fetch cap (decode role)");
  }
  if (free_rows_.empty())
    return ResourceExhausted("all " + std::to_string(config_.max_sparse_seqs) +
                             " sparse rows in use");
  auto fresh = gpu_allocator_.Allocate(static_cast<int32_t>((k + 2) * hkv));
  if (!fresh) {
    return ResourceExhausted("no GPU slots for the sparse working set: need " +
                             std::to_string((k + 2) * hkv) + ", " +
                             std::to_string(gpu_allocator_.num_free()) + " free");
  }
  req.row = free_rows_.back();
  free_rows_.pop_back();
  req.has_prediction = false;
  req.ws_slots.assign(fresh->begin(), fresh->begin() + hkv * k);
  req.tail_slots.assign(fresh->begin() + hkv * k, fresh->end());
  const ImportCopies c = PlanImportCopies(req, num_tokens, working);
  DeviceSide& d = sides_[0];
  Backend& b = *d.backend;
  OASIS_CHECK_EQ(static_cast<int64_t>(gpu_pools.size()), shape_.num_layers)
      << "one GPU pool per layer";
  for (int64_t i = 0; i < ls; ++i) {
    const int64_t l = config_.dense_layers + i;
    b.CopyBlocks(d.store->pool(l), b.Upload(Tensor::FromInts(c.src[static_cast<size_t>(i)])),
                 gpu_pools[static_cast<size_t>(l)],
                 b.Upload(Tensor::FromInts(c.dst[static_cast<size_t>(i)])));
  }
  WriteRowState(*d.state, req, [&](int64_t l) -> const std::vector<std::vector<int32_t>>& {
    return c.layer_ws[static_cast<size_t>(l - config_.dense_layers)];
  });
  MarkRemote(req, num_tokens, local);
  return Status::Ok();
}

SparseKvManager::ImportCopies SparseKvManager::PlanImportCopies(
    const Request& req, int64_t num_tokens,
    const std::vector<std::vector<int32_t>>& working) const {
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t ls = shape_.num_layers - config_.dense_layers;
  const int64_t complete = num_tokens / kBlockSize, partial = num_tokens % kBlockSize;
  ImportCopies c;
  c.layer_ws.resize(static_cast<size_t>(ls));
  c.src.resize(static_cast<size_t>(ls));
  c.dst.resize(static_cast<size_t>(ls));
  for (int64_t i = 0; i < ls; ++i) {
    auto& ws = c.layer_ws[static_cast<size_t>(i)];
    ws.assign(static_cast<size_t>(hkv), std::vector<int32_t>(static_cast<size_t>(k), -1));
    for (int64_t h = 0; h < hkv; ++h) {
      int64_t j = 0;
      for (int32_t b : working[static_cast<size_t>(i * hkv + h)]) {
        if (j == k) break;
        if (b < 0 || b >= complete) continue;
        auto& head = ws[static_cast<size_t>(h)];
        if (std::find(head.begin(), head.begin() + j, b) != head.begin() + j) continue;
        head[static_cast<size_t>(j)] = b;
        c.src[static_cast<size_t>(i)].push_back(HostSlot(req, config_.dense_layers + i, h, b));
        c.dst[static_cast<size_t>(i)].push_back(req.ws_slots[static_cast<size_t>(h * k + j)]);
        ++j;
      }
      if (partial > 0) {
        c.src[static_cast<size_t>(i)].push_back(
            HostSlot(req, config_.dense_layers + i, h, complete));
        c.dst[static_cast<size_t>(i)].push_back(
            req.tail_slots[static_cast<size_t>(h * 2 + complete % 2)]);
      }
    }
  }
  return c;
}

void SparseKvManager::MarkRemote(Request& req, int64_t num_tokens,
                                 const std::vector<std::vector<int32_t>>* local) {
  const int64_t hkv = shape_.num_kv_heads, ls = shape_.num_layers - config_.dense_layers;
  SparseDeviceState& state = *sides_[0].state;
  // Remote blocks: every block below nb that `local` does not name (the working sets and the
  // tail are local by construction: ImportSparse copied them from the host store).
  req.remote_left = 0;
  if (local != nullptr) {
    const int64_t nb = BlocksFor(num_tokens), mb = state.max_blocks();
    std::vector<char> is_local(static_cast<size_t>(nb));
    for (int64_t i = 0; i < ls; ++i) {
      uint8_t* mask = state.layer(config_.dense_layers + i).remote.data<uint8_t>();
      for (int64_t h = 0; h < hkv; ++h) {
        std::fill(is_local.begin(), is_local.end(), 0);
        for (int32_t b : (*local)[static_cast<size_t>(i * hkv + h)]) {
          if (b >= 0 && b < nb) is_local[static_cast<size_t>(b)] = 1;
        }
        for (int64_t b = 0; b < nb && b < mb; ++b) {
          const bool remote = !is_local[static_cast<size_t>(b)];
          mask[(req.row * hkv + h) * mb + b] = remote ? 1 : 0;
          req.remote_left += remote ? 1 : 0;
        }
      }
    }
  }
}

std::vector<int32_t> SparseKvManager::LandingSlots(uint64_t id,
                                                   const std::vector<RemoteBlock>& blocks) {
  std::vector<Landing> all;
  all.reserve(blocks.size());
  for (const RemoteBlock& b : blocks) all.push_back({id, b});
  return LandingSlots(all);
}

std::vector<int32_t> SparseKvManager::LandingSlots(const std::vector<Landing>& blocks) {
  std::vector<int32_t> out(blocks.size(), -1);
  DeviceSide& d = sides_[0];
  HostKvStore& store = *d.store;
  const int64_t hkv = shape_.num_kv_heads, mb = d.state->max_blocks(),
                ls = shape_.num_layers - config_.dense_layers;
  // Per sparse layer: summary-only rows -> fresh cells, and the device table entries that change.
  std::vector<std::vector<int32_t>> from(static_cast<size_t>(ls)), to(static_cast<size_t>(ls));
  std::vector<std::vector<int32_t>> table_at(static_cast<size_t>(ls)),
      table_slot(static_cast<size_t>(ls));
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto it = requests_.find(blocks[i].id);
    if (it == requests_.end()) continue;
    Request& r = it->second;
    const RemoteBlock& b = blocks[i].block;
    if (b.layer < config_.dense_layers || b.layer >= shape_.num_layers || b.head < 0 ||
        b.head >= hkv || b.block < 0 || b.block >= r.reserved_blocks) {
      continue;
    }
    if (b.block >= r.layer_blocks) {  // a whole slot: always local
      out[i] = WholeSlot(r, b.head, b.block);
      continue;
    }
    int32_t& id_ref = CellRef(r, b.layer, b.head, b.block);
    if (!store.IsSlot(id_ref)) {
      auto cell = store.AllocateCells(b.layer, 1);
      if (!cell) continue;
      const auto li = static_cast<size_t>(b.layer - config_.dense_layers);
      from[li].push_back(id_ref);
      to[li].push_back(cell->front());
      id_ref = cell->front();
      ++r.cells_held;
      if (r.row >= 0 && b.block < mb) {
        table_at[li].push_back(static_cast<int32_t>((r.row * hkv + b.head) * mb + b.block));
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
  Backend& be = *d.backend;
  const Tensor idx = be.Upload(Tensor::FromInts(all));
  for (int64_t i = 0; i < ls; ++i) {
    const auto li = static_cast<size_t>(i);
    if (from[li].empty()) continue;
    const int64_t l = config_.dense_layers + i, n = static_cast<int64_t>(from[li].size());
    const int64_t nt = static_cast<int64_t>(table_at[li].size());
    const Tensor src = idx.Slice(at[li], at[li] + n), dst = idx.Slice(at[li] + n, at[li] + 2 * n);
    for (Tensor* t : {&store.kmin(l), &store.kmax(l)}) {
      Tensor moved = be.Empty({n, t->dim(1)}, t->dtype());
      be.GatherRows(*t, src, moved);
      be.ScatterRows(moved, dst, *t);
    }
    if (nt > 0) {
      Tensor& tables = d.state->layer(l).host_tables;
      Tensor flat = tables.Reshape({tables.numel(), 1});
      be.ScatterRows(idx.Slice(at[li] + 2 * n + nt, at[li] + 2 * n + 2 * nt).Reshape({nt, 1}),
                     idx.Slice(at[li] + 2 * n, at[li] + 2 * n + nt), flat);
    }
    store.FreeCells(l, from[li]);  // the rows
  }
  return out;
}

void SparseKvManager::MarkLocal(uint64_t id, const RemoteBlock& b) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.row < 0 || it->second.remote_left == 0) return;
  DeviceSide& d = sides_[0];
  const int64_t hkv = shape_.num_kv_heads, mb = d.state->max_blocks();
  if (b.layer < config_.dense_layers || b.layer >= shape_.num_layers || b.head < 0 ||
      b.head >= hkv || b.block < 0 || b.block >= mb || b.block >= it->second.reserved_blocks ||
      !d.store->IsSlot(HostSlot(it->second, b.layer, b.head, b.block))) {
    return;
  }
  uint8_t& bit = d.state->layer(b.layer)
                     .remote.data<uint8_t>()[(it->second.row * hkv + b.head) * mb + b.block];
  if (bit == 0) return;
  // The block's K/V was written to the host store before: make that visible before the flag
  // (the device reads the flag, then, in a later kernel, the block).
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint8_t>&>(bit).store(0, std::memory_order_release);
  --it->second.remote_left;
}

int64_t SparseKvManager::RemoteBlocksLeft(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? 0 : it->second.remote_left;
}

}  // namespace oasis

// SparseKvManager's layered reservations (a HostLayout holds a request's first blocks per
// layer) and the switch of a request whose KV is already in the host store (sparse_kv_manager.h).
// The rest of the class is in sparse_kv_manager.cpp.
#include <algorithm>

#include "common/check.h"
#include "kvcache/sparse_kv_manager.h"

namespace oasis {

Status SparseKvManager::ReserveWith(uint64_t id, int64_t max_total_tokens,
                                    std::unique_ptr<HostLayout> layout) {
  OASIS_CHECK(layout != nullptr) << "ReserveWith needs a layout";
  HostKvStore& store = host_store();
  Status ok = CanReserve(id, max_total_tokens);
  const int64_t hkv = shape_.num_kv_heads, blocks = BlocksFor(max_total_tokens);
  const int64_t layer_blocks = layout->layer_blocks();
  if (ok.ok() && (layer_blocks < 0 || layer_blocks > blocks)) {
    ok = InvalidArgument("a layout of " + std::to_string(layer_blocks) +
                         " blocks for a reservation of " + std::to_string(blocks));
  }
  std::optional<std::vector<int32_t>> whole;
  if (ok.ok()) {
    whole = store.Allocate(static_cast<int32_t>(hkv * (blocks - layer_blocks)));
    if (!whole) {
      ok = ResourceExhausted("host KV store full: need " +
                             std::to_string(hkv * (blocks - layer_blocks)) + " head-blocks, " +
                             std::to_string(store.num_free()) + " of " +
                             std::to_string(store.num_slots()) + " free (--host-kv-gib)");
    }
  }
  if (!ok.ok()) {
    layout->Release(store);
    return ok;
  }
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
  r.layout = std::move(layout);
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

HostLayout* SparseKvManager::Layout(uint64_t id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.layout.get();
}

const HostLayout* SparseKvManager::Layout(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.layout.get();
}

int64_t SparseKvManager::HostBytesHeld(uint64_t id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return 0;
  const Request& r = it->second;
  const int64_t whole = shape_.num_kv_heads * (r.reserved_blocks - r.layer_blocks);
  return whole * static_cast<int64_t>(host_store().bytes_per_slot()) +
         (r.layout ? r.layout->BytesHeld(host_store()) : 0);
}

int64_t SparseKvManager::summary_rows_held() const {
  const HostKvStore& store = host_store();
  int64_t n = 0;
  for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
    n += store.num_summary_rows() - store.num_free_summary_rows(l);
  }
  return n;
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

Status SparseKvManager::SwitchFromHost(uint64_t id, int64_t num_tokens,
                                       const std::vector<std::vector<int32_t>>& working,
                                       std::vector<LayerKvPool>& gpu_pools) {
  if (num_sides() != 1 || config_.dense_layers != 0) {
    return FailedPrecondition(
        "a switch from the host store needs one device side and no dense layers");
  }
  auto it = requests_.find(id);
  if (it == requests_.end())
    return FailedPrecondition("request " + std::to_string(id) + " has no host KV reservation");
  Request& req = it->second;
  if (req.row >= 0)
    return FailedPrecondition("request " + std::to_string(id) + " is already sparse");
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t ls = shape_.num_layers - config_.dense_layers;
  if (static_cast<int64_t>(working.size()) != ls * hkv) {
    return InvalidArgument("switch from the host store: " + std::to_string(working.size()) +
                           " working sets for " + std::to_string(ls) + " sparse layers x " +
                           std::to_string(hkv) + " KV heads");
  }
  if (num_tokens <= 0 || BlocksFor(num_tokens) > req.reserved_blocks) {
    return InvalidArgument("switch from the host store of " + std::to_string(num_tokens) +
                           " tokens into a reservation of " + std::to_string(req.reserved_blocks) +
                           " blocks");
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
  req.kv_end = num_tokens;
  req.ws_slots.assign(fresh->begin(), fresh->begin() + hkv * k);
  req.tail_slots.assign(fresh->begin() + hkv * k, fresh->end());
  const FromHostCopies c = PlanFromHostCopies(req, num_tokens, working);
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
  return Status::Ok();
}

SparseKvManager::FromHostCopies SparseKvManager::PlanFromHostCopies(
    const Request& req, int64_t num_tokens,
    const std::vector<std::vector<int32_t>>& working) const {
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t ls = shape_.num_layers - config_.dense_layers;
  const int64_t complete = num_tokens / kBlockSize, partial = num_tokens % kBlockSize;
  FromHostCopies c;
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

}  // namespace oasis

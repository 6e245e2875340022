#include "kvcache/host_prefix_tier.h"

#include <algorithm>
#include <unordered_set>

#include "common/check.h"
#include "kvcache/host_kv_store.h"

namespace oasis {
size_t HostPrefixTier::BytesPerSlot(int64_t num_layers, int64_t head_dim, DType dtype) {
  return HostKvStore::BytesPerSlot(num_layers, head_dim, dtype);  // the same layout, all layers
}

namespace {

size_t SlotBytes(const std::vector<HostPrefixTier::Side>& sides) {
  OASIS_CHECK(!sides.empty() && sides[0].gpu != nullptr && !sides[0].gpu->empty())
      << "a host prefix tier needs the GPU pools";
  const LayerKvPool& p = sides[0].gpu->front();
  return HostPrefixTier::BytesPerSlot(static_cast<int64_t>(sides[0].gpu->size()), p.k.dim(2),
                                      p.k.dtype());
}

}  // namespace

HostPrefixTier::HostPrefixTier(std::vector<Side> sides, RunSides run_sides, int32_t num_kv_heads,
                               size_t bytes)
    : sides_(std::move(sides)),
      run_sides_(std::move(run_sides)),
      num_kv_heads_(num_kv_heads),
      bytes_per_slot_(SlotBytes(sides_)),
      slots_(HostKvStore::SlotsFor(bytes / sides_.size(), bytes_per_slot_)),
      index_(std::max<int32_t>(1, slots_.num_slots()), num_kv_heads) {
  OASIS_CHECK_GE(slots_.num_slots(), num_kv_heads) << "a host prefix tier of less than one block";
  host_.resize(sides_.size());
  run_sides_([&](int side) {
    const Side& sd = sides_.at(static_cast<size_t>(side));
    const int64_t n = slots_.num_slots(), d = sd.gpu->front().k.dim(2);
    const DType dt = sd.gpu->front().k.dtype();
    std::vector<LayerKvPool>& host = host_[static_cast<size_t>(side)];
    for (size_t l = 0; l < sd.gpu->size(); ++l) {
      host.push_back({sd.backend->EmptyHost({n, kBlockSize, d}, dt),
                      sd.backend->EmptyHost({n, kBlockSize, d}, dt)});
    }
  });
}

HostPrefixTier::HostPrefixTier(Backend& backend, std::vector<LayerKvPool>& gpu_pools,
                               int32_t num_kv_heads, size_t bytes)
    : HostPrefixTier(
          {Side{&backend, &gpu_pools}}, [](const std::function<void(int)>& fn) { fn(0); },
          num_kv_heads, bytes) {}

void HostPrefixTier::Evicted(const PrefixCache::Evicted& e) {
  OASIS_CHECK_EQ(e.slots.size(), static_cast<size_t>(num_kv_heads_)) << "one slot per KV head";
  if (const std::vector<int32_t>* held = index_.Find(e.hash, e.parent, e.tokens)) {
    // Already here (a reloaded block evicted again): the same KV. Most recently used now,
    // unless a reload pins it.
    const std::vector<int32_t> slots = *held;
    if (index_.IsParked(slots.front())) {  // an entry is parked (or pinned) as a whole
      Pin(slots);
      Unpin(slots);
    }
    return;
  }
  std::optional<std::vector<int32_t>> host = slots_.Allocate(num_kv_heads_);
  while (!host) {
    std::optional<PrefixCache::Evicted> old = index_.EvictEntry();
    if (!old) {  // every entry is pinned by a reload under way
      ++dropped_blocks_total_;
      return;
    }
    slots_.Free(old->slots);
    host = slots_.Allocate(num_kv_heads_);
  }
  OASIS_CHECK(index_.Insert(e.hash, e.parent, e.tokens, *host)) << "host entry inserted twice";
  for (int32_t s : *host) index_.Park(s);
  pending_gpu_.insert(pending_gpu_.end(), e.slots.begin(), e.slots.end());
  pending_host_.insert(pending_host_.end(), host->begin(), host->end());
  ++spilled_blocks_total_;
}

void HostPrefixTier::EndEvictions() {
  if (pending_gpu_.empty()) return;
  // A host slot spilled into twice in one allocation (its first entry evicted for room):
  // the last copy is the one its entry names; destinations must be distinct in one copy.
  std::vector<int32_t> src, dst;
  std::unordered_set<int32_t> seen;
  for (size_t i = pending_host_.size(); i-- > 0;) {
    if (!seen.insert(pending_host_[i]).second) continue;
    src.push_back(pending_gpu_[i]);
    dst.push_back(pending_host_[i]);
  }
  pending_gpu_.clear();
  pending_host_.clear();
  CopyAll(/*to_host=*/true, src, dst);
}

const std::vector<int32_t>* HostPrefixTier::Find(uint64_t hash, uint64_t parent,
                                                 std::span<const int32_t> tokens) const {
  return index_.Find(hash, parent, tokens);
}

void HostPrefixTier::Pin(const std::vector<int32_t>& host_slots) {
  for (int32_t s : host_slots) index_.Unpark(s);
}

void HostPrefixTier::Unpin(const std::vector<int32_t>& host_slots) {
  for (int32_t s : host_slots) index_.Park(s);
}

void HostPrefixTier::Reload(const std::vector<std::vector<int32_t>>& host,
                            const std::vector<std::vector<int32_t>>& gpu) {
  OASIS_CHECK_EQ(host.size(), gpu.size()) << "reload: one GPU block per host block";
  if (host.empty()) return;
  std::vector<int32_t> src, dst;
  for (size_t i = 0; i < host.size(); ++i) {
    OASIS_CHECK(host[i].size() == static_cast<size_t>(num_kv_heads_) &&
                gpu[i].size() == static_cast<size_t>(num_kv_heads_))
        << "reload: one slot per KV head";
    src.insert(src.end(), host[i].begin(), host[i].end());
    dst.insert(dst.end(), gpu[i].begin(), gpu[i].end());
  }
  CopyAll(/*to_host=*/false, src, dst);
  reloaded_blocks_total_ += static_cast<int64_t>(host.size());
}

void HostPrefixTier::CopyAll(bool to_host, const std::vector<int32_t>& src_slots,
                             const std::vector<int32_t>& dst_slots) {
  run_sides_([&](int side) {
    const Side& sd = sides_.at(static_cast<size_t>(side));
    Backend& b = *sd.backend;
    std::vector<LayerKvPool>& gpu = *sd.gpu;
    std::vector<LayerKvPool>& host = host_.at(static_cast<size_t>(side));
    const Tensor src_t = b.UploadAsync(Tensor::FromInts(src_slots));
    const Tensor dst_t = b.UploadAsync(Tensor::FromInts(dst_slots));
    for (size_t l = 0; l < gpu.size(); ++l) {
      if (to_host) {
        b.CopyBlocks(gpu[l], src_t, host[l], dst_t);
      } else {
        b.CopyBlocks(host[l], src_t, gpu[l], dst_t);
      }
    }
  });
}

}  // namespace oasis

// HostPrefixTier (kvcache/host_prefix_tier.h) on the CPU backend: evicted cached blocks are
// copied to the tier with their K and V in every layer, found by key, reloaded exactly into
// other GPU slots; the tier evicts least recently used entries, never pinned ones; a block
// spilled twice is held once.
#include <catch2/catch.hpp>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kvcache/block_allocator.h"
#include "kvcache/host_prefix_tier.h"

using namespace oasis;

namespace {

constexpr int32_t kHeads = 2;
constexpr int64_t kLayers = 3, kDim = 4, kSlots = 8;  // 4 blocks of 2 heads in the GPU pool

struct Rig {
  CpuBackend backend{1};
  std::vector<LayerKvPool> pools;
  BlockAllocator allocator{kSlots};
  std::unique_ptr<HostPrefixTier> tier;

  explicit Rig(int64_t tier_blocks) {
    for (int64_t l = 0; l < kLayers; ++l)
      pools.push_back({Tensor::Zeros({kSlots, kBlockSize, kDim}, DType::kF32),
                       Tensor::Zeros({kSlots, kBlockSize, kDim}, DType::kF32)});
    allocator.EnablePrefixCache(kHeads);
    const size_t per_block = HostPrefixTier::BytesPerSlot(kLayers, kDim, DType::kF32) * kHeads;
    tier = std::make_unique<HostPrefixTier>(backend, pools, kHeads, per_block * tier_blocks);
    allocator.set_host_tier(tier.get(), tier.get());
  }
  // A value unique to (layer, k/v, block content id, head, row, d).
  static float Value(int64_t l, int kv, int32_t id, int32_t h, int64_t row, int64_t d) {
    return static_cast<float>(((((l * 2 + kv) * 100 + id) * 4 + h) * 16 + row) * 8 + d);
  }
  void Write(const std::vector<int32_t>& slots, int32_t id) {
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        float* p = (kv == 0 ? pools[l].k : pools[l].v).data<float>();
        for (int32_t h = 0; h < kHeads; ++h)
          for (int64_t r = 0; r < kBlockSize; ++r)
            for (int64_t d = 0; d < kDim; ++d)
              p[(slots[h] * kBlockSize + r) * kDim + d] = Value(l, kv, id, h, r, d);
      }
    }
  }
  bool Holds(const std::vector<int32_t>& slots, int32_t id) {
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const float* p = (kv == 0 ? pools[l].k : pools[l].v).data<float>();
        for (int32_t h = 0; h < kHeads; ++h)
          for (int64_t r = 0; r < kBlockSize; ++r)
            for (int64_t d = 0; d < kDim; ++d)
              if (p[(slots[h] * kBlockSize + r) * kDim + d] != Value(l, kv, id, h, r, d))
                return false;
      }
    }
    return true;
  }
  // Block `id`: allocated, written, cached, released (evictable).
  void CacheBlock(int32_t id) {
    auto slots = allocator.Allocate(kHeads);
    REQUIRE(slots);
    Write(*slots, id);
    REQUIRE(allocator.prefix_cache()->Insert(Hash(id), 0, Tokens(id), *slots));
    allocator.Free(*slots);
  }
  static uint64_t Hash(int32_t id) { return 1000 + static_cast<uint64_t>(id); }
  static std::vector<int32_t> Tokens(int32_t id) { return std::vector<int32_t>(kBlockSize, id); }
  const std::vector<int32_t>* InTier(int32_t id) {
    const auto t = Tokens(id);
    return tier->Find(Hash(id), 0, t);
  }
};

}  // namespace

TEST_CASE("host prefix tier: evicted blocks spill, reload exactly, LRU and pins hold",
          "[kvcache][prefix][host]") {
  Rig rig(3);
  REQUIRE(rig.tier->num_blocks_capacity() == 3);
  for (int32_t id = 0; id < 4; ++id) rig.CacheBlock(id);  // the GPU pool is full of cached blocks
  CHECK(rig.tier->num_entries() == 0);
  // Taking the whole pool evicts all four blocks: the tier keeps the last three spilled.
  auto all = rig.allocator.Allocate(kSlots);
  REQUIRE(all);
  CHECK(rig.tier->spilled_blocks_total() == 4);
  CHECK(rig.tier->num_entries() == 3);
  CHECK(rig.tier->evictions_total() == 1);
  int held = 0;
  for (int32_t id = 0; id < 4; ++id) held += rig.InTier(id) != nullptr;
  CHECK(held == 3);
  // Reload each held block into other GPU slots (the pool's contents now are garbage).
  rig.allocator.Free(*all);
  for (int32_t id = 0; id < 4; ++id) {
    const std::vector<int32_t>* host = rig.InTier(id);
    if (host == nullptr) continue;
    auto gpu = rig.allocator.Allocate(kHeads);
    REQUIRE(gpu);
    rig.Write(*gpu, 99);  // overwritten by the reload
    rig.tier->Reload({*host}, {*gpu});
    CHECK(rig.Holds(*gpu, id));
    rig.allocator.Free(*gpu);
  }
  CHECK(rig.tier->reloaded_blocks_total() == 3);
  // A wrong key misses: another parent, other tokens.
  CHECK(rig.tier->Find(Rig::Hash(3), 7, Rig::Tokens(3)) == nullptr);
  CHECK(rig.tier->Find(Rig::Hash(3), 0, Rig::Tokens(4)) == nullptr);

  SECTION("a pinned entry is never evicted; with every entry pinned a spill is dropped") {
    std::vector<std::vector<int32_t>> pinned;
    for (int32_t id = 0; id < 4; ++id)
      if (const auto* h = rig.InTier(id)) pinned.push_back(*h);
    for (const auto& p : pinned) rig.tier->Pin(p);
    for (int32_t id = 10; id < 14; ++id) rig.CacheBlock(id);
    REQUIRE(rig.allocator.Allocate(kSlots));
    CHECK(rig.tier->num_entries() == 3);
    CHECK(rig.tier->dropped_blocks_total() == 4);
    for (int32_t id = 10; id < 14; ++id) CHECK(rig.InTier(id) == nullptr);
    for (const auto& p : pinned) rig.tier->Unpin(p);
  }
  SECTION("a block spilled again is held once and becomes the most recently used") {
    // The oldest entry (the first held of blocks 0..3, spilled in that order) cached on the
    // GPU again (as a reload leaves it) and evicted again: still one entry, now the newest.
    int32_t oldest = 0;
    while (rig.InTier(oldest) == nullptr) ++oldest;
    const int64_t before = rig.tier->num_entries();
    rig.CacheBlock(oldest);
    auto all2 = rig.allocator.Allocate(kSlots);
    REQUIRE(all2);
    CHECK(rig.tier->num_entries() == before);
    CHECK(rig.tier->spilled_blocks_total() == 4);
    rig.allocator.Free(*all2);
    // Two new blocks spill: the two least recently used entries go, `oldest` stays.
    rig.CacheBlock(20);
    rig.CacheBlock(21);
    REQUIRE(rig.allocator.Allocate(kSlots));
    CHECK(rig.InTier(oldest) != nullptr);
    CHECK(rig.InTier(20) != nullptr);
    CHECK(rig.InTier(21) != nullptr);
    CHECK(rig.tier->num_entries() == 3);
  }
}

TEST_CASE("host prefix tier: one allocation spilling more blocks than the tier holds",
          "[kvcache][prefix][host]") {
  // The tier reuses a host slot within one allocation's spills: the copy that lands there last
  // is the one its entry names.
  Rig rig(1);
  for (int32_t id = 0; id < 4; ++id) rig.CacheBlock(id);
  REQUIRE(rig.allocator.Allocate(kSlots));
  CHECK(rig.tier->num_entries() == 1);
  int32_t kept = -1;
  for (int32_t id = 0; id < 4; ++id)
    if (rig.InTier(id) != nullptr) kept = id;
  REQUIRE(kept >= 0);
  auto gpu = std::vector<int32_t>{0, 1};
  rig.Write(gpu, 99);
  rig.tier->Reload({*rig.InTier(kept)}, {gpu});
  CHECK(rig.Holds(gpu, kept));
}

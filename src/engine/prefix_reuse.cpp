#include "engine/prefix_reuse.h"

#include <algorithm>
#include <optional>
#include <span>

#include "common/check.h"
#include "kvcache/host_prefix_tier.h"

namespace oasis {
namespace {

bool Takes(const Sequence& seq, const BlockAllocator& allocator) {
  return allocator.prefix_cache() != nullptr && seq.prefix_caching == PrefixCaching::kOn &&
         seq.kv == SequenceKv::kDense;
}

std::span<const int32_t> BlockTokens(const Sequence& seq, int64_t block) {
  return std::span<const int32_t>(seq.tokens)
      .subspan(static_cast<size_t>(block * kBlockSize), kBlockSize);
}

uint64_t ParentHash(const Sequence& seq, int64_t block) {
  return block == 0 ? seq.prefix_root : seq.block_hashes[static_cast<size_t>(block - 1)];
}

// seq.block_hashes covers its first `num_blocks` full blocks.
void EnsureHashes(Sequence& seq, int64_t num_blocks) {
  OASIS_CHECK_LE(num_blocks * kBlockSize, seq.num_tokens()) << "hashing past the tokens";
  for (int64_t b = static_cast<int64_t>(seq.block_hashes.size()); b < num_blocks; ++b)
    seq.block_hashes.push_back(HashPrefixBlock(ParentHash(seq, b), BlockTokens(seq, b)));
}

// How many of seq's first `max_blocks` full blocks are cached, as a leading run (hashes
// ensured); their slots go to `slots` when it is given.
int64_t LeadingCachedBlocks(Sequence& seq, const PrefixCache& cache, int64_t max_blocks,
                            std::vector<std::vector<int32_t>>* slots = nullptr) {
  EnsureHashes(seq, max_blocks);
  int64_t n = 0;
  for (; n < max_blocks; ++n) {
    const std::vector<int32_t>* found = cache.Find(seq.block_hashes[static_cast<size_t>(n)],
                                                   ParentHash(seq, n), BlockTokens(seq, n));
    if (found == nullptr) break;
    if (slots != nullptr) slots->push_back(*found);
  }
  return n;
}

}  // namespace

int64_t AdoptCachedPrefix(Sequence& seq, BlockAllocator& allocator, PrefixCompanion* companion) {
  if (!Takes(seq, allocator) || seq.num_computed != 0) return 0;
  OASIS_CHECK_EQ(seq.table.num_blocks(), 0) << "adopting into a table that holds blocks";
  const PrefixCache& cache = *allocator.prefix_cache();
  HostPrefixTier* tier = allocator.host_tier();
  const int64_t max_blocks = (seq.num_tokens() - 1) / kBlockSize;  // one token left to compute
  EnsureHashes(seq, max_blocks);
  // The leading run of cached blocks: each in the GPU cache, else in the host tier (whose
  // blocks are reloaded into fresh GPU slots below).
  std::vector<std::vector<int32_t>> blocks;       // GPU slots ([head]; empty: to reload)
  std::vector<const std::vector<int32_t>*> host;  // host slots of the blocks to reload
  for (int64_t n = 0; n < max_blocks; ++n) {
    const uint64_t hash = seq.block_hashes[static_cast<size_t>(n)];
    if (const std::vector<int32_t>* found =
            cache.Find(hash, ParentHash(seq, n), BlockTokens(seq, n))) {
      blocks.push_back(*found);
      host.push_back(nullptr);
      continue;
    }
    const std::vector<int32_t>* in_host =
        tier != nullptr ? tier->Find(hash, ParentHash(seq, n), BlockTokens(seq, n)) : nullptr;
    if (in_host == nullptr) break;
    blocks.emplace_back();
    host.push_back(in_host);
  }
  if (companion != nullptr && !blocks.empty()) {
    const int64_t both = companion->NumCached(seq, static_cast<int64_t>(blocks.size()));
    OASIS_CHECK(both >= 0 && both <= static_cast<int64_t>(blocks.size()))
        << "the companion holds " << both << " of " << blocks.size() << " blocks";
    blocks.resize(static_cast<size_t>(both));
    host.resize(static_cast<size_t>(both));
  }
  if (std::any_of(host.begin(), host.end(), [](const auto* h) { return h != nullptr; })) {
    // Reload: hold the GPU hits (an allocation may evict parked blocks) and pin the host
    // entries (an allocation may spill into the tier), then take fresh slots block by block;
    // where the pool runs out, the run ends.
    std::vector<int32_t> held;
    for (const auto& b : blocks) held.insert(held.end(), b.begin(), b.end());
    allocator.Share(held);
    std::vector<std::vector<int32_t>> pinned;
    for (const auto* h : host) {
      if (h == nullptr) continue;
      pinned.push_back(*h);  // a copy: the tier's entries may move while allocating
      tier->Pin(pinned.back());
    }
    std::vector<std::vector<int32_t>> reload_host, reload_gpu;
    size_t n = 0;
    for (; n < blocks.size(); ++n) {
      if (host[n] == nullptr) continue;
      std::optional<std::vector<int32_t>> fresh =
          allocator.Allocate(static_cast<int32_t>(seq.table.num_kv_heads()));
      if (!fresh) break;
      blocks[n] = *fresh;
      held.insert(held.end(), fresh->begin(), fresh->end());
      reload_host.push_back(pinned[reload_host.size()]);
      reload_gpu.push_back(*fresh);
    }
    blocks.resize(n);
    tier->Reload(reload_host, reload_gpu);
    tier->CountHit(static_cast<int64_t>(reload_gpu.size()) * kBlockSize);
    for (const auto& h : pinned) tier->Unpin(h);
    // The reloaded blocks are cached on the GPU again, as if computed here.
    PrefixCache& gpu_cache = *allocator.prefix_cache();
    size_t r = 0;
    for (size_t b = 0; b < n; ++b) {
      if (host[b] == nullptr) continue;
      const auto i = static_cast<int64_t>(b);
      gpu_cache.Insert(seq.block_hashes[b], ParentHash(seq, i), BlockTokens(seq, i),
                       reload_gpu[r++]);
    }
    seq.table.AdoptShared(blocks, allocator);
    allocator.Free(held);  // the table holds its own references now
  } else {
    seq.table.AdoptShared(blocks, allocator);
  }
  if (companion != nullptr && !blocks.empty())
    companion->Adopt(seq, static_cast<int64_t>(blocks.size()));
  seq.num_blocks_cached = static_cast<int64_t>(blocks.size());
  seq.num_computed = seq.num_blocks_cached * kBlockSize;
  return seq.num_computed;
}

void DropCachedPrefix(Sequence& seq, BlockAllocator& allocator, PrefixCompanion* companion) {
  if (companion != nullptr && seq.num_blocks_cached > 0) companion->Drop(seq);
  seq.table.Release(allocator);
  seq.num_computed = 0;
  seq.num_blocks_cached = 0;
}

void CacheComputedBlocks(Sequence& seq, BlockAllocator& allocator) {
  if (!Takes(seq, allocator)) return;
  PrefixCache& cache = *allocator.prefix_cache();
  const int64_t full = std::min(seq.num_computed / kBlockSize, seq.table.num_blocks());
  if (seq.num_blocks_cached >= full) return;
  EnsureHashes(seq, full);
  std::vector<int32_t> slots(static_cast<size_t>(seq.table.num_kv_heads()));
  for (int64_t b = seq.num_blocks_cached; b < full; ++b) {
    for (int32_t h = 0; h < seq.table.num_kv_heads(); ++h)
      slots[static_cast<size_t>(h)] = seq.table.head_slots(h)[static_cast<size_t>(b)];
    // False: another sequence cached the same block first; this copy stays private.
    cache.Insert(seq.block_hashes[static_cast<size_t>(b)], ParentHash(seq, b), BlockTokens(seq, b),
                 slots);
  }
  seq.num_blocks_cached = full;
}

void AddPendingBlocks(Sequence& seq, const BlockAllocator& allocator,
                      std::unordered_set<uint64_t>* pending) {
  if (!Takes(seq, allocator)) return;
  const int64_t full = seq.num_tokens() / kBlockSize;
  EnsureHashes(seq, full);
  for (int64_t b = seq.num_blocks_cached; b < full; ++b)
    pending->insert(seq.block_hashes[static_cast<size_t>(b)]);
}

bool AwaitsPendingBlock(Sequence& seq, const BlockAllocator& allocator,
                        const std::unordered_set<uint64_t>& pending) {
  if (pending.empty() || !Takes(seq, allocator) || seq.num_computed != 0) return false;
  const int64_t max_blocks = (seq.num_tokens() - 1) / kBlockSize;  // as AdoptCachedPrefix
  const int64_t hits = LeadingCachedBlocks(seq, *allocator.prefix_cache(), max_blocks);
  return hits < max_blocks && pending.contains(seq.block_hashes[static_cast<size_t>(hits)]);
}

}  // namespace oasis

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

// How many of seq's first `max_blocks` full blocks the GPU cache holds, as a leading run
// (hashes ensured).
int64_t LeadingCachedBlocks(Sequence& seq, const PrefixCache& cache, int64_t max_blocks) {
  EnsureHashes(seq, max_blocks);
  int64_t n = 0;
  while (n < max_blocks && cache.Find(seq.block_hashes[static_cast<size_t>(n)], ParentHash(seq, n),
                                      BlockTokens(seq, n)) != nullptr)
    ++n;
  return n;
}

}  // namespace

PrefixBlockKey SequenceBlockKey(const Sequence& seq, int64_t block) {
  return {seq.block_hashes[static_cast<size_t>(block)], ParentHash(seq, block),
          BlockTokens(seq, block)};
}

int64_t CountCachedRun(const BlockAllocator& allocator, std::span<const PrefixBlockKey> keys) {
  const PrefixCache& cache = *allocator.prefix_cache();
  const HostPrefixTier* tier = allocator.host_tier();
  int64_t n = 0;
  for (const PrefixBlockKey& k : keys) {
    if (cache.Find(k.hash, k.parent, k.tokens) == nullptr &&
        (tier == nullptr || tier->Find(k.hash, k.parent, k.tokens) == nullptr))
      break;
    ++n;
  }
  return n;
}

CachedRun TakeCachedRun(BlockAllocator& allocator, int32_t num_kv_heads,
                        std::span<const PrefixBlockKey> keys) {
  PrefixCache& cache = *allocator.prefix_cache();
  HostPrefixTier* tier = allocator.host_tier();
  CachedRun run;
  // The GPU hits are held (an allocation below may evict parked blocks) and the host-tier
  // entries pinned (an allocation may spill into the tier) before any slot is allocated.
  std::vector<std::vector<int32_t>> pinned;  // copies: the tier's entries may move meanwhile
  std::vector<int32_t> from_host;            // run index of each pinned block
  for (const PrefixBlockKey& k : keys) {
    if (const std::vector<int32_t>* gpu = cache.Find(k.hash, k.parent, k.tokens)) {
      run.blocks.push_back(*gpu);
      allocator.Share(*gpu);
      run.held.insert(run.held.end(), gpu->begin(), gpu->end());
      continue;
    }
    const std::vector<int32_t>* host =
        tier != nullptr ? tier->Find(k.hash, k.parent, k.tokens) : nullptr;
    if (host == nullptr) break;
    pinned.push_back(*host);
    tier->Pin(pinned.back());
    from_host.push_back(static_cast<int32_t>(run.blocks.size()));
    run.blocks.emplace_back();
  }
  if (pinned.empty()) return run;
  std::vector<std::vector<int32_t>> reload_host, reload_gpu;
  size_t end = run.blocks.size();
  for (size_t p = 0; p < pinned.size(); ++p) {
    std::optional<std::vector<int32_t>> fresh = allocator.Allocate(num_kv_heads);
    if (!fresh) {
      end = static_cast<size_t>(from_host[p]);
      break;
    }
    run.blocks[static_cast<size_t>(from_host[p])] = *fresh;
    run.held.insert(run.held.end(), fresh->begin(), fresh->end());
    reload_host.push_back(pinned[p]);
    reload_gpu.push_back(std::move(*fresh));
  }
  tier->Reload(reload_host, reload_gpu);
  tier->CountHit(static_cast<int64_t>(reload_gpu.size()) * kBlockSize);
  for (const auto& h : pinned) tier->Unpin(h);
  // The reloaded blocks are cached on the GPU again, as if computed here.
  for (size_t p = 0; p < reload_gpu.size(); ++p) {
    const PrefixBlockKey& k = keys[static_cast<size_t>(from_host[p])];
    cache.Insert(k.hash, k.parent, k.tokens, reload_gpu[p]);
  }
  run.blocks.resize(end);  // past a block the pool could not take, the run ends
  return run;
}

void ReleaseCachedRun(BlockAllocator& allocator, CachedRun& run) {
  allocator.Free(run.held);
  run.held.clear();
}

int64_t AdoptCachedPrefix(Sequence& seq, BlockAllocator& allocator, PrefixCompanion* companion) {
  if (!Takes(seq, allocator) || seq.num_computed != 0) return 0;
  OASIS_CHECK_EQ(seq.table.num_blocks(), 0) << "adopting into a table that holds blocks";
  const int64_t max_blocks = (seq.num_tokens() - 1) / kBlockSize;  // one token left to compute
  EnsureHashes(seq, max_blocks);
  std::vector<PrefixBlockKey> keys;
  for (int64_t b = 0; b < max_blocks; ++b)
    keys.push_back(
        {seq.block_hashes[static_cast<size_t>(b)], ParentHash(seq, b), BlockTokens(seq, b)});
  int64_t n = CountCachedRun(allocator, keys);
  if (companion != nullptr && n > 0) {
    const int64_t both = companion->NumCached(seq, n);
    OASIS_CHECK(both >= 0 && both <= n)
        << "the companion holds " << both << " of " << n << " blocks";
    n = both;
  }
  if (n == 0) return 0;
  CachedRun run =
      TakeCachedRun(allocator, seq.table.num_kv_heads(),
                    std::span<const PrefixBlockKey>(keys).first(static_cast<size_t>(n)));
  if (companion != nullptr && !run.blocks.empty()) {
    const int64_t m = companion->Adopt(seq, static_cast<int64_t>(run.blocks.size()));
    OASIS_CHECK(m >= 0 && m <= static_cast<int64_t>(run.blocks.size()))
        << "the companion adopted " << m << " of " << run.blocks.size() << " blocks";
    run.blocks.resize(static_cast<size_t>(m));
  }
  seq.table.AdoptShared(run.blocks, allocator);
  ReleaseCachedRun(allocator, run);  // the table holds its own references now
  seq.num_blocks_cached = static_cast<int64_t>(run.blocks.size());
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

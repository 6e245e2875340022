#include "engine/draft_prefix_cache.h"

#include <span>

#include "common/check.h"
#include "oasis/sampling_noise.h"

namespace oasis {
namespace {

// The 16 tokens head block b's rows embed: tokens [16b + 1, 16b + 17).
std::span<const int32_t> HeadBlockTokens(const Sequence& seq, int64_t block) {
  return std::span<const int32_t>(seq.tokens)
      .subspan(static_cast<size_t>(block * kBlockSize + 1), kBlockSize);
}

bool Takes(const Sequence& seq) {
  return seq.prefix_caching == PrefixCaching::kOn && seq.kv == SequenceKv::kDense;
}

}  // namespace

DraftPrefixCache::DraftPrefixCache(BlockAllocator& allocator,
                                   std::function<DraftHeadState&(const Sequence&)> head_of)
    : allocator_(allocator), head_of_(std::move(head_of)) {
  OASIS_CHECK(allocator_.prefix_cache() != nullptr) << "the head pool caches no prefixes";
}

uint64_t DraftPrefixCache::Parent(const Sequence& seq, const DraftHeadState& head,
                                  int64_t block) const {
  if (block > 0) return head.block_hashes[static_cast<size_t>(block - 1)];
  // The root: the request's salt and token 0 (which the shifted chain does not cover).
  return Mix64(seq.prefix_root ^
               Mix64(0x9e3779b97f4a7c15ULL + static_cast<uint32_t>(seq.tokens[0])));
}

void DraftPrefixCache::EnsureHashes(const Sequence& seq, DraftHeadState& head,
                                    int64_t num_blocks) const {
  OASIS_CHECK_LE(num_blocks * kBlockSize + 1, seq.num_tokens()) << "hashing past the tokens";
  for (int64_t b = static_cast<int64_t>(head.block_hashes.size()); b < num_blocks; ++b)
    head.block_hashes.push_back(HashPrefixBlock(Parent(seq, head, b), HeadBlockTokens(seq, b)));
}

std::vector<PrefixBlockKey> DraftPrefixCache::Keys(const Sequence& seq, DraftHeadState& head,
                                                   int64_t blocks) const {
  EnsureHashes(seq, head, blocks);
  std::vector<PrefixBlockKey> keys;
  for (int64_t b = 0; b < blocks; ++b)
    keys.push_back(
        {head.block_hashes[static_cast<size_t>(b)], Parent(seq, head, b), HeadBlockTokens(seq, b)});
  return keys;
}

int64_t DraftPrefixCache::NumCached(Sequence& seq, int64_t blocks) {
  DraftHeadState& head = head_of_(seq);
  // Block b needs token 16b + 16: the target adopts at most (num_tokens - 1) / 16 blocks.
  blocks = std::min(blocks, (seq.num_tokens() - 1) / kBlockSize);
  return CountCachedRun(allocator_, Keys(seq, head, blocks));
}

int64_t DraftPrefixCache::Adopt(Sequence& seq, int64_t blocks) {
  DraftHeadState& head = head_of_(seq);
  OASIS_CHECK_EQ(head.table.num_blocks(), 0) << "adopting into a head table that holds blocks";
  const std::vector<PrefixBlockKey> keys = Keys(seq, head, blocks);
  CachedRun run = TakeCachedRun(allocator_, head.table.num_kv_heads(), keys);
  head.table.AdoptShared(run.blocks, allocator_);
  ReleaseCachedRun(allocator_, run);
  const auto m = static_cast<int64_t>(run.blocks.size());
  head.num_blocks_cached = m;
  head.num_computed = m * kBlockSize;
  return m;
}

void DraftPrefixCache::Drop(Sequence& seq) {
  DraftHeadState& head = head_of_(seq);
  head.table.Release(allocator_);
  head.num_computed = 0;
  head.num_blocks_cached = 0;
}

void DraftPrefixCache::Register(const Sequence& seq, DraftHeadState& head) {
  if (!Takes(seq)) return;
  // Rows [0, num_computed) are final; block b's last row embeds token 16b + 16.
  const int64_t full = std::min({head.num_computed / kBlockSize, head.table.num_blocks(),
                                 (seq.num_tokens() - 1) / kBlockSize});
  if (head.num_blocks_cached >= full) return;
  EnsureHashes(seq, head, full);
  PrefixCache& cache = *allocator_.prefix_cache();
  std::vector<int32_t> slots(static_cast<size_t>(head.table.num_kv_heads()));
  for (int64_t b = head.num_blocks_cached; b < full; ++b) {
    for (int32_t h = 0; h < head.table.num_kv_heads(); ++h)
      slots[static_cast<size_t>(h)] = head.table.head_slots(h)[static_cast<size_t>(b)];
    cache.Insert(head.block_hashes[static_cast<size_t>(b)], Parent(seq, head, b),
                 HeadBlockTokens(seq, b), slots);
  }
  head.num_blocks_cached = full;
}

void DraftPrefixCache::Reset(DraftHeadState& head) {
  head.num_blocks_cached = 0;
  // The hashes depend only on the tokens, which a preempted sequence keeps: they stay valid.
}

}  // namespace oasis

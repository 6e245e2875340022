// Automatic prefix caching for a dense Sequence (issue 33; the index: kvcache/prefix_cache.h).
// The scheduler calls these on its thread: AdoptCachedPrefix when it admits a sequence
// (before reserving the rest of its context), CacheComputedBlocks at the start of each step
// for running sequences and before a sequence's blocks are released (preemption, finish).
//
// A sequence takes part only when its prefix_caching is kOn (the engine turns it off for
// requests that must compute every prompt position: prompt logprobs, disaggregation) and only
// while its KV is dense (kv == kDense); its cached blocks are read-only: it writes KV only at
// positions >= num_computed, past every adopted or registered block.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "engine/scheduler.h"
#include "kvcache/block_allocator.h"
#include "kvcache/prefix_cache.h"

namespace oasis {

// Another KV pool whose blocks of the same positions a hit must bring along: the EAGLE-3
// draft head's under lookahead (engine/draft_prefix_cache.h). The target adopts only as many
// leading blocks as the companion holds too.
class PrefixCompanion {
 public:
  virtual ~PrefixCompanion() = default;
  virtual int64_t NumCached(Sequence& seq, int64_t blocks) = 0;
  // How many of seq's first `blocks` full blocks the companion holds cached, in its GPU pool
  // or its host tier (a leading run).
  // Adopts its cached blocks [0, m) for seq and returns m <= blocks (blocks <= NumCached's
  // answer; m < blocks only where its pool could not take a block reloaded from its host
  // tier).
  virtual int64_t Adopt(Sequence& seq, int64_t blocks) = 0;
  // Undoes Adopt.
  virtual void Drop(Sequence& seq) = 0;
};

// The key of seq's full block `block` (< seq.block_hashes.size()).
PrefixBlockKey SequenceBlockKey(const Sequence& seq, int64_t block);
// How many leading blocks of `keys` the allocator's prefix cache holds, in its GPU pool or in
// its host tier.
int64_t CountCachedRun(const BlockAllocator& allocator, std::span<const PrefixBlockKey> keys);
// The slots ([block][head]) of the leading run of `keys` found in the GPU cache or the host
// tier; host-tier blocks are reloaded into fresh slots (and cached on the GPU again). The run
// ends at the first block in neither, or where the pool cannot take a reloaded block. Each
// slot of the run carries one extra reference, listed in `held`, until ReleaseCachedRun.
struct CachedRun {
  std::vector<std::vector<int32_t>> blocks;
  std::vector<int32_t> held;
};
CachedRun TakeCachedRun(BlockAllocator& allocator, int32_t num_kv_heads,
                        std::span<const PrefixBlockKey> keys);
void ReleaseCachedRun(BlockAllocator& allocator, CachedRun& run);

// Adopts the longest cached prefix of full blocks of seq.tokens into its (empty) table,
// leaving at least one token to compute (its logits sample the next token), and sets
// num_computed past it; with a companion, only the leading blocks it holds too, which it
// adopts as well. Returns the adopted tokens (0 with caching off or no hit).
int64_t AdoptCachedPrefix(Sequence& seq, BlockAllocator& allocator,
                          PrefixCompanion* companion = nullptr);
// Undoes an adoption whose admission did not go through (the pool could not hold the rest).
void DropCachedPrefix(Sequence& seq, BlockAllocator& allocator,
                      PrefixCompanion* companion = nullptr);
// Registers seq's full blocks whose KV is computed (tokens [0, num_computed)) and not yet
// registered: later prompts with the same prefix reuse them.
void CacheComputedBlocks(Sequence& seq, BlockAllocator& allocator);

// In-flight sharing (SGLang's in-batch prefix rule): the hashes of the full blocks of seq's
// tokens that are not registered yet — blocks a running sequence is computing or will compute
// in its prefill — go into `pending`.
void AddPendingBlocks(Sequence& seq, const BlockAllocator& allocator,
                      std::unordered_set<uint64_t>* pending);
// True when a waiting sequence's first full block past its cached prefix is in `pending`: a
// running sequence (a sibling of n > 1, or another request with the same prompt start) is
// computing it, so admitting seq now would compute the same blocks twice; one step later
// they are cached and seq adopts them.
bool AwaitsPendingBlock(Sequence& seq, const BlockAllocator& allocator,
                        const std::unordered_set<uint64_t>& pending);

}  // namespace oasis

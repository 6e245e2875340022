// Prefix caching of the EAGLE-3 draft head's KV (lookahead; issue 33, docs/prefix_caching.md).
//
// A prompt that adopts cached target blocks skips computing those positions, so the target
// produces no capture rows there and the head could not compute its own K/V for them. The
// head's blocks are therefore cached as the target's are, in the head pool's own PrefixCache,
// and a hit adopts a leading run of blocks that BOTH caches hold (PrefixCompanion).
//
// Head row q reads the target's hidden states at position q (which depend on tokens [0, q])
// and embeds token q + 1, so head block b depends on tokens [0, 16b + 17). Its key is a chain
// over the sequence shifted by one: hash_b = H(hash_{b-1}, tokens[16b + 1, 16b + 17)), the
// root mixing the request's prefix root (salt) with token 0. A head block is registered once
// its 16 rows are computed and final (rows below DraftHeadState::num_computed, whose next
// token is known); rows past num_computed (draft chains) live in private blocks.
//
// Used by the engine loop thread only; not thread-safe.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/lookahead.h"
#include "engine/prefix_reuse.h"
#include "kvcache/block_allocator.h"

namespace oasis {

class DraftPrefixCache final : public PrefixCompanion {
 public:
  // `head_of` gives a live sequence's head state. `allocator` (the head pool's) must have
  // prefix caching enabled.
  DraftPrefixCache(BlockAllocator& allocator,
                   std::function<DraftHeadState&(const Sequence&)> head_of);

  int64_t NumCached(Sequence& seq, int64_t blocks) override;
  int64_t Adopt(Sequence& seq, int64_t blocks) override;
  void Drop(Sequence& seq) override;

  // Registers the head's full blocks whose rows are computed and final and not yet cached
  // (before its table is released, and after each step). A block cached already by another
  // sequence stays private.
  void Register(const Sequence& seq, DraftHeadState& head);
  // Forgets the head's cache bookkeeping (its table was released).
  static void Reset(DraftHeadState& head);

 private:
  // The keys of head blocks [0, blocks) (hashes ensured).
  std::vector<PrefixBlockKey> Keys(const Sequence& seq, DraftHeadState& head, int64_t blocks) const;
  // head.block_hashes covers blocks [0, num_blocks) (needs tokens [0, 16 num_blocks + 1)).
  void EnsureHashes(const Sequence& seq, DraftHeadState& head, int64_t num_blocks) const;
  uint64_t Parent(const Sequence& seq, const DraftHeadState& head, int64_t block) const;

  BlockAllocator& allocator_;
  std::function<DraftHeadState&(const Sequence&)> head_of_;
};

}  // namespace oasis

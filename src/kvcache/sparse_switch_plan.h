// The dense -> sparse switch's plan (docs/sparse.md): which blocks form the initial working
// set, which GPU slots become working and tail slots, what is copied where (GPU -> host store,
// GPU -> GPU) and which slots go back to the allocator. Pure functions of the dense table and
// the host reservation: no backend, no allocator (SparseKvManager::SwitchToSparse allocates the
// fresh slots the plan asks for and runs its copies).
#pragma once

#include <cstdint>
#include <vector>

namespace oasis {

struct SparseSwitchShape {
  int64_t num_kv_heads = 0;
  int64_t topk_blocks = 0;  // K
  int64_t num_tokens = 0;   // tokens with K/V in the dense table
  // dense_layers == 0: the request takes over the table's slots (working slots stay where the
  // blocks are, the partial block becomes a tail slot, two tail slots per head); otherwise it
  // keeps its dense table and gets K fresh working slots per head.
  bool own_tail = true;
};

struct SparseSwitchPlan {
  std::vector<int64_t> chosen;  // the initial working set's logical blocks (ascending, ≤ K)
  // Every used block to the host store: GPU slot src[i] -> whole host slot dst[i], len[i]
  // tokens of it (its summary covers as many).
  std::vector<int32_t> src, dst, len;
  // Working-set blocks copied into fresh GPU slots (not own_tail): GPU ws_src[i] -> ws_dst[i].
  std::vector<int32_t> ws_src, ws_dst;
  std::vector<int32_t> ws_slots;                // [Hkv * K]
  std::vector<int32_t> tail_slots;              // [Hkv * 2] (own_tail), else empty
  std::vector<std::vector<int32_t>> ws_blocks;  // [Hkv][K] logical block per working slot, -1 empty
  std::vector<int32_t> free_later;              // table or fresh slots nobody keeps
};

// Initial working set of a context with `complete` complete blocks: block 0 (the attention
// sink) and the most recent complete blocks, at most `k`, ascending.
std::vector<int64_t> InitialWorkingBlocks(int64_t complete, int64_t k);

// Table slots the switch must not write ([Hkv][table blocks], 1 = shared): blocks the prefix
// cache holds or another sequence reads (docs/prefix_caching.md). Such a slot never becomes a
// working or tail slot: a chosen shared block is copied into a slot of the request's own, and
// every shared slot goes to free_later (which drops only the request's reference). Empty:
// nothing shared.
using SharedSlots = std::vector<std::vector<char>>;

// Fresh GPU slots per head a switch needs besides the table's own (`table_blocks` per head).
int64_t SwitchFreshSlotsPerHead(const SparseSwitchShape& s, int64_t table_blocks,
                                const SharedSlots& shared = {});

// table_slots: [Hkv][table blocks] the dense table's GPU slots (at least ceil(num_tokens / 16)
// blocks); host_slots: [Hkv * reserved_blocks] the request's whole host slots, head-major;
// fresh: Hkv * SwitchFreshSlotsPerHead GPU slots, head by head.
SparseSwitchPlan PlanSparseSwitch(const SparseSwitchShape& s,
                                  const std::vector<std::vector<int32_t>>& table_slots,
                                  const std::vector<int32_t>& host_slots, int64_t reserved_blocks,
                                  const std::vector<int32_t>& fresh,
                                  const SharedSlots& shared = {});

}  // namespace oasis

#include "kvcache/sparse_switch_plan.h"

#include <algorithm>

#include "backend/backend.h"
#include "common/check.h"

namespace oasis {
namespace {

// One head's working and tail slots: the table's slots of the chosen (and partial) blocks stay
// with own_tail; the rest come from `pool` (its unused table slots, then fresh ones). Returns
// how many of `pool` it took.
size_t AssignHeadSlots(const SparseSwitchShape& s, const std::vector<int32_t>& hs,
                       const std::vector<int64_t>& chosen, const std::vector<int32_t>& pool,
                       const std::vector<char>& head_shared, int64_t h, SparseSwitchPlan& p) {
  const int64_t k = s.topk_blocks, m = static_cast<int64_t>(chosen.size());
  const int64_t complete = s.num_tokens / kBlockSize, partial = s.num_tokens % kBlockSize;
  const auto is_shared = [&](int64_t b) {
    return !head_shared.empty() && head_shared[static_cast<size_t>(b)] != 0;
  };
  size_t next = 0;
  for (int64_t j = 0; j < k; ++j) {
    int32_t& slot = p.ws_slots[static_cast<size_t>(h * k + j)];
    if (s.own_tail && j < m && !is_shared(chosen[static_cast<size_t>(j)])) {
      slot = hs[static_cast<size_t>(chosen[static_cast<size_t>(j)])];
    } else {
      OASIS_CHECK_LT(next, pool.size()) << "switch plan: too few spare slots";
      slot = pool[next++];
      if (j < m) {
        p.ws_src.push_back(hs[static_cast<size_t>(chosen[static_cast<size_t>(j)])]);
        p.ws_dst.push_back(slot);
      }
    }
  }
  if (s.own_tail) {
    int32_t tail[2] = {-1, -1};
    OASIS_CHECK(partial == 0 || !is_shared(complete)) << "switch plan: a shared partial block";
    if (partial > 0) tail[complete % 2] = hs[static_cast<size_t>(complete)];
    for (int32_t& t : tail) {
      if (t < 0) {
        OASIS_CHECK_LT(next, pool.size()) << "switch plan: too few spare slots";
        t = pool[next++];
      }
    }
    p.tail_slots.push_back(tail[0]);
    p.tail_slots.push_back(tail[1]);
  }
  return next;
}

}  // namespace

std::vector<int64_t> InitialWorkingBlocks(int64_t complete, int64_t k) {
  std::vector<int64_t> blocks;
  if (complete <= k) {
    for (int64_t b = 0; b < complete; ++b) blocks.push_back(b);
    return blocks;
  }
  blocks.push_back(0);  // the first block (attention sink)
  for (int64_t b = complete - (k - 1); b < complete; ++b) blocks.push_back(b);
  return blocks;
}

int64_t SwitchFreshSlotsPerHead(const SparseSwitchShape& s, int64_t table_blocks,
                                const SharedSlots& shared) {
  const int64_t complete = s.num_tokens / kBlockSize, partial = s.num_tokens % kBlockSize;
  const std::vector<int64_t> chosen = InitialWorkingBlocks(complete, s.topk_blocks);
  const int64_t m = static_cast<int64_t>(chosen.size());
  int64_t most = 0;
  for (int64_t h = 0; h < std::max<int64_t>(1, static_cast<int64_t>(shared.size())); ++h) {
    // Shared slots are neither kept nor spare: a chosen one needs a slot of the request's own.
    int64_t shared_chosen = 0, shared_other = 0;
    if (!shared.empty()) {
      const std::vector<char>& hs = shared[static_cast<size_t>(h)];
      std::vector<char> is_chosen(hs.size(), 0);
      for (int64_t b : chosen) is_chosen[static_cast<size_t>(b)] = 1;
      for (size_t b = 0; b < hs.size() && static_cast<int64_t>(b) < table_blocks; ++b) {
        if (hs[b] != 0) ++(is_chosen[b] ? shared_chosen : shared_other);
      }
    }
    const int64_t spare = s.own_tail ? table_blocks - m - (partial > 0 ? 1 : 0) - shared_other : 0;
    const int64_t need =
        s.own_tail ? (s.topk_blocks - m) + (partial > 0 ? 1 : 2) + shared_chosen : s.topk_blocks;
    most = std::max(most, need - spare);
  }
  return std::max<int64_t>(0, most);
}

SparseSwitchPlan PlanSparseSwitch(const SparseSwitchShape& s,
                                  const std::vector<std::vector<int32_t>>& table_slots,
                                  const std::vector<int32_t>& host_slots, int64_t reserved_blocks,
                                  const std::vector<int32_t>& fresh, const SharedSlots& shared) {
  const int64_t hkv = s.num_kv_heads, k = s.topk_blocks;
  const int64_t complete = s.num_tokens / kBlockSize, partial = s.num_tokens % kBlockSize;
  const int64_t used_blocks = BlocksFor(s.num_tokens);
  OASIS_CHECK_EQ(static_cast<int64_t>(table_slots.size()), hkv)
      << "switch plan: one table row per KV head";
  OASIS_CHECK_LE(used_blocks, reserved_blocks) << "context beyond the host reservation";
  OASIS_CHECK_EQ(static_cast<int64_t>(host_slots.size()), hkv * reserved_blocks)
      << "switch plan: host slots";
  OASIS_CHECK(shared.empty() || static_cast<int64_t>(shared.size()) == hkv)
      << "switch plan: one shared row per KV head";
  SparseSwitchPlan p;
  p.chosen = InitialWorkingBlocks(complete, k);
  // Full KV of every used block to the host store.
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = 0; b < used_blocks; ++b) {
      p.src.push_back(table_slots[static_cast<size_t>(h)][static_cast<size_t>(b)]);
      p.dst.push_back(host_slots[static_cast<size_t>(h * reserved_blocks + b)]);
      p.len.push_back(b < complete ? kBlockSize : static_cast<int32_t>(partial));
    }
  }
  // GPU slots per head: with own_tail the chosen blocks stay where they are, the partial block
  // becomes a tail slot and spare table slots fill the rest; otherwise K fresh working slots.
  const int64_t fresh_per_head = hkv > 0 ? static_cast<int64_t>(fresh.size()) / hkv : 0;
  p.ws_slots.assign(static_cast<size_t>(hkv * k), -1);
  size_t next_fresh = 0;
  for (int64_t h = 0; h < hkv; ++h) {
    const std::vector<int32_t>& hs = table_slots[static_cast<size_t>(h)];
    static const std::vector<char> kNoneShared;
    const std::vector<char>& head_shared =
        shared.empty() ? kNoneShared : shared[static_cast<size_t>(h)];
    OASIS_CHECK(head_shared.empty() || head_shared.size() >= hs.size())
        << "switch plan: shared flags for every table block";
    std::vector<int32_t> pool;  // this head's unused slots
    if (s.own_tail) {
      std::vector<char> keep(hs.size(), 0);
      for (int64_t b : p.chosen) keep[static_cast<size_t>(b)] = 1;
      if (partial > 0) keep[static_cast<size_t>(complete)] = 1;
      for (size_t b = 0; b < hs.size(); ++b) {
        if (!head_shared.empty() && head_shared[b] != 0) {
          p.free_later.push_back(hs[b]);  // read by others: only our reference goes
        } else if (!keep[b]) {
          pool.push_back(hs[b]);
        }
      }
    }
    for (int64_t i = 0; i < fresh_per_head; ++i) pool.push_back(fresh[next_fresh++]);
    const size_t used = AssignHeadSlots(s, hs, p.chosen, pool, head_shared, h, p);
    p.free_later.insert(p.free_later.end(), pool.begin() + static_cast<std::ptrdiff_t>(used),
                        pool.end());
  }
  p.ws_blocks.assign(static_cast<size_t>(hkv), std::vector<int32_t>(static_cast<size_t>(k), -1));
  for (auto& head : p.ws_blocks) {
    for (size_t j = 0; j < p.chosen.size(); ++j) head[j] = static_cast<int32_t>(p.chosen[j]);
  }
  return p;
}

}  // namespace oasis

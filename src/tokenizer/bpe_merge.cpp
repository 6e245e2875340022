#include "tokenizer/bpe_merge.h"

#include <algorithm>
#include <climits>
#include <queue>

namespace oasis::tokenizer {
namespace {

// Words with more symbols than this use the heap (O(n log n)) instead of the scan (O(n^2)).
constexpr size_t kHeapThreshold = 96;

int32_t RankOf(const MergeTable& merges, int32_t left, int32_t right) {
  const MergeRule* rule = merges.Find(left, right);
  return rule ? rule->rank : INT32_MAX;
}

}  // namespace

void ApplyMerges(const MergeTable& merges, std::vector<int32_t>* ids) {
  if (ids->size() < 2) return;
  if (ids->size() > kHeapThreshold) {
    ApplyMergesHeap(merges, ids);
  } else {
    ApplyMergesQuadratic(merges, ids);
  }
}

void ApplyMergesQuadratic(const MergeTable& merges, std::vector<int32_t>* ids) {
  std::vector<int32_t>& s = *ids;
  if (s.size() < 2) return;
  // ranks[i] is the rank of the pair (s[i], s[i+1]).
  thread_local std::vector<int32_t> ranks;
  ranks.resize(s.size() - 1);
  for (size_t i = 0; i + 1 < s.size(); ++i) ranks[i] = RankOf(merges, s[i], s[i + 1]);
  while (!ranks.empty()) {
    const auto best = std::min_element(ranks.begin(), ranks.end());  // first minimum: leftmost
    if (*best == INT32_MAX) break;
    const size_t i = static_cast<size_t>(best - ranks.begin());
    s[i] = merges.Find(s[i], s[i + 1])->merged_id;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(i));
    if (i > 0) ranks[i - 1] = RankOf(merges, s[i - 1], s[i]);
    if (i < ranks.size()) ranks[i] = RankOf(merges, s[i], s[i + 1]);
  }
}

// HF tokenizers' algorithm: a min-heap of (rank, position) candidates over a linked list of
// symbols. An entry is stale when the pair now at its position merges to a different id; since a
// symbol only grows rightwards from a fixed start, the same merged id means the same span and the
// same pair, so the stale check is exact and the result equals the quadratic scan's.
void ApplyMergesHeap(const MergeTable& merges, std::vector<int32_t>* ids) {
  std::vector<int32_t>& s = *ids;
  const int n = static_cast<int>(s.size());
  if (n < 2) return;
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int32_t pos) {
    const int32_t right = next[pos];
    if (right < 0) return;
    if (const MergeRule* r = merges.Find(s[pos], s[right]))
      queue.push({r->rank, pos, r->merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int32_t right = next[top.pos];
    const MergeRule* r = merges.Find(s[top.pos], s[right]);
    if (r == nullptr || r->merged_id != top.merged_id) continue;  // stale
    s[top.pos] = top.merged_id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) push(prev[top.pos]);
    push(top.pos);
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) s[out++] = s[i];
  }
  s.resize(out);
}

}  // namespace oasis::tokenizer

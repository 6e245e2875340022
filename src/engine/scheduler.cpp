#include "engine/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "common/check.h"
#include "engine/prefix_reuse.h"

namespace oasis {

Sequence::Sequence(uint64_t id_, std::vector<int32_t> prompt, int32_t num_kv_heads)
    : id(id_),
      tokens(std::move(prompt)),
      num_prompt_tokens(static_cast<int64_t>(tokens.size())),
      table(num_kv_heads) {}

void Sequence::CommitChunk(int64_t n) {
  OASIS_CHECK(n > 0 && n <= num_pending())
      << "committing " << n << " tokens, " << num_pending() << " pending";
  num_computed += n;
}

Scheduler::Scheduler(SchedulerOptions options, BlockAllocator& allocator, SequenceKvHooks* hooks)
    : options_(options), allocator_(allocator), hooks_(hooks) {
  OASIS_CHECK_GT(options_.max_num_batched_tokens, 0) << "max_num_batched_tokens";
  OASIS_CHECK_GT(options_.max_num_seqs, 0) << "max_num_seqs";
  // Every running sequence's decode token must fit one step's budget.
  options_.max_num_seqs = std::min(options_.max_num_seqs, options_.max_num_batched_tokens);
}

void Scheduler::Add(Sequence* seq) {
  OASIS_CHECK(seq->status == SequenceStatus::kWaiting) << "sequence " << seq->id << " added twice";
  OASIS_CHECK_EQ(seq->table.num_blocks(), 0) << "a new sequence holds no blocks";
  OASIS_CHECK_GT(seq->num_tokens(), 0) << "empty sequence";
  waiting_.push_back(seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  OASIS_CHECK(seq->status == SequenceStatus::kWaiting) << "sequence " << seq->id << " added twice";
  OASIS_CHECK(seq->num_pending() >= 1) << "a running sequence has a pending token";
  seq->status = SequenceStatus::kRunning;
  running_.push_back(seq);
}

bool Scheduler::FitsInPool(int64_t num_tokens, int32_t num_kv_heads) const {
  return HeadBlockTable::SlotsFor(num_tokens, num_kv_heads) <= allocator_.num_slots();
}

void Scheduler::Preempt(Sequence* seq, SchedulerOutput* out) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  OASIS_CHECK(it != running_.end()) << "preempting a sequence that is not running";
  running_.erase(it);
  CacheComputedBlocks(*seq, allocator_);  // a later admission (its own too) reuses them
  seq->table.Release(allocator_);
  seq->num_blocks_cached = 0;
  if (hooks_ != nullptr) hooks_->Release(*seq);  // sparse: working set, host room, row
  seq->kv = SequenceKv::kDense;
  seq->always_sparse = false;
  seq->num_computed = 0;  // recomputed (prompt + generated) on re-admission
  seq->draft_tokens.clear();
  seq->status = SequenceStatus::kWaiting;
  ++seq->num_preemptions;
  waiting_.push_front(seq);
  out->preempted.push_back(seq);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int64_t budget = options_.max_num_batched_tokens;
  for (Sequence* s : running_) CacheComputedBlocks(*s, allocator_);  // last step's full blocks

  // 1. Decodes, oldest first; a missing block preempts the newest running sequence. Draft
  // tokens only take budget no decode needs, and never preempt.
  int64_t spare = budget;
  for (const Sequence* s : running_) spare -= s->num_pending() == 1 ? 1 : 0;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    if (s->num_pending() != 1) {
      ++i;
      continue;
    }
    int64_t num_draft =
        std::min(static_cast<int64_t>(s->draft_tokens.size()), std::max<int64_t>(spare, 0));
    // A kSparse sequence's tokens go to its tail slots (no table growth, never preempts). A
    // missing block is relieved (a sparse request's KV moved out of the pool) before anyone is
    // preempted; relief may turn s itself into one that does not grow.
    if (s->grows_table() && num_draft > 0 &&
        !s->table.Reserve(s->num_computed + 1 + num_draft, allocator_).ok())
      num_draft = 0;
    bool preempted_self = false;
    while (s->grows_table() && !s->table.Reserve(s->num_computed + 1, allocator_).ok()) {
      if (hooks_ != nullptr && hooks_->Relieve(running_)) continue;
      Sequence* victim = running_.back();
      Preempt(victim, &out);
      if (victim == s) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // s was the newest: no running sequence follows it
    out.chunks.push_back({s, s->num_computed, 1, true, num_draft});
    budget -= 1 + num_draft;
    spare -= num_draft;
    ++i;
  }

  // 2. Prefill chunks of running sequences (blocks reserved at admission).
  for (Sequence* s : running_) {
    if (budget == 0) break;
    if (s->num_pending() <= 1) continue;
    const int64_t n = std::min(s->num_pending(), budget);
    OASIS_CHECK_OK(
        s->table.Reserve(s->num_computed + n, allocator_));  // no-op: reserved at admission
    out.chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens()});
    budget -= n;
  }

  // 3. FCFS admission of waiting sequences; none in a step that had to preempt. A sequence
  // whose next uncached block a running sequence is computing (prefix caching: n > 1
  // siblings, a shared prompt start) waits a step and adopts it then; the ones behind it may
  // go first.
  if (out.preempted.empty()) {
    std::unordered_set<uint64_t> pending;
    if (allocator_.prefix_cache() != nullptr && !waiting_.empty()) {
      for (Sequence* s : running_) AddPendingBlocks(*s, allocator_, &pending);
    }
    size_t next = 0;
    while (next < waiting_.size() && budget > 0 && num_running() < options_.max_num_seqs) {
      Sequence* s = waiting_[next];
      if (AwaitsPendingBlock(*s, allocator_, pending)) {
        ++next;
        ++out.num_awaiting_prefix;
        continue;
      }
      if (hooks_ != nullptr) {
        const SequenceKvHooks::Admission a = hooks_->Admit(*s);
        if (a == SequenceKvHooks::Admission::kRefuse) out.refused.push_back(s);
        if (a != SequenceKvHooks::Admission::kAdmit) break;  // FCFS: nothing behind it either
      }
      const int64_t cached = AdoptCachedPrefix(*s, allocator_, companion_);
      if (!s->table.Reserve(s->num_tokens(), allocator_).ok()) {  // whole context, or wait
        if (cached > 0) DropCachedPrefix(*s, allocator_, companion_);
        if (hooks_ != nullptr) hooks_->Release(*s);
        break;
      }
      if (PrefixCache* cache = allocator_.prefix_cache();
          cache != nullptr && s->prefix_caching == PrefixCaching::kOn) {
        cache->CountLookup(s->num_tokens(), cached);
        if (s->num_preemptions == 0) s->num_cached_tokens = cached;  // usage: the first admission's
      }
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
      s->status = SequenceStatus::kRunning;
      running_.push_back(s);
      AddPendingBlocks(*s, allocator_, &pending);
      const int64_t n = std::min(s->num_pending(), budget);
      out.chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens()});
      budget -= n;
      ++out.num_admitted;
    }
  }
  out.num_batched_tokens = options_.max_num_batched_tokens - budget;
  return out;
}

void Scheduler::Finish(Sequence* seq) {
  OASIS_CHECK(seq->status != SequenceStatus::kFinished)
      << "sequence " << seq->id << " finished twice";
  if (seq->status == SequenceStatus::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    OASIS_CHECK(it != running_.end())
        << "running sequence " << seq->id << " not in the running list";
    running_.erase(it);
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    OASIS_CHECK(it != waiting_.end())
        << "waiting sequence " << seq->id << " not in the waiting queue";
    waiting_.erase(it);
  }
  CacheComputedBlocks(*seq, allocator_);
  seq->table.Release(allocator_);
  seq->num_blocks_cached = 0;
  if (hooks_ != nullptr) hooks_->Release(*seq);
  seq->kv = SequenceKv::kDense;
  seq->status = SequenceStatus::kFinished;
}

}  // namespace oasis

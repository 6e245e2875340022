// Scheduler: decides, once per engine step, which tokens of which sequences run — continuous
// batching under a per-step token budget, with chunked prefill, FCFS admission and
// preemption by recompute. Pure CPU logic (no model, no CUDA headers): unit-tested with a
// real BlockAllocator of a few slots and hand-made Sequences.
//
// Policy (one Schedule() call):
//   1. Decodes first: every running sequence with exactly one pending token (its last
//      sampled token), oldest admission first, takes one token of budget and grows its block
//      table to hold it. When the pool has no block for it, the most recently admitted
//      running sequence is preempted (blocks freed, back to the FRONT of the waiting queue,
//      its generated tokens kept and later recomputed as prompt) until the block fits — or
//      the sequence itself is the newest, and it is preempted.
//      Lookahead: a decode whose sequence holds draft tokens also runs them (after its
//      pending token) when the budget left after ALL decodes' own tokens allows and the pool
//      has the blocks without preempting anyone; otherwise it runs without them.
//   2. Prefill chunks of running sequences (chunked prefill), oldest first, as much of each
//      as the budget left allows. Their blocks were reserved at admission, so they never
//      preempt.
//   3. Admission, strictly FCFS: the waiting queue's front is admitted while budget is left,
//      fewer than max_num_seqs run, no sequence was preempted this step, and the pool can
//      hold its whole current context (prompt + tokens generated before a preemption); its
//      blocks are reserved at once and its first chunk runs this step. With prefix caching
//      (engine/prefix_reuse.h) it first adopts its longest cached prefix of full blocks and
//      reserves (and computes) only the rest; running sequences register their computed full
//      blocks at the start of each step and before their blocks are released. One exception
//      to FCFS: a waiting sequence whose next uncached full block a running sequence is
//      computing (n > 1 siblings, prompts that start alike) is passed over until that block
//      is cached, so it is computed once (SGLang's in-batch prefix rule).
// max_num_seqs is clamped to max_num_batched_tokens so every running decode fits a step.
//
// State machine of a Sequence: kWaiting → (admitted) kRunning → kFinished (Finish());
// kRunning → (preempted) kWaiting. A running sequence is "in prefill" while more than one
// token is pending, "in decode" when one is.
//
// Sparse KV (docs/sparse.md): with SequenceKvHooks, admission also asks the hooks (host KV
// store room: admit, wait at the front, or refuse), and a sequence's KV outside its table
// is released through them on preemption and finish. A kSparse sequence's table is empty and
// no longer grown: its K+2 slots per KV head (working set + tails) come from the same
// BlockAllocator, held by the sparse manager, so the pool accounting stays exact.
//
// Owns nothing but the queues of Sequence pointers: the caller owns the Sequences (they must
// outlive their time in the scheduler), the BlockAllocator and the hooks. Not thread-safe:
// the engine loop thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"

namespace oasis {

enum class SequenceStatus { kWaiting, kRunning, kFinished };

// Where a running sequence's KV lives. kDense: its block table (grown by the scheduler).
// kSparse: the sparse KV manager's working set and tail slots (docs/sparse.md); the table is
// empty and not grown. kSparseDenseTable: sparse, but the table still serves the dense
// layers (--dense-layers > 0) and grows as a dense sequence's does.
enum class SequenceKv : uint8_t { kDense, kSparse, kSparseDenseTable };

// Whether a sequence reuses and feeds the automatic prefix cache (engine/prefix_reuse.h).
enum class PrefixCaching : uint8_t { kOff, kOn };

// The scheduling state of one request: its tokens (prompt, then generated), how many of
// them have KV in the cache, and its block table. Owned by the caller (the engine's
// RequestState); mutated by the scheduler (status, table, num_computed on preemption) and by
// the engine after each step (CommitChunk, AppendToken).
struct Sequence {
  Sequence(uint64_t id, std::vector<int32_t> prompt, int32_t num_kv_heads);

  uint64_t id;                  // caller's key (the engine's request number)
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t num_prompt_tokens;    // of the original prompt
  int64_t num_computed = 0;     // leading tokens whose KV is cached
  HeadBlockTable table;
  SequenceStatus status = SequenceStatus::kWaiting;
  int64_t num_preemptions = 0;
  // Lookahead decoding: proposed tokens following `tokens` (not part of the sequence). A
  // decode step runs them after its pending token when the scheduler grants them
  // (ScheduledChunk::num_draft). Cleared on preemption.
  std::vector<int32_t> draft_tokens;
  // The most tokens (prompt + output) it can reach; 0 = unknown. Sparse admission reserves
  // host KV room for this many.
  int64_t max_total_tokens = 0;
  SequenceKv kv = SequenceKv::kDense;  // set by the engine; back to kDense on preemption
  // Sparse whatever its length (disaggregation: a handoff or an imported request); cleared
  // on preemption (it recomputes as a plain request).
  bool always_sparse = false;
  // Automatic prefix caching (engine/prefix_reuse.h; set by the engine): the chained hashes of
  // the leading full blocks of `tokens` computed so far, the leading table blocks adopted from
  // or registered in the cache, and the tokens found cached at its latest admission.
  PrefixCaching prefix_caching = PrefixCaching::kOff;
  uint64_t prefix_root = 0;  // the chain's root (PrefixCacheRoot of the request's cache salt)
  std::vector<uint64_t> block_hashes;
  int64_t num_blocks_cached = 0;
  int64_t num_cached_tokens = 0;

  bool grows_table() const { return kv != SequenceKv::kSparse; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - num_prompt_tokens; }
  int64_t num_pending() const { return num_tokens() - num_computed; }
  // After a step ran `n` of its pending tokens.
  void CommitChunk(int64_t n);
  // After a step sampled its next token (the chunk reached the end of `tokens`).
  void AppendToken(int32_t token) { tokens.push_back(token); }
};

struct SchedulerOptions {
  int64_t max_num_seqs = 256;             // running sequences at most
  int64_t max_num_batched_tokens = 2048;  // tokens per step (decodes + prefill chunks)
};

// "Run tokens [start, start + num_tokens) of `seq` this step."
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;
  int64_t num_tokens = 0;
  bool samples = false;  // the chunk reaches the end of seq->tokens: a token is sampled
  // Decodes only: seq->draft_tokens[0, num_draft) run after the pending token, at positions
  // start + 1, ...; the table holds start + 1 + num_draft tokens. Not in num_tokens.
  int64_t num_draft = 0;
};

// KV a sequence holds outside its block table (the engine's sparse KV manager: host store
// reservations, sparse rows, working-set slots). Called by the scheduler on its thread.
class SequenceKvHooks {
 public:
  enum class Admission {
    kAdmit,   // whatever it needs is taken now (given back by Release)
    kWait,    // not now: it stays at the front of the queue, nothing behind it is admitted
    kRefuse,  // never: reported in SchedulerOutput::refused (still waiting: the caller fails it)
  };
  virtual ~SequenceKvHooks() = default;
  // Before the waiting queue's front is admitted (its table reservation comes after).
  virtual Admission Admit(Sequence& seq) = 0;
  // Gives back everything Admit and later steps took for it: on preemption, on finish, and
  // when the pool cannot hold the admitted sequence after all. Idempotent.
  virtual void Release(Sequence& seq) = 0;
  // The pool cannot give a running decode its next block: frees blocks some other way than
  // preemption if it can (sparse KV: moves a running request's KV out of the pool at once; the
  // sequence keeps running without a growing table). True when it freed something.
  virtual bool Relieve(const std::vector<Sequence*>& running) {
    (void)running;
    return false;
  }
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<Sequence*> preempted;    // sequences preempted by this step (now waiting)
  std::vector<Sequence*> refused;      // waiting sequences the hooks refused (fail them)
  int64_t num_batched_tokens = 0;      // including draft tokens
  int64_t num_admitted = 0;
  // Waiting sequences left for a later step because a running sequence is computing their
  // next uncached prefix block (prefix caching: prefix_reuse.h AwaitsPendingBlock).
  int64_t num_awaiting_prefix = 0;
  bool empty() const { return chunks.empty(); }
};

class PrefixCompanion;  // engine/prefix_reuse.h

class Scheduler {
 public:
  // `hooks` (optional) must outlive the scheduler.
  Scheduler(SchedulerOptions options, BlockAllocator& allocator, SequenceKvHooks* hooks = nullptr);
  // Prefix caching: another pool whose cached blocks admission adopts along (the draft
  // head's; prefix_reuse.h). Must outlive the scheduler; set before the first Schedule.
  void set_prefix_companion(PrefixCompanion* companion) { companion_ = companion; }

  // Appends a new kWaiting sequence to the back of the waiting queue.
  void Add(Sequence* seq);
  // Appends a sequence whose KV is already in place (an imported request, its KV held by the
  // hooks' owner) to the running list, as the newest; kRunning from now on. The caller keeps
  // num_running() <= max_num_seqs.
  void AddRunning(Sequence* seq);
  // Plans one step (see the policy above). Reserves the blocks the chunks need.
  SchedulerOutput Schedule();
  // Removes a waiting or running sequence, frees its blocks, marks it kFinished.
  void Finish(Sequence* seq);

  // Whether a sequence of `num_tokens` tokens could ever fit in the whole pool.
  bool FitsInPool(int64_t num_tokens, int32_t num_kv_heads) const;

  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }  // admission order
  const SchedulerOptions& options() const { return options_; }

 private:
  void Preempt(Sequence* seq, SchedulerOutput* out);

  SchedulerOptions options_;
  BlockAllocator& allocator_;
  SequenceKvHooks* hooks_;
  PrefixCompanion* companion_ = nullptr;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
};

}  // namespace oasis

// Scheduler policy with fakes: a real BlockAllocator of a few head-blocks, hand-made
// Sequences, and a fake "model step" that commits the scheduled chunks and appends token 7
// to every sequence that samples. No model involved.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "engine/scheduler.h"

using namespace oasis;

namespace {

constexpr int32_t kHeads = 1;  // one KV head: a sequence of n tokens holds ceil(n / 16) slots

std::unique_ptr<Sequence> MakeSeq(uint64_t id, int64_t prompt_len) {
  return std::make_unique<Sequence>(id, std::vector<int32_t>(static_cast<size_t>(prompt_len), 3),
                                    kHeads);
}

// Applies a step's results the way the engine does.
void RunStep(const SchedulerOutput& out) {
  for (const ScheduledChunk& c : out.chunks) {
    c.seq->CommitChunk(c.num_tokens);
    if (c.samples) c.seq->AppendToken(7);
  }
}

int64_t Blocks(const Sequence& s) { return s.table.num_blocks(); }

}  // namespace

TEST_CASE("chunked prefill under the token budget, decodes first", "[scheduler]") {
  BlockAllocator alloc(64);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 8}, alloc);
  auto a = MakeSeq(1, 10), b = MakeSeq(2, 7);
  sched.Add(a.get());
  sched.Add(b.get());

  SchedulerOutput s1 = sched.Schedule();
  REQUIRE(s1.chunks.size() == 1);  // a takes the whole budget; b waits
  CHECK(s1.chunks[0].seq == a.get());
  CHECK(s1.chunks[0].start == 0);
  CHECK(s1.chunks[0].num_tokens == 8);
  CHECK_FALSE(s1.chunks[0].samples);
  CHECK(Blocks(*a) == 1);  // the whole prompt's blocks are reserved at admission
  CHECK(sched.num_running() == 1);
  CHECK(sched.num_waiting() == 1);
  RunStep(s1);

  SchedulerOutput s2 = sched.Schedule();
  REQUIRE(s2.chunks.size() == 2);
  CHECK(s2.chunks[0].seq == a.get());  // a finishes its prompt and samples
  CHECK(s2.chunks[0].start == 8);
  CHECK(s2.chunks[0].num_tokens == 2);
  CHECK(s2.chunks[0].samples);
  CHECK(s2.chunks[1].seq == b.get());  // b is admitted with the rest of the budget
  CHECK(s2.chunks[1].num_tokens == 6);
  CHECK_FALSE(s2.chunks[1].samples);
  CHECK(s2.num_admitted == 1);
  CHECK(s2.num_batched_tokens == 8);
  RunStep(s2);

  SchedulerOutput s3 = sched.Schedule();
  REQUIRE(s3.chunks.size() == 2);
  CHECK(s3.chunks[0].seq == a.get());  // the decode comes first
  CHECK(s3.chunks[0].start == 10);
  CHECK(s3.chunks[0].num_tokens == 1);
  CHECK(s3.chunks[1].seq == b.get());
  CHECK(s3.chunks[1].start == 6);
  CHECK(s3.chunks[1].num_tokens == 1);
  CHECK(s3.chunks[1].samples);
  RunStep(s3);
  CHECK(a->num_generated() == 2);
  CHECK(b->num_generated() == 1);

  sched.Finish(a.get());
  sched.Finish(b.get());
  CHECK(a->status == SequenceStatus::kFinished);
  CHECK(sched.idle());
  CHECK(alloc.num_free() == 64);
}

TEST_CASE("admission is FCFS and needs the whole context in free blocks", "[scheduler]") {
  BlockAllocator alloc(4);  // 64 tokens
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 256}, alloc);
  auto a = MakeSeq(1, 40), big = MakeSeq(2, 40), small = MakeSeq(3, 5);
  sched.Add(a.get());
  sched.Add(big.get());
  sched.Add(small.get());
  SchedulerOutput s1 = sched.Schedule();
  REQUIRE(s1.chunks.size() == 1);  // big (3 blocks) does not fit next to a; small may not pass it
  CHECK(s1.chunks[0].seq == a.get());
  CHECK(sched.waiting().front() == big.get());
  CHECK(alloc.num_free() == 1);
  RunStep(s1);
  sched.Finish(a.get());
  SchedulerOutput s2 = sched.Schedule();
  REQUIRE(s2.chunks.size() == 2);
  CHECK(s2.chunks[0].seq == big.get());
  CHECK(s2.chunks[1].seq == small.get());
  RunStep(s2);
  sched.Finish(big.get());
  sched.Finish(small.get());
  CHECK(alloc.num_free() == 4);
}

TEST_CASE("max_num_seqs bounds the running set and is clamped to the token budget", "[scheduler]") {
  BlockAllocator alloc(64);
  Scheduler sched({.max_num_seqs = 2, .max_num_batched_tokens = 100}, alloc);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 4; ++i) {
    seqs.push_back(MakeSeq(static_cast<uint64_t>(i), 3));
    sched.Add(seqs.back().get());
  }
  SchedulerOutput s1 = sched.Schedule();
  CHECK(s1.chunks.size() == 2);
  CHECK(sched.num_running() == 2);
  CHECK(sched.num_waiting() == 2);
  RunStep(s1);
  sched.Finish(seqs[0].get());
  SchedulerOutput s2 = sched.Schedule();
  REQUIRE(s2.chunks.size() == 2);
  CHECK(s2.chunks[0].seq == seqs[1].get());  // decode
  CHECK(s2.chunks[1].seq == seqs[2].get());  // admitted in order
  for (auto& s : seqs) {
    if (s->status != SequenceStatus::kFinished) sched.Finish(s.get());
  }

  Scheduler tight({.max_num_seqs = 256, .max_num_batched_tokens = 3}, alloc);
  CHECK(tight.options().max_num_seqs == 3);
}

TEST_CASE("out of blocks, the newest running sequence is preempted and recomputed", "[scheduler]") {
  BlockAllocator alloc(4);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 64}, alloc);
  auto a = MakeSeq(1, 16), b = MakeSeq(2, 16), c = MakeSeq(3, 16);
  sched.Add(a.get());
  sched.Add(b.get());
  sched.Add(c.get());
  RunStep(sched.Schedule());  // all three admitted (one block each), each samples a token
  REQUIRE(sched.num_running() == 3);
  REQUIRE(alloc.num_free() == 1);

  // Decodes at position 16 need a second block each: a gets the last free one, b's need
  // preempts c (the newest), the block freed goes to b.
  SchedulerOutput s = sched.Schedule();
  REQUIRE(s.preempted.size() == 1);
  CHECK(s.preempted[0] == c.get());
  CHECK(c->status == SequenceStatus::kWaiting);
  CHECK(c->num_computed == 0);
  CHECK(c->num_generated() == 1);  // its generated token is kept, recomputed as prompt
  CHECK(c->num_preemptions == 1);
  CHECK(Blocks(*c) == 0);
  CHECK(sched.waiting().front() == c.get());
  REQUIRE(s.chunks.size() == 2);
  CHECK(s.chunks[0].seq == a.get());
  CHECK(s.chunks[1].seq == b.get());
  CHECK(s.num_admitted == 0);  // no admission in a step that preempted
  RunStep(s);

  // Once a finishes, c comes back with its whole context (17 tokens) as one prefill.
  sched.Finish(a.get());
  SchedulerOutput r = sched.Schedule();
  REQUIRE(r.chunks.size() == 2);
  CHECK(r.chunks[0].seq == b.get());
  CHECK(r.chunks[1].seq == c.get());
  CHECK(r.chunks[1].start == 0);
  CHECK(r.chunks[1].num_tokens == 17);
  CHECK(r.chunks[1].samples);
  RunStep(r);
  CHECK(c->num_generated() == 2);
  sched.Finish(b.get());
  sched.Finish(c.get());
  CHECK(alloc.num_free() == 4);
}

TEST_CASE("a decoding sequence that is the newest preempts itself", "[scheduler]") {
  BlockAllocator alloc(2);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 64}, alloc);
  auto a = MakeSeq(1, 16), b = MakeSeq(2, 16);
  sched.Add(a.get());
  sched.Add(b.get());
  RunStep(sched.Schedule());
  REQUIRE(alloc.num_free() == 0);
  // a needs a block: b (newest) goes; then b would be next, but it is already gone.
  SchedulerOutput s = sched.Schedule();
  REQUIRE(s.preempted.size() == 1);
  CHECK(s.preempted[0] == b.get());
  REQUIRE(s.chunks.size() == 1);
  CHECK(s.chunks[0].seq == a.get());
  RunStep(s);
  sched.Finish(a.get());
  sched.Finish(b.get());  // finishing a waiting (preempted) sequence
  CHECK(alloc.num_free() == 2);
  CHECK(sched.idle());

  // Alone and out of blocks with nothing newer: the sequence itself is preempted.
  BlockAllocator one(1);
  Scheduler solo({.max_num_seqs = 8, .max_num_batched_tokens = 64}, one);
  auto x = MakeSeq(3, 16);
  solo.Add(x.get());
  RunStep(solo.Schedule());
  SchedulerOutput t = solo.Schedule();
  CHECK(t.chunks.empty());
  REQUIRE(t.preempted.size() == 1);
  CHECK(t.preempted[0] == x.get());
  solo.Finish(x.get());
  CHECK(one.num_free() == 1);
}

// Random workloads against a small pool and budget: every step respects the budget, block
// tables cover what runs, waiting sequences hold nothing, slots are conserved, and every
// sequence finishes with exactly its token count.
TEST_CASE("random workloads keep the scheduler's invariants", "[scheduler]") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      std::mt19937_64 rng(seed);
      const int32_t heads = 1 + static_cast<int32_t>(rng() % 3);
      const int32_t pool = heads * static_cast<int32_t>(8 + rng() % 16);
      const int64_t budget = 4 + static_cast<int64_t>(rng() % 40);
      BlockAllocator alloc(pool);
      Scheduler sched(
          {.max_num_seqs = 1 + static_cast<int64_t>(rng() % 8), .max_num_batched_tokens = budget},
          alloc);
      const int64_t max_tokens_fit = pool / heads * 16;
      std::vector<std::unique_ptr<Sequence>> seqs;
      std::map<Sequence*, int64_t> target;  // generated tokens each must reach
      for (int i = 0; i < 24; ++i) {
        const int64_t prompt = 1 + static_cast<int64_t>(rng() % 60);
        const int64_t gen = 1 + static_cast<int64_t>(rng() % 40);
        if (prompt + gen > max_tokens_fit) continue;  // Submit would reject it
        seqs.push_back(std::make_unique<Sequence>(
            static_cast<uint64_t>(i), std::vector<int32_t>(static_cast<size_t>(prompt), 5), heads));
        target[seqs.back().get()] = gen;
        sched.Add(seqs.back().get());
      }
      int64_t preemptions = 0;
      for (int step = 0; step < 100000 && !sched.idle(); ++step) {
        SchedulerOutput out = sched.Schedule();
        preemptions += static_cast<int64_t>(out.preempted.size());
        REQUIRE(!out.empty());
        int64_t tokens = 0;
        for (const ScheduledChunk& c : out.chunks) {
          REQUIRE(c.seq->status == SequenceStatus::kRunning);
          REQUIRE(c.start == c.seq->num_computed);
          REQUIRE(c.num_tokens >= 1);
          REQUIRE(c.seq->table.num_blocks() * 16 >= c.start + c.num_tokens);
          tokens += c.num_tokens;
        }
        REQUIRE(tokens <= budget);
        REQUIRE(tokens == out.num_batched_tokens);
        REQUIRE(sched.num_running() <= sched.options().max_num_seqs);
        int64_t held = 0;
        for (Sequence* s : sched.running()) held += s->table.num_blocks() * heads;
        for (Sequence* s : sched.waiting()) REQUIRE(s->table.num_blocks() == 0);
        REQUIRE(held + alloc.num_free() == pool);
        RunStep(out);
        for (const ScheduledChunk& c : out.chunks) {
          if (c.samples && c.seq->num_generated() == target[c.seq]) sched.Finish(c.seq);
        }
      }
      CHECK(sched.idle());
      CHECK(alloc.num_free() == pool);
      for (auto& s : seqs) {
        CHECK(s->status == SequenceStatus::kFinished);
        CHECK(s->num_generated() == target[s.get()]);
      }
      INFO("preemptions " << preemptions);
    }
  }
}

TEST_CASE("lookahead drafts take only budget no decode needs and never preempt", "[scheduler][lookahead]") {
  BlockAllocator alloc(8);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 4}, alloc);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(MakeSeq(static_cast<uint64_t>(i), 1));
    sched.Add(seqs.back().get());
  }
  RunStep(sched.Schedule());  // each prefills its one token and samples
  for (auto& s : seqs) s->draft_tokens = {9};
  // Budget 4, three decodes: one token of spare budget, which the oldest decode's draft takes.
  SchedulerOutput s = sched.Schedule();
  REQUIRE(s.chunks.size() == 3);
  CHECK(s.chunks[0].num_draft == 1);
  CHECK(s.chunks[1].num_draft == 0);
  CHECK(s.chunks[2].num_draft == 0);
  CHECK(s.num_batched_tokens == 4);
  for (const ScheduledChunk& c : s.chunks) CHECK(c.num_tokens == 1);
  RunStep(s);

  // A draft that would need a new block when none is free runs without its draft.
  BlockAllocator tiny(2);
  Scheduler one({.max_num_seqs = 8, .max_num_batched_tokens = 64}, tiny);
  auto a = MakeSeq(10, 15), b = MakeSeq(11, 15);
  one.Add(a.get());
  one.Add(b.get());
  RunStep(one.Schedule());  // 16 tokens each: both blocks full, pending token at position 15
  a->draft_tokens = {9};    // position 16 would need a second block
  b->draft_tokens = {9};
  SchedulerOutput t = one.Schedule();
  CHECK(t.preempted.empty());
  REQUIRE(t.chunks.size() == 2);
  CHECK(t.chunks[0].num_draft == 0);
  CHECK(t.chunks[1].num_draft == 0);
  CHECK(tiny.num_free() == 0);

  // Preemption clears a sequence's drafts (they belong to the discarded KV).
  RunStep(t);
  SchedulerOutput u = one.Schedule();  // both need a second block: b (newest) is preempted
  REQUIRE(u.preempted.size() == 1);
  CHECK(u.preempted[0] == b.get());
  CHECK(b->draft_tokens.empty());
  CHECK(a->draft_tokens.size() == 1);  // tried before the preemption freed a block: runs without it
  CHECK(u.chunks[0].num_draft == 0);
  for (auto& x : seqs) sched.Finish(x.get());
  one.Finish(a.get());
  one.Finish(b.get());
  CHECK(alloc.num_free() == 8);
  CHECK(tiny.num_free() == 2);
}

namespace {

// Fake sparse hooks: a host store of `capacity` tokens; sequences of max_total_tokens above
// `never` are refused. Records every call. Sequences marked kSparse hold `sparse_slots`
// allocator slots (their "working set"), returned by Release.
class FakeHooks final : public SequenceKvHooks {
 public:
  FakeHooks(BlockAllocator& alloc, int64_t capacity, int64_t never) : alloc_(alloc), free_(capacity), never_(never) {}
  Admission Admit(Sequence& seq) override {
    ++admits;
    if (seq.max_total_tokens > never_) return Admission::kRefuse;
    if (held_.count(seq.id)) return Admission::kAdmit;
    if (seq.max_total_tokens > free_) {
      ++waits;
      return Admission::kWait;
    }
    free_ -= seq.max_total_tokens;
    held_[seq.id] = seq.max_total_tokens;
    return Admission::kAdmit;
  }
  void Release(Sequence& seq) override {
    ++releases;
    auto it = held_.find(seq.id);
    if (it != held_.end()) {
      free_ += it->second;
      held_.erase(it);
    }
    auto sl = slots_.find(seq.id);
    if (sl != slots_.end()) {
      alloc_.Free(sl->second);
      slots_.erase(sl);
    }
  }
  // The engine's switch: the table's blocks go back, `n` slots are held instead.
  void MakeSparse(Sequence& seq, int32_t n) {
    auto got = alloc_.Allocate(n);
    REQUIRE(got);
    seq.table.Release(alloc_);
    slots_[seq.id] = *got;
    seq.kv = SequenceKv::kSparse;
  }
  int64_t free_tokens() const { return free_; }
  int admits = 0, waits = 0, releases = 0;

 private:
  BlockAllocator& alloc_;
  int64_t free_, never_;
  std::map<uint64_t, int64_t> held_;
  std::map<uint64_t, std::vector<int32_t>> slots_;
};

}  // namespace

TEST_CASE("sparse hooks: host admission waits FCFS, refusals are reported, release on preempt and finish",
          "[scheduler][sparse]") {
  BlockAllocator alloc(64);
  FakeHooks hooks(alloc, /*capacity=*/100, /*never=*/200);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 256}, alloc, &hooks);
  auto a = MakeSeq(1, 20), b = MakeSeq(2, 20), c = MakeSeq(3, 5), d = MakeSeq(4, 5);
  a->max_total_tokens = 60;
  b->max_total_tokens = 60;  // a and b do not fit the host store together
  c->max_total_tokens = 10;
  d->max_total_tokens = 500;  // never
  sched.Add(a.get());
  sched.Add(b.get());
  sched.Add(c.get());
  SchedulerOutput s1 = sched.Schedule();
  REQUIRE(s1.chunks.size() == 1);  // b waits at the front, so c (which would fit) waits too
  CHECK(s1.chunks[0].seq == a.get());
  CHECK(s1.refused.empty());
  CHECK(hooks.waits == 1);
  CHECK(sched.num_waiting() == 2);
  CHECK(b->table.num_blocks() == 0);  // nothing reserved for a waiting sequence
  RunStep(s1);

  // A sparse sequence's table is not grown; its decodes never need (or preempt for) blocks.
  hooks.MakeSparse(*a, 6);
  const int32_t free_before = alloc.num_free();
  for (int i = 0; i < 40; ++i) {  // crosses two block boundaries
    SchedulerOutput s = sched.Schedule();
    REQUIRE(s.chunks.size() == 1);
    CHECK(s.chunks[0].num_tokens == 1);
    CHECK(s.preempted.empty());
    a->draft_tokens = {9};  // drafts are granted without blocks (its tail holds them)
    RunStep(s);
  }
  CHECK(a->table.num_blocks() == 0);
  CHECK(alloc.num_free() == free_before);
  SchedulerOutput sd = sched.Schedule();
  CHECK(sd.chunks[0].num_draft == 1);
  RunStep(sd);

  // a finishes: its host room and slots return, b and c are admitted.
  sched.Finish(a.get());
  CHECK(hooks.releases == 1);
  CHECK(a->kv == SequenceKv::kDense);
  CHECK(alloc.num_free() == 64);
  SchedulerOutput s2 = sched.Schedule();
  REQUIRE(s2.chunks.size() == 2);
  CHECK(s2.chunks[0].seq == b.get());
  CHECK(s2.chunks[1].seq == c.get());
  CHECK(hooks.free_tokens() == 100 - 60 - 10);
  RunStep(s2);

  // A refused front is reported (the caller fails it) and blocks the queue behind it.
  sched.Add(d.get());
  auto e = MakeSeq(5, 3);
  sched.Add(e.get());
  SchedulerOutput s3 = sched.Schedule();
  REQUIRE(s3.refused.size() == 1);
  CHECK(s3.refused[0] == d.get());
  CHECK(sched.num_waiting() == 2);
  sched.Finish(d.get());  // what the engine does with it
  RunStep(s3);
  SchedulerOutput s4 = sched.Schedule();
  CHECK(s4.refused.empty());
  CHECK(s4.chunks.back().seq == e.get());
  RunStep(s4);

  // Preemption of a sparse sequence releases its hooks' state; it comes back dense.
  // e (the newest) goes sparse holding 40 slots; b and c grow until the pool is full and
  // the newest running sequence, e, is preempted.
  hooks.MakeSparse(*e, 40);
  const int releases = hooks.releases;
  bool preempted = false;
  for (int i = 0; i < 300 && !preempted; ++i) {
    SchedulerOutput s = sched.Schedule();
    for (Sequence* p : s.preempted) preempted = preempted || p == e.get();
    RunStep(s);
  }
  CHECK(preempted);
  CHECK(hooks.releases == releases + 1);
  CHECK(e->kv == SequenceKv::kDense);
  CHECK(e->num_computed == 0);
  for (Sequence* x : {b.get(), c.get(), e.get()}) sched.Finish(x);
  CHECK(alloc.num_free() == 64);
  CHECK(hooks.free_tokens() == 100);
}

namespace {

// Relief by "moving" a running sequence's KV out of the pool: the oldest in-place one (`movable`)
// gives its table's blocks back and runs on without a growing table.
class RelievingHooks final : public SequenceKvHooks {
 public:
  explicit RelievingHooks(BlockAllocator& alloc) : alloc_(alloc) {}
  Admission Admit(Sequence&) override { return Admission::kAdmit; }
  void Release(Sequence&) override {}
  bool Relieve(const std::vector<Sequence*>& running) override {
    ++calls;
    for (Sequence* s : running) {
      if (!movable.count(s->id) || s->kv == SequenceKv::kSparse) continue;
      s->table.Release(alloc_);
      s->kv = SequenceKv::kSparse;
      ++moved;
      return true;
    }
    return false;
  }
  std::set<uint64_t> movable;
  int calls = 0, moved = 0;

 private:
  BlockAllocator& alloc_;
};

}  // namespace

TEST_CASE("a missing block is relieved by the hooks before anyone is preempted", "[scheduler]") {
  BlockAllocator alloc(4);
  RelievingHooks hooks(alloc);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 64}, alloc, &hooks);
  auto a = MakeSeq(1, 16), b = MakeSeq(2, 16), c = MakeSeq(3, 16);
  for (auto* s : {a.get(), b.get(), c.get()}) {
    s->max_total_tokens = 64;
    sched.Add(s);
  }
  RunStep(sched.Schedule());  // one block each, one free
  REQUIRE(alloc.num_free() == 1);
  hooks.movable = {1};  // a can move; b and c cannot

  // a takes the free block; b's missing block is relieved by moving a (its two blocks back):
  // nobody is preempted, c gets one too.
  SchedulerOutput s = sched.Schedule();
  CHECK(s.preempted.empty());
  CHECK(hooks.moved == 1);
  CHECK(a->kv == SequenceKv::kSparse);
  CHECK(Blocks(*a) == 0);
  REQUIRE(s.chunks.size() == 3);  // a still decodes (its tokens go elsewhere now)
  CHECK(Blocks(*b) == 2);
  CHECK(Blocks(*c) == 2);
  RunStep(s);

  // Nothing left to move: the next missing block preempts the newest as before.
  for (int i = 0; i < 15; ++i) RunStep(sched.Schedule());
  SchedulerOutput p = sched.Schedule();
  CHECK(p.preempted.size() == 1);
  CHECK(hooks.calls >= 2);
  for (auto* x : {a.get(), b.get(), c.get()}) {
    if (x->status != SequenceStatus::kFinished) sched.Finish(x);
  }
  CHECK(alloc.num_free() == 4);
}

TEST_CASE("prefix caching: admission adopts cached full blocks and computes the rest",
          "[scheduler][prefix]") {
  BlockAllocator alloc(64);
  alloc.EnablePrefixCache(2);
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 256}, alloc);
  std::vector<int32_t> tokens(45);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(100 + i);
  auto seq = [&](uint64_t id, size_t len) {
    auto s = std::make_unique<Sequence>(
        id, std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<long>(len)), 2);
    s->prefix_caching = PrefixCaching::kOn;
    return s;
  };
  auto a = seq(1, 40);
  sched.Add(a.get());
  SchedulerOutput out = sched.Schedule();
  REQUIRE(out.chunks.size() == 1);
  CHECK(out.chunks[0].start == 0);
  CHECK(a->num_cached_tokens == 0);
  RunStep(out);  // 40 computed: blocks 0 and 1 are full
  CHECK(alloc.prefix_cache()->num_entries() == 0);
  out = sched.Schedule();  // registers them
  CHECK(alloc.prefix_cache()->num_entries() == 2);
  RunStep(out);

  // A prompt of exactly two blocks adopts one (its last token needs logits).
  auto b = seq(2, 32);
  sched.Add(b.get());
  out = sched.Schedule();
  REQUIRE(out.chunks.size() == 2);
  CHECK(out.chunks[1].seq == b.get());
  CHECK(out.chunks[1].start == 16);
  CHECK(out.chunks[1].num_tokens == 16);
  CHECK(b->num_cached_tokens == 16);
  CHECK(b->table.head_slots(0)[0] == a->table.head_slots(0)[0]);
  CHECK(b->table.head_slots(1)[0] == a->table.head_slots(1)[0]);
  CHECK(b->table.head_slots(0)[1] != a->table.head_slots(0)[1]);
  CHECK(alloc.ref_count(a->table.head_slots(1)[0]) == 2);
  RunStep(out);

  // A finished sequence's blocks stay cached and free (evictable); a longer prompt takes both.
  sched.Finish(a.get());
  sched.Finish(b.get());
  CHECK(alloc.num_free() == 64);
  CHECK(alloc.prefix_cache()->num_evictable_slots() > 0);
  auto c = seq(3, 45);
  sched.Add(c.get());
  out = sched.Schedule();
  REQUIRE(out.chunks.size() == 1);
  CHECK(out.chunks[0].start == 32);  // blocks 0, 1 cached (a's 40 computed tokens: 2 blocks)
  CHECK(out.chunks[0].num_tokens == 13);
  CHECK(alloc.prefix_cache()->queries_tokens_total() == 40 + 32 + 45);
  CHECK(alloc.prefix_cache()->hits_tokens_total() == 16 + 32);
  RunStep(out);
  sched.Finish(c.get());
  CHECK(alloc.num_free() == 64);

  // Off for a sequence: no lookup.
  auto d = seq(4, 45);
  d->prefix_caching = PrefixCaching::kOff;
  sched.Add(d.get());
  out = sched.Schedule();
  REQUIRE(out.chunks.size() == 1);
  CHECK(out.chunks[0].start == 0);
  RunStep(out);
  sched.Finish(d.get());
  CHECK(alloc.num_free() == 64);
}

#include "engine/lookahead.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace oasis {
const char* LookaheadModeName(LookaheadMode mode) {
  switch (mode) {
    case LookaheadMode::kOff:
      return "off";
    case LookaheadMode::kReject:
      return "reject";
    case LookaheadMode::kSpeculate:
      return "speculate";
  }
  return "?";
}

StatusOr<LookaheadMode> ParseLookaheadMode(std::string_view name) {
  if (name == "off") return LookaheadMode::kOff;
  if (name == "reject") return LookaheadMode::kReject;
  if (name == "speculate") return LookaheadMode::kSpeculate;
  return InvalidArgument("lookahead mode must be off, reject or speculate, got '" +
                         std::string(name) + "'");
}

ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs,
                                       const std::vector<int64_t>& num_draft,
                                       bool logits_for_drafts, std::vector<int64_t>* first_row) {
  return BuildLookaheadTargetInput(seqs, num_draft,
                                   std::vector<bool>(seqs.size(), logits_for_drafts), first_row);
}

ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs,
                                       const std::vector<int64_t>& num_draft,
                                       const std::vector<bool>& logits_for_drafts,
                                       std::vector<int64_t>* first_row,
                                       const std::vector<bool>* every_row) {
  OASIS_CHECK_EQ(seqs.size(), num_draft.size()) << "one draft count per sequence";
  OASIS_CHECK(every_row == nullptr || every_row->size() == seqs.size())
      << "one every-row choice per sequence";
  OASIS_CHECK_EQ(seqs.size(), logits_for_drafts.size()) << "one draft-logits choice per sequence";
  ForwardInput in = BuildHostForwardInput(seqs, LogitsFor::kLastTokenOfEachSequence);
  std::vector<int32_t> rows;
  if (first_row != nullptr) first_row->clear();
  int64_t t = 0;
  bool changed = false;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(seqs[s].tokens.size()), d = num_draft[s];
    OASIS_CHECK(d >= 0 && d < n) << "sequence " << s << ": " << d << " drafts among " << n
                                 << " tokens";
    if (first_row != nullptr) first_row->push_back(t);
    if (every_row != nullptr && (*every_row)[s]) {
      OASIS_CHECK_EQ(d, 0) << "sequence " << s << ": a row for every token, and drafts";
      for (int64_t j = 0; j + 1 < n; ++j) rows.push_back(static_cast<int32_t>(t + j));
      changed = changed || n > 1;
    }
    rows.push_back(static_cast<int32_t>(t + n - 1 - d));
    if (logits_for_drafts[s]) {
      for (int64_t j = 0; j < d; ++j) rows.push_back(static_cast<int32_t>(t + n - d + j));
    }
    changed = changed || d > 0;
    t += n;
  }
  if (changed) in.logit_rows = Tensor::FromInts(rows);
  return in;
}

HeadStepInput BuildHeadStepInput(const std::vector<HeadStepSequence>& seqs) {
  std::vector<StepSequence> steps;
  steps.reserve(seqs.size());
  HeadStepInput out;
  std::vector<int32_t> rows;
  int64_t t = 0;
  for (const HeadStepSequence& s : seqs) {
    OASIS_CHECK(!s.tokens.empty()) << "a head sequence without rows";
    steps.push_back({s.table, s.start, s.tokens});
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    for (int64_t i = 0; i < n; ++i)
      out.aux_rows.push_back(static_cast<int32_t>(s.first_aux_row + i));
    if (s.wants_draft) rows.push_back(static_cast<int32_t>(t + n - 1));
    t += n;
  }
  out.input = BuildHostForwardInput(steps, LogitsFor::kLastTokenOfEachSequence);
  out.input.logit_rows = Tensor::FromInts(rows);
  return out;
}

namespace {

std::vector<HeadStepSequence> HeadSequences(BlockAllocator& allocator,
                                            const std::vector<DraftHeadWork>& work,
                                            const std::vector<int64_t>& rows_end) {
  std::vector<HeadStepSequence> seqs;
  seqs.reserve(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    const DraftHeadWork& w = work[i];
    const int64_t q0 = w.head->num_computed, q1 = rows_end[i];
    OASIS_CHECK(q0 < q1 && q1 <= w.seq->num_tokens())
        << "head rows [" << q0 << ", " << q1 << ") of a sequence of " << w.seq->num_tokens()
        << " tokens";
    // The head pool holds as many tokens as the target's and the head never holds more
    // rows than the target computed, so this cannot run out (Engine::CheckOptions).
    OASIS_CHECK_OK(w.head->table.Reserve(q1, allocator));
    // Row q embeds token q + 1; the one the step is sampling is not there yet (0 until refreshed).
    std::vector<int32_t> tokens(static_cast<size_t>(q1 - q0), 0);
    for (int64_t q = q0; q < q1 && q + 1 < w.seq->num_tokens(); ++q)
      tokens[static_cast<size_t>(q - q0)] = w.seq->tokens[q + 1];
    seqs.push_back({&w.head->table, q0, std::move(tokens), w.first_aux_row, w.wants_draft});
  }
  return seqs;
}

// Each item's head rows are committed and its draft (if it wants one) set, in logits-row order.
int64_t CommitDrafts(const std::vector<DraftHeadWork>& work, const HeadStepInput& in,
                     const std::vector<int32_t>& drafts) {
  OASIS_CHECK_EQ(static_cast<int64_t>(drafts.size()), in.input.logit_rows.numel())
      << "one draft per logits row";
  size_t k = 0;
  for (const DraftHeadWork& w : work) {
    w.head->num_computed = w.seq->num_computed;
    w.seq->draft_tokens.clear();
    if (w.wants_draft) w.seq->draft_tokens.push_back(drafts[k++]);
  }
  return static_cast<int64_t>(drafts.size());
}

bool AnyChain(const std::vector<DraftHeadWork>& work) {
  return std::any_of(work.begin(), work.end(),
                     [](const DraftHeadWork& w) { return w.wants_draft && w.num_drafts > 1; });
}

// The chained steps after a committed head step whose logits rows' features are `features`
// (one row per item wanting a draft, in order): step j (1 ..) runs, for each item whose chain
// wants more than j drafts, one head row at position num_computed - 1 + j embedding its draft
// j - 1, and appends draft j. Returns the drafts proposed.
int64_t ExtendChains(DraftRunner& runner, BlockAllocator& allocator,
                     const std::vector<DraftHeadWork>& work, Tensor features) {
  std::vector<int32_t> feature_row(work.size(), -1);
  int32_t rows = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    if (work[i].wants_draft) feature_row[i] = rows++;
  }
  // Chains only take head blocks while every item could still grow by a block per head (the
  // committed rows of the next head step never wait for a chain's).
  const int64_t margin = static_cast<int64_t>(work.size()) * runner.num_kv_heads();
  int64_t proposed = 0;
  for (size_t j = 1; j < static_cast<size_t>(kMaxDraftTokens); ++j) {
    std::vector<HeadStepSequence> seqs;
    std::vector<int32_t> frows;
    std::vector<size_t> items;
    for (size_t i = 0; i < work.size(); ++i) {
      const DraftHeadWork& w = work[i];
      if (feature_row[i] < 0 || static_cast<size_t>(w.num_drafts) <= j ||
          w.seq->draft_tokens.size() != j) {
        continue;
      }
      const int64_t pos = w.seq->num_computed - 1 + static_cast<int64_t>(j);
      const int64_t grow = HeadBlockTable::SlotsFor(pos + 1, runner.num_kv_heads()) -
                           w.head->table.num_blocks() * runner.num_kv_heads();
      if (grow > 0 && allocator.num_free() - grow < margin) continue;
      if (!w.head->table.Reserve(pos + 1, allocator).ok()) continue;
      seqs.push_back({&w.head->table, pos, {w.seq->draft_tokens[j - 1]}, 0, true});
      frows.push_back(feature_row[i]);
      items.push_back(i);
    }
    if (seqs.empty()) break;
    const HeadStepInput in = BuildHeadStepInput(seqs);
    DraftRunner::ChainStep step = runner.ProposeFromFeatures(in.input, features, frows);
    OASIS_CHECK_EQ(step.drafts.size(), items.size()) << "one chained draft per row";
    std::fill(feature_row.begin(), feature_row.end(), -1);
    for (size_t m = 0; m < items.size(); ++m) {
      work[items[m]].seq->draft_tokens.push_back(step.drafts[m]);
      feature_row[items[m]] = static_cast<int32_t>(m);
    }
    features = step.features;
    proposed += static_cast<int64_t>(items.size());
  }
  return proposed;
}

int64_t ProposeAndCommit(DraftRunner& runner, BlockAllocator& allocator,
                         const std::vector<DraftHeadWork>& work, const HeadStepInput& in,
                         const Tensor& aux) {
  if (!AnyChain(work)) return CommitDrafts(work, in, runner.Propose(in.input, aux, in.aux_rows));
  DraftRunner::ChainStep first = runner.ProposeWithFeatures(in.input, aux, in.aux_rows);
  const int64_t n = CommitDrafts(work, in, first.drafts);
  return n + ExtendChains(runner, allocator, work, first.features);
}

// Whether the step as committed is the one prepared (the same items, each committed up to
// its prepared rows_end).
bool SameAsPrepared(const PreparedHeadStep& prepared, const std::vector<DraftHeadWork>& work) {
  bool same = prepared.work.size() == work.size();
  for (size_t i = 0; same && i < work.size(); ++i) {
    const DraftHeadWork &a = work[i], &b = prepared.work[i];
    same = a.seq == b.seq && a.head == b.head && a.first_aux_row == b.first_aux_row &&
           a.wants_draft == b.wants_draft && a.num_drafts == b.num_drafts &&
           a.seq->num_computed == prepared.rows_end[i];
  }
  return same;
}

std::vector<int64_t> CommittedEnds(const std::vector<DraftHeadWork>& work) {
  std::vector<int64_t> ends;
  ends.reserve(work.size());
  for (const DraftHeadWork& w : work) {
    OASIS_CHECK(w.seq->num_computed < w.seq->num_tokens())
        << "head rows end at " << w.seq->num_computed << " of a sequence of " << w.seq->num_tokens()
        << " tokens";
    ends.push_back(w.seq->num_computed);
  }
  return ends;
}

}  // namespace

int64_t RunDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                         const std::vector<DraftHeadWork>& work, const Tensor& aux) {
  if (work.empty()) return 0;
  const HeadStepInput in = BuildHeadStepInput(HeadSequences(allocator, work, CommittedEnds(work)));
  return ProposeAndCommit(runner, allocator, work, in, aux);
}

PreparedHeadStep PrepareDraftHeadStep(BlockAllocator& allocator, std::vector<DraftHeadWork> work,
                                      std::vector<int64_t> rows_end,
                                      std::vector<int64_t> sample_rows) {
  OASIS_CHECK(work.size() == rows_end.size() && work.size() == sample_rows.size())
      << "one rows end and one sample row per head work item";
  PreparedHeadStep p;
  if (!work.empty()) p.in = BuildHeadStepInput(HeadSequences(allocator, work, rows_end));
  p.work = std::move(work);
  p.rows_end = std::move(rows_end);
  p.sample_rows = std::move(sample_rows);
  return p;
}

int64_t RunPreparedDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                                 PreparedHeadStep* prepared, const std::vector<DraftHeadWork>& work,
                                 const Tensor& aux) {
  if (work.empty()) return 0;
  if (prepared == nullptr || !SameAsPrepared(*prepared, work))
    return RunDraftHeadStep(runner, allocator, work, aux);
  // Every row's token from the sequence as it is now (the sampled tokens included).
  int32_t* ids = prepared->in.input.token_ids.data<int32_t>();
  int64_t t = 0;
  for (const DraftHeadWork& w : work) {
    for (int64_t q = w.head->num_computed; q < w.seq->num_computed; ++q)
      ids[t++] = w.seq->tokens[q + 1];
  }
  OASIS_CHECK_EQ(t, prepared->in.input.token_ids.numel()) << "prepared head rows";
  return ProposeAndCommit(runner, allocator, work, prepared->in, aux);
}

bool ChainPreparedDraftHeadStep(DraftRunner& runner, const PreparedHeadStep& prepared,
                                const Tensor& aux, const DeviceSamples& samples) {
  if (prepared.work.empty()) return false;
  std::vector<int32_t> pairs;
  int64_t t = 0;
  for (size_t i = 0; i < prepared.work.size(); ++i) {
    t += prepared.rows_end[i] - prepared.work[i].head->num_computed;  // the item's rows
    if (prepared.sample_rows[i] >= 0) {
      pairs.push_back(static_cast<int32_t>(prepared.sample_rows[i]));
      pairs.push_back(static_cast<int32_t>(t - 1));
    }
  }
  OASIS_CHECK_EQ(t, prepared.in.input.token_ids.numel()) << "prepared head rows";
  return runner.ProposeChained(prepared.in.input, aux, prepared.in.aux_rows, samples, pairs);
}

int64_t FinishChainedDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                                   const PreparedHeadStep& prepared,
                                   const std::vector<DraftHeadWork>& work, const Tensor& aux,
                                   bool* used) {
  const std::vector<int32_t> drafts = runner.CollectChained();
  if (used != nullptr) *used = false;
  if (work.empty()) return 0;
  if (!SameAsPrepared(prepared, work)) return RunDraftHeadStep(runner, allocator, work, aux);
  if (used != nullptr) *used = true;
  OASIS_CHECK(!AnyChain(work)) << "a chained head step with draft chains";
  return CommitDrafts(work, prepared.in, drafts);
}

}  // namespace oasis

#include "engine/lookahead.h"

#include <string>

#include "common/check.h"

namespace oasis {
namespace {

Tensor RowsTensor(const std::vector<int32_t>& rows) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(rows.size())}, DType::kI32);
  for (size_t i = 0; i < rows.size(); ++i) t.data<int32_t>()[i] = rows[i];
  return t;
}

}  // namespace

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
  return InvalidArgument("lookahead mode must be off, reject or speculate, got '" + std::string(name) + "'");
}

ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs, const std::vector<int64_t>& num_draft,
                                       bool logits_for_drafts, std::vector<int64_t>* first_row) {
  return BuildLookaheadTargetInput(seqs, num_draft, std::vector<bool>(seqs.size(), logits_for_drafts), first_row);
}

ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs, const std::vector<int64_t>& num_draft,
                                       const std::vector<bool>& logits_for_drafts, std::vector<int64_t>* first_row) {
  OASIS_CHECK_EQ(seqs.size(), num_draft.size()) << "one draft count per sequence";
  OASIS_CHECK_EQ(seqs.size(), logits_for_drafts.size()) << "one draft-logits choice per sequence";
  ForwardInput in = BuildHostForwardInput(seqs, LogitsFor::kLastTokenOfEachSequence);
  std::vector<int32_t> rows;
  if (first_row != nullptr) first_row->clear();
  int64_t t = 0;
  bool changed = false;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(seqs[s].tokens.size()), d = num_draft[s];
    OASIS_CHECK(d >= 0 && d < n) << "sequence " << s << ": " << d << " drafts among " << n << " tokens";
    if (first_row != nullptr) first_row->push_back(t);
    rows.push_back(static_cast<int32_t>(t + n - 1 - d));
    if (logits_for_drafts[s]) {
      for (int64_t j = 0; j < d; ++j) rows.push_back(static_cast<int32_t>(t + n - d + j));
    }
    changed = changed || d > 0;
    t += n;
  }
  if (changed) in.logit_rows = RowsTensor(rows);
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
    for (int64_t i = 0; i < n; ++i) out.aux_rows.push_back(static_cast<int32_t>(s.first_aux_row + i));
    if (s.wants_draft) rows.push_back(static_cast<int32_t>(t + n - 1));
    t += n;
  }
  out.input = BuildHostForwardInput(steps, LogitsFor::kLastTokenOfEachSequence);
  out.input.logit_rows = RowsTensor(rows);
  return out;
}

int64_t RunDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator, const std::vector<DraftHeadWork>& work,
                         const Tensor& aux) {
  if (work.empty()) return 0;
  std::vector<HeadStepSequence> seqs;
  seqs.reserve(work.size());
  for (const DraftHeadWork& w : work) {
    const int64_t q0 = w.head->num_computed, q1 = w.seq->num_computed;
    OASIS_CHECK(q0 < q1 && q1 < w.seq->num_tokens())
        << "head rows [" << q0 << ", " << q1 << ") of a sequence of " << w.seq->num_tokens() << " tokens";
    // The head pool holds as many tokens as the target's and the head never holds more
    // rows than the target computed, so this cannot run out (Engine::CheckOptions).
    OASIS_CHECK_OK(w.head->table.Reserve(q1, allocator));
    seqs.push_back({&w.head->table, q0,
                    std::vector<int32_t>(w.seq->tokens.begin() + q0 + 1, w.seq->tokens.begin() + q1 + 1),
                    w.first_aux_row, w.wants_draft});
  }
  HeadStepInput in = BuildHeadStepInput(seqs);
  const std::vector<int32_t> drafts = runner.Propose(in.input, aux, in.aux_rows);
  OASIS_CHECK_EQ(static_cast<int64_t>(drafts.size()), in.input.logit_rows.numel()) << "one draft per logits row";
  size_t k = 0;
  for (const DraftHeadWork& w : work) {
    w.head->num_computed = w.seq->num_computed;
    w.seq->draft_tokens.clear();
    if (w.wants_draft) w.seq->draft_tokens.push_back(drafts[k++]);
  }
  return static_cast<int64_t>(drafts.size());
}

}  // namespace oasis

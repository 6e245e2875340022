// Lookahead decoding (docs/lookahead.md): the mode enum, a request's draft-head state, and
// the host-side batch layouts of one engine step — the target batch with each decode's
// draft token stacked after its real token, and the EAGLE-3 head's batch over the target's
// captured rows. The engine loop (engine.cpp) drives them; DraftRunner runs the head.
//
// Plain functions and value types; thread-compatible (the engine loop uses them).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/scheduler.h"
#include "kvcache/head_block_table.h"
#include "kvcache/sparse_step_plan.h"
#include "models/decoder_lm.h"
#include "oasis/status.h"
#include "runner/batch_builder.h"
#include "runner/draft_runner.h"

namespace oasis {

// kOff: plain decoding. kReject (the paper's): every decode step also runs the draft token
// x̂_{t+1} through the target (stacked queries) and discards its output, so the text is
// exactly plain decoding's. kSpeculate: the draft is accepted when the token sampled from
// the real row equals it, and the draft row's token is emitted as well (up to two tokens
// per step), still token-for-token plain decoding's output for the same seed.
enum class LookaheadMode { kOff, kReject, kSpeculate };

// The longest draft chain a speculate step verifies (--num-speculative-tokens 1..4): the
// target runs 1 + k query rows per sequence (the decode attention takes up to 16), and a
// sparse step's tail holds them (kMaxSparseDraftTokens).
inline constexpr int64_t kMaxDraftTokens = 4;
static_assert(kMaxDraftTokens == kMaxSparseDraftTokens, "sparse steps hold every draft chain");

const char* LookaheadModeName(LookaheadMode mode);  // "off", "reject", "speculate"
StatusOr<LookaheadMode> ParseLookaheadMode(std::string_view name);

// One request's state in the draft head: its head-level block table in the head's own KV
// pool and how many head rows (target positions 0..num_computed-1) have K/V there. Owned by
// the request's RequestState; the engine loop keeps num_computed equal to the target's
// Sequence::num_computed after every step and releases the table on preemption and finish.
// With prefix caching (engine/draft_prefix_cache.h) the head's full blocks are cached as the
// target's are: block_hashes covers its leading full blocks, num_blocks_cached of them are
// adopted from or registered in the head pool's cache (read-only).
struct DraftHeadState {
  explicit DraftHeadState(int32_t num_kv_heads) : table(num_kv_heads) {}
  HeadBlockTable table;
  int64_t num_computed = 0;
  std::vector<uint64_t> block_hashes;
  int64_t num_blocks_cached = 0;
};

// The target input of one step: BuildHostForwardInput over `seqs` (each StepSequence's
// tokens = its real tokens followed by its num_draft[i] draft tokens), with logits rows,
// per sequence in order: its last REAL token's row, then (when `logits_for_drafts`) one row
// per draft token. Without drafts this is exactly BuildHostForwardInput(seqs,
// kLastTokenOfEachSequence). `first_row` (optional) gets each sequence's first batch row.
ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs,
                                       const std::vector<int64_t>& num_draft,
                                       bool logits_for_drafts,
                                       std::vector<int64_t>* first_row = nullptr);
// The same with the draft rows' logits chosen per sequence (logits_for_drafts[i]). A sequence
// with every_row[i] (prompt logprobs; no drafts) has a logits row for each of its tokens.
ForwardInput BuildLookaheadTargetInput(const std::vector<StepSequence>& seqs,
                                       const std::vector<int64_t>& num_draft,
                                       const std::vector<bool>& logits_for_drafts,
                                       std::vector<int64_t>* first_row = nullptr,
                                       const std::vector<bool>* every_row = nullptr);

// Head rows of one sequence in one step: target positions [start, start + tokens.size()),
// head row for position q embeds tokens[q - start] (the target token at q + 1) and reads
// the target capture row first_aux_row + (q - start).
struct HeadStepSequence {
  const HeadBlockTable* table = nullptr;  // the head's table, holding start + tokens.size() tokens
  int64_t start = 0;
  std::vector<int32_t> tokens;
  int64_t first_aux_row = 0;
  bool wants_draft = false;  // return a draft from the last row
};

struct HeadStepInput {
  ForwardInput input;  // host tensors; logit_rows = last rows of the sequences wanting drafts
  std::vector<int32_t> aux_rows;  // per head row: the target capture row it reads
};

HeadStepInput BuildHeadStepInput(const std::vector<HeadStepSequence>& seqs);

// One live request's part of a step's head run. After the target step committed its
// tokens, the head computes rows [head->num_computed, seq->num_computed): row q embeds
// seq->tokens[q + 1] and reads target capture row first_aux_row + (q - head->num_computed)
// (head->num_computed must be the chunk's start position).
struct DraftHeadWork {
  Sequence* seq = nullptr;
  DraftHeadState* head = nullptr;
  int64_t first_aux_row = 0;
  bool wants_draft = false;  // propose a draft for the next step (else the draft is cleared)
  // Drafts wanted (with wants_draft): a chain of this many, 1..kMaxDraftTokens. The head runs
  // its step, then num_drafts - 1 chained steps, each over the previous draft at the next
  // position with the previous step's features; their head K/V sits past num_computed (the
  // next head step overwrites it). A chain ends early when the head pool cannot hold it.
  int32_t num_drafts = 1;
};

// Runs the head over every work item in one batch: grows each head table (from
// `allocator`, the head pool's), appends the rows' K/V, advances head->num_computed to
// seq->num_computed and sets seq->draft_tokens to the proposal (or clears it). `aux` is the
// target capture of the same step. Returns the number of drafts proposed. Runner failures
// propagate as exceptions (the caller fails the requests).
int64_t RunDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                         const std::vector<DraftHeadWork>& work, const Tensor& aux);

// The head step prepared ahead, while the target step runs on the device: `work` with the
// head rows each item WILL have, [head->num_computed, rows_end[i]), once the target step has
// committed its tokens (decodes: the chunk's tokens, the draft not accepted). The host input
// is built with the tokens known so far (0 for a token the step has yet to sample);
// sample_rows[i] is the target step's sample row whose token item i's last head row takes
// (-1: its chunk samples none, the token is known).
struct PreparedHeadStep {
  std::vector<DraftHeadWork> work;
  std::vector<int64_t> rows_end;
  std::vector<int64_t> sample_rows;
  HeadStepInput in;
};
PreparedHeadStep PrepareDraftHeadStep(BlockAllocator& allocator, std::vector<DraftHeadWork> work,
                                      std::vector<int64_t> rows_end,
                                      std::vector<int64_t> sample_rows);
// RunDraftHeadStep over `work` using `prepared` when it matches (the same items, each with
// seq->num_computed == the prepared rows_end: then only the token ids are refreshed from the
// sequences), else building the input afresh. Returns the number of drafts proposed.
int64_t RunPreparedDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                                 PreparedHeadStep* prepared, const std::vector<DraftHeadWork>& work,
                                 const Tensor& aux);

// The prepared step queued on the device behind the target step (DraftRunner::ProposeChained,
// from the target runner's after-sampling hook; docs/lookahead.md): item i's last head row
// takes the token the step samples in prepared.sample_rows[i], read on the device. Returns
// whether the runner queued it.
bool ChainPreparedDraftHeadStep(DraftRunner& runner, const PreparedHeadStep& prepared,
                                const Tensor& aux, const DeviceSamples& samples);
// After a chained step: its drafts are committed when `work` matches the prepared items as
// RunPreparedDraftHeadStep requires; otherwise they are dropped and the step runs again from
// the sequences as they are (the same rows rewrite the same K/V). Returns the drafts proposed;
// `used` (when not null) tells whether the chained step's were.
int64_t FinishChainedDraftHeadStep(DraftRunner& runner, BlockAllocator& allocator,
                                   const PreparedHeadStep& prepared,
                                   const std::vector<DraftHeadWork>& work, const Tensor& aux,
                                   bool* used = nullptr);

}  // namespace oasis

// One engine step (Engine::Impl::Step) in named phases: schedule (and clean up after the
// scheduler's decisions), build the target batch (chunks, stacked lookahead drafts, sparse
// sequences' plan, sample rows), run it (one runner call: execute and sample, the draft
// head's next batch prepared or chained meanwhile), commit and emit each chunk (stop checks,
// draft acceptance), then the after-step work: the draft head, handoffs, switching requests
// past the sparse threshold. See docs/engine.md, docs/lookahead.md and docs/sparse.md.
#include <algorithm>
#include <exception>

#include "common/check.h"
#include "common/logging.h"
#include "engine/engine_impl.h"
#include "runner/batch_builder.h"

namespace oasis {
namespace {

static_assert(SpeculativeDepthController::kMaxDepth == kMaxDraftTokens,
              "the adaptive depth chooses among every chain length");

// Adds the whole step's wall time to the stats however Step returns.
struct StepClock {
  EngineStats& stats;
  EngineClock::time_point begin;
  bool decode_only = false;  // set once the batch is known (and ran)
  ~StepClock() {
    const double secs = Seconds(EngineClock::now() - begin);
    stats.loop.step_seconds_total += secs;
    if (decode_only) {
      ++stats.loop.decode_steps_total;
      stats.loop.decode_step_seconds_total += secs;
    }
  }
};

// A decode-only batch: every chunk one token past its prompt.
bool DecodeOnly(const SchedulerOutput& plan) {
  return std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
    return c.num_tokens == 1 && c.start >= c.seq->num_prompt_tokens;
  });
}

}  // namespace

void Engine::Impl::Step() {
  StepClock clock{stats, EngineClock::now()};
  StepBatch b;
  if (draft_prefix !=
      nullptr) {  // the head's full blocks of last step, as Schedule does the target's
    for (Sequence* seq : scheduler.running())
      draft_prefix->Register(*seq, requests.at(seq->id)->draft_head);
  }
  b.plan = scheduler.Schedule();
  const auto t_scheduled = EngineClock::now();
  stats.loop.schedule_seconds_total += Seconds(t_scheduled - clock.begin);
  if (!HandleScheduled(b.plan)) return;
  BuildBatch(b);
  ChooseChainDepth(b);
  const auto step_start = EngineClock::now();
  stats.loop.build_seconds_total += Seconds(step_start - t_scheduled);
  const Status failure = RunBatch(b);
  ++stats.loop.steps_total;
  const double model_secs = Seconds(EngineClock::now() - step_start);
  stats.loop.model_step_seconds_total += model_secs;
  const bool decode_only = failure.ok() && DecodeOnly(b.plan);
  if (decode_only) stats.loop.decode_model_step_seconds_total += model_secs;
  clock.decode_only = decode_only;
  if (!failure.ok()) {
    FailBatch(b, failure);
    return;
  }
  const auto now = EngineClock::now();
  CommitAndEmit(b, now);
  delivery.Flush();  // the step's tokens go out now, not after the draft head's step
  const auto head_start = EngineClock::now();
  stats.loop.emit_seconds_total += Seconds(head_start - now);
  RunDraftHead(b, head_start);
  if (!b.handoffs.empty()) HandoffReady(b.handoffs);
  if (sparse != nullptr) {
    sparse->SwitchReady(scheduler.running());  // (counted in stats.sparse.switches_total)
    sparse->Rebalance(scheduler.running(), PoolShortfall(b.plan), allocator.num_free());
  }
  if (decode_only) ObserveChainDepthCost(b, Seconds(EngineClock::now() - clock.begin));
}

void Engine::Impl::ChooseChainDepth(StepBatch& b) {
  b.chain_depth = static_cast<int32_t>(options.num_speculative_tokens);
  if (depth_controller == nullptr) return;
  const SpeculativeDepthController::Choice c =
      depth_controller->Choose(static_cast<int64_t>(b.plan.chunks.size()), b.sparse_step);
  b.chain_depth = c.depth;
  b.depth_explored = c.explored;
}

void Engine::Impl::ObserveChainDepthCost(const StepBatch& b, double step_seconds) {
  if (depth_controller == nullptr || b.head_failed) return;
  // The target verified chains of the step's longest stacked chain (the query rows per
  // sequence of its graph); the head proposed chains of the longest wanted.
  int64_t verified = 0;
  for (size_t i = 0; i < b.num_draft.size(); ++i) {
    if (b.draft_logits[i]) verified = std::max(verified, b.num_draft[i]);
  }
  int32_t proposed = 0;
  for (const DraftHeadWork& w : b.head_work) {
    if (w.wants_draft) proposed = std::max(proposed, w.num_drafts);
  }
  depth_controller->ObserveStep(static_cast<int64_t>(b.plan.chunks.size()), b.sparse_step,
                                static_cast<int32_t>(verified), step_seconds - b.head_seconds,
                                proposed, b.head_seconds);
}

int64_t Engine::Impl::PoolShortfall(const SchedulerOutput& plan) const {
  int64_t short_by = plan.preempted.empty() ? 0 : 1;
  if (scheduler.waiting().empty()) return short_by;
  const Sequence& next = *scheduler.waiting().front();
  return std::max(short_by,
                  HeadBlockTable::SlotsFor(next.num_tokens(), num_kv_heads) - allocator.num_free());
}

bool Engine::Impl::HandleScheduled(const SchedulerOutput& plan) {
  stats.requests.preemptions_total += static_cast<int64_t>(plan.preempted.size());
  for (Sequence* p : plan.preempted) {
    RequestState& s = *requests.at(p->id);
    ReleaseDraftHead(s);
    ReleaseImport(s,
                  true);  // an imported request recomputes here: its lease is not needed any more
    s.import_generation = 0;  // drift fetches still in flight are dropped
  }
  // Requests the sparse admission refused (their KV can never fit the host store; Submit
  // refuses those already, so this is a safety net): they fail, the others go on.
  for (Sequence* r : plan.refused) Fail(*requests.at(r->id), sparse->RefusalStatus(*r));
  if (!plan.empty()) {
    const auto now = EngineClock::now();
    for (const ScheduledChunk& c : plan.chunks) {
      RequestState& s = *requests.at(c.seq->id);
      if (!s.first_scheduled) s.first_scheduled = now;
    }
    return true;
  }
  if (!plan.refused.empty()) return false;
  // Cannot happen while Submit keeps every request within the pool; never spin on it.
  const Status error = Internal("the scheduler found nothing to run for a non-empty queue");
  while (!scheduler.waiting().empty()) Fail(*requests.at(scheduler.waiting().front()->id), error);
  return false;
}

void Engine::Impl::BuildBatch(StepBatch& b) {
  // The target batch: each chunk's tokens, a decode's granted draft tokens after its own.
  // Sparse sequences run drafts for the draft predictor and under speculate, which accepts
  // them as it does a dense sequence's (the sparse plan writes accepted drafts through at the
  // next step). Under reject a sparse server's dense sequences stack none: nothing would read
  // or accept it (their head still runs, so a draft is ready the step they switch).
  const bool speculate = draft != nullptr && options.lookahead == LookaheadMode::kSpeculate;
  const bool dense_drafts = sparse == nullptr || options.lookahead != LookaheadMode::kReject;
  std::vector<const Sequence*> seqs;
  b.steps.reserve(b.plan.chunks.size());
  b.rows.reserve(b.plan.chunks.size());
  for (const ScheduledChunk& c : b.plan.chunks) {
    const bool is_sparse = c.seq->kv != SequenceKv::kDense;
    // A handoff request (disaggregation's prefill side) hands off after exactly two tokens:
    // its drafts are verified, never accepted.
    const bool accepts = speculate && !requests.at(c.seq->id)->request.handoff;
    const bool stack = is_sparse ? sparse->FeedsDraft() || accepts : dense_drafts;
    const int64_t d = stack ? std::min<int64_t>(c.num_draft, accepts ? c.num_draft : 1) : 0;
    std::vector<int32_t> tokens(c.seq->tokens.begin() + c.start,
                                c.seq->tokens.begin() + c.start + c.num_tokens);
    tokens.insert(tokens.end(), c.seq->draft_tokens.begin(), c.seq->draft_tokens.begin() + d);
    b.steps.push_back({&c.seq->table, c.start, std::move(tokens)});
    seqs.push_back(c.seq);
    b.num_draft.push_back(d);
    b.draft_logits.push_back(accepts);
    b.every_row.push_back(!is_sparse && WantsPromptRows(c, d));
    b.first_sample.push_back(
        AddSampleRows(c, d, b.draft_logits.back(), b.every_row.back(), b.rows));
  }
  b.sparse_step = sparse != nullptr && sparse->PlanStep(seqs, b.steps, b.sparse_plan);
  b.input =
      BuildLookaheadTargetInput(b.steps, b.num_draft, b.draft_logits, &b.first_row, &b.every_row);
}

bool Engine::Impl::WantsPromptRows(const ScheduledChunk& c, int64_t num_draft) const {
  const RequestState& s = *requests.at(c.seq->id);
  // Prompt positions p < P - 1 have a successor in the prompt; a chunk past them (or a
  // recomputation after the logprobs went out) needs no rows. Prefill chunks carry no drafts.
  return s.request.prompt_logprobs >= 0 && !s.prompt_logprobs_sent && num_draft == 0 &&
         c.start < c.seq->num_prompt_tokens - 1;
}

void Engine::Impl::CollectPromptLogprobs(StepBatch& b, size_t i) {
  const ScheduledChunk& c = b.plan.chunks[i];
  RequestState& s = *requests.at(c.seq->id);
  const int64_t P = c.seq->num_prompt_tokens, n = c.num_tokens;
  const size_t first = b.first_sample[i] + 1 - static_cast<size_t>(n);  // the chunk's first row
  for (int64_t j = 0; j < n && c.start + j + 1 < P; ++j) {
    SampleResult& r = b.samples[first + static_cast<size_t>(j)];
    s.prompt_logprobs.at(static_cast<size_t>(c.start + j)) =
        PromptTokenLogprob{r.token, r.logprob, r.rank, std::move(r.top_logprobs)};
  }
}

size_t Engine::Impl::AddSampleRows(const ScheduledChunk& c, int64_t num_draft, bool draft_logits,
                                   bool prompt_rows, std::vector<SampleRow>& rows) const {
  const RequestState& s = *requests.at(c.seq->id);
  if (prompt_rows) {
    // Position p's row is forced to the prompt's next token: its log-probability, rank and
    // the top tokens come back (raw logits: no processing). The chunk's last position is the
    // sampling row when it ends the prompt, else one more prompt row.
    const int64_t P = c.seq->num_prompt_tokens;
    OASIS_CHECK_LE(c.start + c.num_tokens, P) << "a prompt-logprobs chunk past the prompt";
    SampleRow pr;
    pr.params = s.row_sampling;
    pr.seed = s.seed;
    pr.num_top_logprobs = s.request.prompt_logprobs;
    pr.want_rank = true;
    for (int64_t p = c.start; p < c.start + c.num_tokens && p + 1 < P; ++p) {
      pr.forced_token = c.seq->tokens[static_cast<size_t>(p + 1)];
      rows.push_back(pr);
    }
    if (c.start + c.num_tokens < P) return rows.size() - 1;  // no sampling row in this chunk
  }
  const size_t own = rows.size();
  SampleRow row;
  row.params = s.row_sampling;  // (the token lists are in s.logits_processing)
  row.seed = s.seed;
  row.counter = static_cast<uint64_t>(c.seq->num_generated());
  row.num_top_logprobs = s.request.num_top_logprobs;
  row.needed = c.samples;
  const std::vector<int32_t>& forced = s.request.forced_output;
  const auto forced_at = [&forced](uint64_t k) { return k < forced.size() ? forced[k] : -1; };
  row.forced_token = forced_at(row.counter);
  if (s.logits_processing != nullptr && c.samples) {
    // Penalties, biases and masks read the request's tokens (committed before this step).
    const std::span<const int32_t> tokens(c.seq->tokens);
    const auto prompt = static_cast<size_t>(c.seq->num_prompt_tokens);
    row.processing = s.logits_processing;
    row.prompt_tokens = tokens.first(prompt);
    row.output_tokens = tokens.subspan(prompt);
  }
  rows.push_back(row);
  for (int64_t j = 0; draft_logits && j < num_draft; ++j) {
    ++row.counter;  // the token after an accepted draft: plain decoding's next draw
    row.forced_token = forced_at(row.counter);
    // ... from the logits plain decoding would have processed: the draft counts as generated.
    if (row.processing != nullptr) row.draft_tokens.push_back(c.seq->draft_tokens[j]);
    rows.push_back(row);
  }
  return own;
}

Status Engine::Impl::RunBatch(StepBatch& b) {
  StepInputs step{.input = b.input, .rows = b.rows};
  if (draft != nullptr) {
    b.capture.layer_ids = draft->aux_layer_ids();
    step.capture = &b.capture;
    // The draft head's next batch, prepared while the target step runs on the device.
    step.while_running = [this, &b] { PrepareDraftHead(b); };
  }
  if (b.sparse_step) {
    step.sparse = sparse->RunInputs(b.sparse_plan);
  } else if (draft != nullptr && options.lookahead == LookaheadMode::kReject) {
    // Under reject (drafts never accepted, so the prepared batch is the committed one unless
    // a request finishes) the head's step is queued on the device right behind the target's
    // sampling, reading the sampled tokens there: its launches overlap the target's graph
    // and one wait brings back both (docs/lookahead.md). Speculate accepts drafts, which
    // changes the head's rows; it runs the head after the step.
    step.after_sampling = [this, &b](const DeviceSamples& samples) {
      if (b.have_prepared)
        b.chained = ChainPreparedDraftHeadStep(*draft, b.prepared, b.capture.out, samples);
    };
  }
  try {
    b.samples = runner.Run(step);
  } catch (const std::exception& e) {
    return Internal(std::string("model step failed: ") + e.what());
  }
  if (b.samples.size() != b.rows.size()) {
    return Internal("the model runner returned " + std::to_string(b.samples.size()) +
                    " samples for " + std::to_string(b.rows.size()) + " rows");
  }
  return Status::Ok();
}

void Engine::Impl::PrepareDraftHead(StepBatch& b) {
  // Every chunk's rows as they will be once committed, the draft not accepted. Used when the
  // step turns out that way (RunPreparedDraftHeadStep checks), else rebuilt.
  std::vector<DraftHeadWork> work;
  std::vector<int64_t> ends, sample_rows;
  for (size_t i = 0; i < b.plan.chunks.size(); ++i) {
    const ScheduledChunk& c = b.plan.chunks[i];
    RequestState& s = *requests.at(c.seq->id);
    DraftHeadWork w{c.seq, &s.draft_head, b.first_row[i], false};
    if (c.samples) {  // counting the token this step samples
      SetDraftsWanted(w, s, c.seq->num_tokens() + 1, c.seq->kv != SequenceKv::kDense,
                      b.chain_depth);
    }
    work.push_back(w);
    ends.push_back(c.seq->num_computed + c.num_tokens);
    sample_rows.push_back(c.samples ? static_cast<int64_t>(b.first_sample[i]) : -1);
  }
  b.prepared = PrepareDraftHeadStep(draft_allocator, std::move(work), std::move(ends),
                                    std::move(sample_rows));
  b.have_prepared = true;
}

void Engine::Impl::FailBatch(StepBatch& b, const Status& failure) {
  if (b.chained) {
    try {
      draft->CollectChained();  // its drafts are not used
    } catch (const std::exception& e) {
      spdlog::warn("draft head step after a failed model step: {}", e.what());
    }
  }
  for (const ScheduledChunk& c : b.plan.chunks) Fail(*requests.at(c.seq->id), failure);
}

void Engine::Impl::CommitAndEmit(StepBatch& b, EngineClock::time_point now) {
  for (size_t i = 0; i < b.plan.chunks.size(); ++i) {
    const ScheduledChunk& c = b.plan.chunks[i];
    RequestState& s = *requests.at(c.seq->id);
    const bool is_sparse = c.seq->kv != SequenceKv::kDense;  // read now: finishing resets it
    c.seq->CommitChunk(c.num_tokens);
    const int64_t prompt_done = std::min(c.seq->num_computed, c.seq->num_prompt_tokens);
    if (prompt_done > s.prompt_tokens_counted) {
      stats.requests.prompt_tokens_total += prompt_done - s.prompt_tokens_counted;
      s.prompt_tokens_counted = prompt_done;
    }
    if (b.every_row[i]) CollectPromptLogprobs(b, i);
    DraftHeadWork work{c.seq, &s.draft_head, b.first_row[i], false};
    if (!c.samples) {
      if (draft != nullptr) b.head_work.push_back(work);
      continue;
    }
    const int64_t num_draft = b.num_draft[i];
    const std::vector<int32_t> drafted(c.seq->draft_tokens.begin(),
                                       c.seq->draft_tokens.begin() + num_draft);
    RequestOutput out;
    if (s.request.prompt_logprobs >= 0 && !s.prompt_logprobs_sent) {  // with the first token
      out.prompt_logprobs = std::move(s.prompt_logprobs);
      s.prompt_logprobs_sent = true;
    }
    SampleResult& sample = b.samples[b.first_sample[i]];
    if (!Emit(s, sample, true, now, out)) continue;
    if (num_draft > 0 && !VerifyDrafts(b, i, s, drafted, is_sparse, now, out)) continue;
    out.prompt_tokens = c.seq->num_prompt_tokens;
    out.completion_tokens = c.seq->num_generated();
    out.cached_tokens = c.seq->num_cached_tokens;
    delivery.Add(s.stream, std::move(out));
    if (s.request.handoff && c.seq->num_generated() == 2) b.handoffs.push_back(c.seq->id);
    if (draft != nullptr) {
      SetDraftsWanted(work, s, c.seq->num_tokens(), is_sparse, b.chain_depth);
      b.head_work.push_back(work);
    }
  }
}

bool Engine::Impl::VerifyDrafts(StepBatch& b, size_t i, RequestState& s,
                                const std::vector<int32_t>& drafted, bool is_sparse,
                                EngineClock::time_point now, RequestOutput& out) {
  // Counted where the request went on after the step's first token. Draft j is verified when
  // the tokens before it were accepted (and did not end the request); it is accepted when the
  // token sampled at its position (row j, plain decoding's draw there) equals it. Under
  // speculate the accepted draft's K/V is the token's (positions advance) and row j + 1 gives
  // the next token, so the step emits 1 + the accepted prefix — plain decoding's tokens.
  const ScheduledChunk& c = b.plan.chunks[i];
  EngineStats::Lookahead& la = stats.lookahead;
  ++la.steps_total;
  ++la.tokens_total;
  if (is_sparse) {
    ++la.sparse_steps_total;
    ++la.sparse_tokens_total;
  }
  int32_t sampled = b.samples[b.first_sample[i]].token;
  for (size_t j = 0; j < drafted.size(); ++j) {
    ++la.draft_tokens_total;
    ++la.position_drafts_total[j];
    if (depth_controller != nullptr && b.draft_logits[i])
      depth_controller->ObserveDraft(static_cast<int32_t>(j), sampled == drafted[j]);
    if (sampled != drafted[j]) return true;
    ++la.draft_accepted_total;
    ++la.position_accepted_total[j];
    if (!b.draft_logits[i]) return true;  // reject: only counted
    c.seq->CommitChunk(1);
    ++la.tokens_total;
    if (is_sparse) ++la.sparse_tokens_total;
    SampleResult& next = b.samples[b.first_sample[i] + 1 + j];
    sampled = next.token;
    if (!Emit(s, next, false, now, out)) return false;
  }
  return true;
}

void Engine::Impl::RunDraftHead(StepBatch& b, EngineClock::time_point head_start) {
  if (draft == nullptr || (!b.chained && b.head_work.empty())) return;
  try {
    bool chain_used = false;
    stats.lookahead.draft_tokens_proposed_total +=
        b.chained ? FinishChainedDraftHeadStep(*draft, draft_allocator, b.prepared, b.head_work,
                                               b.capture.out, &chain_used)
                  : RunPreparedDraftHeadStep(*draft, draft_allocator,
                                             b.have_prepared ? &b.prepared : nullptr, b.head_work,
                                             b.capture.out);
    if (chain_used) ++stats.lookahead.draft_chained_steps_total;
    b.head_seconds = Seconds(EngineClock::now() - head_start);
    stats.loop.draft_step_seconds_total += b.head_seconds;
    CountChainDepth(b);
  } catch (const std::exception& e) {
    b.head_failed = true;
    const Status error = Internal(std::string("draft head step failed: ") + e.what());
    for (const DraftHeadWork& w : b.head_work) Fail(*requests.at(w.seq->id), error);
  }
}

void Engine::Impl::CountChainDepth(const StepBatch& b) {
  // Speculate steps whose head proposed chains, by the depth chosen for them.
  if (options.lookahead != LookaheadMode::kSpeculate ||
      std::none_of(b.head_work.begin(), b.head_work.end(),
                   [](const DraftHeadWork& w) { return w.wants_draft; })) {
    return;
  }
  EngineStats::Lookahead& la = stats.lookahead;
  ++la.depth_steps_total.at(static_cast<size_t>(b.chain_depth - 1));
  if (b.depth_explored) ++la.depth_explorations_total;
  la.depth = b.chain_depth;
}

void Engine::Impl::SetDraftsWanted(DraftHeadWork& w, const RequestState& s, int64_t num_tokens,
                                   bool is_sparse, int32_t depth) const {
  // A chain of `depth` drafts under speculate (k, or the adaptive controller's choice), cut so
  // that all of it and the token after it fit (prompt + generated <= max_total_tokens); one
  // draft otherwise.
  w.wants_draft = WantsDraft(s, num_tokens, is_sparse);
  w.num_drafts = 1;
  if (w.wants_draft && options.lookahead == LookaheadMode::kSpeculate && !s.request.handoff) {
    const int64_t room = s.stop_checker.conditions().max_total_tokens - num_tokens - 1;
    w.num_drafts = static_cast<int32_t>(
        std::clamp<int64_t>(std::min<int64_t>(depth, room), 1, kMaxDraftTokens));
  }
}

bool Engine::Impl::WantsDraft(const RequestState& s, int64_t num_tokens, bool is_sparse) const {
  // A draft only pays when two more tokens fit (prompt + generated <= max_total_tokens); for
  // a sparse request when its predictor reads it or speculate may accept it; for a dense one
  // on a sparse server under reject (nothing stacks or accepts it) only when it may switch at
  // the next step.
  if (num_tokens + 2 > s.stop_checker.conditions().max_total_tokens) return false;
  if (sparse == nullptr) return true;
  if (is_sparse) return sparse->FeedsDraft() || options.lookahead == LookaheadMode::kSpeculate;
  return options.lookahead != LookaheadMode::kReject || sparse->DenseNeedsDraft(s.seq, num_tokens);
}

bool Engine::Impl::Emit(RequestState& s, SampleResult& sample, bool first_of_event,
                        EngineClock::time_point now, RequestOutput& out) {
  if (sample.token < 0 || sample.token >= config.vocab_size) {
    // Like Fail, but the event keeps a token this step already emitted.
    out.error =
        Internal("sampled token id " + std::to_string(sample.token) + " outside the vocabulary");
    spdlog::warn("request {} failed: {}", s.request.id, out.error.ToString());
    Finish(s, std::move(out), FinishReasonKind::kError);
    return false;
  }
  s.seq.AppendToken(sample.token);
  ++stats.requests.generation_tokens_total;
  if (first_of_event) {  // one latency observation per event (a step may emit two tokens)
    if (s.last_token_time) {
      stats.itl.Observe(Seconds(now - *s.last_token_time));
    } else {
      stats.ttft.Observe(Seconds(now - s.arrival));
      s.first_token_time = now;
    }
    s.last_token_time = now;
  }
  if (s.request.handoff) s.handoff_tokens.push_back({sample.logprob, sample.top_logprobs});
  GeneratedToken g;
  g.token = sample.token;
  g.logprob = sample.logprob;
  g.top_logprobs = std::move(sample.top_logprobs);
  out.tokens.push_back(std::move(g));
  StopDecision d = s.stop_checker.Append(sample.token, s.seq.num_generated(), s.seq.num_tokens());
  out.text += d.text;
  if (!d.finished()) return true;
  out.stop_reason = std::move(d.stop_reason);
  Finish(s, std::move(out), d.reason);
  return false;
}

}  // namespace oasis

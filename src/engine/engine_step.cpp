// One engine step (Engine::Impl::Step): schedule, build the target batch (chunks, stacked
// lookahead drafts, sparse sequences' plan), execute and sample, post-process each chunk
// (commit, emit, stop checks, draft acceptance), run the draft head, switch requests past
// the sparse threshold. See docs/engine.md, docs/lookahead.md and docs/sparse.md.
#include <algorithm>
#include <exception>

#include "common/check.h"
#include "common/logging.h"
#include "engine/engine_impl.h"
#include "runner/batch_builder.h"

namespace oasis {

void Engine::Impl::Step() {
  const auto t_begin = EngineClock::now();
  struct StepClock {  // adds the whole step's wall time however Step returns
    EngineStats& stats;
    EngineClock::time_point begin;
    bool decode_only = false;  // set once the batch is known (and ran)
    ~StepClock() {
      const double secs = Seconds(EngineClock::now() - begin);
      stats.step_seconds_total += secs;
      if (decode_only) {
        ++stats.decode_steps_total;
        stats.decode_step_seconds_total += secs;
      }
    }
  } step_clock{stats, t_begin};
  SchedulerOutput plan = scheduler.Schedule();
  const auto t_scheduled = EngineClock::now();
  stats.schedule_seconds_total += Seconds(t_scheduled - t_begin);
  stats.preemptions_total += static_cast<int64_t>(plan.preempted.size());
  for (Sequence* p : plan.preempted) {
    RequestState& s = *requests.at(p->id);
    ReleaseDraftHead(s);
    ReleaseImport(s, true);  // an imported request recomputes here: its lease is not needed any more
    s.import_generation = 0;  // drift fetches still in flight are dropped
  }
  // Requests the sparse admission refused (their KV can never fit the host store; Submit
  // refuses those already, so this is a safety net): they fail, the others go on.
  for (Sequence* r : plan.refused) Fail(*requests.at(r->id), sparse->RefusalStatus(*r));
  if (plan.empty()) {
    if (!plan.refused.empty()) return;
    // Cannot happen while Submit keeps every request within the pool; never spin on it.
    const Status error = Internal("the scheduler found nothing to run for a non-empty queue");
    while (!scheduler.waiting().empty()) Fail(*requests.at(scheduler.waiting().front()->id), error);
    return;
  }
  // The target batch: each chunk's tokens, a decode's granted draft tokens after its own.
  // Sparse sequences run a draft only for the draft predictor, and never accept it (a
  // sparse step advances by exactly one token: under speculate they verify as reject does).
  const bool speculate = draft != nullptr && options.lookahead == LookaheadMode::kSpeculate;
  std::vector<StepSequence> steps;
  std::vector<const Sequence*> seqs;
  std::vector<int64_t> num_draft;
  std::vector<bool> draft_logits;
  std::vector<SampleRow> rows;
  std::vector<size_t> first_sample;  // per chunk: its first row in `rows`
  steps.reserve(plan.chunks.size());
  rows.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    const RequestState& s = *requests.at(c.seq->id);
    const bool is_sparse = c.seq->kv != SequenceKv::kDense;
    const int64_t d = is_sparse && !sparse->FeedsDraft() ? 0 : c.num_draft;
    std::vector<int32_t> tokens(c.seq->tokens.begin() + c.start,
                                c.seq->tokens.begin() + c.start + c.num_tokens);
    tokens.insert(tokens.end(), c.seq->draft_tokens.begin(), c.seq->draft_tokens.begin() + d);
    steps.push_back({&c.seq->table, c.start, std::move(tokens)});
    seqs.push_back(c.seq);
    num_draft.push_back(d);
    draft_logits.push_back(speculate && !is_sparse);
    SampleRow row;
    row.params = s.request.sampling;
    row.seed = s.seed;
    row.counter = static_cast<uint64_t>(c.seq->num_generated());
    row.num_top_logprobs = s.request.num_top_logprobs;
    row.needed = c.samples;
    const std::vector<int32_t>& forced = s.request.forced_output;
    const auto forced_at = [&forced](uint64_t k) { return k < forced.size() ? forced[k] : -1; };
    row.forced_token = forced_at(row.counter);
    first_sample.push_back(rows.size());
    rows.push_back(row);
    for (int64_t j = 0; draft_logits.back() && j < d; ++j) {
      ++row.counter;  // the token after an accepted draft: plain decoding's next draw
      row.forced_token = forced_at(row.counter);
      rows.push_back(row);
    }
  }
  SparseStepPlan sparse_plan;
  const bool sparse_step = sparse != nullptr && sparse->PlanStep(seqs, steps, sparse_plan);
  std::vector<int64_t> first_row;
  const ForwardInput input = BuildLookaheadTargetInput(steps, num_draft, draft_logits, &first_row);
  std::vector<SampleResult> samples;
  ResidualCapture capture;
  Status failure = Status::Ok();
  // The draft head's next batch, prepared while the target step runs on the device (graph
  // steps): every chunk's rows as they will be once committed, the draft not accepted.
  // Used when the step turns out that way (RunPreparedDraftHeadStep checks), else rebuilt.
  PreparedHeadStep prepared;
  bool have_prepared = false;
  const auto prepare_head = [&] {
    std::vector<DraftHeadWork> work;
    std::vector<int64_t> ends, sample_rows;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      RequestState& s = *requests.at(c.seq->id);
      DraftHeadWork w{c.seq, &s.draft_head, first_row[i], false};
      if (c.samples) {  // counting the token this step samples
        w.wants_draft = WantsDraft(s, c.seq->num_tokens() + 1, c.seq->kv != SequenceKv::kDense);
      }
      work.push_back(w);
      ends.push_back(c.seq->num_computed + c.num_tokens);
      sample_rows.push_back(c.samples ? static_cast<int64_t>(first_sample[i]) : -1);
    }
    prepared = PrepareDraftHeadStep(draft_allocator, std::move(work), std::move(ends), std::move(sample_rows));
    have_prepared = true;
  };
  // Under reject (drafts never accepted, so the prepared batch is the committed one unless a
  // request finishes) the head's step is queued on the device right behind the target's
  // sampling, reading the sampled tokens there: its launches overlap the target's graph and
  // one wait brings back both (docs/lookahead.md). Speculate accepts drafts, which changes
  // the head's rows; it runs the head after the step.
  bool chained = false;
  const bool chain_head = draft != nullptr && options.lookahead == LookaheadMode::kReject;
  const auto chain = [&](const DeviceSamples& samples) {
    if (have_prepared) chained = ChainPreparedDraftHeadStep(*draft, prepared, capture.out, samples);
  };
  const auto step_start = EngineClock::now();
  stats.build_seconds_total += Seconds(step_start - t_scheduled);
  try {
    StepInputs step{.input = input, .rows = rows};
    if (draft != nullptr) {
      capture.layer_ids = draft->aux_layer_ids();
      step.capture = &capture;
      step.while_running = prepare_head;
    }
    if (sparse_step) {
      step.sparse = sparse->RunInputs(sparse_plan);
    } else if (chain_head) {
      step.after_sampling = chain;
    }
    samples = runner.Run(step);
    if (samples.size() != rows.size()) {
      failure = Internal("the model runner returned " + std::to_string(samples.size()) +
                         " samples for " + std::to_string(rows.size()) + " rows");
    }
  } catch (const std::exception& e) {
    failure = Internal(std::string("model step failed: ") + e.what());
  }
  ++stats.steps_total;
  const double model_secs = Seconds(EngineClock::now() - step_start);
  stats.model_step_seconds_total += model_secs;
  // A decode-only batch: every chunk one token past its prompt.
  const bool decode_only = failure.ok() && std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
    return c.num_tokens == 1 && c.start >= c.seq->num_prompt_tokens;
  });
  if (decode_only) stats.decode_model_step_seconds_total += model_secs;
  step_clock.decode_only = decode_only;
  if (!failure.ok()) {
    if (chained) {
      try {
        draft->CollectChained();  // its drafts are not used
      } catch (const std::exception& e) {
        spdlog::warn("draft head step after a failed model step: {}", e.what());
      }
    }
    for (const ScheduledChunk& c : plan.chunks) Fail(*requests.at(c.seq->id), failure);
    return;
  }

  const auto now = EngineClock::now();
  std::vector<DraftHeadWork> head_work;
  std::vector<uint64_t> handoffs;  // handoff requests that sampled x2 this step
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    RequestState& s = *requests.at(c.seq->id);
    const bool is_sparse = c.seq->kv != SequenceKv::kDense;  // read now: finishing resets it
    c.seq->CommitChunk(c.num_tokens);
    const int64_t prompt_done = std::min(c.seq->num_computed, c.seq->num_prompt_tokens);
    if (prompt_done > s.prompt_tokens_counted) {
      stats.prompt_tokens_total += prompt_done - s.prompt_tokens_counted;
      s.prompt_tokens_counted = prompt_done;
    }
    DraftHeadWork work{c.seq, &s.draft_head, first_row[i], false};
    if (!c.samples) {
      if (draft != nullptr) head_work.push_back(work);
      continue;
    }
    const int32_t drafted = num_draft[i] > 0 ? c.seq->draft_tokens[0] : -1;
    RequestOutput out;
    SampleResult& sample = samples[first_sample[i]];
    if (!Emit(s, sample, true, now, out)) continue;
    if (num_draft[i] > 0) {  // counted where the request went on after the first token
      ++stats.draft_tokens_total;
      ++stats.lookahead_steps_total;
      ++stats.lookahead_tokens_total;
      const bool matched = sample.token == drafted;
      if (matched) ++stats.draft_accepted_total;
      if (matched && draft_logits[i]) {
        // Accepted: the draft row's K/V, at the new token's position, is the new token's;
        // its logits row gives the next token with plain decoding's next counter.
        c.seq->CommitChunk(1);
        ++stats.lookahead_tokens_total;
        if (!Emit(s, samples[first_sample[i] + 1], false, now, out)) continue;
      }
    }
    out.prompt_tokens = c.seq->num_prompt_tokens;
    out.completion_tokens = c.seq->num_generated();
    delivery.Add(s.stream, std::move(out));
    if (s.request.handoff && c.seq->num_generated() == 2) handoffs.push_back(c.seq->id);
    if (draft != nullptr) {
      work.wants_draft = WantsDraft(s, c.seq->num_tokens(), is_sparse);
      head_work.push_back(work);
    }
  }
  delivery.Flush();  // the step's tokens go out now, not after the draft head's step
  const auto head_start = EngineClock::now();
  stats.emit_seconds_total += Seconds(head_start - now);
  if (draft != nullptr && (chained || !head_work.empty())) {
    try {
      bool chain_used = false;
      stats.draft_tokens_proposed_total +=
          chained ? FinishChainedDraftHeadStep(*draft, draft_allocator, prepared, head_work, capture.out, &chain_used)
                  : RunPreparedDraftHeadStep(*draft, draft_allocator, have_prepared ? &prepared : nullptr, head_work,
                                             capture.out);
      if (chain_used) ++stats.draft_chained_steps_total;
      stats.draft_step_seconds_total += Seconds(EngineClock::now() - head_start);
    } catch (const std::exception& e) {
      const Status error = Internal(std::string("draft head step failed: ") + e.what());
      for (const DraftHeadWork& w : head_work) Fail(*requests.at(w.seq->id), error);
    }
  }
  if (!handoffs.empty()) HandoffReady(handoffs);
  if (sparse != nullptr) stats.sparse_switches_total += sparse->SwitchReady(scheduler.running());
}

bool Engine::Impl::WantsDraft(const RequestState& s, int64_t num_tokens, bool is_sparse) const {
  // A draft only pays when two more tokens fit (prompt + generated <= max_total_tokens), and
  // for a sparse request only when its predictor reads it.
  return num_tokens + 2 <= s.stop_checker.conditions().max_total_tokens && (!is_sparse || sparse->FeedsDraft());
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
  ++stats.generation_tokens_total;
  if (first_of_event) {  // one latency observation per event (a step may emit two tokens)
    if (s.last_token_time) {
      stats.itl.Observe(Seconds(now - *s.last_token_time));
    } else {
      stats.ttft.Observe(Seconds(now - s.arrival));
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

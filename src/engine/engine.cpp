#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/check.h"
#include "common/logging.h"
#include "engine/batch_builder.h"
#include "engine/request_state.h"
#include "engine/request_validation.h"
#include "engine/scheduler.h"

namespace oasis {
namespace {

// Bucket bounds (seconds) as vLLM's metrics.
const std::vector<double> kTtftBounds = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                         0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                         20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBounds = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                        5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

double Seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

struct Engine::Impl {
  Impl(ModelRunner& r, const tokenizer::Tokenizer* t, EngineOptions o, DraftRunner* d)
      : runner(r),
        tok(t),
        options(o),
        config(r.model().config()),
        num_kv_heads(static_cast<int32_t>(config.num_key_value_heads)),
        draft(o.lookahead != LookaheadMode::kOff ? d : nullptr),
        draft_kv_heads(draft != nullptr ? draft->num_kv_heads() : 1),
        allocator(static_cast<int32_t>(r.num_kv_slots())),
        draft_allocator(static_cast<int32_t>(draft != nullptr ? draft->num_kv_slots() : 0)),
        scheduler(
            {.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.max_num_batched_tokens},
            allocator),
        rng(o.seed) {
    OASIS_CHECK_GT(num_kv_heads, 0) << "model without KV heads";
    const int64_t pool_tokens = r.num_kv_slots() / num_kv_heads * kBlockSize;
    context_tokens = config.max_position_embeddings > 0
                         ? std::min(config.max_position_embeddings, pool_tokens)
                         : pool_tokens;
    for (int64_t id : config.eos_token_ids) eos_ids.push_back(static_cast<int32_t>(id));
    stats.num_kv_slots = r.num_kv_slots();
    stats.num_free_kv_slots = r.num_kv_slots();
    stats.num_draft_kv_slots = draft_allocator.num_slots();
    stats.num_free_draft_kv_slots = draft_allocator.num_free();
    stats.ttft = LatencyHistogram::WithBounds(kTtftBounds);
    stats.itl = LatencyHistogram::WithBounds(kItlBounds);
    stats.e2e = LatencyHistogram::WithBounds(kE2eBounds);
    published = stats;
  }

  Status Validate(const EngineRequest& r) const;
  StopConditions MakeStopConditions(const EngineRequest& r) const;

  void Loop();
  void Step();
  // Appends one sampled token to a request and adds it to `out`; returns false when the
  // request is gone (finished with `out` as its last event, or failed).
  bool Emit(RequestState& s, SampleResult& sample, bool first_of_event, EngineClock::time_point now,
            RequestOutput& out);
  // Releases the request's draft-head KV (finish, preemption).
  void ReleaseDraftHead(RequestState& s);
  void Admit(std::unique_ptr<RequestState> state);
  // Finishes a live request: frees its blocks, counts it, pushes `out` as its last event.
  void Finish(RequestState& s, RequestOutput out, FinishReasonKind reason);
  void Fail(RequestState& s, const Status& error);
  void AbortAll();
  void Publish();

  // Fixed at construction.
  ModelRunner& runner;
  const tokenizer::Tokenizer* tok;
  EngineOptions options;
  const ModelConfig& config;
  int32_t num_kv_heads;
  DraftRunner* draft;  // null: lookahead off
  int32_t draft_kv_heads;
  int64_t context_tokens = 0;
  std::vector<int32_t> eos_ids;

  // Shared with front-end threads, guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<RequestState>> inbox;
  std::vector<uint64_t> aborts;                    // keys of requests to abort
  std::unordered_map<std::string, uint64_t> live;  // id → key, Submit until finished
  uint64_t next_key = 1;
  bool stop_requested = false;
  bool stopped = false;  // no more submissions
  std::thread thread;
  std::mutex lifecycle_mu;  // serialises Start/Stop (held while joining; never under mu)
  std::atomic<int64_t> num_waiting_engine{0};  // waiting in the scheduler (for max_waiting)

  mutable std::mutex stats_mu;
  EngineStats published;  // guarded by stats_mu

  // Engine-loop state.
  BlockAllocator allocator;
  BlockAllocator draft_allocator;  // the draft head's KV pool (empty when lookahead is off)
  Scheduler scheduler;
  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> requests;  // by key
  std::mt19937_64 rng;
  EngineStats stats;
};

Status Engine::Impl::Validate(const EngineRequest& r) const {
  return ValidateRequest(r, config, tok != nullptr, runner.num_kv_slots(), num_kv_heads);
}

StopConditions Engine::Impl::MakeStopConditions(const EngineRequest& r) const {
  StopConditions c;
  if (!r.ignore_eos) c.eos_token_ids = eos_ids;
  c.stop_token_ids = r.stop_token_ids;
  c.stop_strings = r.stop;
  c.include_stop_str_in_output = r.include_stop_str_in_output;
  c.min_tokens = r.min_tokens;
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  c.max_total_tokens = r.max_tokens == -1 ? context_tokens : P + r.max_tokens;
  c.max_tokens = c.max_total_tokens - P;
  return c;
}

void Engine::Impl::Admit(std::unique_ptr<RequestState> state) {
  RequestState& s = *state;
  s.seed = s.request.sampling.seed ? *s.request.sampling.seed : rng();
  scheduler.Add(&s.seq);
  requests.emplace(s.seq.id, std::move(state));
}

void Engine::Impl::ReleaseDraftHead(RequestState& s) {
  if (draft == nullptr) return;
  s.draft_head.table.Release(draft_allocator);
  s.draft_head.num_computed = 0;
}

void Engine::Impl::Finish(RequestState& s, RequestOutput out, FinishReasonKind reason) {
  scheduler.Finish(&s.seq);
  ReleaseDraftHead(s);
  ++stats.requests_finished_total;
  switch (reason) {
    case FinishReasonKind::kStop:
      ++stats.requests_stop_total;
      break;
    case FinishReasonKind::kLength:
      ++stats.requests_length_total;
      break;
    case FinishReasonKind::kAbort:
      ++stats.requests_abort_total;
      break;
    case FinishReasonKind::kError:
      ++stats.requests_error_total;
      break;
    case FinishReasonKind::kNone:
      OASIS_CHECK(false) << "finishing without a reason";
  }
  stats.e2e.Observe(Seconds(EngineClock::now() - s.arrival));
  out.finished = true;
  out.finish_reason = reason;
  out.prompt_tokens = s.seq.num_prompt_tokens;
  out.completion_tokens = s.seq.num_generated();
  {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(s.request.id);  // the id may be reused once the finished event is visible
  }
  s.stream->Push(std::move(out));
  requests.erase(s.seq.id);  // destroys s
}

void Engine::Impl::Fail(RequestState& s, const Status& error) {
  spdlog::warn("request {} failed: {}", s.request.id, error.ToString());
  RequestOutput out;
  out.error = error;
  Finish(s, std::move(out), FinishReasonKind::kError);
}

void Engine::Impl::AbortAll() {
  std::vector<std::unique_ptr<RequestState>> pending;
  {
    std::lock_guard<std::mutex> lock(mu);
    stopped = true;
    pending.swap(inbox);
    aborts.clear();
  }
  for (auto& s : pending) Admit(std::move(s));
  std::vector<uint64_t> keys;
  for (auto& [key, s] : requests) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (uint64_t key : keys) {
    RequestState& s = *requests.at(key);
    RequestOutput out;
    out.text = s.stop_checker.Flush();
    Finish(s, std::move(out), FinishReasonKind::kAbort);
  }
  Publish();
}

void Engine::Impl::Publish() {
  stats.num_running = scheduler.num_running();
  stats.num_waiting = scheduler.num_waiting();
  stats.num_free_kv_slots = allocator.num_free();
  stats.num_free_draft_kv_slots = draft_allocator.num_free();
  stats.kv_usage =
      stats.num_kv_slots > 0
          ? static_cast<double>(stats.num_kv_slots - stats.num_free_kv_slots) / stats.num_kv_slots
          : 0.0;
  num_waiting_engine.store(stats.num_waiting, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(stats_mu);
  published = stats;
}

void Engine::Impl::Loop() {
  while (true) {
    std::vector<std::unique_ptr<RequestState>> arrived;
    std::vector<uint64_t> to_abort;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return stop_requested || !inbox.empty() || !aborts.empty() || !scheduler.idle();
      });
      if (stop_requested) break;
      arrived.swap(inbox);
      to_abort.swap(aborts);
      // They stay counted against max_waiting until the next Publish has the exact number.
      num_waiting_engine.fetch_add(static_cast<int64_t>(arrived.size()), std::memory_order_relaxed);
    }
    for (auto& s : arrived) Admit(std::move(s));
    for (uint64_t key : to_abort) {
      auto it = requests.find(key);
      if (it == requests.end()) continue;  // finished meanwhile
      RequestOutput out;
      out.text = it->second->stop_checker.Flush();
      Finish(*it->second, std::move(out), FinishReasonKind::kAbort);
    }
    if (!scheduler.idle()) Step();
    Publish();
  }
  AbortAll();
}

void Engine::Impl::Step() {
  SchedulerOutput plan = scheduler.Schedule();
  stats.preemptions_total += static_cast<int64_t>(plan.preempted.size());
  for (Sequence* p : plan.preempted) ReleaseDraftHead(*requests.at(p->id));
  if (plan.empty()) {
    // Cannot happen while Submit keeps every request within the pool; never spin on it.
    const Status error = Internal("the scheduler found nothing to run for a non-empty queue");
    while (!scheduler.waiting().empty()) Fail(*requests.at(scheduler.waiting().front()->id), error);
    return;
  }
  // The target batch: each chunk's tokens, a decode's granted draft tokens after its own.
  const bool speculate = draft != nullptr && options.lookahead == LookaheadMode::kSpeculate;
  std::vector<StepSequence> steps;
  std::vector<int64_t> num_draft;
  std::vector<SampleRow> rows;
  std::vector<size_t> first_sample;  // per chunk: its first row in `rows`
  steps.reserve(plan.chunks.size());
  rows.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    const RequestState& s = *requests.at(c.seq->id);
    std::vector<int32_t> tokens(c.seq->tokens.begin() + c.start, c.seq->tokens.begin() + c.start + c.num_tokens);
    tokens.insert(tokens.end(), c.seq->draft_tokens.begin(), c.seq->draft_tokens.begin() + c.num_draft);
    steps.push_back({&c.seq->table, c.start, std::move(tokens)});
    num_draft.push_back(c.num_draft);
    SampleRow row;
    row.params = s.request.sampling;
    row.seed = s.seed;
    row.counter = static_cast<uint64_t>(c.seq->num_generated());
    row.num_top_logprobs = s.request.num_top_logprobs;
    row.needed = c.samples;
    first_sample.push_back(rows.size());
    rows.push_back(row);
    for (int64_t j = 0; speculate && j < c.num_draft; ++j) {
      ++row.counter;  // the token after an accepted draft: plain decoding's next draw
      rows.push_back(row);
    }
  }
  std::vector<int64_t> first_row;
  const ForwardInput input = BuildLookaheadTargetInput(steps, num_draft, speculate, &first_row);
  std::vector<SampleResult> samples;
  ResidualCapture capture;
  Status failure = Status::Ok();
  try {
    if (draft != nullptr) {
      capture.layer_ids = draft->aux_layer_ids();
      samples = runner.ExecuteSampleAndCapture(input, rows, capture);
    } else {
      samples = runner.ExecuteAndSample(input, rows);
    }
    if (samples.size() != rows.size()) {
      failure = Internal("the model runner returned " + std::to_string(samples.size()) +
                         " samples for " + std::to_string(rows.size()) + " rows");
    }
  } catch (const std::exception& e) {
    failure = Internal(std::string("model step failed: ") + e.what());
  }
  ++stats.steps_total;
  if (!failure.ok()) {
    for (const ScheduledChunk& c : plan.chunks) Fail(*requests.at(c.seq->id), failure);
    return;
  }

  const auto now = EngineClock::now();
  std::vector<DraftHeadWork> head_work;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    RequestState& s = *requests.at(c.seq->id);
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
    const int32_t drafted = c.num_draft > 0 ? c.seq->draft_tokens[0] : -1;
    RequestOutput out;
    SampleResult& sample = samples[first_sample[i]];
    if (!Emit(s, sample, true, now, out)) continue;
    if (c.num_draft > 0) {  // counted where the request went on after the first token
      ++stats.draft_tokens_total;
      ++stats.lookahead_steps_total;
      ++stats.lookahead_tokens_total;
      const bool matched = sample.token == drafted;
      if (matched) ++stats.draft_accepted_total;
      if (matched && speculate) {
        // Accepted: the draft row's K/V, at the new token's position, is the new token's;
        // its logits row gives the next token with plain decoding's next counter.
        c.seq->CommitChunk(1);
        ++stats.lookahead_tokens_total;
        if (!Emit(s, samples[first_sample[i] + 1], false, now, out)) continue;
      }
    }
    out.prompt_tokens = c.seq->num_prompt_tokens;
    out.completion_tokens = c.seq->num_generated();
    s.stream->Push(std::move(out));
    if (draft != nullptr) {
      // A draft only pays when two more tokens fit (prompt + generated <= max_total_tokens).
      work.wants_draft = c.seq->num_tokens() + 2 <= s.stop_checker.conditions().max_total_tokens;
      head_work.push_back(work);
    }
  }
  if (draft == nullptr || head_work.empty()) return;
  try {
    stats.draft_tokens_proposed_total += RunDraftHeadStep(*draft, draft_allocator, head_work, capture.out);
  } catch (const std::exception& e) {
    const Status error = Internal(std::string("draft head step failed: ") + e.what());
    for (const DraftHeadWork& w : head_work) Fail(*requests.at(w.seq->id), error);
  }
}

bool Engine::Impl::Emit(RequestState& s, SampleResult& sample, bool first_of_event, EngineClock::time_point now,
                        RequestOutput& out) {
  if (sample.token < 0 || sample.token >= config.vocab_size) {
    // Like Fail, but the event keeps a token this step already emitted.
    out.error = Internal("sampled token id " + std::to_string(sample.token) + " outside the vocabulary");
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

namespace {

// Broken options are a programming error here (the server checks them with CheckOptions).
int CheckedOrDie(const EngineOptions& options, const ModelRunner& runner, const DraftRunner* draft) {
  OASIS_CHECK_GT(options.max_waiting, 0) << "max_waiting";
  const Status st = Engine::CheckOptions(options, runner, draft);
  OASIS_CHECK(st.ok()) << st.ToString();
  return 0;
}

}  // namespace

Engine::Engine(ModelRunner& runner, const tokenizer::Tokenizer* tok, EngineOptions options, DraftRunner* draft)
    : impl_((CheckedOrDie(options, runner, draft), std::make_unique<Impl>(runner, tok, options, draft))) {}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  std::lock_guard<std::mutex> lifecycle(impl_->lifecycle_mu);
  std::lock_guard<std::mutex> lock(impl_->mu);
  OASIS_CHECK(!impl_->stopped && !impl_->stop_requested) << "Start after Stop";
  if (impl_->thread.joinable()) return;
  impl_->thread = std::thread([this] { impl_->Loop(); });
}

void Engine::Stop() {
  std::lock_guard<std::mutex> lifecycle(impl_->lifecycle_mu);  // a second Stop waits, then returns
  bool has_thread;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped && !impl_->thread.joinable()) return;
    impl_->stop_requested = true;
    has_thread = impl_->thread.joinable();
  }
  impl_->cv.notify_all();
  if (has_thread) {
    impl_->thread.join();  // the loop aborts every live request on its way out
  } else {
    impl_->AbortAll();  // never started: the caller is the only thread with engine state
  }
}

StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request) {
  OASIS_RETURN_IF_ERROR(impl_->Validate(request));
  StopConditions stop = impl_->MakeStopConditions(request);
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped || impl_->stop_requested) return Unavailable("the engine is shutting down");
    if (impl_->live.count(request.id))
      return InvalidArgument("request id '" + request.id + "' is already in use");
    const int64_t waiting = static_cast<int64_t>(impl_->inbox.size()) +
                            impl_->num_waiting_engine.load(std::memory_order_relaxed);
    if (waiting >= impl_->options.max_waiting) {
      return ResourceExhausted("too many waiting requests (" + std::to_string(waiting) + ")");
    }
    const uint64_t key = impl_->next_key++;
    auto state = std::make_unique<RequestState>(key, std::move(request), std::move(stop), impl_->tok,
                                                impl_->num_kv_heads, impl_->draft_kv_heads);
    stream = state->stream;
    impl_->live.emplace(state->request.id, key);
    impl_->inbox.push_back(std::move(state));
  }
  impl_->cv.notify_all();
  return stream;
}

void Engine::Abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->live.find(id);
    if (it == impl_->live.end()) return;
    impl_->aborts.push_back(it->second);
  }
  impl_->cv.notify_all();
}

EngineStats Engine::Stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    s = impl_->published;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.num_waiting += static_cast<int64_t>(impl_->inbox.size());
  return s;
}

const ModelConfig& Engine::model_config() const { return impl_->config; }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::max_context_tokens() const { return impl_->context_tokens; }

}  // namespace oasis

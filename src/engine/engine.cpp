// The engine's API and lifecycle (Engine), admission of new requests, finishing them and
// the stats snapshot; one step of the loop is in engine_step.cpp (docs/engine.md).
#include "engine/engine.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <set>

#include "common/check.h"
#include "common/logging.h"
#include "engine/engine_impl.h"
#include "engine/prefix_reuse.h"
#include "engine/request_validation.h"

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

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's token-count buckets).
std::vector<double> OneTwoFiveBounds(int64_t max) {
  std::vector<double> out;
  for (int64_t scale = 1; scale <= max; scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max) return out;
      out.push_back(static_cast<double>(m * scale));
    }
  }
  return out;
}

}  // namespace

double Seconds(EngineClock::duration d) { return std::chrono::duration<double>(d).count(); }

namespace {

// Prompt + generated tokens one request may reach: the model's context, or less when the KV
// pool is smaller (a request always fits the pool densely: it prefills densely, also after
// a preemption).
int64_t ContextTokens(const ModelRunner& r) {
  const ModelConfig& c = r.model().config();
  OASIS_CHECK_GT(c.num_key_value_heads, 0) << "model without KV heads";
  const int64_t pool_tokens = r.num_kv_slots() / c.num_key_value_heads * kBlockSize;
  return c.max_position_embeddings > 0 ? std::min(c.max_position_embeddings, pool_tokens)
                                       : pool_tokens;
}

std::unique_ptr<SparseDecoding> MakeSparse(const EngineOptions& o, ModelRunner& r,
                                           BlockAllocator& allocator, int64_t context_tokens) {
  if (!o.sparse) return nullptr;
  SparseConfig c = *o.sparse;
  c.max_seq_len = context_tokens;
  // Under speculate the draft chain's queries predict together, as one GQA group of at most
  // 16 query heads (the CUDA score kernel's widest).
  if (o.lookahead == LookaheadMode::kSpeculate && c.predictor == SparsePredictor::kDraft) {
    const ModelConfig& m = r.model().config();
    const int64_t group = std::max<int64_t>(1, m.num_attention_heads / m.num_key_value_heads);
    c.chain_queries = static_cast<int32_t>(
        std::clamp<int64_t>(std::min(o.num_speculative_tokens, 16 / group), 1, kMaxDraftTokens));
  }
  return std::make_unique<SparseDecoding>(c, r, allocator, o.sparse_metrics_interval);
}

}  // namespace

Engine::Impl::Impl(ModelRunner& r, const tokenizer::Tokenizer* t, EngineOptions o, DraftRunner* d)
    : runner(r),
      tok(t),
      options(o),
      config(r.model().config()),
      num_kv_heads(static_cast<int32_t>(config.num_key_value_heads)),
      draft(o.lookahead != LookaheadMode::kOff ? d : nullptr),
      draft_kv_heads(draft != nullptr ? draft->num_kv_heads() : 1),
      context_tokens(ContextTokens(r)),
      allocator(static_cast<int32_t>(r.num_kv_slots())),
      draft_allocator(static_cast<int32_t>(draft != nullptr ? draft->num_kv_slots() : 0)),
      sparse(MakeSparse(o, r, allocator, context_tokens)),
      scheduler(
          {.max_num_seqs = o.max_num_seqs, .max_num_batched_tokens = o.max_num_batched_tokens},
          allocator, sparse.get()),
      rng(o.seed) {
  // An id outside the vocabulary is never sampled (and must not wrap onto one that is).
  for (int64_t id : config.eos_token_ids) {
    if (id >= 0 && id < config.vocab_size) eos_ids.push_back(static_cast<int32_t>(id));
  }
  if (o.enable_prefix_caching) {  // before any allocation
    allocator.EnablePrefixCache(num_kv_heads);
    if (o.prefix_cache_host_bytes > 0) {
      // One side per rank (tensor parallelism: each rank's pools hold its own heads under the
      // same slot ids), each used on its rank's thread.
      std::vector<HostPrefixTier::Side> sides(static_cast<size_t>(r.num_ranks()));
      r.ForEachRank([&](int rank, ModelRunner& rr) {
        sides[static_cast<size_t>(rank)] = {&rr.backend(), &rr.kv_pools()};
      });
      host_tier = std::make_unique<HostPrefixTier>(
          std::move(sides),
          [&r](const std::function<void(int)>& fn) {
            r.ForEachRank([&](int rank, ModelRunner&) { fn(rank); });
          },
          num_kv_heads, static_cast<size_t>(o.prefix_cache_host_bytes));
      allocator.set_host_tier(host_tier.get(), host_tier.get());
    }
    if (draft != nullptr) {
      draft_allocator.EnablePrefixCache(draft_kv_heads);
      if (host_tier != nullptr) {  // the head's blocks spill and reload with the target's
        draft_pools.push_back(draft->kv_pool());
        const LayerKvPool& p = draft_pools.front();
        const size_t per_block = HostPrefixTier::BytesPerSlot(1, p.k.dim(2), p.k.dtype()) *
                                 static_cast<size_t>(draft_kv_heads);
        draft_host_tier = std::make_unique<HostPrefixTier>(
            draft->backend(), draft_pools, draft_kv_heads,
            per_block * static_cast<size_t>(host_tier->num_blocks_capacity()));
        draft_allocator.set_host_tier(draft_host_tier.get(), draft_host_tier.get());
      }
      draft_prefix = std::make_unique<DraftPrefixCache>(
          draft_allocator, [this](const Sequence& seq) -> DraftHeadState& {
            return requests.at(seq.id)->draft_head;
          });
      scheduler.set_prefix_companion(draft_prefix.get());
    }
  }
  if (o.enable_prefix_caching && sparse != nullptr &&
      disagg::CheckDisaggregation(sparse->manager()).ok()) {
    // Imported prompt blocks stay in the host store for later imports of the same prefix, and
    // so do the blocks local host-home requests computed while dense, for later switches.
    HostKvStore& store = sparse->manager().host_store();
    import_cache = std::make_unique<StorePrefixCache>(store, num_kv_heads);
    host_store_cache =
        std::make_unique<StorePrefixCache>(store, num_kv_heads, StorePrefixCache::Unit::kSlots);
    sparse->set_before_release([this](Sequence& seq) {
      auto it = requests.find(seq.id);
      if (it == requests.end()) return;
      ParkImportPrefix(*it->second);
      GiveHostStorePrefix(*it->second);
    });
  }
  if (sparse != nullptr && (draft_prefix != nullptr || host_store_cache != nullptr)) {
    sparse->set_before_switch([this](Sequence& seq) {
      RequestState& s = *requests.at(seq.id);
      // The head's rows so far are dense ones: cache them before the switch.
      if (draft_prefix != nullptr) draft_prefix->Register(seq, s.draft_head);
      AdoptHostStorePrefix(s);
    });
  }
  if (draft != nullptr && o.lookahead == LookaheadMode::kSpeculate &&
      o.speculative_depth == SpeculativeDepth::kAdaptive) {
    depth_controller = std::make_unique<SpeculativeDepthController>(
        static_cast<int32_t>(o.num_speculative_tokens), o.speculative_depth_rule);
  }
  stats.kv.num_slots = r.num_kv_slots();
  stats.kv.num_free_slots = r.num_kv_slots();
  const DType kv_dtype = KvCacheDtype(r.backend(), r.model().config().kv_cache_fp8);
  stats.kv.dtype = kv_dtype == DType::kF8E4M3 ? "fp8_e4m3"
                   : kv_dtype == DType::kBF16 ? "bfloat16"
                                              : "float32";
  stats.kv.num_draft_slots = draft_allocator.num_slots();
  stats.kv.num_free_draft_slots = draft_allocator.num_free();
  if (host_tier != nullptr)
    stats.kv.prefix_cache_host_capacity_blocks = host_tier->num_blocks_capacity();
  stats.ttft = LatencyHistogram::WithBounds(kTtftBounds);
  stats.itl = LatencyHistogram::WithBounds(kItlBounds);
  stats.e2e = LatencyHistogram::WithBounds(kE2eBounds);
  EngineStats::PerRequest& pr = stats.per_request;
  for (Histogram* h :
       {&pr.queue_seconds, &pr.prefill_seconds, &pr.decode_seconds, &pr.inference_seconds}) {
    *h = Histogram::WithBounds(kE2eBounds);
  }
  pr.prompt_tokens = Histogram::WithBounds(OneTwoFiveBounds(context_tokens));
  pr.generation_tokens = Histogram::WithBounds(OneTwoFiveBounds(context_tokens));
  if (sparse) sparse->UpdateStats(stats);
  published = stats;
}

Status Engine::Impl::Validate(const EngineRequest& r) const {
  return ValidateRequest(r, config, tok != nullptr, runner.num_kv_slots(), num_kv_heads);
}

StopConditions Engine::Impl::MakeStopConditions(const EngineRequest& r) const {
  StopConditions c;
  if (!r.ignore_eos) c.eos_token_ids = eos_ids;
  c.stop_token_ids = r.stop_token_ids;
  c.stop_strings = r.stop;
  c.include_stop_str_in_output = r.include_stop_str_in_output;
  c.skip_special_tokens = r.skip_special_tokens;
  c.spaces_between_special_tokens = r.spaces_between_special_tokens;
  c.min_tokens = r.min_tokens;
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  c.max_total_tokens = r.max_tokens == -1 ? context_tokens : P + r.max_tokens;
  c.max_tokens = c.max_total_tokens - P;
  return c;
}

void Engine::Impl::Admit(std::unique_ptr<RequestState> state) {
  if (state->request.import) {
    QueueImport(std::move(state));
    return;
  }
  RequestState& s = *state;
  s.seed = s.request.sampling.seed ? *s.request.sampling.seed : rng();
  s.seq.always_sparse = s.request.handoff;
  // Prompt logprobs need a logits row at every prompt position. A handoff (prefill instance)
  // adopts cached blocks too: its KV is staged from the host store after its switch, which
  // copies every block there, adopted or computed.
  if (options.enable_prefix_caching && s.request.prompt_logprobs < 0) {
    s.seq.prefix_caching = PrefixCaching::kOn;
    s.seq.prefix_root = PrefixCacheRoot(std::hash<std::string>{}(s.request.cache_salt));
  }
  if (s.request.prompt_logprobs >= 0 && s.request.prompt.size() > 1)
    s.prompt_logprobs.resize(s.request.prompt.size() - 1);
  scheduler.Add(&s.seq);
  requests.emplace(s.seq.id, std::move(state));
}

void Engine::Impl::ReleaseDraftHead(RequestState& s) {
  if (draft == nullptr) return;
  // (Its head blocks were registered before: each step's start for running requests, Finish
  // before the scheduler forgets whether the request went sparse — rows of sparse steps read
  // approximate target states and are never cached.)
  s.draft_head.table.Release(draft_allocator);
  s.draft_head.num_computed = 0;
  DraftPrefixCache::Reset(s.draft_head);
}

void Engine::Impl::ObserveFinished(const RequestState& s) {
  const auto now = EngineClock::now();
  stats.e2e.Observe(Seconds(now - s.arrival));
  EngineStats::PerRequest& pr = stats.per_request;
  pr.prompt_tokens.Observe(static_cast<double>(s.seq.num_prompt_tokens));
  pr.generation_tokens.Observe(static_cast<double>(s.seq.num_generated()));
  if (!s.first_scheduled) return;  // finished (aborted, failed) before it ever ran
  pr.queue_seconds.Observe(Seconds(*s.first_scheduled - s.arrival));
  if (!s.first_token_time) return;
  const auto last = s.last_token_time.value_or(*s.first_token_time);
  pr.prefill_seconds.Observe(Seconds(*s.first_token_time - *s.first_scheduled));
  pr.decode_seconds.Observe(Seconds(last - *s.first_token_time));
  pr.inference_seconds.Observe(Seconds(last - *s.first_scheduled));
}

void Engine::Impl::Finish(RequestState& s, RequestOutput out, FinishReasonKind reason) {
  OASIS_CHECK(s.import_phase != RequestState::ImportPhase::kFetching)
      << "finishing a request while its KV is fetched";
  if (s.request.import && sparse && s.import_phase == RequestState::ImportPhase::kNone) {
    SparseKvManager& m = sparse->manager();
    stats.disagg.import_host_kv_bytes_finished_total += m.HostBytesHeld(s.seq.id);
    ++stats.disagg.imports_finished_total;
  }
  if (s.import_phase == RequestState::ImportPhase::kNone) {
    if (draft_prefix != nullptr) draft_prefix->Register(s.seq, s.draft_head);  // while kv tells
    scheduler.Finish(&s.seq);
  } else if (sparse) {    // an import not yet running: only its host room (and draft KV) is held
    ParkImportPrefix(s);  // what it took from the import cache goes back
    sparse->manager().Release(s.seq.id);
  }
  ReleaseImport(s, reason == FinishReasonKind::kStop || reason == FinishReasonKind::kLength);
  ReleaseDraftHead(s);
  ++stats.requests.finished_total;
  switch (reason) {
    case FinishReasonKind::kStop:
      ++stats.requests.stop_total;
      break;
    case FinishReasonKind::kLength:
      ++stats.requests.length_total;
      break;
    case FinishReasonKind::kAbort:
      ++stats.requests.abort_total;
      break;
    case FinishReasonKind::kError:
      ++stats.requests.error_total;
      break;
    case FinishReasonKind::kHandoff:
      ++stats.requests.handoff_total;
      break;
    case FinishReasonKind::kNone:
      OASIS_CHECK(false) << "finishing without a reason";
  }
  ObserveFinished(s);
  out.finished = true;
  out.finish_reason = reason;
  out.prompt_tokens = s.seq.num_prompt_tokens;
  out.completion_tokens = s.seq.num_generated();
  out.cached_tokens = s.seq.num_cached_tokens;
  {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(s.request.id);  // the id may be reused once the finished event is visible
  }
  delivery.Add(s.stream, std::move(out));
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
  StopImportThread();  // a fetch in flight completes (it has a deadline); queued ones are dropped
  for (auto& s : pending) Admit(std::move(s));
  std::vector<uint64_t> keys;
  for (auto& [key, s] : requests) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (uint64_t key : keys) {
    RequestState& s = *requests.at(key);
    if (s.import_phase == RequestState::ImportPhase::kFetching)
      s.import_phase = RequestState::ImportPhase::kQueued;
    RequestOutput out;
    out.text = s.stop_checker.Flush();
    Finish(s, std::move(out), FinishReasonKind::kAbort);
  }
  Publish();
  delivery.Drain();  // every finished event is in its stream when Stop returns
}

void Engine::Impl::Publish() {
  stats.requests.num_running = scheduler.num_running();
  stats.requests.num_waiting = scheduler.num_waiting();
  stats.disagg.num_importing = static_cast<int64_t>(import_queue.size()) + num_fetching;
  if (sparse) {
    const SparseKvManager& m = sparse->manager();
    int64_t bytes = 0;
    for (const auto& [key, st] : requests) {
      if (st->request.import) bytes += m.HostBytesHeld(key);
    }
    stats.disagg.import_host_kv_bytes = bytes;
    stats.disagg.import_host_kv_bytes_peak =
        std::max(stats.disagg.import_host_kv_bytes_peak, stats.disagg.import_host_kv_bytes);
  }
  stats.kv.num_free_slots = allocator.num_free();
  stats.kv.num_free_draft_slots = draft_allocator.num_free();
  if (const PrefixCache* cache = allocator.prefix_cache()) {
    stats.kv.num_cached_free_slots = cache->num_evictable_slots();
    stats.kv.prefix_cache_queries_total = cache->queries_tokens_total();
    stats.kv.prefix_cache_hits_total = cache->hits_tokens_total();
    stats.kv.prefix_cache_evictions_total = cache->evictions_total();
  }
  if (host_tier != nullptr) {
    stats.kv.prefix_cache_host_capacity_blocks = host_tier->num_blocks_capacity();
    stats.kv.prefix_cache_host_blocks = host_tier->num_entries();
    stats.kv.prefix_cache_host_hits_total = host_tier->hits_tokens_total();
    stats.kv.prefix_cache_host_spilled_bytes_total = host_tier->spilled_bytes_total();
    stats.kv.prefix_cache_host_reloaded_bytes_total = host_tier->reloaded_bytes_total();
    stats.kv.prefix_cache_host_evictions_total = host_tier->evictions_total();
  }
  stats.kv.usage =
      stats.kv.num_slots > 0
          ? static_cast<double>(stats.kv.num_slots - stats.kv.num_free_slots) / stats.kv.num_slots
          : 0.0;
  if (sparse) sparse->UpdateStats(stats);
  if (host_store_cache != nullptr) stats.sparse.host_prefix_blocks = host_store_cache->num_blocks();
  if (import_cache != nullptr) {
    stats.disagg.import_prefix_blocks = import_cache->num_blocks();
    stats.disagg.import_prefix_held_blocks = import_cache->num_held_blocks();
    stats.disagg.import_prefix_cells = import_cache->num_cells();
    stats.disagg.import_prefix_evictions_total = import_cache->evictions_total();
  }
  num_waiting_engine.store(stats.requests.num_waiting, std::memory_order_relaxed);
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
        return stop_requested || !inbox.empty() || !aborts.empty() || !scheduler.idle() ||
               !imports_done.empty();
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
      if (it->second->import_phase == RequestState::ImportPhase::kFetching) {
        it->second->abort_after_fetch =
            true;  // its buffers are being written: finished when the fetch ends
        continue;
      }
      RequestOutput out;
      out.text = it->second->stop_checker.Flush();
      Finish(*it->second, std::move(out), FinishReasonKind::kAbort);
    }
    const auto t_imports = EngineClock::now();
    FinishImports();
    StartImports();
    stats.loop.imports_seconds_total += Seconds(EngineClock::now() - t_imports);
    if (!scheduler.idle()) {
      Step();
      const auto t_drift = EngineClock::now();
      FetchDrift();
      stats.loop.drift_seconds_total += Seconds(EngineClock::now() - t_drift);
    }
    const auto t_publish = EngineClock::now();
    Publish();
    delivery.Flush();
    stats.loop.publish_seconds_total += Seconds(EngineClock::now() - t_publish);
  }
  AbortAll();
}

namespace {

// Broken options are a programming error here (the server checks them with CheckOptions).
int CheckedOrDie(const EngineOptions& options, const ModelRunner& runner,
                 const DraftRunner* draft) {
  OASIS_CHECK_GT(options.max_waiting, 0) << "max_waiting";
  const Status st = Engine::CheckOptions(options, runner, draft);
  OASIS_CHECK(st.ok()) << st.ToString();
  return 0;
}

}  // namespace

Engine::Engine(ModelRunner& runner, const tokenizer::Tokenizer* tok, EngineOptions options,
               DraftRunner* draft)
    : impl_((CheckedOrDie(options, runner, draft),
             std::make_unique<Impl>(runner, tok, options, draft))) {}

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
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  OASIS_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                         SubmitGroup(std::move(one)));
  return std::move(streams.front());
}

StatusOr<std::vector<std::shared_ptr<RequestStream>>> Engine::SubmitGroup(
    std::vector<EngineRequest> requests) {
  // Everything that can refuse one request is checked for all of them before any is queued.
  struct Prepared {
    EngineRequest request;
    StopConditions stop;
    int64_t max_total_tokens = 0;
    std::shared_ptr<const LogitsProcessing> processing;
  };
  std::vector<Prepared> group;
  group.reserve(requests.size());
  std::set<std::string> ids;
  for (EngineRequest& request : requests) {
    OASIS_RETURN_IF_ERROR(impl_->Validate(request));
    OASIS_RETURN_IF_ERROR(impl_->ValidateDisaggregation(request));
    if (!ids.insert(request.id).second)
      return InvalidArgument("request id '" + request.id + "' is given twice");
    StopConditions stop = impl_->MakeStopConditions(request);
    // A handoff request stops at x2 here: host room for its prompt, x1 and x2.
    const int64_t max_total_tokens =
        request.handoff ? std::min<int64_t>(stop.max_total_tokens,
                                            static_cast<int64_t>(request.prompt.size()) + 2)
                        : stop.max_total_tokens;
    if (impl_->sparse) OASIS_RETURN_IF_ERROR(impl_->sparse->CheckFits(max_total_tokens));
    // min_tokens keeps the stop tokens from being drawn (vLLM masks them), not only from
    // stopping.
    std::vector<int32_t> min_tokens_stops = stop.eos_token_ids;
    min_tokens_stops.insert(min_tokens_stops.end(), stop.stop_token_ids.begin(),
                            stop.stop_token_ids.end());
    std::shared_ptr<const LogitsProcessing> processing =
        LogitsProcessing::For(request.sampling, request.min_tokens, std::move(min_tokens_stops));
    group.push_back({std::move(request), std::move(stop), max_total_tokens, std::move(processing)});
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped || impl_->stop_requested) return Unavailable("the engine is shutting down");
    for (const Prepared& p : group) {
      if (impl_->live.count(p.request.id))
        return InvalidArgument("request id '" + p.request.id + "' is already in use");
    }
    const int64_t waiting = static_cast<int64_t>(impl_->inbox.size()) +
                            impl_->num_waiting_engine.load(std::memory_order_relaxed);
    const int64_t n = static_cast<int64_t>(group.size());
    // More sequences than the queue ever holds can never be queued: the request's own fault
    // (InvalidArgument, a 400), not a full queue to retry later (ResourceExhausted, a 429).
    if (n > impl_->options.max_waiting) {
      return InvalidArgument("a request of " + std::to_string(n) +
                             " sequences (prompts x n) is more than the waiting queue holds (" +
                             std::to_string(impl_->options.max_waiting) +
                             "), so it can never be queued: send fewer prompts or a smaller n");
    }
    if (waiting + n > impl_->options.max_waiting) {
      return ResourceExhausted("too many waiting requests (" + std::to_string(waiting) + ")");
    }
    for (Prepared& p : group) {
      const uint64_t key = impl_->next_key++;
      auto state =
          std::make_unique<RequestState>(key, std::move(p.request), std::move(p.stop), impl_->tok,
                                         impl_->num_kv_heads, impl_->draft_kv_heads);
      state->seq.max_total_tokens = p.max_total_tokens;
      state->logits_processing = std::move(p.processing);
      state->row_sampling = state->request.sampling;
      state->row_sampling.logit_bias.clear();
      state->row_sampling.allowed_token_ids.clear();
      state->row_sampling.bad_words_token_ids.clear();
      streams.push_back(state->stream);
      impl_->live.emplace(state->request.id, key);
      impl_->inbox.push_back(std::move(state));
    }
  }
  impl_->cv.notify_all();
  return streams;
}

Status Engine::CheckHostKvRoom(int64_t prompt_tokens, int64_t max_tokens) const {
  if (!impl_->sparse) return Status::Ok();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t total = impl_->context_tokens;  // max_tokens = -1: the rest of the context
  if (max_tokens != -1)
    total = max_tokens > kMax - prompt_tokens ? kMax : prompt_tokens + max_tokens;
  return impl_->sparse->CheckFits(total);
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

KvCapacity Engine::CapacityAt(int64_t tokens) const {
  const Impl& m = *impl_;
  KvCapacity c;
  c.tokens = tokens;
  const int64_t need = HeadBlockTable::SlotsFor(tokens, m.num_kv_heads);
  const int64_t seqs = m.options.max_num_seqs, pool = m.runner.num_kv_slots();
  c.dense = need > 0 && tokens <= m.context_tokens ? std::min(seqs, pool / need) : 0;
  if (m.sparse) {
    const SparseCapacity s = m.sparse->CapacityAt(tokens);
    c.hbm = std::min(seqs, s.hbm);
    c.host = std::min(seqs - c.hbm, s.host);
    c.sparse = c.hbm + c.host;
  }
  return c;
}

EngineStats Engine::Stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    s = impl_->published;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.requests.num_waiting += static_cast<int64_t>(impl_->inbox.size());
  return s;
}

const ModelConfig& Engine::model_config() const { return impl_->config; }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::max_context_tokens() const { return impl_->context_tokens; }

void Engine::Impl::AdoptHostStorePrefix(RequestState& s) {
  Sequence& seq = s.seq;
  if (host_store_cache == nullptr || s.host_prefix_tried || s.request.import ||
      seq.prefix_caching != PrefixCaching::kOn || seq.block_hashes.empty())
    return;
  SparseKvManager& m = sparse->manager();
  if (!m.HasReservation(seq.id) || m.InPlace(seq.id)) return;
  s.host_prefix_tried = true;  // (a switch that fails now is retried with what it adopted)
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(seq.block_hashes.size()),
                                      seq.num_computed / kBlockSize);
  std::vector<int32_t> slots;
  int64_t blocks = 0;
  for (; blocks < n; ++blocks) {
    auto got = host_store_cache->Acquire(SequenceBlockKey(seq, blocks));
    if (!got) break;
    slots.insert(slots.end(), got->begin(), got->end());
  }
  if (blocks == 0) return;
  if (!m.AdoptHostPrefix(seq.id, blocks, slots).ok()) {
    for (int64_t b = 0; b < blocks; ++b)
      host_store_cache->Release(SequenceBlockKey(seq, b), {}, /*held=*/true);
    return;
  }
  stats.sparse.host_prefix_adopted_blocks_total += blocks;
}

void Engine::Impl::GiveHostStorePrefix(RequestState& s) {
  Sequence& seq = s.seq;
  if (host_store_cache == nullptr || s.request.import) return;
  SparseKvManager& m = sparse->manager();
  const int64_t adopted = m.AdoptedHostBlocks(seq.id);
  // Only blocks computed while dense (their hashes): rows of sparse steps are approximate.
  const std::vector<int32_t> slots =
      m.DetachHostPrefix(seq.id, static_cast<int64_t>(seq.block_hashes.size()));
  const int64_t hkv = host_store_cache->cells_per_block();
  const int64_t n = static_cast<int64_t>(slots.size()) / hkv;
  for (int64_t b = 0; b < n; ++b) {
    const PrefixBlockKey key = SequenceBlockKey(seq, b);
    if (b < adopted) {
      host_store_cache->Release(key, {}, /*held=*/true);
    } else {
      host_store_cache->Release(
          key, std::span<const int32_t>(slots.data() + b * hkv, static_cast<size_t>(hkv)), false);
      ++stats.sparse.host_prefix_given_blocks_total;
    }
  }
  s.host_prefix_tried = false;
}

}  // namespace oasis

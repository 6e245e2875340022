// Engine::Impl: the engine's state and loop, shared by engine.cpp (API, admission, finish,
// stats) and engine_step.cpp (one step: batch, execute, post-process) so that neither file
// grows past a screenful of responsibilities. Private to src/engine.
//
// Owns the scheduler, the KV allocators, every RequestState and (sparse KV on) the
// SparseDecoding. Thread-safety: the fields under "guarded by mu" / stats_mu are shared with
// front-end threads; the rest belongs to the engine loop thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "disagg/kv_import.h"
#include "engine/draft_prefix_cache.h"
#include "engine/engine.h"
#include "engine/output_delivery.h"
#include "engine/request_state.h"
#include "engine/scheduler.h"
#include "engine/sparse_decoding.h"
#include "kvcache/host_prefix_tier.h"
#include "kvcache/store_prefix_cache.h"

namespace oasis {

double Seconds(EngineClock::duration d);

// Disaggregation's decode side: reads from a request's remote lease on a thread of its own, so
// that no network wait is on the engine loop. Admission fetches (the whole admission set) and
// drift fetches (a step's remote misses) run on two workers, so a long admission never
// delays a drift fetch.
struct FetchJob {
  uint64_t key = 0;
  bool drift = false;
  uint64_t generation = 0;  // the request's import generation when the job was made
  std::shared_ptr<KvImportSource> source;
  std::vector<KvFetchItem> items;
  std::shared_ptr<std::vector<char>> buffer;  // drift: where the blocks land
  std::vector<disagg::RemoteBlock> blocks;    // drift: which blocks (K and V each)
  Status status = Status::Ok();               // set by the worker
  double seconds = 0;
};

class FetchWorker {
 public:
  // `done` runs on the worker thread after each job (the job with its status).
  explicit FetchWorker(std::function<void(FetchJob)> done) : done_(std::move(done)) {}
  ~FetchWorker() { Stop(); }
  void Push(FetchJob job);
  // Finishes the job in flight (fetches have deadlines), drops the queued ones, joins.
  void Stop();

 private:
  std::function<void(FetchJob)> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<FetchJob> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// One step's batch and what its phases (engine_step.cpp) hand each other. Plain data owned
// by Engine::Impl::Step for the step's duration; the engine loop thread.
struct StepBatch {
  SchedulerOutput plan;
  // Per chunk: its step sequence, draft tokens stacked after its own, whether those have
  // logits rows (speculate), its first row in `rows` and its first token's row in `input`.
  std::vector<StepSequence> steps;
  std::vector<int64_t> num_draft;
  std::vector<bool> draft_logits;
  std::vector<bool> every_row;  // prompt logprobs: a logits row for each of the chunk's tokens
  std::vector<size_t> first_sample;
  std::vector<int64_t> first_row;
  std::vector<SampleRow> rows;
  SparseStepPlan sparse_plan;  // steps[i].sparse points into it
  bool sparse_step = false;
  ForwardInput input;  // host tensors
  std::vector<SampleResult> samples;
  ResidualCapture capture;  // for the draft head
  // The draft head's next batch, prepared while the target step ran; whether its step was
  // chained behind the target's sampling; the head's work once the chunks are committed.
  PreparedHeadStep prepared;
  bool have_prepared = false;
  bool chained = false;
  std::vector<DraftHeadWork> head_work;
  std::vector<uint64_t> handoffs;  // handoff requests that sampled x2 this step
  // Speculate: the chain depth the head proposes this step (for the next one), whether the
  // adaptive controller explored with it, and the head step's wall time.
  int32_t chain_depth = 1;
  bool depth_explored = false;
  double head_seconds = 0.0;
  bool head_failed = false;
};

struct Engine::Impl {
  Impl(ModelRunner& r, const tokenizer::Tokenizer* t, EngineOptions o, DraftRunner* d);

  Status Validate(const EngineRequest& r) const;
  StopConditions MakeStopConditions(const EngineRequest& r) const;

  void Loop();
  // One step, in phases (engine_step.cpp): schedule, then
  void Step();
  // preemption clean-up and refusals; false when there is nothing to run;
  bool HandleScheduled(const SchedulerOutput& plan);
  // Head-blocks the pool is short of (sparse switches and moves relieve it,
  // SparseDecoding::Rebalance): to admit the next waiting request, at least 1 when the step
  // preempted; 0 without pressure.
  int64_t PoolShortfall(const SchedulerOutput& plan) const;
  // the target batch and its sample rows (AddSampleRows: a chunk's, `draft_logits` adding
  // one per draft token, `prompt_rows` one before it per prompt token of the chunk whose
  // successor's log-probability is asked for; returns the index of the chunk's own row);
  void BuildBatch(StepBatch& b);
  size_t AddSampleRows(const ScheduledChunk& c, int64_t num_draft, bool draft_logits,
                       bool prompt_rows, std::vector<SampleRow>& rows) const;
  // Whether chunk `c` computes prompt logprobs (a row per token: StepBatch::every_row).
  bool WantsPromptRows(const ScheduledChunk& c, int64_t num_draft) const;
  // The prompt logprobs of a chunk with prompt rows, into its request's state.
  void CollectPromptLogprobs(StepBatch& b, size_t i);
  // one runner call (the draft head's next batch prepared, under reject chained, meanwhile);
  Status RunBatch(StepBatch& b);
  void PrepareDraftHead(StepBatch& b);
  void FailBatch(StepBatch& b, const Status& failure);
  // commit, emit, stop checks, draft acceptance, per chunk;
  void CommitAndEmit(StepBatch& b, EngineClock::time_point now);
  // Chunk i's drafts (`drafted`, stacked after its real token) against the tokens sampled at
  // their positions: counted, and under speculate the accepted prefix committed and emitted
  // (with the token after it). False when the request finished.
  bool VerifyDrafts(StepBatch& b, size_t i, RequestState& s, const std::vector<int32_t>& drafted,
                    bool is_sparse, EngineClock::time_point now, RequestOutput& out);
  // the draft head's step over the committed chunks (timed from `head_start`).
  void RunDraftHead(StepBatch& b, EngineClock::time_point head_start);
  // Appends one sampled token to a request and adds it to `out`; returns false when the
  // request is gone (finished with `out` as its last event, or failed).
  bool Emit(RequestState& s, SampleResult& sample, bool first_of_event, EngineClock::time_point now,
            RequestOutput& out);
  // Whether a request of `num_tokens` tokens gets a draft for its next step.
  bool WantsDraft(const RequestState& s, int64_t num_tokens, bool is_sparse) const;
  // w.wants_draft and the chain length w.num_drafts (at most `depth`) for such a request.
  void SetDraftsWanted(DraftHeadWork& w, const RequestState& s, int64_t num_tokens, bool is_sparse,
                       int32_t depth) const;
  // Speculate: the chain depth this step's head proposes (b.chain_depth): k, or the adaptive
  // controller's choice for the batch. Before RunBatch (the head's batch is prepared in it).
  void ChooseChainDepth(StepBatch& b);
  // EngineStats::lookahead's depth counters after a head step that proposed chains.
  void CountChainDepth(const StepBatch& b);
  // Adaptive depth: a decode-only step's wall time (`step_seconds`), split into the head's
  // part and the rest, for the controller.
  void ObserveChainDepthCost(const StepBatch& b, double step_seconds);
  // Releases the request's draft-head KV (finish, preemption).
  void ReleaseDraftHead(RequestState& s);
  void Admit(std::unique_ptr<RequestState> state);
  // Finishes a live request: frees its blocks, counts it, pushes `out` as its last event.
  void Finish(RequestState& s, RequestOutput out, FinishReasonKind reason);
  // The latency and length histograms of a request that finishes now.
  void ObserveFinished(const RequestState& s);
  void Fail(RequestState& s, const Status& error);
  void AbortAll();
  void Publish();

  // Disaggregation (engine_handoff.cpp, engine/kv_handoff.h).
  // What this engine stages per request of `staged_tokens` tokens (the draft head's KV when a
  // draft runner is in use).
  disagg::StagedKvGeometry HandoffGeometry(int64_t staged_tokens) const;
  // Where a request's staged state lives here (its host KV, summaries and draft-head KV).
  disagg::StagedKvHome StagedHome(RequestState& s);
  Status ValidateDisaggregation(const EngineRequest& r) const;
  // Prefill side, after a step: the handoff requests that now have x2 export and finish.
  void HandoffReady(const std::vector<uint64_t>& keys);
  StatusOr<std::string> ExportHandoff(RequestState& s);
  // Decode side: an arrived import request waits in import_queue; StartImports reserves its
  // room and hands its fetch to the import thread; FinishImports finalizes the fetched ones
  // and lets them run.
  void QueueImport(std::unique_ptr<RequestState> state);
  void StartImports();
  void FinishImports();
  void FinalizeImport(RequestState& s);
  void ReleaseImport(RequestState& s, bool completed);
  void StopImportThread();
  // After a step: the remote misses select listed go to the drift worker (each block once).
  void FetchDrift();
  void OnFetched(FetchJob job);  // a worker's job ended (worker thread)
  // Drifted blocks that landed (jobs of requests still running this import): host slots for
  // all of them at once, then copied into the host store and marked local.
  void ApplyDrift(const std::vector<const FetchJob*>& jobs);

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
  // Fetches that finished (admission and drift), for the loop to apply.
  std::vector<FetchJob> imports_done;

  mutable std::mutex stats_mu;
  EngineStats published;  // guarded by stats_mu

  // Engine-loop state.
  BlockAllocator allocator;
  BlockAllocator draft_allocator;  // the draft head's KV pool (empty when lookahead is off)
  // Prefix caching with lookahead: the head's blocks cached along (null otherwise).
  std::unique_ptr<DraftPrefixCache> draft_prefix;
  // The prefix cache's host tier (EngineOptions::prefix_cache_host_bytes; null: none).
  std::unique_ptr<HostPrefixTier> host_tier;
  // The draft head's (lookahead), holding as many blocks: its pool, as a one-layer list.
  std::vector<LayerKvPool> draft_pools;
  std::unique_ptr<HostPrefixTier> draft_host_tier;
  std::unique_ptr<SparseDecoding> sparse;  // null: sparse KV off
  // Decode side of disaggregation with prefix caching: imported prompt blocks kept in the host
  // store for later imports of the same prefix (null: caching off, or no import path).
  std::unique_ptr<StorePrefixCache> import_cache;
  // Local host-home sparse requests with prefix caching: the whole host-store slots of blocks
  // they computed while dense, for later switches of the same prefix (null: off).
  std::unique_ptr<StorePrefixCache> host_store_cache;
  // Before s switches to a host home: takes the leading blocks the host-store cache holds.
  void AdoptHostStorePrefix(RequestState& s);
  // Before s's host room is released: its dense-computed blocks' host slots to the cache.
  void GiveHostStorePrefix(RequestState& s);
  // Speculate with --speculative-depth adaptive (null otherwise).
  std::unique_ptr<SpeculativeDepthController> depth_controller;
  Scheduler scheduler;
  std::unordered_map<uint64_t, std::unique_ptr<RequestState>> requests;  // by key
  OutputDelivery delivery;  // request events to their streams, off the loop's critical path
  // Decode side of disaggregation: imports waiting for room, and the import thread.
  std::deque<uint64_t> import_queue;  // keys, FCFS
  int64_t num_fetching = 0;
  // Made on first use: admission fetches spread over kAdmissionWorkers threads (a 32K
  // request's full KV takes seconds), drift fetches on their own.
  static constexpr int kAdmissionWorkers = 4;
  std::vector<std::unique_ptr<FetchWorker>> admission_workers;
  uint64_t next_admission_worker = 0;
  std::unique_ptr<FetchWorker> drift_worker;
  // Landing buffers of drift reads, reused: a fresh megabyte per request and step is a fresh
  // mapping (page faults, then an unmap's TLB shootdown across every thread).
  std::vector<std::shared_ptr<std::vector<char>>> drift_buffers;
  uint64_t next_import_generation = 1;
  // Per fetching request: its unpacker (the summaries' and draft KV's landing buffers).
  std::unordered_map<uint64_t, disagg::StagedKvUnpacker> import_unpackers;
  // The keys of an import's full prompt blocks (its import_block_hashes over seq.tokens).
  std::vector<PrefixBlockKey> ImportKeys(const RequestState& s) const;
  // Takes the leading run of s's prompt blocks the import cache holds (s.import_adopted).
  void AdoptImportPrefix(RequestState& s);
  // Prompt blocks imports are fetching now (hash -> imports), until their fetch lands.
  std::unordered_map<uint64_t, int32_t> pending_import_blocks;
  // Whether s's first prompt block the import cache lacks is being fetched by another import:
  // s then waits to hold it (SGLang's in-batch prefix rule, for imports).
  bool AwaitsImportedBlock(const RequestState& s) const;
  void EndPendingImport(RequestState& s);
  // Gives s's adopted blocks back to the cache (an admission that did not go through).
  void ReturnImportPrefix(RequestState& s);
  // Before s's host room is released: parks its prompt blocks (every local one when it ran
  // sparse, else what it adopted).
  void ParkImportPrefix(RequestState& s);
  std::mt19937_64 rng;
  EngineStats stats;
};

}  // namespace oasis

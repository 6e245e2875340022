// Engine: the serving engine loop. One thread owns all engine state (scheduler, KV
// allocator, request states, the ModelRunner) and runs: drain new requests → schedule →
// execute → sample → post-process (detokenize, stop checks) → emit to per-request output
// channels. Front-end threads (HTTP, gRPC) only call Submit/Abort/Stats and read their
// RequestStream; they never touch engine state.
//
// Thread-safety: Submit, Abort, Stats, Start, Stop are thread-safe. RequestStream is a
// single-producer (the engine loop) single-consumer (the front end) channel.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "engine/kv_handoff.h"
#include "engine/lookahead.h"
#include "engine/speculative_depth.h"
#include "engine/stop_checker.h"
#include "kvcache/sparse_config.h"
#include "oasis/sampling.h"
#include "oasis/status.h"
#include "runner/draft_runner.h"
#include "runner/model_runner.h"
#include "runner/sampler.h"

namespace oasis {

namespace tokenizer {
class Tokenizer;
}

// FinishReasonKind (why a request finished) is declared in engine/stop_checker.h.

// OpenAI's finish_reason string: "stop", "length", "abort", "error"; "" for kNone.
const char* FinishReasonName(FinishReasonKind kind);

struct EngineRequest {
  std::string id;                       // unique among live requests (the server makes them)
  std::vector<int32_t> prompt;          // token ids
  int64_t max_tokens = -1;              // -1: until the context is full
  int64_t min_tokens = 0;               // EOS / stop ids / stop strings are ignored before this
  SamplingParams sampling;              // seed unset: the engine draws one
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS unless ignore_eos
  std::vector<std::string> stop;        // stop strings, matched across token boundaries
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // false: special tokens' text stays in RequestOutput::text
  // vLLM's spaces_between_special_tokens (tokenizer::SpacesBetweenSpecialTokens).
  bool spaces_between_special_tokens = true;
  bool ignore_eos = false;
  // Prefix caching: only requests with the same salt share cached blocks (vLLM's cache_salt:
  // tenants that must not learn from each other's cache timing use different salts).
  std::string cache_salt;
  bool logprobs = false;     // report the chosen token's log-probability
  int num_top_logprobs = 0;  // 0..kMaxTopLogprobs
  bool detokenize = true;    // fill RequestOutput::text (needs the tokenizer)
  // vLLM's prompt_logprobs: -1 off; k in [0, kMaxTopLogprobs]: each prompt token after the
  // first gets its log-probability and rank under the model given the tokens before it, and
  // the k most likely tokens there (RequestOutput::prompt_logprobs, on the first event).
  int prompt_logprobs = -1;
  // Teacher forcing, for evaluation (docs/server.md, "forced_output_ids"): the k-th generated
  // token is forced_output[k] instead of a draw, for k < its size; its log-probability and
  // top log-probabilities are the model's, computed through the same decode path as
  // generated tokens (lookahead, sparse KV). Later tokens are sampled as usual.
  std::vector<int32_t> forced_output;
  // Disaggregation (engine/kv_handoff.h, docs/disaggregation.md). handoff: a prefill
  // instance's request: after x2 its KV goes to EngineOptions::handoff_exporter and it
  // finishes with kHandoff and the ticket (unless it finished by itself first). import: a
  // decode instance's request continuing from a ticket: `prompt` must be the prompt the
  // ticket was made for; its stream carries the whole completion (x1 and x2 first).
  bool handoff = false;
  std::shared_ptr<KvImportSource> import;
};

// One token generated for a request.
struct GeneratedToken {
  int32_t token = -1;
  float logprob = 0.0f;                    // valid when the request asked for logprobs
  std::vector<TokenLogprob> top_logprobs;  // num_top_logprobs entries
};

// The log-probability of prompt token p (p >= 1) given the tokens before it.
struct PromptTokenLogprob {
  int32_t token = -1;                      // prompt[p]
  float logprob = 0.0f;                    // log P(prompt[p] | prompt[0..p))
  int64_t rank = 0;                        // 1 + tokens more likely (ties count against it)
  std::vector<TokenLogprob> top_logprobs;  // EngineRequest::prompt_logprobs entries, best first
};

// One event on a request's stream: the tokens produced since the previous event (usually
// one per engine step), the text they completed, and, on the last event, why it finished.
// Text held back because it may be the start of a stop string is emitted later or dropped
// when the stop string completes (unless include_stop_str_in_output).
struct RequestOutput {
  std::vector<GeneratedToken> tokens;
  std::string text;  // new text (valid UTF-8; may be empty)
  bool finished = false;
  FinishReasonKind finish_reason = FinishReasonKind::kNone;
  std::string stop_reason;      // the matched stop string, or the stop token id as text
  Status error = Status::Ok();  // set with kError
  int64_t prompt_tokens = 0;    // usage, counted at every event
  int64_t completion_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache (usage.prompt_tokens_details).
  int64_t cached_tokens = 0;
  std::string handoff_ticket;  // kHandoff: the encoded handoff ticket
  // With EngineRequest::prompt_logprobs, on the event of the first generated token: one entry
  // per prompt token after the first (prompt[1..P)).
  std::vector<PromptTokenLogprob> prompt_logprobs;
};

// The per-request output channel. The engine pushes; the front end pops.
class RequestStream {
 public:
  explicit RequestStream(std::string id) : id_(std::move(id)) {}
  const std::string& id() const { return id_; }

  // Blocks up to `timeout` for the next event; nullopt on timeout. After the finished event
  // has been popped, returns nullopt immediately.
  std::optional<RequestOutput> Next(std::chrono::milliseconds timeout);
  // Engine side: appends an event (merging is allowed) and wakes the reader.
  void Push(RequestOutput out);
  bool finished() const;
  // For a reader that does not block in Next (an event-driven front end): `wakeup` runs after
  // every Push, on the pushing thread and outside the stream's lock, so it must be quick and
  // thread-safe (post work elsewhere). Runs at once when an event is already queued.
  void SetWakeup(std::function<void()> wakeup);

 private:
  std::string id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool finished_pushed_ = false;
  bool finished_popped_ = false;
  std::shared_ptr<const std::function<void()>> wakeup_;
};

struct EngineOptions {
  int64_t max_num_seqs = 256;             // running requests at most (admission limit)
  int64_t max_num_batched_tokens = 2048;  // per-step token budget (decode tokens + prefill chunks)
  int64_t max_waiting = 4096;  // Submit fails with ResourceExhausted beyond this (→ 429)
  uint64_t seed = 0;           // seeds for requests without one
  // Lookahead decoding with an EAGLE-3 draft head (docs/lookahead.md); kReject and
  // kSpeculate need the engine's DraftRunner. kOff: plain decoding (a draft runner, if
  // given, stays unused).
  LookaheadMode lookahead = LookaheadMode::kOff;
  // Draft tokens per step under kSpeculate (--num-speculative-tokens, 1..kMaxDraftTokens): the
  // head proposes a chain of this many, the target verifies them in one stacked step and
  // emits 1 + the accepted prefix. kReject always stacks one (only its query is read).
  int64_t num_speculative_tokens = 1;
  // How long the chains are under kSpeculate (--speculative-depth): kFixed, num_speculative_tokens
  // at every step; kAdaptive, the depth in 1..num_speculative_tokens that a
  // SpeculativeDepthController (engine/speculative_depth.h) picks per step from the measured
  // acceptance by position and step times (`speculative_depth_rule` its constants). Only the
  // number of drafts changes, never the output. Ignored outside kSpeculate.
  SpeculativeDepth speculative_depth = SpeculativeDepth::kFixed;
  SpeculativeDepthRule speculative_depth_rule;
  // Lookahead sparse KV (docs/sparse.md): requests whose context exceeds
  // sparse->sparse_threshold decode over a per-head working set of top-K blocks, the full KV
  // in the host store. nullopt: off, the engine is exactly the dense one. max_seq_len is
  // replaced by the engine's context length. Predictor kDraft needs lookahead (kReject or
  // kSpeculate) with a DraftRunner; under kSpeculate sparse requests accept drafts as dense
  // ones do (a sparse step advances by 1 + the drafts accepted).
  std::optional<SparseConfig> sparse;
  // Sparse steps between collections of the pipeline's device counters (a host sync).
  int64_t sparse_metrics_interval = 16;
  // Prefill role of disaggregation: where handoff requests' KV goes (must outlive the
  // engine; needs sparse KV with dense_layers 0 on one GPU). null: handoff requests refused.
  KvHandoffExporter* handoff_exporter = nullptr;
  // Automatic prefix caching (issue 33, engine/prefix_reuse.h): a prompt reuses the KV of
  // every leading full block some earlier request computed (read-only, reference-counted),
  // computing only the rest; unreferenced cached blocks stay until the pool needs them (LRU).
  // Requests asking for prompt logprobs and imported requests bypass it.
  bool enable_prefix_caching = false;
  // The host tier of prefix caching (kvcache/host_prefix_tier.h): bytes of page-locked host
  // memory that cached blocks evicted from the GPU pool spill to and reload from. 0: none.
  // Needs enable_prefix_caching, one rank (CheckOptions), and at least one block's worth.
  double prefix_cache_host_bytes = 0;
};

// The engine's latency histograms (common/histogram.h).
using LatencyHistogram = Histogram;

// Point-in-time counters for /metrics (names in the server follow vLLM's, prefix oasis:),
// grouped by concern: requests, KV pool, the loop's time, lookahead, sparse KV,
// disaggregation, and the latency histograms.
struct EngineStats {
  // Requests: queue depths, token counters and finished requests by reason.
  struct Requests {
    int64_t num_running = 0;
    int64_t num_waiting = 0;
    int64_t prompt_tokens_total =
        0;  // prompt tokens of finished + running requests' computed prefill
    int64_t generation_tokens_total = 0;
    int64_t finished_total = 0;  // all reasons
    int64_t stop_total = 0, length_total = 0, abort_total = 0, error_total = 0;
    int64_t handoff_total = 0;
    int64_t preemptions_total = 0;
  };
  // The target's KV pool and the draft head's (lookahead; zero when off), in head-blocks.
  struct Kv {
    double usage = 0.0;  // used / total head-block slots, in [0, 1]
    int64_t num_slots = 0;
    int64_t num_free_slots = 0;
    // The KV pools' element type as vLLM names it: "bfloat16" / "float32" (auto) or
    // "fp8_e4m3" (--kv-cache-dtype fp8).
    std::string dtype;
    int64_t num_draft_slots = 0;  // the draft head's KV pool (head-blocks)
    int64_t num_free_draft_slots = 0;
    // Automatic prefix caching (zero when off): head-blocks held only by the cache (counted
    // in num_free_slots: evicted when the pool needs them), prompt tokens looked up at
    // admission and found cached (vLLM's prefix_cache_queries / _hits), cached blocks evicted.
    int64_t num_cached_free_slots = 0;
    int64_t prefix_cache_queries_total = 0;
    int64_t prefix_cache_hits_total = 0;
    int64_t prefix_cache_evictions_total = 0;
    // Its host tier (zero without one): blocks it can hold and holds, prompt tokens reloaded
    // from it at admission (also counted in prefix_cache_hits_total), bytes spilled to it
    // and reloaded from it, entries it evicted.
    int64_t prefix_cache_host_capacity_blocks = 0;
    int64_t prefix_cache_host_blocks = 0;
    int64_t prefix_cache_host_hits_total = 0;
    int64_t prefix_cache_host_spilled_bytes_total = 0;
    int64_t prefix_cache_host_reloaded_bytes_total = 0;
    int64_t prefix_cache_host_evictions_total = 0;
  };
  // The loop's steps and where their wall time goes.
  struct Loop {
    int64_t steps_total = 0;
    // Wall time of the model steps (the target's forward + sampling, ending with the sampled
    // tokens on the host) and of the draft head's steps; their ratio shows what lookahead costs.
    double model_step_seconds_total = 0.0;
    double draft_step_seconds_total = 0.0;
    // The engine's own host work per step: scheduling; building the step's batch (tokens,
    // tables, sampling rows, sparse plan); committing and emitting the results; the whole step.
    double schedule_seconds_total = 0.0;
    double build_seconds_total = 0.0;
    double emit_seconds_total = 0.0;
    double step_seconds_total = 0.0;
    // Outside the step (disaggregation's decode side): finishing and starting imports (landing
    // drifted blocks included), and handing a step's remote misses to the drift worker.
    double imports_seconds_total = 0.0;
    double drift_seconds_total = 0.0;
    double publish_seconds_total = 0.0;  // the loop's stats snapshot and output delivery
    // Steps whose batch held decode tokens only (no prompt chunk): their whole wall time and
    // their model part. Per such step they are the decode step the byte roofline describes,
    // without the prefill chunks that share other steps (tools/bench_long_context.py).
    int64_t decode_steps_total = 0;
    double decode_step_seconds_total = 0.0;
    double decode_model_step_seconds_total = 0.0;
  };
  // Lookahead decoding (zero when off). A draft is verified when a decode step runs it
  // through the target; it is accepted when the token sampled from the real row equals it
  // (emitted in speculate mode; in reject mode only counted: the draft's accuracy).
  struct Lookahead {
    int64_t draft_tokens_proposed_total = 0;  // drafts the head produced
    int64_t draft_chained_steps_total =
        0;                             // head steps queued behind the target's (reject) and used
    int64_t draft_tokens_total = 0;    // drafts verified by the target
    int64_t draft_accepted_total = 0;  // verified drafts equal to the sampled token
    int64_t steps_total = 0;           // request-steps that verified a draft
    int64_t tokens_total = 0;          // tokens those request-steps emitted
    // The sparse requests' part of steps_total and tokens_total (the dense part: the rest).
    int64_t sparse_steps_total = 0;
    int64_t sparse_tokens_total = 0;
    // By position j in the draft chain (0 = the draft right after the real token): drafts
    // verified at j (the tokens before it accepted and not ending the request) and accepted.
    std::array<int64_t, kMaxDraftTokens> position_drafts_total{};
    std::array<int64_t, kMaxDraftTokens> position_accepted_total{};
    // Speculate: engine steps whose draft head proposed chains, by the chain depth chosen for
    // them (index depth - 1; --speculative-depth fixed: always k, adaptive: the controller's,
    // explorations included), the explorations among them, and the depth chosen last (0
    // before any). A request's own chain may still end earlier (room, head pool).
    std::array<int64_t, kMaxDraftTokens> depth_steps_total{};
    int64_t depth_explorations_total = 0;
    int32_t depth = 0;
    double acceptance_rate() const {
      return draft_tokens_total > 0 ? static_cast<double>(draft_accepted_total) / draft_tokens_total
                                    : 0.0;
    }
    // Mean tokens emitted per request-step that verified a draft (1 in reject mode; up to 2
    // in speculate mode); 0 before any.
    double tokens_per_step() const {
      return steps_total > 0 ? static_cast<double>(tokens_total) / steps_total : 0.0;
    }
    double dense_tokens_per_step() const {
      const int64_t n = steps_total - sparse_steps_total;
      return n > 0 ? static_cast<double>(tokens_total - sparse_tokens_total) / n : 0.0;
    }
    double sparse_tokens_per_step() const {
      return sparse_steps_total > 0 ? static_cast<double>(sparse_tokens_total) / sparse_steps_total
                                    : 0.0;
    }
  };
  // Sparse KV (docs/sparse.md; zero when off). The per-step counters come from the
  // pipeline's device counters, collected every EngineOptions::sparse_metrics_interval
  // sparse steps and when the last sparse request has gone (so they may lag a little).
  struct Sparse {
    int64_t num_requests = 0;             // running sparse requests now
    int64_t switches_total = 0;           // dense -> sparse switches
    int64_t admission_waits_total = 0;    // admissions that had to wait for host KV room
    int64_t num_host_kv_slots = 0;        // host store head-blocks (every sparse layer)
    int64_t num_free_host_kv_slots = 0;   // not reserved by any request
    int64_t gpu_slots = 0;                // GPU head-blocks held as working sets + tails
    int64_t num_in_place = 0;             // sparse requests whose KV stays in the GPU pool
    int64_t in_place_blocks = 0;          // GPU pool head-blocks their tables hold
    int64_t in_place_switches_total = 0;  // switches that kept the KV in the GPU pool
    int64_t pressure_switches_total = 0;  // dense -> sparse switches made by the pressure policy
    int64_t moves_started_total = 0;      // in-place requests that began moving to the host
    // Prefix caching in the host store (local host-home requests): blocks switches took from
    // the cache (not copied, not summarised), blocks ended requests gave it, its blocks now.
    int64_t host_prefix_adopted_blocks_total = 0;
    int64_t host_prefix_given_blocks_total = 0;
    int64_t host_prefix_blocks = 0;
    int64_t moves_total = 0;             // ... and finished (their GPU blocks freed)
    int64_t move_bytes_total = 0;        // K/V bytes copied GPU -> host by moves
    double move_seconds_total = 0;       // engine-loop time spent issuing moves
    double move_copy_seconds_total = 0;  // device time of their background copies
    int64_t steps_total = 0;             // engine steps that ran sparse sequences
    int64_t seq_steps_total = 0;         // sum of sparse sequences over those steps
    int64_t hits_total = 0;              // predicted blocks already resident (per layer and head)
    int64_t misses_total = 0;            // predicted blocks not resident
    int64_t blocks_fetched_total = 0;    // misses fetched host -> GPU (<= C per head per step)
    int64_t h2d_bytes_total = 0;         // their bytes (K and V)
    double transfer_wait_seconds_total = 0;  // attention waiting on transfers (CUDA)
    // Per-layer fetch caps in use (blocks per KV head per step; 0 = dense layer): C everywhere
    // with --sparse-budget fixed, the controller's with adaptive (docs/sparse.md §13).
    std::vector<int32_t> fetch_caps;
    int64_t fetch_budget_backoffs_total = 0;  // adaptive: intervals that halved every cap
    std::vector<int64_t> agree_overlap;  // [num_layers] sampled |predicted top-K & actual top-K|
    std::vector<int64_t> agree_total;    // [num_layers] sampled |actual top-K|
    // [num_layers] sampled at the same steps: blocks fetched for the step that are in its real
    // top-K when attention reads them, and blocks fetched (docs/sparse.md §13).
    std::vector<int64_t> fetch_used;
    std::vector<int64_t> fetch_sampled;
    double host_kv_usage() const {
      return num_host_kv_slots > 0
                 ? 1.0 - static_cast<double>(num_free_host_kv_slots) / num_host_kv_slots
                 : 0.0;
    }
    double hit_rate() const {
      const int64_t n = hits_total + misses_total;
      return n > 0 ? static_cast<double>(hits_total) / n : 0.0;
    }
    double fetched_per_step() const {
      return steps_total > 0 ? static_cast<double>(blocks_fetched_total) / steps_total : 0.0;
    }
    double misses_per_step() const {
      return steps_total > 0 ? static_cast<double>(misses_total) / steps_total : 0.0;
    }
    double h2d_bytes_per_step() const {
      return steps_total > 0 ? static_cast<double>(h2d_bytes_total) / steps_total : 0.0;
    }
    // Sampled top-K agreement of the prediction with the real query's top-K: all layers, or
    // one layer (0 before any sample).
    double topk_agreement() const;
    double topk_agreement(size_t layer) const;
  };
  // Disaggregation (docs/disaggregation.md §7).
  struct Disagg {
    // Prefill side: requests handed off, the bytes staged for them (KV, summaries, draft KV)
    // and the handoff's own time on the loop.
    int64_t handoffs_total = 0;
    int64_t handoff_staged_bytes_total = 0;
    double handoff_seconds_total = 0.0;
    // Decode side: imported requests, the bytes fetched at admission (KV, summaries, draft KV),
    // the fetch time, the imports queued or fetching now, failed imports; and the host KV the
    // imported requests hold (reserved head-blocks, in bytes) now.
    int64_t imports_total = 0;
    int64_t import_admission_bytes_total = 0;
    double import_fetch_seconds_total = 0.0;
    int64_t num_importing = 0;
    int64_t import_failures_total = 0;
    // Decode side, partial mode: blocks select wanted that were still remote, fetched after the
    // step (each once), their bytes, the fetch calls and their time.
    int64_t drift_blocks_total = 0;
    int64_t drift_bytes_total = 0;
    int64_t drift_fetches_total = 0;
    double drift_fetch_seconds_total = 0.0;
    int64_t drift_blocks_dropped_total = 0;  // arrived with no free host slot: still remote
    // Decode side: host KV (host slots, in bytes) the imported requests hold now, its peak
    // since start, and the sum over finished imports of what each held at its end (its
    // largest: a request's host KV only grows); remote blocks on summary-only rows hold none.
    int64_t import_host_kv_bytes = 0;
    int64_t import_host_kv_bytes_peak = 0;
    int64_t import_host_kv_bytes_finished_total = 0;
    int64_t imports_finished_total = 0;
    int64_t num_summary_rows =
        0;  // summary-only rows of the host store, all layers (--remote-kv-gib)
    int64_t num_free_summary_rows = 0;
    // Decode side's prefix cache (kvcache/store_prefix_cache.h): imports that looked up their
    // prompt, the prompt tokens of the leading blocks they took from it (not fetched), the
    // head-block cells taken and the ones ended imports gave it, the cache's blocks (those
    // running imports hold among them) and cells now, its evictions.
    int64_t import_prefix_queries_total = 0;
    int64_t import_prefix_hit_tokens_total = 0;
    int64_t import_prefix_cells_adopted_total = 0;
    int64_t import_prefix_cells_cached_total = 0;
    int64_t import_prefix_blocks = 0;
    int64_t import_prefix_held_blocks = 0;
    int64_t import_prefix_cells = 0;
    int64_t import_prefix_evictions_total = 0;
    int64_t import_prefix_mismatches_total = 0;        // prompt hashes differ from the ticket's
    int64_t import_prefix_blocks_published_total = 0;  // shared as soon as their fetch landed
  };

  Requests requests;
  Kv kv;
  Loop loop;
  Lookahead lookahead;
  Sparse sparse;
  Disagg disagg;
  // Cumulative latency histograms (seconds) since start.
  LatencyHistogram ttft, itl, e2e;
  // Per finished request, as vLLM's request-level histograms: queue (arrival to first
  // scheduled), prefill (first scheduled to first token), decode (first to last token),
  // inference (first scheduled to last token), in seconds; prompt and generated tokens.
  struct PerRequest {
    Histogram queue_seconds, prefill_seconds, decode_seconds, inference_seconds;
    Histogram prompt_tokens, generation_tokens;
  };
  PerRequest per_request;
};

// How many requests of one length the KV can hold at once (start-up log, --check-config): dense
// (each whole in the GPU pool) and, with sparse KV, sparse (in place in the pool plus in the
// host store, each host-home one with its working set and tails in the pool, within the sparse
// rows). Both at most max_num_seqs.
struct KvCapacity {
  int64_t tokens = 0;
  int64_t dense = 0;
  int64_t sparse = 0;  // = hbm + host; 0 without sparse KV
  int64_t hbm = 0, host = 0;
};

class Engine {
 public:
  // `runner` (and `tok`, `draft`, when given) must outlive the engine. `tok` may be null:
  // then requests must set detokenize = false and have no stop strings. `draft` runs the
  // EAGLE-3 head of lookahead decoding; the options must pass CheckOptions (a CHECK).
  Engine(ModelRunner& runner, const tokenizer::Tokenizer* tok, EngineOptions options,
         DraftRunner* draft = nullptr);

  // Whether `options` work with `runner` and `draft`: lookahead without a draft runner, a
  // head that does not fit the target (hidden size, aux layer ids) or a head KV pool
  // holding fewer tokens than the target's are InvalidArgument, naming the values.
  // Sparse KV: an invalid SparseConfig, the draft predictor without lookahead and a draft
  // runner, a threshold below one block, a pool smaller than one working set ((K+2)*Hkv
  // head-blocks) or a host store too small for one request past the threshold. Prefix
  // caching with sparse KV, lookahead, a handoff exporter or more than one rank (not yet).
  static Status CheckOptions(const EngineOptions& options, const ModelRunner& runner,
                             const DraftRunner* draft);
  ~Engine();  // Stop()s

  void Start();  // starts the loop thread
  void Stop();   // aborts every live request (kAbort), joins the thread

  // Validates (empty prompt, ids outside the vocabulary, prompt length + max_tokens beyond
  // the context (InvalidArgument / OutOfRange naming the numbers), bad sampling values,
  // more KV than the whole pool, duplicate id) and enqueues. The stream's first event
  // comes after the first token.
  StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request);
  // Submit for a request's sequences together (prompts x n): all are queued, or none — any
  // refusal (one invalid, the waiting queue without room for all of them) queues nothing, so a
  // refused request never takes queue places from others.
  StatusOr<std::vector<std::shared_ptr<RequestStream>>> SubmitGroup(
      std::vector<EngineRequest> requests);
  // Sparse KV: ResourceExhausted (naming the sizes and --host-kv-gib) when a request with
  // this prompt length and max_tokens (-1: the rest of the context) could never fit the
  // host KV store; OK when it can, or when sparse KV is off. Submit refuses such requests
  // with the same error; front ends call it first to answer them as "too large" (HTTP 413).
  Status CheckHostKvRoom(int64_t prompt_tokens, int64_t max_tokens) const;
  // Aborts a live request (no-op for unknown ids): it finishes with kAbort and its KV
  // blocks go back to the pool within one step.
  void Abort(const std::string& id);

  EngineStats Stats() const;
  KvCapacity CapacityAt(int64_t tokens) const;
  const ModelConfig& model_config() const;
  const EngineOptions& options() const;
  // Prompt + generated tokens one request may reach: the model's context length, or less when
  // the KV pool is smaller. Requests with max_tokens = -1 stop ("length") there.
  int64_t max_context_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oasis

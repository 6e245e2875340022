// RequestState: everything the engine loop keeps about one live request — the validated
// request, its output stream, its scheduling state (Sequence: tokens, KV blocks), its stop
// checker and detokenizer, its draft-head state (lookahead), its resolved seed and its
// latency timestamps.
//
// Built by Submit on a front-end thread, then handed to the engine loop through the queue;
// from then on owned and touched only by the engine loop thread. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>

#include "disagg/kv_import.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "engine/stop_checker.h"

namespace oasis {

using EngineClock = std::chrono::steady_clock;

struct RequestState {
  RequestState(uint64_t key, EngineRequest req, StopConditions stop,
               const tokenizer::Tokenizer* tok, int32_t num_kv_heads, int32_t draft_kv_heads)
      : request(std::move(req)),
        stream(std::make_shared<RequestStream>(request.id)),
        seq(key, request.prompt, num_kv_heads),
        stop_checker(std::move(stop), request.detokenize ? tok : nullptr),
        draft_head(draft_kv_heads) {}

  EngineRequest request;
  std::shared_ptr<RequestStream> stream;
  Sequence seq;
  StopChecker stop_checker;
  DraftHeadState draft_head;  // lookahead decoding: the head's KV of this request
  uint64_t seed = 0;          // resolved: the request's, or one drawn by the engine
  // Penalties, logit_bias, masks (LogitsProcessing::For at Submit); null: none.
  std::shared_ptr<const LogitsProcessing> logits_processing;
  // request.sampling without its token lists (logits_processing holds them): what each step's
  // SampleRow copies.
  SamplingParams row_sampling;
  int64_t prompt_tokens_counted = 0;  // prompt positions counted in prompt_tokens_total
  // request.prompt_logprobs >= 0: entry p for prompt token p + 1, filled as the prefill chunks
  // run, handed to the first event (then prompt_logprobs_sent; a recomputation after a
  // preemption asks for none).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  EngineClock::time_point arrival = EngineClock::now();
  std::optional<EngineClock::time_point> first_scheduled;  // unset until it first runs
  std::optional<EngineClock::time_point> first_token_time;
  std::optional<EngineClock::time_point> last_token_time;  // unset until the first token
  // Disaggregation. Prefill side: x1's and x2's sampling results (the ticket carries them).
  std::vector<HandoffSampling::Token> handoff_tokens;
  // Decode side: where an imported request is before it runs (then kNone: in the scheduler).
  enum class ImportPhase { kNone, kQueued, kFetching };
  ImportPhase import_phase = ImportPhase::kNone;
  bool abort_after_fetch = false;  // aborted while its fetch was in flight
  bool import_released = false;    // KvImportSource::Release called
  // Parsed once when queued: the ticket's sampling state and its staged layout.
  HandoffSampling import_sampling;
  std::optional<disagg::StagedKvLayout> import_layout;
  // Drift (partial mode): remote blocks asked for so far, as (layer, head, block) keys; the
  // generation names this import (a preemption ends it: results of older fetches are dropped).
  std::unordered_set<uint64_t> drift_requested;
  uint64_t import_generation = 0;
  // Decode side's prefix cache (kvcache/store_prefix_cache.h): the chain hashes of the full
  // prompt blocks (computed when queued), and the leading blocks taken from the cache.
  std::vector<uint64_t> import_block_hashes;
  disagg::AdoptedPrefix import_adopted;
  // From admission until its fetch lands: its prompt blocks from this one on are in flight
  // (Engine::Impl::pending_import_blocks); -1 otherwise.
  int64_t import_pending_from = -1;
  // Local host-home sparse requests: whether the switch looked up the host-store prefix cache.
  bool host_prefix_tried = false;
};

}  // namespace oasis

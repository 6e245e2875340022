#include "engine/request_validation.h"

#include <cstdio>
#include <string>

#include "kvcache/host_kv_store.h"
#include "kvcache/host_prefix_tier.h"
#include "kvcache/sparse_kv_manager.h"
#include "runner/sampler.h"

namespace oasis {

Status ValidateRequest(const EngineRequest& r, const ModelConfig& config, bool has_tokenizer,
                       int64_t num_kv_slots, int32_t num_kv_heads) {
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  if (r.id.empty()) return InvalidArgument("the request id is empty");
  if (r.prompt.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= config.vocab_size) {
      return InvalidArgument("prompt token id " + std::to_string(id) +
                             " outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                             ")");
    }
  }
  if (r.max_tokens != -1 && r.max_tokens < 1) {
    return InvalidArgument("max_tokens must be >= 1 (or -1 for the rest of the context), got " +
                           std::to_string(r.max_tokens));
  }
  if (r.min_tokens < 0)
    return InvalidArgument("min_tokens must be >= 0, got " + std::to_string(r.min_tokens));
  if (r.max_tokens != -1 && r.min_tokens > r.max_tokens) {
    return InvalidArgument("min_tokens (" + std::to_string(r.min_tokens) +
                           ") exceeds max_tokens (" + std::to_string(r.max_tokens) + ")");
  }
  if (r.num_top_logprobs < 0 || r.num_top_logprobs > kMaxTopLogprobs) {
    return InvalidArgument("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                           "], got " + std::to_string(r.num_top_logprobs));
  }
  for (int32_t id : r.forced_output) {
    if (id < 0 || id >= config.vocab_size) {
      return InvalidArgument("forced output token id " + std::to_string(id) +
                             " outside the vocabulary [0, " + std::to_string(config.vocab_size) +
                             ")");
    }
  }
  if (!r.forced_output.empty() && (r.handoff || r.import != nullptr)) {
    return InvalidArgument(
        "forced output tokens are not supported with disaggregated prefill/decode");
  }
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxTopLogprobs) {
    return InvalidArgument("prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                           "] (or -1: off), got " + std::to_string(r.prompt_logprobs));
  }
  if (r.prompt_logprobs >= 0 && (r.handoff || r.import != nullptr)) {
    return InvalidArgument("prompt logprobs are not supported with disaggregated prefill/decode");
  }
  OASIS_RETURN_IF_ERROR(r.sampling.Validate(config.vocab_size));
  if (r.detokenize && !has_tokenizer)
    return InvalidArgument("detokenize needs a tokenizer; the engine has none");
  if (!r.stop.empty() && (!has_tokenizer || !r.detokenize)) {
    return InvalidArgument(
        "stop strings need detokenized output (a tokenizer and detokenize = true)");
  }
  for (const std::string& s : r.stop) {
    if (s.empty()) return InvalidArgument("a stop string is empty");
  }
  // Compared as "max_tokens > room" so that huge max_tokens values cannot overflow.
  const int64_t ctx = config.max_position_embeddings;
  if (r.max_tokens != -1 && ctx > 0 && r.max_tokens > ctx - P) {
    return OutOfRange("prompt (" + std::to_string(P) + " tokens) + max_tokens (" +
                      std::to_string(r.max_tokens) + ") exceeds the context length " +
                      std::to_string(ctx));
  }
  if (r.max_tokens == -1 && ctx > 0 && P >= ctx) {
    return OutOfRange("prompt (" + std::to_string(P) +
                      " tokens) leaves no room in the context length " + std::to_string(ctx));
  }
  if (r.max_tokens == -1 && ctx > 0 && r.min_tokens > ctx - P) {
    return InvalidArgument("min_tokens (" + std::to_string(r.min_tokens) +
                           ") exceeds the room the prompt leaves in the context (" +
                           std::to_string(ctx - P) + " tokens)");
  }
  // The whole pool holds pool_tokens tokens of one sequence (all heads dense). A request that
  // needs more can never run, however long it waits: InvalidArgument (a 400, not a retryable
  // 429).
  const int64_t pool_tokens = num_kv_slots / num_kv_heads * kBlockSize;
  const int64_t needed = r.max_tokens == -1 ? 1 : r.max_tokens;
  if (needed > pool_tokens - P) {
    const std::string what = r.max_tokens == -1
                                 ? "the prompt (" + std::to_string(P) + " tokens) and a token"
                                 : "the prompt (" + std::to_string(P) + " tokens) + max_tokens (" +
                                       std::to_string(needed) + ")";
    return InvalidArgument(what + " need more KV cache than the server's whole pool holds (" +
                           std::to_string(num_kv_slots) +
                           " head-blocks = " + std::to_string(pool_tokens) + " tokens of " +
                           std::to_string(num_kv_heads) +
                           " KV heads), so the request can never run: lower max_tokens or the "
                           "prompt");
  }
  return Status::Ok();
}

namespace {

Status CheckLookaheadOptions(const EngineOptions& options, const ModelRunner& runner,
                             const DraftRunner* draft) {
  if (options.num_speculative_tokens < 1 || options.num_speculative_tokens > kMaxDraftTokens) {
    return InvalidArgument("--num-speculative-tokens must be 1 to " +
                           std::to_string(kMaxDraftTokens) + ", got " +
                           std::to_string(options.num_speculative_tokens));
  }
  const SpeculativeDepthRule& r = options.speculative_depth_rule;
  if (options.speculative_depth == SpeculativeDepth::kAdaptive &&
      !(r.acceptance_decay > 0 && r.acceptance_decay <= 1 && r.prior_weight > 0 &&
        r.level_smoothing > 0 && r.level_smoothing <= 1 && r.ratio_smoothing > 0 &&
        r.ratio_smoothing <= 1 && r.explore_interval > 0)) {
    return InvalidArgument(
        "the adaptive speculative depth's rule needs acceptance_decay, level_smoothing and "
        "ratio_smoothing in (0, 1] and prior_weight, explore_interval > 0");
  }
  if (options.lookahead == LookaheadMode::kOff) return Status::Ok();
  const std::string mode = LookaheadModeName(options.lookahead);
  if (draft == nullptr) {
    return InvalidArgument("lookahead mode '" + mode +
                           "' needs an EAGLE-3 draft model (--draft-model)");
  }
  const ModelConfig& t = runner.model().config();
  const ModelConfig& h = draft->head().config();
  if (h.target_hidden_size != t.hidden_size) {
    return InvalidArgument("the EAGLE-3 draft head expects a target hidden_size of " +
                           std::to_string(h.target_hidden_size) + ", the model's is " +
                           std::to_string(t.hidden_size));
  }
  for (int64_t id : draft->aux_layer_ids()) {
    if (id < 0 || id > t.num_hidden_layers) {
      return InvalidArgument("the EAGLE-3 draft head reads target layer " + std::to_string(id) +
                             ", outside [0, " + std::to_string(t.num_hidden_layers) +
                             "] of the model");
    }
  }
  for (int32_t id : draft->head().draft_to_target()) {
    if (id < 0 || id >= t.vocab_size) {
      return InvalidArgument("the EAGLE-3 draft head maps to target id " + std::to_string(id) +
                             ", outside the model's vocabulary of " + std::to_string(t.vocab_size));
    }
  }
  // Every head table holds at most as many tokens as its target table, so a head pool with
  // as many blocks per KV head as the target's never runs out before the target's does.
  const int64_t heads = t.num_key_value_heads, head_heads = draft->num_kv_heads();
  if (draft->num_kv_slots() * heads < runner.num_kv_slots() * head_heads) {
    return InvalidArgument(
        "the draft head's KV pool (" + std::to_string(draft->num_kv_slots()) + " head-blocks of " +
        std::to_string(head_heads) + " KV heads) holds fewer tokens than the model's (" +
        std::to_string(runner.num_kv_slots()) + " head-blocks of " + std::to_string(heads) +
        " KV heads); it needs at least " +
        std::to_string(DraftKvSlotsFor(runner.num_kv_slots(), heads, head_heads)));
  }
  return Status::Ok();
}

// Sparse KV options against the model, the KV pool and the lookahead setting.
Status CheckSparseOptions(const EngineOptions& options, const ModelRunner& runner,
                          const DraftRunner* draft) {
  if (!options.sparse) return Status::Ok();
  const SparseConfig& s = *options.sparse;
  const ModelConfig& c = runner.model().config();
  OASIS_RETURN_IF_ERROR(s.Validate(c.num_hidden_layers));
  if (s.sparse_threshold < kBlockSize) {
    return InvalidArgument("--sparse-threshold must be at least one block (" +
                           std::to_string(kBlockSize) + " tokens) when sparse KV is on, got " +
                           std::to_string(s.sparse_threshold));
  }
  if (s.predictor == SparsePredictor::kDraft &&
      (options.lookahead == LookaheadMode::kOff || draft == nullptr)) {
    return InvalidArgument(
        "--sparse-predictor draft needs lookahead decoding with an EAGLE-3 draft head "
        "(--draft-model, "
        "--lookahead reject or speculate); use previous-query without one");
  }
  if (options.sparse_metrics_interval < 1)
    return InvalidArgument("the sparse metrics interval must be at least 1");
  // One working set: K working slots + 2 tail slots per KV head, from the same pool.
  const int64_t hkv = c.num_key_value_heads,
                per_request = (static_cast<int64_t>(s.topk_blocks) + 2) * hkv;
  if (per_request > runner.num_kv_slots()) {
    return InvalidArgument("--topk-blocks " + std::to_string(s.topk_blocks) + " needs " +
                           std::to_string(per_request) +
                           " KV head-blocks per sparse request ((K + 2) x " + std::to_string(hkv) +
                           " KV heads); the pool has " + std::to_string(runner.num_kv_slots()));
  }
  // The host store must hold at least one request just past the threshold.
  const DType dtype = KvCacheDtype(runner.backend(), c.kv_cache_fp8);
  const size_t per_slot =
      HostKvStore::BytesPerSlot(c.num_hidden_layers - s.dense_layers, c.head_dim, dtype);
  const HostKvSlots host =
      HostKvSlotsFor(s, {c.num_hidden_layers, hkv, c.head_dim}, dtype, runner.num_ranks());
  const int64_t need = (s.sparse_threshold + 1 + kBlockSize - 1) / kBlockSize * hkv;
  if (host.slots < need && s.home != KvHome::kHbm) {
    return InvalidArgument(
        "--host-kv-gib " + std::to_string(s.host_kv_gib) + " holds " + std::to_string(host.slots) +
        " head-blocks" + (runner.num_ranks() > 1 ? " per rank" : "") +
        "; one request past --sparse-threshold " + std::to_string(s.sparse_threshold) + " needs " +
        std::to_string(need) + " (" + std::to_string(per_slot) + " bytes each)");
  }
  // The draft head keeps every running request's tokens whatever the home of its target KV, so
  // its pool holds as many tokens as the target pool and the host store together.
  if (draft != nullptr && options.lookahead != LookaheadMode::kOff) {
    const int64_t head_heads = draft->num_kv_heads();
    const int64_t want = DraftKvSlotsFor(runner.num_kv_slots() + host.total(), hkv, head_heads);
    if (draft->num_kv_slots() < want) {
      return InvalidArgument(
          "the draft head's KV pool (" + std::to_string(draft->num_kv_slots()) +
          " head-blocks) cannot hold the tokens of the KV pool (" +
          std::to_string(runner.num_kv_slots()) + " head-blocks) and the host KV store (" +
          std::to_string(host.total()) + " head-blocks, --host-kv-gib) together; it needs " +
          std::to_string(want));
    }
  }
  return Status::Ok();
}

Status CheckPrefixCacheHostTier(const EngineOptions& o, const ModelRunner& r) {
  if (o.prefix_cache_host_bytes == 0) return Status::Ok();
  if (!(o.prefix_cache_host_bytes > 0))
    return InvalidArgument("the prefix cache's host tier size must not be negative");
  if (!o.enable_prefix_caching)
    return InvalidArgument("a host tier for the prefix cache needs prefix caching on");
  // Under tensor parallelism the model's config has one rank's heads; a block spans every rank.
  const ModelConfig& m = r.model().config();
  const size_t per_block = HostPrefixTier::BytesPerSlot(m.num_hidden_layers, m.head_dim,
                                                        KvCacheDtype(r.backend(), m.kv_cache_fp8)) *
                           static_cast<size_t>(m.num_key_value_heads) *
                           static_cast<size_t>(r.num_ranks());
  if (o.prefix_cache_host_bytes < static_cast<double>(per_block)) {
    char msg[200];
    std::snprintf(msg, sizeof msg,
                  "the prefix cache's host tier of %.0f bytes holds no block (one block of %d "
                  "tokens takes %zu bytes)",
                  o.prefix_cache_host_bytes, kBlockSize, per_block);
    return InvalidArgument(msg);
  }
  return Status::Ok();
}

}  // namespace

Status Engine::CheckOptions(const EngineOptions& options, const ModelRunner& runner,
                            const DraftRunner* draft) {
  OASIS_RETURN_IF_ERROR(CheckLookaheadOptions(options, runner, draft));
  OASIS_RETURN_IF_ERROR(CheckPrefixCacheHostTier(options, runner));
  return CheckSparseOptions(options, runner, draft);
}

}  // namespace oasis

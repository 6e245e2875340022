// The engine's /metrics: one row per metric of EngineStats (names like vLLM's, prefix "oasis:").
#include <string>
#include <vector>

#include "common/http_util.h"
#include "server/metric_table.h"
#include "server/metrics.h"

namespace oasis::server {
namespace {

using Row = MetricRow<EngineStats>;
using Samples = std::vector<MetricSample>;
constexpr MetricType kGauge = MetricType::kGauge;
constexpr MetricType kCounter = MetricType::kCounter;

// Where the engine loop's time goes (seconds summed over steps), by phase.
Samples PhaseSeconds(const EngineStats& st) {
  const std::pair<const char*, double> phases[] = {
      {"step", st.loop.step_seconds_total},       {"schedule", st.loop.schedule_seconds_total},
      {"build", st.loop.build_seconds_total},     {"model", st.loop.model_step_seconds_total},
      {"emit", st.loop.emit_seconds_total},       {"draft", st.loop.draft_step_seconds_total},
      {"imports", st.loop.imports_seconds_total}, {"drift", st.loop.drift_seconds_total},
      {"publish", st.loop.publish_seconds_total}};
  Samples out;
  for (const auto& [phase, seconds] : phases)
    out.push_back({"phase=\"" + std::string(phase) + "\"", seconds});
  return out;
}

// Per sparse layer with sampled agreement (dense layers, or nothing sampled yet, left out).
template <class Value>
Samples PerSampledLayer(const EngineStats& st, Value value) {
  Samples out;
  for (size_t l = 0; l < st.sparse.agree_total.size(); ++l) {
    if (st.sparse.agree_total[l] == 0) continue;
    out.push_back({"layer=\"" + std::to_string(l) + "\"", value(l)});
  }
  return out;
}

// Speculative decoding split by the request's KV (dense, sparse).
Samples StepsByKv(const EngineStats& st) {
  const auto& la = st.lookahead;
  return {{"kv=\"dense\"", static_cast<double>(la.steps_total - la.sparse_steps_total)},
          {"kv=\"sparse\"", static_cast<double>(la.sparse_steps_total)}};
}
Samples TokensByKv(const EngineStats& st) {
  const auto& la = st.lookahead;
  return {{"kv=\"dense\"", static_cast<double>(la.tokens_total - la.sparse_tokens_total)},
          {"kv=\"sparse\"", static_cast<double>(la.sparse_tokens_total)}};
}
Samples TokensPerStepByKv(const EngineStats& st) {
  return {{"kv=\"dense\"", st.lookahead.dense_tokens_per_step()},
          {"kv=\"sparse\"", st.lookahead.sparse_tokens_per_step()}};
}

// By position in the draft chain (vLLM: spec_decode_num_accepted_tokens_per_pos).
template <class Counts>
Samples PerDraftPosition(const Counts& counts) {
  Samples out;
  for (size_t j = 0; j < counts.size(); ++j)
    out.push_back({"position=\"" + std::to_string(j) + "\"", static_cast<double>(counts[j])});
  return out;
}

// Speculate steps by the chain depth chosen (depth="1".."4").
Samples ChainDepthSteps(const EngineStats& st) {
  Samples out;
  const auto& steps = st.lookahead.depth_steps_total;
  for (size_t d = 0; d < steps.size(); ++d)
    out.push_back({"depth=\"" + std::to_string(d + 1) + "\"", static_cast<double>(steps[d])});
  return out;
}

Samples FinishedByReason(const EngineStats& st) {
  return {{"finished_reason=\"stop\"", st.requests.stop_total},
          {"finished_reason=\"length\"", st.requests.length_total},
          {"finished_reason=\"abort\"", st.requests.abort_total},
          {"finished_reason=\"error\"", st.requests.error_total}};
}

// clang-format off
constexpr Row kEngineMetrics[] = {
    {"oasis:num_requests_running", kGauge, "Requests in the running batch.",
     [](const EngineStats& s) -> double { return s.requests.num_running; }},
    {"oasis:num_requests_waiting", kGauge, "Requests waiting to be scheduled.",
     [](const EngineStats& s) -> double { return s.requests.num_waiting; }},
    {"oasis:kv_cache_usage_perc", kGauge, "Fraction of KV cache head-blocks in use (1 = 100%).",
     [](const EngineStats& s) -> double { return s.kv.usage; }},
    {"oasis:num_kv_blocks", kGauge, "KV cache head-blocks per layer.",
     [](const EngineStats& s) -> double { return s.kv.num_slots; }},
    {"oasis:num_free_kv_blocks", kGauge, "Free KV cache head-blocks per layer.",
     [](const EngineStats& s) -> double { return s.kv.num_free_slots; }},
    {"oasis:num_cached_free_kv_blocks", kGauge,
     "Free KV cache head-blocks held by the prefix cache (evicted when needed).",
     [](const EngineStats& s) -> double { return s.kv.num_cached_free_slots; }},
    {"oasis:prefix_cache_queries_total", kCounter, "Prompt tokens looked up in the prefix cache.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_queries_total; }},
    {"oasis:prefix_cache_hits_total", kCounter, "Prompt tokens found in the prefix cache.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_hits_total; }},
    {"oasis:prefix_cache_evictions_total", kCounter, "Cached KV blocks evicted from the prefix cache.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_evictions_total; }},
    {"oasis:prefix_cache_host_hits_total", kCounter,
     "Prompt tokens reloaded from the prefix cache's host tier (also in prefix_cache_hits).",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_hits_total; }},
    {"oasis:prefix_cache_host_spilled_bytes_total", kCounter,
     "Bytes of evicted cached KV blocks copied to the prefix cache's host tier.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_spilled_bytes_total; }},
    {"oasis:prefix_cache_host_reloaded_bytes_total", kCounter,
     "Bytes of KV blocks reloaded from the prefix cache's host tier into the GPU pool.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_reloaded_bytes_total; }},
    {"oasis:prefix_cache_host_evictions_total", kCounter,
     "Blocks evicted from the prefix cache's host tier.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_evictions_total; }},
    {"oasis:prefix_cache_host_blocks", kGauge, "Blocks held in the prefix cache's host tier.",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_blocks; }},
    {"oasis:prefix_cache_host_capacity_blocks", kGauge,
     "Blocks the prefix cache's host tier can hold (0: no host tier).",
     [](const EngineStats& s) -> double { return s.kv.prefix_cache_host_capacity_blocks; }},
    {"oasis:prompt_tokens_total", kCounter, "Prefilled prompt tokens.",
     [](const EngineStats& s) -> double { return s.requests.prompt_tokens_total; }},
    {"oasis:generation_tokens_total", kCounter, "Generated tokens.",
     [](const EngineStats& s) -> double { return s.requests.generation_tokens_total; }},
    {"oasis:num_preemptions_total", kCounter, "Requests preempted (recomputed later).",
     [](const EngineStats& s) -> double { return s.requests.preemptions_total; }},
    {"oasis:engine_steps_total", kCounter, "Engine steps executed.",
     [](const EngineStats& s) -> double { return s.loop.steps_total; }},
    {"oasis:engine_phase_seconds_total", kCounter,
     "Engine loop wall time by phase: the whole step, scheduling, building the batch, the model step (forward + "
     "sampling), emitting, the draft head; outside the step, imports (decode side), handing remote misses to the "
     "drift worker, the stats snapshot and output delivery.",
     PhaseSeconds},
    {"oasis:engine_decode_steps_total", kCounter, "Engine steps whose batch held decode tokens only.",
     [](const EngineStats& s) -> double { return s.loop.decode_steps_total; }},
    {"oasis:engine_decode_step_seconds_total", kCounter, "Wall time of the decode-only steps.",
     [](const EngineStats& s) -> double { return s.loop.decode_step_seconds_total; }},
    {"oasis:engine_decode_model_step_seconds_total", kCounter,
     "Model part (forward + sampling) of the decode-only steps.",
     [](const EngineStats& s) -> double { return s.loop.decode_model_step_seconds_total; }},

    // Lookahead decoding (EAGLE-3 drafts); zero when it is off.
    {"oasis:num_draft_kv_blocks", kGauge, "Draft head KV cache head-blocks.",
     [](const EngineStats& s) -> double { return s.kv.num_draft_slots; }},
    {"oasis:num_free_draft_kv_blocks", kGauge, "Free draft head KV cache head-blocks.",
     [](const EngineStats& s) -> double { return s.kv.num_free_draft_slots; }},
    {"oasis:spec_decode_num_proposed_tokens_total", kCounter, "Draft tokens the draft head proposed.",
     [](const EngineStats& s) -> double { return s.lookahead.draft_tokens_proposed_total; }},
    {"oasis:draft_head_chained_steps_total", kCounter,
     "Draft head steps queued on the device behind the target's step (lookahead reject).",
     [](const EngineStats& s) -> double { return s.lookahead.draft_chained_steps_total; }},
    {"oasis:spec_decode_num_draft_tokens_total", kCounter, "Draft tokens verified by the model.",
     [](const EngineStats& s) -> double { return s.lookahead.draft_tokens_total; }},
    {"oasis:spec_decode_num_accepted_tokens_total", kCounter,
     "Verified draft tokens equal to the sampled token (emitted with --lookahead speculate).",
     [](const EngineStats& s) -> double { return s.lookahead.draft_accepted_total; }},
    {"oasis:spec_decode_draft_acceptance_rate", kGauge, "Accepted / verified draft tokens.",
     [](const EngineStats& s) -> double { return s.lookahead.acceptance_rate(); }},
    {"oasis:spec_decode_num_steps_total", kCounter, "Request decode steps that verified a draft.",
     [](const EngineStats& s) -> double { return s.lookahead.steps_total; }},
    {"oasis:spec_decode_num_emitted_tokens_total", kCounter,
     "Tokens emitted by request decode steps that verified a draft.",
     [](const EngineStats& s) -> double { return s.lookahead.tokens_total; }},
    {"oasis:spec_decode_tokens_per_step", kGauge,
     "Mean tokens emitted per request decode step that verified a draft.",
     [](const EngineStats& s) -> double { return s.lookahead.tokens_per_step(); }},
    {"oasis:spec_decode_num_steps_by_kv_total", kCounter,
     "Request decode steps that verified drafts, by where the request's KV is (dense or sparse).",
     StepsByKv},
    {"oasis:spec_decode_num_emitted_tokens_by_kv_total", kCounter,
     "Tokens emitted by those steps, by the request's KV (dense or sparse).", TokensByKv},
    {"oasis:spec_decode_tokens_per_step_by_kv", kGauge,
     "Mean tokens emitted per request decode step that verified drafts, dense and sparse requests "
     "apart.",
     TokensPerStepByKv},
    {"oasis:spec_decode_num_draft_tokens_per_pos", kCounter,
     "Drafts verified by their position in the chain (0 = right after the real token; position j "
     "is verified when drafts 0..j-1 were accepted).",
     [](const EngineStats& s) { return PerDraftPosition(s.lookahead.position_drafts_total); }},
    {"oasis:spec_decode_num_accepted_tokens_per_pos", kCounter,
     "Drafts accepted by their position in the chain.",
     [](const EngineStats& s) { return PerDraftPosition(s.lookahead.position_accepted_total); }},
    {"oasis:spec_decode_chain_depth_steps_total", kCounter,
     "Engine steps whose draft head proposed chains, by the chain depth chosen for them "
     "(--speculative-depth fixed: always --num-speculative-tokens; adaptive: the controller's).",
     ChainDepthSteps},
    {"oasis:spec_decode_chain_depth_explorations_total", kCounter,
     "Of those steps, the adaptive depth's explorations (a depth other than its best estimate).",
     [](const EngineStats& s) -> double { return s.lookahead.depth_explorations_total; }},
    {"oasis:spec_decode_chain_depth", kGauge, "The chain depth chosen at the last such step.",
     [](const EngineStats& s) -> double { return s.lookahead.depth; }},

    // Lookahead sparse KV (docs/sparse.md); zero when it is off.
    {"oasis:sparse_requests", kGauge, "Running requests decoding with sparse KV.",
     [](const EngineStats& s) -> double { return s.sparse.num_requests; }},
    {"oasis:sparse_switches_total", kCounter, "Requests switched from dense to sparse KV.",
     [](const EngineStats& s) -> double { return s.sparse.switches_total; }},
    {"oasis:sparse_admission_waits_total", kCounter,
     "Admissions (first or after a preemption) that had to wait for host KV store room.",
     [](const EngineStats& s) -> double { return s.sparse.admission_waits_total; }},
    {"oasis:kv_cache_dtype_info", kGauge,
     "The KV cache's element type (--kv-cache-dtype): 1 for the dtype label in use.",
     [](const EngineStats& s) -> std::vector<MetricSample> {
       return {{"dtype=\"" + s.kv.dtype + "\"", 1.0}};
     }},
    {"oasis:host_kv_usage", kGauge, "Fraction of the host KV store reserved by requests (1 = 100%).",
     [](const EngineStats& s) -> double { return s.sparse.host_kv_usage(); }},
    {"oasis:num_host_kv_blocks", kGauge, "Host KV store head-blocks (each holds every sparse layer).",
     [](const EngineStats& s) -> double { return s.sparse.num_host_kv_slots; }},
    {"oasis:num_free_host_kv_blocks", kGauge, "Free host KV store head-blocks.",
     [](const EngineStats& s) -> double { return s.sparse.num_free_host_kv_slots; }},
    {"oasis:kv_home_requests", kGauge,
     "Sparse requests by where their full KV lives: the GPU pool (read in place) or the host "
     "KV store.",
     [](const EngineStats& s) -> std::vector<MetricSample> {
       return {{"home=\"hbm\"", s.sparse.num_in_place},
               {"home=\"host\"", s.sparse.num_requests - s.sparse.num_in_place}};
     }},
    {"oasis:kv_home_blocks", kGauge,
     "KV head-blocks (every layer) of sparse requests by home: the GPU pool blocks their "
     "tables hold in place, and the host KV store head-blocks reserved by requests.",
     [](const EngineStats& s) -> std::vector<MetricSample> {
       return {{"home=\"hbm\"", s.sparse.in_place_blocks},
               {"home=\"host\"", s.sparse.num_host_kv_slots - s.sparse.num_free_host_kv_slots}};
     }},
    {"oasis:kv_home_switches_total", kCounter,
     "Dense -> sparse switches by the home of the request's KV: the GPU pool or the host store.",
     [](const EngineStats& s) -> std::vector<MetricSample> {
       return {{"home=\"hbm\"", s.sparse.in_place_switches_total},
               {"home=\"host\"", s.sparse.switches_total - s.sparse.in_place_switches_total}};
     }},
    {"oasis:kv_moves_total", kCounter,
     "Sparse requests moved from the GPU pool to the host KV store, by stage: begun (copying "
     "while they decode) and done (their GPU blocks back in the pool).",
     [](const EngineStats& s) -> std::vector<MetricSample> {
       return {{"stage=\"begun\"", s.sparse.moves_started_total},
               {"stage=\"done\"", s.sparse.moves_total}};
     }},
    {"oasis:sparse_pressure_switches_total", kCounter,
     "Requests the pressure policy switched to sparse (host store) when the GPU pool ran short.",
     [](const EngineStats& s) -> double { return s.sparse.pressure_switches_total; }},
    {"oasis:kv_move_bytes_total", kCounter, "K/V bytes moves copied from the GPU pool to the host.",
     [](const EngineStats& s) -> double { return static_cast<double>(s.sparse.move_bytes_total); }},
    {"oasis:kv_move_seconds_total", kCounter, "Engine-loop seconds spent issuing moves.",
     [](const EngineStats& s) -> double { return s.sparse.move_seconds_total; }},
    {"oasis:kv_move_copy_seconds_total", kCounter,
     "Device seconds of the moves' copies on the background stream (beside the steps).",
     [](const EngineStats& s) -> double { return s.sparse.move_copy_seconds_total; }},
    {"oasis:sparse_gpu_kv_blocks", kGauge, "KV head-blocks held as sparse working sets and tails.",
     [](const EngineStats& s) -> double { return s.sparse.gpu_slots; }},
    {"oasis:sparse_steps_total", kCounter, "Engine steps that ran sparse requests.",
     [](const EngineStats& s) -> double { return s.sparse.steps_total; }},
    {"oasis:sparse_hits_total", kCounter, "Predicted blocks already resident (per layer and KV head).",
     [](const EngineStats& s) -> double { return s.sparse.hits_total; }},
    {"oasis:sparse_misses_total", kCounter, "Predicted blocks not resident (per layer and KV head).",
     [](const EngineStats& s) -> double { return s.sparse.misses_total; }},
    {"oasis:sparse_hit_rate", kGauge, "Hits / (hits + misses) of the predicted working sets.",
     [](const EngineStats& s) -> double { return s.sparse.hit_rate(); }},
    {"oasis:sparse_blocks_fetched_total", kCounter,
     "Blocks fetched host to device (at most C per KV head per step).",
     [](const EngineStats& s) -> double { return s.sparse.blocks_fetched_total; }},
    {"oasis:sparse_blocks_fetched_per_step", kGauge, "Blocks fetched per engine step with sparse requests.",
     [](const EngineStats& s) -> double { return s.sparse.fetched_per_step(); }},
    {"oasis:sparse_misses_per_step", kGauge, "Misses per engine step with sparse requests.",
     [](const EngineStats& s) -> double { return s.sparse.misses_per_step(); }},
    {"oasis:sparse_h2d_bytes_total", kCounter, "Bytes fetched host to device (K and V).",
     [](const EngineStats& s) -> double { return s.sparse.h2d_bytes_total; }},
    {"oasis:sparse_h2d_bytes_per_step", kGauge,
     "Bytes fetched host to device per engine step with sparse requests.",
     [](const EngineStats& s) -> double { return s.sparse.h2d_bytes_per_step(); }},
    {"oasis:sparse_transfer_wait_seconds_total", kCounter,
     "Time sparse steps' ends waited for the transfers, predict and select the step did not hide (CUDA).",
     [](const EngineStats& s) -> double { return s.sparse.transfer_wait_seconds_total; }},
    {"oasis:sparse_fetch_cap", kGauge,
     "Fetch cap in use per sparse layer: blocks a KV head may fetch per step (C with "
     "--sparse-budget fixed; the adaptive controller's cap in [1, C] with adaptive).",
     [](const EngineStats& s) {
       Samples out;
       for (size_t l = 0; l < s.sparse.fetch_caps.size(); ++l) {
         if (s.sparse.fetch_caps[l] <= 0) continue;  // a dense layer
         out.push_back({"layer=\"" + std::to_string(l) + "\"", s.sparse.fetch_caps[l]});
       }
       return out;
     }},
    {"oasis:sparse_fetch_budget_backoffs_total", kCounter,
     "Adaptive budget updates that halved every layer's fetch cap (transfer waits over 5% of the "
     "steps' time).",
     [](const EngineStats& s) -> double { return s.sparse.fetch_budget_backoffs_total; }},
    {"oasis:sparse_topk_agreement", kGauge,
     "Sampled agreement of the predicted top-K with the real query's top-K.",
     [](const EngineStats& s) -> double { return s.sparse.topk_agreement(); }},
    {"oasis:sparse_topk_agreement_by_layer", kGauge, "Sampled top-K agreement per layer.",
     [](const EngineStats& s) {
       return PerSampledLayer(s, [&s](size_t l) -> double { return s.sparse.topk_agreement(l); });
     }},
    // The sampled counts behind the gauges, as counters: a client takes deltas around its
    // requests (tools/eval_trained_model.py measures agreement per context length this way).
    {"oasis:sparse_topk_agreement_overlap_total", kCounter, "Sampled |predicted top-K & real top-K|, per layer.",
     [](const EngineStats& s) {
       return PerSampledLayer(s, [&s](size_t l) -> int64_t { return s.sparse.agree_overlap[l]; });
     }},
    {"oasis:sparse_topk_agreement_sampled_total", kCounter, "Sampled |real top-K|, per layer.",
     [](const EngineStats& s) {
       return PerSampledLayer(s, [&s](size_t l) -> int64_t { return s.sparse.agree_total[l]; });
     }},
    {"oasis:sparse_fetch_used_total", kCounter,
     "Sampled blocks fetched for a step that were in its real query's top-K, per layer.",
     [](const EngineStats& s) {
       return PerSampledLayer(
           s, [&s](size_t l) -> int64_t { return l < s.sparse.fetch_used.size() ? s.sparse.fetch_used[l] : 0; });
     }},
    {"oasis:sparse_fetch_sampled_total", kCounter,
     "Blocks fetched for the steps whose agreement was sampled, per layer.",
     [](const EngineStats& s) {
       return PerSampledLayer(s, [&s](size_t l) -> int64_t {
         return l < s.sparse.fetch_sampled.size() ? s.sparse.fetch_sampled[l] : 0;
       });
     }},

    // Disaggregation's engine side (docs/disaggregation.md §7); zero on a single instance.
    {"oasis:handoffs_total", kCounter, "Requests this prefill instance handed to a decode instance.",
     [](const EngineStats& s) -> double { return s.disagg.handoffs_total; }},
    {"oasis:handoff_staged_bytes_total", kCounter,
     "Bytes staged for handed-off requests (KV, summaries, draft KV).",
     [](const EngineStats& s) -> double { return s.disagg.handoff_staged_bytes_total; }},
    {"oasis:handoff_seconds_total", kCounter, "Time the engine loop spent staging handed-off requests.",
     [](const EngineStats& s) -> double { return s.disagg.handoff_seconds_total; }},
    {"oasis:rpf_imports_total", kCounter, "Requests this decode instance imported from a prefill instance.",
     [](const EngineStats& s) -> double { return s.disagg.imports_total; }},
    {"oasis:rpf_admission_bytes_total", kCounter,
     "Bytes read from prefill instances at admission (KV, summaries, draft KV).",
     [](const EngineStats& s) -> double { return s.disagg.import_admission_bytes_total; }},
    {"oasis:rpf_admission_fetch_seconds_total", kCounter, "Time of the admission reads (off the engine loop).",
     [](const EngineStats& s) -> double { return s.disagg.import_fetch_seconds_total; }},
    {"oasis:rpf_drift_blocks_total", kCounter,
     "Remote blocks select wanted after admission, read once each (per layer, KV head).",
     [](const EngineStats& s) -> double { return s.disagg.drift_blocks_total; }},
    {"oasis:rpf_drift_bytes_total", kCounter, "Bytes of those blocks (K and V).",
     [](const EngineStats& s) -> double { return s.disagg.drift_bytes_total; }},
    {"oasis:rpf_drift_fetches_total", kCounter,
     "Reads of drifted blocks (one per request and step with new ones).",
     [](const EngineStats& s) -> double { return s.disagg.drift_fetches_total; }},
    {"oasis:rpf_drift_fetch_seconds_total", kCounter, "Time of those reads (off the engine loop).",
     [](const EngineStats& s) -> double { return s.disagg.drift_fetch_seconds_total; }},
    {"oasis:rpf_import_failures_total", kCounter, "Imports or drift reads that failed (the request failed).",
     [](const EngineStats& s) -> double { return s.disagg.import_failures_total; }},
    {"oasis:rpf_importing", kGauge, "Imported requests queued for host room or reading their admission set.",
     [](const EngineStats& s) -> double { return s.disagg.num_importing; }},
    {"oasis:rpf_drift_blocks_dropped_total", kCounter,
     "Drifted blocks that found no free host slot (they stay remote).",
     [](const EngineStats& s) -> double { return s.disagg.drift_blocks_dropped_total; }},
    {"oasis:sparse_host_prefix_adopted_blocks_total", kCounter,
     "Blocks host-home switches took from the host store's prefix cache (not copied, not summarised).",
     [](const EngineStats& s) -> double { return s.sparse.host_prefix_adopted_blocks_total; }},
    {"oasis:sparse_host_prefix_given_blocks_total", kCounter,
     "Blocks ended host-home requests left in the host store's prefix cache.",
     [](const EngineStats& s) -> double { return s.sparse.host_prefix_given_blocks_total; }},
    {"oasis:sparse_host_prefix_blocks", kGauge, "Blocks in the host store's prefix cache (local requests).",
     [](const EngineStats& s) -> double { return s.sparse.host_prefix_blocks; }},
    {"oasis:rpf_prefix_cache_queries_total", kCounter,
     "Imports that looked their prompt up in this decode instance's prefix cache.",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_queries_total; }},
    {"oasis:rpf_prefix_cache_hit_tokens_total", kCounter,
     "Prompt tokens of imports whose blocks this decode instance held already (not fetched).",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_hit_tokens_total; }},
    {"oasis:rpf_prefix_cache_cells_adopted_total", kCounter,
     "Head-blocks of one layer imports took from the prefix cache instead of fetching them.",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_cells_adopted_total; }},
    {"oasis:rpf_prefix_cache_cells_cached_total", kCounter,
     "Head-blocks of one layer ended imports gave the prefix cache (fetched by them, kept).",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_cells_cached_total; }},
    {"oasis:rpf_prefix_cache_blocks", kGauge, "Prompt blocks in this decode instance's prefix cache.",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_blocks; }},
    {"oasis:rpf_prefix_cache_held_blocks", kGauge,
     "Prompt blocks of the decode instance's prefix cache that running imports hold.",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_held_blocks; }},
    {"oasis:rpf_prefix_cache_cells", kGauge,
     "Head-blocks of one layer the prefix cache holds in the host KV store (evictable room).",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_cells; }},
    {"oasis:rpf_prefix_cache_evictions_total", kCounter,
     "Prompt blocks evicted from the decode instance's prefix cache for room.",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_evictions_total; }},
    {"oasis:rpf_prefix_cache_blocks_published_total", kCounter,
     "Prompt blocks imports shared as soon as their fetch landed (later imports of the prefix hold them).",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_blocks_published_total; }},
    {"oasis:rpf_prefix_cache_mismatches_total", kCounter,
     "Imports whose prompt's block hashes differed from their ticket's (no reuse for them).",
     [](const EngineStats& s) -> double { return s.disagg.import_prefix_mismatches_total; }},
    {"oasis:rpf_host_kv_bytes", kGauge, "Host KV (host slots) the imported requests hold now.",
     [](const EngineStats& s) -> double { return s.disagg.import_host_kv_bytes; }},
    {"oasis:rpf_host_kv_bytes_peak", kGauge, "The largest oasis:rpf_host_kv_bytes since start.",
     [](const EngineStats& s) -> double { return s.disagg.import_host_kv_bytes_peak; }},
    {"oasis:rpf_host_kv_bytes_finished_total", kCounter,
     "Sum over finished imported requests of the host KV each held at its end (its largest).",
     [](const EngineStats& s) -> double { return s.disagg.import_host_kv_bytes_finished_total; }},
    {"oasis:rpf_imports_finished_total", kCounter, "Imported requests that finished after running.",
     [](const EngineStats& s) -> double { return s.disagg.imports_finished_total; }},
    {"oasis:num_summary_rows", kGauge,
     "Summary-only rows of all sparse layers: remote blocks tracked without host KV (--remote-kv-gib).",
     [](const EngineStats& s) -> double { return s.disagg.num_summary_rows; }},
    {"oasis:num_free_summary_rows", kGauge, "Free summary-only rows.",
     [](const EngineStats& s) -> double { return s.disagg.num_free_summary_rows; }},

    // Finished requests and latencies.
    {"oasis:request_success_total", kCounter, "Finished requests, by finish reason.", FinishedByReason},
    {"oasis:time_to_first_token_seconds", "Time to first token.",
     [](const EngineStats& s) -> const Histogram& { return s.ttft; }},
    {"oasis:inter_token_latency_seconds", "Time between consecutive tokens.",
     [](const EngineStats& s) -> const Histogram& { return s.itl; }},
    {"oasis:e2e_request_latency_seconds", "End-to-end request latency.",
     [](const EngineStats& s) -> const Histogram& { return s.e2e; }},
    {"oasis:request_queue_time_seconds", "Finished requests: arrival to first scheduled.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.queue_seconds; }},
    {"oasis:request_prefill_time_seconds", "Finished requests: first scheduled to first token.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.prefill_seconds; }},
    {"oasis:request_decode_time_seconds", "Finished requests: first token to last token.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.decode_seconds; }},
    {"oasis:request_inference_time_seconds", "Finished requests: first scheduled to last token.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.inference_seconds; }},
    {"oasis:request_prompt_tokens", "Finished requests: prompt tokens.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.prompt_tokens; }},
    {"oasis:request_generation_tokens", "Finished requests: generated tokens.",
     [](const EngineStats& s) -> const Histogram& { return s.per_request.generation_tokens; }},
};
// clang-format on

}  // namespace

std::string RenderEngineMetrics(const EngineStats& stats, const std::string& model_name) {
  return RenderMetricTable<EngineStats>(kEngineMetrics, stats,
                                        "model_name=\"" + EscapeLabel(model_name) + "\"");
}

}  // namespace oasis::server

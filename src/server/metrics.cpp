#include "server/metrics.h"

#include "common/histogram.h"

#include <sstream>
#include <tuple>

namespace oasis::server {
namespace {

std::string Number(double v) { return PrometheusNumber(v); }

void Metric(std::ostringstream& s, const char* type, const std::string& name, const std::string& help,
            const std::string& labels, double value) {
  s << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  s << name << "{" << labels << "} " << Number(value) << "\n";
}

// Lookahead sparse KV (docs/sparse.md); zero when it is off.
void RenderSparseMetrics(std::ostringstream& s, const EngineStats& st, const std::string& labels) {
  auto gauge = [&](const char* name, const char* help, double v) { Metric(s, "gauge", name, help, labels, v); };
  auto counter = [&](const char* name, const char* help, double v) { Metric(s, "counter", name, help, labels, v); };
  gauge("oasis:sparse_requests", "Running requests decoding with sparse KV.",
        static_cast<double>(st.num_sparse_requests));
  counter("oasis:sparse_switches_total", "Requests switched from dense to sparse KV.",
          static_cast<double>(st.sparse_switches_total));
  counter("oasis:sparse_admission_waits_total", "Admissions (first or after a preemption) that had to wait for host KV store room.",
          static_cast<double>(st.sparse_admission_waits_total));
  gauge("oasis:host_kv_usage", "Fraction of the host KV store reserved by requests (1 = 100%).", st.host_kv_usage());
  gauge("oasis:num_host_kv_blocks", "Host KV store head-blocks (each holds every sparse layer).",
        static_cast<double>(st.num_host_kv_slots));
  gauge("oasis:num_free_host_kv_blocks", "Free host KV store head-blocks.",
        static_cast<double>(st.num_free_host_kv_slots));
  gauge("oasis:sparse_gpu_kv_blocks", "KV head-blocks held as sparse working sets and tails.",
        static_cast<double>(st.sparse_gpu_slots));
  counter("oasis:sparse_steps_total", "Engine steps that ran sparse requests.",
          static_cast<double>(st.sparse_steps_total));
  counter("oasis:sparse_hits_total", "Predicted blocks already resident (per layer and KV head).",
          static_cast<double>(st.sparse_hits_total));
  counter("oasis:sparse_misses_total", "Predicted blocks not resident (per layer and KV head).",
          static_cast<double>(st.sparse_misses_total));
  gauge("oasis:sparse_hit_rate", "Hits / (hits + misses) of the predicted working sets.", st.sparse_hit_rate());
  counter("oasis:sparse_blocks_fetched_total", "Blocks fetched host to device (at most C per KV head per step).",
          static_cast<double>(st.sparse_blocks_fetched_total));
  gauge("oasis:sparse_blocks_fetched_per_step", "Blocks fetched per engine step with sparse requests.",
        st.sparse_fetched_per_step());
  gauge("oasis:sparse_misses_per_step", "Misses per engine step with sparse requests.", st.sparse_misses_per_step());
  counter("oasis:sparse_h2d_bytes_total", "Bytes fetched host to device (K and V).",
          static_cast<double>(st.sparse_h2d_bytes_total));
  gauge("oasis:sparse_h2d_bytes_per_step", "Bytes fetched host to device per engine step with sparse requests.",
        st.sparse_h2d_bytes_per_step());
  counter("oasis:sparse_transfer_wait_seconds_total", "Time sparse steps' ends waited for the transfers, predict and select the step did not hide (CUDA).",
          st.sparse_transfer_wait_seconds_total);
  gauge("oasis:sparse_topk_agreement", "Sampled agreement of the predicted top-K with the real query's top-K.",
        st.sparse_topk_agreement());
  s << "# HELP oasis:sparse_topk_agreement_by_layer Sampled top-K agreement per layer.\n"
       "# TYPE oasis:sparse_topk_agreement_by_layer gauge\n";
  for (size_t l = 0; l < st.sparse_agree_total.size(); ++l) {
    if (st.sparse_agree_total[l] == 0) continue;  // dense layers, or nothing sampled yet
    s << "oasis:sparse_topk_agreement_by_layer{" << labels << ",layer=\"" << l << "\"} "
      << Number(st.sparse_topk_agreement(l)) << "\n";
  }
  // The sampled counts behind the gauges, as counters: a client takes deltas around its
  // requests (tools/eval_trained_model.py measures agreement per context length this way).
  for (const auto& [name, help, v] :
       {std::tuple{"oasis:sparse_topk_agreement_overlap_total", "Sampled |predicted top-K & real top-K|, per layer.",
                   &st.sparse_agree_overlap},
        std::tuple{"oasis:sparse_topk_agreement_sampled_total", "Sampled |real top-K|, per layer.",
                   &st.sparse_agree_total}}) {
    s << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n";
    for (size_t l = 0; l < v->size(); ++l) {
      if (st.sparse_agree_total[l] == 0) continue;
      s << name << "{" << labels << ",layer=\"" << l << "\"} " << (*v)[l] << "\n";
    }
  }
}

// Disaggregation's engine side (docs/disaggregation.md §7); zero on a single instance.
void RenderDisaggMetrics(std::ostringstream& s, const EngineStats& st, const std::string& labels) {
  auto gauge = [&](const char* name, const char* help, double v) { Metric(s, "gauge", name, help, labels, v); };
  auto counter = [&](const char* name, const char* help, double v) { Metric(s, "counter", name, help, labels, v); };
  counter("oasis:handoffs_total", "Requests this prefill instance handed to a decode instance.",
          static_cast<double>(st.handoffs_total));
  counter("oasis:handoff_staged_bytes_total", "Bytes staged for handed-off requests (KV, summaries, draft KV).",
          static_cast<double>(st.handoff_staged_bytes_total));
  counter("oasis:handoff_seconds_total", "Time the engine loop spent staging handed-off requests.",
          st.handoff_seconds_total);
  counter("oasis:rpf_imports_total", "Requests this decode instance imported from a prefill instance.",
          static_cast<double>(st.imports_total));
  counter("oasis:rpf_admission_bytes_total", "Bytes read from prefill instances at admission (KV, summaries, draft KV).",
          static_cast<double>(st.import_admission_bytes_total));
  counter("oasis:rpf_admission_fetch_seconds_total", "Time of the admission reads (off the engine loop).",
          st.import_fetch_seconds_total);
  counter("oasis:rpf_drift_blocks_total", "Remote blocks select wanted after admission, read once each (per layer, KV head).",
          static_cast<double>(st.drift_blocks_total));
  counter("oasis:rpf_drift_bytes_total", "Bytes of those blocks (K and V).", static_cast<double>(st.drift_bytes_total));
  counter("oasis:rpf_drift_fetches_total", "Reads of drifted blocks (one per request and step with new ones).",
          static_cast<double>(st.drift_fetches_total));
  counter("oasis:rpf_drift_fetch_seconds_total", "Time of those reads (off the engine loop).",
          st.drift_fetch_seconds_total);
  counter("oasis:rpf_import_failures_total", "Imports or drift reads that failed (the request failed).",
          static_cast<double>(st.import_failures_total));
  gauge("oasis:rpf_importing", "Imported requests queued for host room or reading their admission set.",
        static_cast<double>(st.num_importing));
  counter("oasis:rpf_drift_blocks_dropped_total", "Drifted blocks that found no free host slot (they stay remote).",
          static_cast<double>(st.drift_blocks_dropped_total));
  gauge("oasis:rpf_host_kv_bytes", "Host KV (host slots) the imported requests hold now.",
        static_cast<double>(st.import_host_kv_bytes));
  gauge("oasis:rpf_host_kv_bytes_peak", "The largest oasis:rpf_host_kv_bytes since start.",
        static_cast<double>(st.import_host_kv_bytes_peak));
  counter("oasis:rpf_host_kv_bytes_finished_total",
          "Sum over finished imported requests of the host KV each held at its end (its largest).",
          static_cast<double>(st.import_host_kv_bytes_finished_total));
  counter("oasis:rpf_imports_finished_total", "Imported requests that finished after running.",
          static_cast<double>(st.imports_finished_total));
  gauge("oasis:num_summary_rows", "Summary-only rows of all sparse layers: remote blocks tracked without host KV (--remote-kv-gib).",
        static_cast<double>(st.num_summary_rows));
  gauge("oasis:num_free_summary_rows", "Free summary-only rows.", static_cast<double>(st.num_free_summary_rows));
}

}  // namespace

std::string RenderStagingMetrics(const StagingMetrics& m, const std::string& model_name) {
  std::ostringstream s;
  const std::string labels = "model_name=\"" + EscapeLabel(model_name) + "\"";
  auto gauge = [&](const char* name, const char* help, double v) { Metric(s, "gauge", name, help, labels, v); };
  auto counter = [&](const char* name, const char* help, double v) { Metric(s, "counter", name, help, labels, v); };
  gauge("oasis:staging_pool_bytes", "Staging pool size.", static_cast<double>(m.bytes_total));
  gauge("oasis:staging_pool_bytes_held", "Staging pool bytes held by handed-off requests.",
        static_cast<double>(m.bytes_held));
  gauge("oasis:staging_pool_requests_held", "Handed-off requests whose KV is staged here.",
        static_cast<double>(m.requests_held));
  s << "# HELP oasis:staging_pool_leases_total Staging leases ended, by how.\n"
       "# TYPE oasis:staging_pool_leases_total counter\n";
  for (auto [end, v] : {std::pair{"completed", m.completed}, {"aborted", m.aborted}, {"expired", m.expired}}) {
    s << "oasis:staging_pool_leases_total{" << labels << ",end=\"" << end << "\"} " << Number(static_cast<double>(v))
      << "\n";
  }
  counter("oasis:staging_pool_acquire_failures_total", "Handoffs refused for lack of staging room.",
          static_cast<double>(m.acquire_failures));
  gauge("oasis:staging_connections_open", "Decode instances connected to the staging server.",
        static_cast<double>(m.connections_open));
  return s.str();
}

void HttpMetrics::Count(const std::string& method, const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{method, route, status}];
}

std::string HttpMetrics::Render(const std::string& model_label) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream s;
  s << "# HELP oasis:http_requests_total HTTP requests answered, by method, route and status.\n"
       "# TYPE oasis:http_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    const auto& [method, route, status] = key;
    s << "oasis:http_requests_total{method=\"" << EscapeLabel(method) << "\",handler=\"" << EscapeLabel(route)
      << "\",status=\"" << status << "\"} " << count << "\n";
  }
  Metric(s, "counter", "oasis:client_disconnects_total",
         "Requests aborted because their client disconnected before they finished.",
         "model_name=\"" + EscapeLabel(model_label) + "\"", static_cast<double>(client_disconnects_));
  return s.str();
}

std::string RenderEngineMetrics(const EngineStats& st, const std::string& model_name) {
  const std::string labels = "model_name=\"" + EscapeLabel(model_name) + "\"";
  std::ostringstream s;
  Metric(s, "gauge", "oasis:num_requests_running", "Requests in the running batch.", labels,
         static_cast<double>(st.num_running));
  Metric(s, "gauge", "oasis:num_requests_waiting", "Requests waiting to be scheduled.", labels,
         static_cast<double>(st.num_waiting));
  Metric(s, "gauge", "oasis:kv_cache_usage_perc", "Fraction of KV cache head-blocks in use (1 = 100%).", labels,
         st.kv_usage);
  Metric(s, "gauge", "oasis:num_kv_blocks", "KV cache head-blocks per layer.", labels,
         static_cast<double>(st.num_kv_slots));
  Metric(s, "gauge", "oasis:num_free_kv_blocks", "Free KV cache head-blocks per layer.", labels,
         static_cast<double>(st.num_free_kv_slots));
  Metric(s, "counter", "oasis:prompt_tokens_total", "Prefilled prompt tokens.", labels,
         static_cast<double>(st.prompt_tokens_total));
  Metric(s, "counter", "oasis:generation_tokens_total", "Generated tokens.", labels,
         static_cast<double>(st.generation_tokens_total));
  Metric(s, "counter", "oasis:num_preemptions_total", "Requests preempted (recomputed later).", labels,
         static_cast<double>(st.preemptions_total));
  Metric(s, "counter", "oasis:engine_steps_total", "Engine steps executed.", labels,
         static_cast<double>(st.steps_total));
  // Where the engine loop's time goes (seconds summed over steps).
  const std::pair<const char*, double> phases[] = {
      {"step", st.step_seconds_total},         {"schedule", st.schedule_seconds_total},
      {"build", st.build_seconds_total},       {"model", st.model_step_seconds_total},
      {"emit", st.emit_seconds_total},         {"draft", st.draft_step_seconds_total},
      {"imports", st.imports_seconds_total},   {"drift", st.drift_seconds_total},
      {"publish", st.publish_seconds_total}};
  s << "# HELP oasis:engine_phase_seconds_total Engine loop wall time by phase: the whole step, scheduling, "
       "building the batch, the model step (forward + sampling), emitting, the draft head; outside the step, "
       "imports (decode side), handing remote misses to the drift worker, the stats snapshot and output delivery.\n"
       "# TYPE oasis:engine_phase_seconds_total counter\n";
  for (const auto& [phase, secs] : phases) {
    s << "oasis:engine_phase_seconds_total{" << labels << ",phase=\"" << phase << "\"} " << Number(secs) << "\n";
  }
  Metric(s, "counter", "oasis:engine_decode_steps_total", "Engine steps whose batch held decode tokens only.", labels,
         static_cast<double>(st.decode_steps_total));
  Metric(s, "counter", "oasis:engine_decode_step_seconds_total", "Wall time of the decode-only steps.", labels,
         st.decode_step_seconds_total);
  Metric(s, "counter", "oasis:engine_decode_model_step_seconds_total",
         "Model part (forward + sampling) of the decode-only steps.", labels, st.decode_model_step_seconds_total);
  // Lookahead decoding (EAGLE-3 drafts); zero when it is off.
  Metric(s, "gauge", "oasis:num_draft_kv_blocks", "Draft head KV cache head-blocks.", labels,
         static_cast<double>(st.num_draft_kv_slots));
  Metric(s, "gauge", "oasis:num_free_draft_kv_blocks", "Free draft head KV cache head-blocks.", labels,
         static_cast<double>(st.num_free_draft_kv_slots));
  Metric(s, "counter", "oasis:spec_decode_num_proposed_tokens_total", "Draft tokens the draft head proposed.",
         labels, static_cast<double>(st.draft_tokens_proposed_total));
  Metric(s, "counter", "oasis:draft_head_chained_steps_total",
         "Draft head steps queued on the device behind the target's step (lookahead reject).", labels,
         static_cast<double>(st.draft_chained_steps_total));
  Metric(s, "counter", "oasis:spec_decode_num_draft_tokens_total", "Draft tokens verified by the model.", labels,
         static_cast<double>(st.draft_tokens_total));
  Metric(s, "counter", "oasis:spec_decode_num_accepted_tokens_total",
         "Verified draft tokens equal to the sampled token (emitted with --lookahead speculate).", labels,
         static_cast<double>(st.draft_accepted_total));
  Metric(s, "gauge", "oasis:spec_decode_draft_acceptance_rate", "Accepted / verified draft tokens.", labels,
         st.draft_acceptance_rate());
  Metric(s, "counter", "oasis:spec_decode_num_steps_total", "Request decode steps that verified a draft.", labels,
         static_cast<double>(st.lookahead_steps_total));
  Metric(s, "counter", "oasis:spec_decode_num_emitted_tokens_total",
         "Tokens emitted by request decode steps that verified a draft.", labels,
         static_cast<double>(st.lookahead_tokens_total));
  Metric(s, "gauge", "oasis:spec_decode_tokens_per_step",
         "Mean tokens emitted per request decode step that verified a draft.", labels,
         st.tokens_per_lookahead_step());
  RenderSparseMetrics(s, st, labels);
  RenderDisaggMetrics(s, st, labels);
  s << "# HELP oasis:request_success_total Finished requests, by finish reason.\n"
       "# TYPE oasis:request_success_total counter\n";
  const std::pair<const char*, int64_t> reasons[] = {{"stop", st.requests_stop_total},
                                                    {"length", st.requests_length_total},
                                                    {"abort", st.requests_abort_total},
                                                    {"error", st.requests_error_total}};
  for (const auto& [reason, count] : reasons) {
    s << "oasis:request_success_total{" << labels << ",finished_reason=\"" << reason << "\"} " << count << "\n";
  }
  s << RenderHistogram("oasis:time_to_first_token_seconds", "Time to first token.", st.ttft, labels);
  s << RenderHistogram("oasis:inter_token_latency_seconds", "Time between consecutive tokens.", st.itl, labels);
  s << RenderHistogram("oasis:e2e_request_latency_seconds", "End-to-end request latency.", st.e2e, labels);
  return s.str();
}

}  // namespace oasis::server

// Prometheus text: gauges, counters by finish reason, cumulative histogram buckets, HTTP counters.
#include <catch2/catch.hpp>

#include "server/metrics.h"

using namespace oasis;
using namespace oasis::server;

TEST_CASE("engine metrics in Prometheus text") {
  EngineStats st;
  st.requests.num_running = 2;
  st.requests.num_waiting = 1;
  st.kv.usage = 0.25;
  st.requests.prompt_tokens_total = 100;
  st.requests.generation_tokens_total = 40;
  st.requests.stop_total = 3;
  st.requests.abort_total = 1;
  st.ttft.bounds = {0.1, 1.0};
  st.ttft.counts = {2, 1, 1};
  st.ttft.sum = 3.5;
  st.ttft.count = 4;
  const std::string text = RenderEngineMetrics(st, "m\"x");
  const std::string labels = "model_name=\"m\\\"x\"";
  CHECK(text.find("# TYPE oasis:num_requests_running gauge\noasis:num_requests_running{" + labels + "} 2\n") !=
        std::string::npos);
  CHECK(text.find("oasis:num_requests_waiting{" + labels + "} 1\n") != std::string::npos);
  CHECK(text.find("oasis:kv_cache_usage_perc{" + labels + "} 0.25\n") != std::string::npos);
  CHECK(text.find("oasis:prompt_tokens_total{" + labels + "} 100\n") != std::string::npos);
  CHECK(text.find("oasis:generation_tokens_total{" + labels + "} 40\n") != std::string::npos);
  CHECK(text.find("oasis:request_success_total{" + labels + ",finished_reason=\"stop\"} 3\n") != std::string::npos);
  CHECK(text.find("oasis:request_success_total{" + labels + ",finished_reason=\"abort\"} 1\n") != std::string::npos);
  // Cumulative buckets.
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.1\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"1\"} 3\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_count{" + labels + "} 4\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_sum{" + labels + "} 3.5\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:e2e_request_latency_seconds histogram") != std::string::npos);
}

TEST_CASE("spec-decode metrics of lookahead decoding") {
  EngineStats st;
  st.kv.num_draft_slots = 64;
  st.kv.num_free_draft_slots = 60;
  st.lookahead.draft_tokens_proposed_total = 12;
  st.lookahead.draft_tokens_total = 10;
  st.lookahead.draft_accepted_total = 4;
  st.lookahead.steps_total = 10;
  st.lookahead.tokens_total = 14;
  st.lookahead.draft_chained_steps_total = 9;
  const std::string text = RenderEngineMetrics(st, "m");
  const std::string l = "{model_name=\"m\"} ";
  CHECK(text.find("# TYPE oasis:spec_decode_num_draft_tokens_total counter\noasis:spec_decode_num_draft_tokens_total" + l +
                  "10\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_proposed_tokens_total" + l + "12\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_accepted_tokens_total" + l + "4\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:spec_decode_draft_acceptance_rate gauge\noasis:spec_decode_draft_acceptance_rate" + l +
                  "0.4\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_steps_total" + l + "10\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_emitted_tokens_total" + l + "14\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_tokens_per_step" + l + "1.4\n") != std::string::npos);
  CHECK(text.find("oasis:num_draft_kv_blocks" + l + "64\n") != std::string::npos);
  CHECK(text.find("oasis:num_free_draft_kv_blocks" + l + "60\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:draft_head_chained_steps_total counter\noasis:draft_head_chained_steps_total" + l +
                  "9\n") != std::string::npos);
  // Before any draft: rates are 0, not NaN.
  const std::string idle = RenderEngineMetrics(EngineStats{}, "m");
  CHECK(idle.find("oasis:spec_decode_draft_acceptance_rate" + l + "0\n") != std::string::npos);
  CHECK(idle.find("oasis:spec_decode_tokens_per_step" + l + "0\n") != std::string::npos);
}

TEST_CASE("spec-decode chain depth metrics") {
  EngineStats st;
  st.lookahead.depth_steps_total = {40, 3, 2, 0};
  st.lookahead.depth_explorations_total = 5;
  st.lookahead.depth = 1;
  const std::string text = RenderEngineMetrics(st, "m");
  CHECK(text.find("# TYPE oasis:spec_decode_chain_depth_steps_total counter\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_chain_depth_steps_total{model_name=\"m\",depth=\"1\"} 40\n") !=
        std::string::npos);
  CHECK(text.find("oasis:spec_decode_chain_depth_steps_total{model_name=\"m\",depth=\"3\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("oasis:spec_decode_chain_depth_steps_total{model_name=\"m\",depth=\"4\"} 0\n") !=
        std::string::npos);
  CHECK(text.find("oasis:spec_decode_chain_depth_explorations_total{model_name=\"m\"} 5\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:spec_decode_chain_depth gauge\noasis:spec_decode_chain_depth{model_name=\"m\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("HTTP request counters") {
  HttpMetrics m;
  m.Count("POST", "/v1/completions", 200);
  m.Count("POST", "/v1/completions", 200);
  m.Count("POST", "/v1/completions", 400);
  m.CountClientDisconnect();
  const std::string text = m.Render("m");
  CHECK(text.find("oasis:http_requests_total{method=\"POST\",handler=\"/v1/completions\",status=\"200\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("oasis:http_requests_total{method=\"POST\",handler=\"/v1/completions\",status=\"400\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("oasis:client_disconnects_total{model_name=\"m\"} 1\n") != std::string::npos);
}

TEST_CASE("sparse KV metrics in Prometheus text") {
  EngineStats st;
  st.sparse.num_requests = 3;
  st.sparse.switches_total = 5;
  st.sparse.num_host_kv_slots = 200;
  st.sparse.num_free_host_kv_slots = 150;
  st.sparse.gpu_slots = 48;
  st.sparse.num_in_place = 2;
  st.sparse.in_place_blocks = 640;
  st.sparse.steps_total = 10;
  st.sparse.hits_total = 90;
  st.sparse.misses_total = 10;
  st.sparse.blocks_fetched_total = 8;
  st.sparse.h2d_bytes_total = 8 * 2048;
  st.sparse.transfer_wait_seconds_total = 0.5;
  st.sparse.agree_overlap = {0, 3, 1};  // layer 0 dense: nothing sampled
  st.loop.decode_steps_total = 7;
  st.loop.decode_step_seconds_total = 0.25;
  st.loop.decode_model_step_seconds_total = 0.125;
  st.loop.model_step_seconds_total = 0.5;
  st.sparse.agree_total = {0, 4, 4};
  st.sparse.fetch_used = {0, 5, 2};
  st.sparse.fetch_sampled = {0, 9, 6};
  const std::string text = RenderEngineMetrics(st, "m");
  const std::string l = "{model_name=\"m\"}";
  CHECK(text.find("# TYPE oasis:sparse_requests gauge\noasis:sparse_requests" + l + " 3\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:sparse_switches_total counter\noasis:sparse_switches_total" + l + " 5\n") !=
        std::string::npos);
  CHECK(text.find("oasis:host_kv_usage" + l + " 0.25\n") != std::string::npos);
  CHECK(text.find("oasis:num_host_kv_blocks" + l + " 200\n") != std::string::npos);
  CHECK(text.find("oasis:num_free_host_kv_blocks" + l + " 150\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_gpu_kv_blocks" + l + " 48\n") != std::string::npos);
  CHECK(text.find("oasis:kv_home_requests{model_name=\"m\",home=\"hbm\"} 2\n"
                  "oasis:kv_home_requests{model_name=\"m\",home=\"host\"} 1\n") != std::string::npos);
  CHECK(text.find("oasis:kv_home_blocks{model_name=\"m\",home=\"hbm\"} 640\n"
                  "oasis:kv_home_blocks{model_name=\"m\",home=\"host\"} 50\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_hit_rate" + l + " 0.9\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_blocks_fetched_total" + l + " 8\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_blocks_fetched_per_step" + l + " 0.8\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_misses_per_step" + l + " 1\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_h2d_bytes_total" + l + " 16384\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_h2d_bytes_per_step" + l + " 1638.4\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_transfer_wait_seconds_total" + l + " 0.5\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_topk_agreement" + l + " 0.5\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_topk_agreement_by_layer{model_name=\"m\",layer=\"1\"} 0.75\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_topk_agreement_by_layer{model_name=\"m\",layer=\"2\"} 0.25\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:sparse_topk_agreement_overlap_total counter\n"
                  "oasis:sparse_topk_agreement_overlap_total{model_name=\"m\",layer=\"1\"} 3\n"
                  "oasis:sparse_topk_agreement_overlap_total{model_name=\"m\",layer=\"2\"} 1\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_topk_agreement_sampled_total{model_name=\"m\",layer=\"2\"} 4\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:sparse_fetch_used_total counter\n"
                  "oasis:sparse_fetch_used_total{model_name=\"m\",layer=\"1\"} 5\n"
                  "oasis:sparse_fetch_used_total{model_name=\"m\",layer=\"2\"} 2\n") != std::string::npos);
  CHECK(text.find("oasis:sparse_fetch_sampled_total{model_name=\"m\",layer=\"1\"} 9\n"
                  "oasis:sparse_fetch_sampled_total{model_name=\"m\",layer=\"2\"} 6\n") != std::string::npos);
  CHECK(text.find("layer=\"0\"") == std::string::npos);
  CHECK(text.find("oasis:engine_decode_steps_total" + l + " 7\n") != std::string::npos);
  CHECK(text.find("oasis:engine_decode_step_seconds_total" + l + " 0.25\n") != std::string::npos);
  CHECK(text.find("oasis:engine_decode_model_step_seconds_total" + l + " 0.125\n") != std::string::npos);
  CHECK(text.find("oasis:engine_phase_seconds_total{model_name=\"m\",phase=\"model\"} 0.5\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:engine_phase_seconds_total counter\n") != std::string::npos);
  // Off: zeros, no per-layer lines.
  const std::string off = RenderEngineMetrics(EngineStats{}, "m");
  CHECK(off.find("oasis:sparse_requests" + l + " 0\n") != std::string::npos);
  CHECK(off.find("oasis:host_kv_usage" + l + " 0\n") != std::string::npos);
  CHECK(off.find("oasis:sparse_topk_agreement_by_layer{") == std::string::npos);
}

// Prometheus text: gauges, counters by finish reason, cumulative histogram buckets, HTTP counters.
#include <catch2/catch.hpp>

#include "server/metrics.h"

using namespace oasis;
using namespace oasis::server;

TEST_CASE("engine metrics in Prometheus text") {
  EngineStats st;
  st.num_running = 2;
  st.num_waiting = 1;
  st.kv_usage = 0.25;
  st.prompt_tokens_total = 100;
  st.generation_tokens_total = 40;
  st.requests_stop_total = 3;
  st.requests_abort_total = 1;
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
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"0.10000000000000001\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"1\"} 3\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_bucket{" + labels + ",le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_count{" + labels + "} 4\n") != std::string::npos);
  CHECK(text.find("oasis:time_to_first_token_seconds_sum{" + labels + "} 3.5\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:e2e_request_latency_seconds histogram") != std::string::npos);
}

TEST_CASE("spec-decode metrics of lookahead decoding") {
  EngineStats st;
  st.num_draft_kv_slots = 64;
  st.num_free_draft_kv_slots = 60;
  st.draft_tokens_proposed_total = 12;
  st.draft_tokens_total = 10;
  st.draft_accepted_total = 4;
  st.lookahead_steps_total = 10;
  st.lookahead_tokens_total = 14;
  const std::string text = RenderEngineMetrics(st, "m");
  const std::string l = "{model_name=\"m\"} ";
  CHECK(text.find("# TYPE oasis:spec_decode_num_draft_tokens_total counter\noasis:spec_decode_num_draft_tokens_total" + l +
                  "10\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_proposed_tokens_total" + l + "12\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_accepted_tokens_total" + l + "4\n") != std::string::npos);
  CHECK(text.find("# TYPE oasis:spec_decode_draft_acceptance_rate gauge\noasis:spec_decode_draft_acceptance_rate" + l +
                  "0.40000000000000002\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_steps_total" + l + "10\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_num_emitted_tokens_total" + l + "14\n") != std::string::npos);
  CHECK(text.find("oasis:spec_decode_tokens_per_step" + l + "1.3999999999999999\n") != std::string::npos);
  CHECK(text.find("oasis:num_draft_kv_blocks" + l + "64\n") != std::string::npos);
  CHECK(text.find("oasis:num_free_draft_kv_blocks" + l + "60\n") != std::string::npos);
  // Before any draft: rates are 0, not NaN.
  const std::string idle = RenderEngineMetrics(EngineStats{}, "m");
  CHECK(idle.find("oasis:spec_decode_draft_acceptance_rate" + l + "0\n") != std::string::npos);
  CHECK(idle.find("oasis:spec_decode_tokens_per_step" + l + "0\n") != std::string::npos);
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

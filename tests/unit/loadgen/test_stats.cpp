// Percentiles (numpy's linear interpolation), distributions and the run summary.
#include <catch2/catch.hpp>

#include <vector>

#include "tools/loadgen/report.h"
#include "tools/loadgen/stats.h"

using namespace oasis::loadgen;

TEST_CASE("percentile: linear interpolation between closest ranks, like numpy") {
  // numpy.percentile([15, 20, 35, 40, 50], p)
  const std::vector<double> v = {40, 15, 50, 35, 20};  // unsorted on purpose
  CHECK(Percentile(v, 0) == 15);
  CHECK(Percentile(v, 100) == 50);
  CHECK(Percentile(v, 50) == 35);
  CHECK(Percentile(v, 40) == Approx(29.0));  // rank 1.6: 20 + 0.6 * 15
  CHECK(Percentile(v, 99) == Approx(49.6));  // rank 3.96: 40 + 0.96 * 10
  CHECK(Percentile(v, 25) == Approx(20.0));
  CHECK(Percentile({7}, 99) == 7);
  CHECK(Percentile({}, 50) == 0);
  CHECK(Percentile({1, 2}, 50) == Approx(1.5));
  // 1..100: p99 = 99.01
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  CHECK(Percentile(hundred, 99) == Approx(99.01));
  CHECK(Percentile(hundred, 90) == Approx(90.1));
}

TEST_CASE("describe: mean, median, population std, requested percentiles") {
  const Distribution d = Describe({2, 4, 4, 4, 5, 5, 7, 9}, {50, 99, 99.9});
  CHECK(d.count == 8);
  CHECK(d.mean == Approx(5.0));
  CHECK(d.stddev == Approx(2.0));
  CHECK(d.median == Approx(4.5));
  CHECK(d.min == 2);
  CHECK(d.max == 9);
  REQUIRE(d.percentiles.size() == 3);
  CHECK(d.percentiles[0].first == 50);
  CHECK(d.percentiles[0].second == Approx(4.5));
  CHECK(d.percentiles[1].second == Approx(8.86));  // rank 6.93: 7 + 0.93 * 2
  const Distribution empty = Describe({}, {99});
  CHECK(empty.count == 0);
  CHECK(empty.mean == 0);
  REQUIRE(empty.percentiles.size() == 1);
}

TEST_CASE("summary: totals, throughputs, TPOT, pooled ITL, failures by reason") {
  std::vector<RequestRecord> records(4);
  // Two successes, both starting at 0.
  records[0].success = true;
  records[0].prompt_tokens = 10;
  records[0].output_tokens = 3;
  records[0].ttft_s = 0.1;
  records[0].itl_s = {0.2, 0.3};
  records[0].e2el_s = 0.6;
  records[1].success = true;
  records[1].prompt_tokens = 20;
  records[1].output_tokens = 1;
  records[1].ttft_s = 0.3;
  records[1].e2el_s = 0.3;
  records[1].start_s = 0.1;
  records[2].failure = FailureKind::kHttpStatus;
  records[2].http_status = 429;
  records[2].error = "queue full";
  records[2].prompt_tokens = 99;  // failures count no tokens
  records[3] = records[2];
  const Summary s = Summarize(records, /*duration_s=*/2.0, {99});
  CHECK(s.completed == 2);
  CHECK(s.failed == 2);
  REQUIRE(s.failure_reasons.size() == 1);
  CHECK(s.failure_reasons.at("HTTP 429: queue full").count == 2);
  CHECK(s.failure_reasons.at("HTTP 429: queue full").example == "HTTP 429: queue full");
  CHECK(s.total_input_tokens == 30);
  CHECK(s.total_output_tokens == 4);
  CHECK(s.request_throughput == Approx(1.0));
  CHECK(s.output_throughput == Approx(2.0));
  CHECK(s.total_token_throughput == Approx(17.0));
  CHECK(s.ttft_ms.mean == Approx(200.0));
  // TPOT only for the 3-token request: (0.6 - 0.1) / 2.
  CHECK(s.tpot_ms.count == 1);
  CHECK(s.tpot_ms.mean == Approx(250.0));
  CHECK(s.itl_ms.count == 2);
  CHECK(s.itl_ms.mean == Approx(250.0));
  CHECK(s.e2el_ms.median == Approx(450.0));
  // Token events of request 0 at 0.1, 0.3, 0.6 and of request 1 at 0.4: 4 in second 0.
  CHECK(s.peak_output_throughput == 4);
  // Request 0 [0, 0.6], request 1 [0.1, 0.4], failures [0, 0]: two at once.
  CHECK(s.peak_concurrency == 2);
}

TEST_CASE("summary json and text carry the configured percentiles") {
  std::vector<RequestRecord> records(1);
  records[0].success = true;
  records[0].output_tokens = 2;
  records[0].ttft_s = 0.01;
  records[0].itl_s = {0.02};
  records[0].e2el_s = 0.03;
  const Summary s = Summarize(records, 1.0, {50, 99.9});
  const auto j = SummaryJson(s);
  CHECK(j["p99.9_ttft_ms"].get<double>() == Approx(10.0));
  CHECK(j["p50_itl_ms"].get<double>() == Approx(20.0));
  CHECK(j["median_e2el_ms"].get<double>() == Approx(30.0));
  CHECK(j["completed"] == 1);
  const std::string text = FormatSummary(s, {{"max_concurrency", 4}, {"request_rate", "inf"}});
  CHECK(text.find("P99.9 TTFT (ms):") != std::string::npos);
  CHECK(text.find("Successful requests:                     1") != std::string::npos);
  CHECK(text.find("Maximum request concurrency:             4") != std::string::npos);
  CHECK(text.find("Failure reasons") == std::string::npos);
}

TEST_CASE("percentile flags") {
  auto p = ParsePercentiles("50,90,99.9");
  REQUIRE(p.ok());
  CHECK(*p == std::vector<double>{50, 90, 99.9});
  CHECK_FALSE(ParsePercentiles("101").ok());
  CHECK_FALSE(ParsePercentiles("50,x").ok());
  CHECK_FALSE(ParsePercentiles("").ok());
  CHECK(PercentileKey(99) == "99");
  CHECK(PercentileKey(99.9) == "99.9");
}

TEST_CASE("failures group by reason with numbers normalised, HTTP status kept") {
  std::vector<RequestRecord> records(5);
  for (int i = 0; i < 3; ++i) {
    records[i].failure = FailureKind::kHttpStatus;
    records[i].http_status = 400;
    records[i].error =
        "token id " + std::to_string(1000 + i * 777) + " is outside the vocabulary [0, 512)";
  }
  records[3].failure = FailureKind::kHttpStatus;
  records[3].http_status = 413;
  records[3].error = "body of 99 bytes";
  records[4].failure = FailureKind::kConnection;
  records[4].error = "cannot connect to http://127.0.0.1:8000";
  CHECK(FailureGroupKey(records[0]) == "HTTP 400: token id N is outside the vocabulary [N, N)");
  CHECK(FailureGroupKey(records[3]) == "HTTP 413: body of N bytes");
  CHECK(FailureGroupKey(records[4]) == "connection error: cannot connect to http://N.N.N.N:N");
  const Summary s = Summarize(records, 1.0, {99});
  CHECK(s.failed == 5);
  REQUIRE(s.failure_reasons.size() == 3);
  const auto& vocab = s.failure_reasons.at("HTTP 400: token id N is outside the vocabulary [N, N)");
  CHECK(vocab.count == 3);
  CHECK(vocab.example == "HTTP 400: token id 1000 is outside the vocabulary [0, 512)");
  const std::string text = FormatSummary(s, {});
  CHECK(text.find(
            "  3 x HTTP 400: token id 1000 is outside the vocabulary [0, 512)  (and the like)\n") !=
        std::string::npos);
  CHECK(text.find("  1 x HTTP 413: body of 99 bytes\n") != std::string::npos);
  const auto j = ResultJson({}, s, records, {});
  REQUIRE(j["failures"].size() == 3);
  CHECK(j["requests"].size() == 5);
  CHECK(j["requests"][0]["error"] == records[0].error);
}

namespace {

RequestRecord Done(double ttft_ms, double e2el_ms, int64_t output_tokens) {
  RequestRecord r;
  r.success = true;
  r.ttft_s = ttft_ms / 1e3;
  r.e2el_s = e2el_ms / 1e3;
  r.output_tokens = output_tokens;
  return r;
}

}  // namespace

TEST_CASE("goodput: SLO parsing, vLLM's names, clear errors") {
  auto slos = ParseGoodput("ttft:100 tpot:50.5 e2el:1000");
  REQUIRE(slos.ok());
  CHECK(*slos->ttft_ms == 100);
  CHECK(*slos->tpot_ms == 50.5);
  CHECK(*slos->e2el_ms == 1000);
  auto two = ParseGoodput("ttft:0,e2el:7");  // commas too; 0 is a valid SLO
  REQUIRE(two.ok());
  CHECK(*two->ttft_ms == 0);
  CHECK_FALSE(two->tpot_ms.has_value());
  CHECK_FALSE(two->empty());
  const auto error = [](const std::string& text) {
    auto s = ParseGoodput(text);
    REQUIRE_FALSE(s.ok());
    return s.status().message();
  };
  CHECK(error("ttft=100").find("'ttft=100' is not KEY:VALUE") != std::string::npos);
  CHECK(error("ttft:1:2").find("is not KEY:VALUE") != std::string::npos);
  CHECK(error("itl:5").find("unknown metric 'itl'") != std::string::npos);
  CHECK(error("ttft:-1").find("the ttft SLO '-1' is not a non-negative number") !=
        std::string::npos);
  CHECK(error("tpot:fast").find("the tpot SLO 'fast'") != std::string::npos);
  CHECK(error("tpot:5ms").find("the tpot SLO '5ms'") != std::string::npos);
  CHECK(error("e2el:nan").find("the e2el SLO 'nan'") != std::string::npos);
  CHECK(error("e2el:").find("the e2el SLO ''") != std::string::npos);
  CHECK(error("ttft:1 ttft:2").find("ttft is given twice") != std::string::npos);
  CHECK(error("  ").find("at least one") != std::string::npos);
}

TEST_CASE("goodput: a request is good when it succeeded and meets every given SLO") {
  std::vector<RequestRecord> r;
  r.push_back(Done(100, 300, 5));  // tpot = 200 / 4 = 50
  r.push_back(Done(100, 300, 3));  // tpot = 100
  r.push_back(Done(150, 200, 5));  // ttft over 100
  r.push_back(Done(20, 20, 1));    // one token: tpot counts as 0 (vLLM)
  RequestRecord failed = Done(1, 1, 5);
  failed.success = false;
  failed.failure = FailureKind::kHttpStatus;
  r.push_back(failed);  // never good, however fast
  GoodputSlos slos;
  slos.ttft_ms = 100;  // an SLO equal to the metric is met (<=)
  CHECK(CountGoodRequests(r, slos) == 3);
  slos.tpot_ms = 50;
  CHECK(CountGoodRequests(r, slos) == 2);  // the 3-token request's 100 ms TPOT fails
  slos.tpot_ms = 0;
  CHECK(CountGoodRequests(r, slos) == 1);  // only the one-token request
  GoodputSlos e2el;
  e2el.e2el_ms = 250;
  CHECK(CountGoodRequests(r, e2el) == 2);
  CHECK(CountGoodRequests({}, e2el) == 0);

  Summary s = Summarize(r, 2.0, {99});
  CHECK_FALSE(s.request_goodput.has_value());
  CHECK(FormatSummary(s, {}).find("goodput") == std::string::npos);
  CHECK(SummaryJson(s)["request_goodput"].is_null());
  AddGoodput(r, e2el, &s);
  CHECK(s.good_completed == 2);
  CHECK(*s.request_goodput == Approx(1.0));  // 2 good requests in 2 s
  const std::string text = FormatSummary(s, {});
  const size_t throughput = text.find("Request throughput (req/s):");
  const size_t goodput = text.find("Request goodput (req/s):                 1.00");
  REQUIRE(goodput != std::string::npos);
  CHECK(throughput < goodput);  // right after the request throughput, as vLLM prints it
  const auto j = SummaryJson(s);
  CHECK(j["request_goodput"].get<double>() == Approx(1.0));
  CHECK(j["good_completed"] == 2);
  Summary zero = Summarize(r, 0.0, {99});  // no duration: no division by zero
  AddGoodput(r, e2el, &zero);
  CHECK(*zero.request_goodput == 0);
}

TEST_CASE("percentile metrics: only the chosen metrics are reported") {
  auto m = ParsePercentileMetrics("ttft,e2el,ttft");
  REQUIRE(m.ok());
  CHECK(*m == std::vector<std::string>{"ttft", "e2el"});
  CHECK_FALSE(ParsePercentileMetrics("").ok());
  CHECK_FALSE(ParsePercentileMetrics("ttft,").ok());
  auto bad = ParsePercentileMetrics("ttft,client_queue_time");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("'client_queue_time' is not one of ttft, tpot, itl, e2el") !=
        std::string::npos);
  auto mp = ParsePercentiles("25,x", "--metric-percentiles");
  REQUIRE_FALSE(mp.ok());
  CHECK(mp.status().message().rfind("--metric-percentiles: 'x'", 0) == 0);

  std::vector<RequestRecord> r = {Done(10, 30, 3)};
  r[0].itl_s = {0.01, 0.01};
  Summary s = Summarize(r, 1.0, {25, 50});
  CHECK(s.reported_metrics == std::vector<std::string>{"ttft", "tpot", "itl", "e2el"});
  s.reported_metrics = *m;
  const std::string text = FormatSummary(s, {});
  CHECK(text.find("P25 TTFT (ms):") != std::string::npos);
  CHECK(text.find("P50 E2EL (ms):") != std::string::npos);
  CHECK(text.find("TPOT") == std::string::npos);
  CHECK(text.find("ITL") == std::string::npos);
  CHECK(text.find("Time to First Token") < text.find("End-to-end Latency"));
  const auto j = SummaryJson(s);
  CHECK(j.contains("p25_ttft_ms"));
  CHECK(j.contains("mean_e2el_ms"));
  CHECK_FALSE(j.contains("mean_tpot_ms"));
  CHECK_FALSE(j.contains("p50_itl_ms"));
}

TEST_CASE("summary: cached prompt tokens and their ratio, per-turn TTFT and cache (multi-turn)") {
  // Two conversations of three turns; conversation 1's turn 3 failed.
  std::vector<RequestRecord> r;
  const double ttft_ms[2][3] = {{100, 20, 30}, {200, 40, 50}};
  const int64_t prompt[3] = {64, 96, 128}, cached[3] = {0, 64, 96};
  for (int c = 0; c < 2; ++c) {
    for (int t = 0; t < 3; ++t) {
      RequestRecord x = Done(ttft_ms[c][t], ttft_ms[c][t] + 10, 2);
      x.conversation = c;
      x.turn = t + 1;
      x.prompt_tokens = prompt[t];
      x.cached_tokens = cached[t];
      r.push_back(x);
    }
  }
  r.back().success = false;
  r.back().failure = FailureKind::kHttpStatus;
  r.back().http_status = 500;
  const Summary s = Summarize(r, 1.0, {99});
  CHECK(s.total_input_tokens == 64 + 96 + 128 + 64 + 96);
  CHECK(s.total_cached_tokens == 0 + 64 + 96 + 0 + 64);
  CHECK(s.cached_token_ratio == Approx(224.0 / 448.0));
  REQUIRE(s.per_turn.size() == 3);
  CHECK(s.per_turn[0].turn == 1);
  CHECK(s.per_turn[0].completed == 2);
  CHECK(s.per_turn[0].median_ttft_ms == Approx(150));
  CHECK(s.per_turn[0].p90_ttft_ms == Approx(190));  // 100 + 0.9 * 100
  CHECK(s.per_turn[0].mean_cached_tokens == 0);
  CHECK(s.per_turn[1].mean_cached_tokens == 64);
  CHECK(s.per_turn[1].mean_prompt_tokens == 96);
  CHECK(s.per_turn[1].median_ttft_ms == Approx(30));
  CHECK(s.per_turn[2].completed == 1);
  CHECK(s.per_turn[2].failed == 1);
  CHECK(s.per_turn[2].median_ttft_ms == Approx(30));
  CHECK(s.per_turn[2].mean_cached_tokens == 96);

  // The text with runs of spaces squashed, so the checks do not count columns.
  std::string text;
  for (char ch : FormatSummary(s, {})) {
    if (ch != ' ' || text.empty() || text.back() != ' ') text += ch;
  }
  CHECK(text.find("\nTotal cached prompt tokens: 224 \n") != std::string::npos);
  CHECK(text.find("\nCached / total prompt tokens: 0.5000 \n") != std::string::npos);
  CHECK(text.find("Per Turn (TTFT, cached prompt tokens)") != std::string::npos);
  CHECK(text.find("\n1 2 0 150.00 190.00 0.0 64.0\n") != std::string::npos);
  CHECK(text.find("\n2 2 0 30.00 38.00 64.0 96.0\n") != std::string::npos);
  CHECK(text.find("\n3 1 1 30.00 30.00 96.0 128.0\n") != std::string::npos);
  const auto j = SummaryJson(s);
  CHECK(j["total_cached_tokens"] == 224);
  CHECK(j["cached_token_ratio"].get<double>() == Approx(0.5));
  REQUIRE(j["per_turn"].size() == 3);
  CHECK(j["per_turn"][1]["turn"] == 2);
  CHECK(j["per_turn"][1]["mean_cached_tokens"].get<double>() == 64);
  CHECK(j["per_turn"][0]["p90_ttft_ms"].get<double>() == Approx(190));
  CHECK(j["per_turn"][2]["failed"] == 1);
  const auto rec = RecordJson(r[4]);
  CHECK(rec["conversation"] == 1);
  CHECK(rec["turn"] == 2);
  CHECK(rec["cached_tokens"] == 64);

  // Other datasets: the ratio is there (0 without cache hits), no per-turn part.
  const Summary plain = Summarize({Done(10, 20, 2)}, 1.0, {99});
  CHECK(plain.per_turn.empty());
  CHECK(plain.cached_token_ratio == 0);
  CHECK(FormatSummary(plain, {}).find("Per Turn") == std::string::npos);
  CHECK(FormatSummary(plain, {}).find("Cached / total prompt tokens:") != std::string::npos);
  CHECK_FALSE(SummaryJson(plain).contains("per_turn"));
  CHECK_FALSE(RecordJson(Done(10, 20, 2)).contains("turn"));
}

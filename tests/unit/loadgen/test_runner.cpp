// BenchClient and RunBenchmark over real HTTP against an in-process cpp-httplib server that
// streams like an OpenAI completions endpoint: the concurrency cap holds, every request is
// recorded, HTTP errors / refused connections / timeouts become failures with reasons, and
// Poisson arrival times have the asked rate.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "tools/loadgen/runner.h"

using namespace oasis::loadgen;
using nlohmann::json;

namespace {

// A streaming server on a free loopback port, stopped and joined on destruction.
class StreamingServer {
 public:
  StreamingServer() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const json body = json::parse(req.body);
      const int max_tokens = body.at("max_tokens").get<int>();
      const int prompt_tokens = static_cast<int>(body.at("prompt").size());
      if (max_tokens > 100) {
        res.status = 400;
        res.set_content(
            R"({"error":{"message":"max_tokens too large","type":"invalid_request_error"}})",
            "application/json");
        return;
      }
      const int now = ++in_flight_;
      int seen = max_in_flight_.load();
      while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
      }
      const int delay_ms = max_tokens == 99 ? 1500 : 2;  // 99 tokens: a stalled server
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, max_tokens, prompt_tokens, delay_ms, sent = 0](size_t,
                                                                httplib::DataSink& sink) mutable {
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            std::string out;
            if (sent < max_tokens) {
              out = "data: " +
                    json({{"choices", {{{"index", 0}, {"text", "t"}, {"finish_reason", nullptr}}}}})
                        .dump() +
                    "\n\n";
              ++sent;
              sink.write(out.data(), out.size());
              return true;
            }
            out = "data: " +
                  json({{"choices", json::array()},
                        {"usage",
                         {{"prompt_tokens", prompt_tokens}, {"completion_tokens", max_tokens}}}})
                      .dump() +
                  "\n\ndata: [DONE]\n\n";
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          },
          [this](bool) { --in_flight_; });
    });
    server_.set_tcp_nodelay(true);  // like oasis-server: each SSE chunk leaves at once
    port_ = server_.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~StreamingServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int max_in_flight() const { return max_in_flight_.load(); }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
};

std::vector<Prompt> Prompts(int n, int input, int output) {
  std::vector<Prompt> prompts(n);
  for (Prompt& p : prompts) {
    for (int i = 0; i < input; ++i) p.token_ids.push_back(i);
    p.prompt_len = input;
    p.output_len = output;
  }
  return prompts;
}

RunOptions Options(int port) {
  RunOptions o;
  o.address = ParseBaseUrl("http://127.0.0.1:" + std::to_string(port)).value();
  o.request.model = "m";
  o.timeout_s = 20;
  return o;
}

}  // namespace

TEST_CASE("base url parsing") {
  auto a = ParseBaseUrl("http://127.0.0.1:8000");
  REQUIRE(a.ok());
  CHECK(a->origin == "http://127.0.0.1:8000");
  CHECK(a->path_prefix.empty());
  auto b = ParseBaseUrl("https://api.example.com/proxy/");
  REQUIRE(b.ok());
  CHECK(b->origin == "https://api.example.com");
  CHECK(b->path_prefix == "/proxy");
  CHECK_FALSE(ParseBaseUrl("127.0.0.1:8000").ok());
  CHECK_FALSE(ParseBaseUrl("ftp://x").ok());
  CHECK_FALSE(ParseBaseUrl("http://").ok());
}

TEST_CASE("run: every request recorded, concurrency capped, tokens from usage") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.max_concurrency = 3;
  const auto prompts = Prompts(12, 5, 8);
  const RunResult result = RunBenchmark(o, prompts, nullptr);
  REQUIRE(result.records.size() == 12);
  for (size_t i = 0; i < 12; ++i) {
    const RequestRecord& r = result.records[i];
    CAPTURE(i, r.error);
    REQUIRE(r.success);
    CHECK(r.index == static_cast<int64_t>(i));
    CHECK(r.usage_reported);
    CHECK(r.prompt_tokens == 5);
    CHECK(r.output_tokens == 8);
    CHECK(r.itl_s.size() == 7);
    CHECK(r.ttft_s > 0);
    CHECK(r.e2el_s >= r.ttft_s);
  }
  CHECK(server.max_in_flight() == 3);  // 12 requests, 3 workers: the cap is reached, never passed
  CHECK(result.duration_s > 0);
}

TEST_CASE("run: HTTP errors and refused connections are failures with reasons") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  auto prompts = Prompts(4, 3, 2);
  prompts[1].output_len = 500;  // rejected with 400
  const RunResult result = RunBenchmark(o, prompts, nullptr);
  CHECK(result.records[0].success);
  CHECK_FALSE(result.records[1].success);
  CHECK(result.records[1].failure == FailureKind::kHttpStatus);
  CHECK(result.records[1].http_status == 400);
  CHECK(FailureReason(result.records[1]) == "HTTP 400: max_tokens too large");

  // A port nobody listens on: a just-closed server's.
  int dead_port;
  {
    StreamingServer gone;
    dead_port = gone.port();
  }
  RunOptions dead = Options(dead_port);
  const RunResult refused = RunBenchmark(dead, Prompts(2, 1, 1), nullptr);
  for (const RequestRecord& r : refused.records) {
    CHECK_FALSE(r.success);
    CHECK(r.failure == FailureKind::kConnection);
    CHECK(r.error.find("cannot connect") != std::string::npos);
  }
}

TEST_CASE("run: a stalled stream times out") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.timeout_s = 0.5;
  auto prompts = Prompts(1, 1, 99);  // the server waits 1.5 s between tokens
  const RunResult result = RunBenchmark(o, prompts, nullptr);
  const RequestRecord& r = result.records[0];
  CHECK_FALSE(r.success);
  CHECK(r.failure == FailureKind::kTimeout);
  CHECK(r.e2el_s < 1.4);
}

TEST_CASE("run: request rate paces the sends") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.request_rate = 20;  // 10 requests: about 0.45 s of arrivals
  o.seed = 1;
  const auto prompts = Prompts(10, 2, 2);
  const RunResult result = RunBenchmark(o, prompts, nullptr);
  const auto arrivals = ArrivalTimes(10, 20, 1.0, 1);
  for (size_t i = 0; i < 10; ++i) {
    REQUIRE(result.records[i].success);
    CHECK(result.records[i].start_s >= arrivals[i] - 1e-3);
    CHECK(result.records[i].start_s < arrivals[i] + 0.2);
  }
}

TEST_CASE("arrival times: infinite rate is all at once, Poisson has the asked mean gap") {
  for (double t : ArrivalTimes(5, INFINITY, 1.0, 0)) CHECK(t == 0);
  for (double burstiness : {1.0, 0.5, 4.0}) {
    CAPTURE(burstiness);
    const auto times = ArrivalTimes(20001, 50.0, burstiness, 7);
    CHECK(times.front() == 0);
    CHECK(std::is_sorted(times.begin(), times.end()));
    const double mean_gap = times.back() / 20000.0;
    CHECK(mean_gap == Approx(0.02).epsilon(0.05));
    // Coefficient of variation of gamma gaps = 1 / sqrt(shape).
    double sq = 0;
    for (size_t i = 1; i < times.size(); ++i) {
      const double g = times[i] - times[i - 1] - mean_gap;
      sq += g * g;
    }
    const double cv = std::sqrt(sq / 20000.0) / mean_gap;
    CHECK(cv == Approx(1.0 / std::sqrt(burstiness)).epsilon(0.1));
  }
  CHECK(ArrivalTimes(10, 5.0, 1.0, 3) == ArrivalTimes(10, 5.0, 1.0, 3));
}

TEST_CASE("run: a reused keep-alive connection adds no Nagle delay to TTFT") {
  // One worker sends ten requests over one connection. If the request body waited for the
  // server's delayed ACK (Nagle on the client socket), every TTFT after the first would be
  // >= 40 ms; the server itself answers in about 2 ms.
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.max_concurrency = 1;
  const RunResult result = RunBenchmark(o, Prompts(10, 4, 2), nullptr);
  std::vector<double> ttft;
  for (const RequestRecord& r : result.records) {
    REQUIRE(r.success);
    ttft.push_back(r.ttft_s);
  }
  std::sort(ttft.begin(), ttft.end());
  CHECK(ttft[5] < 0.025);
}

// BenchClient, RunBenchmark and RunConversations over real HTTP against an in-process
// cpp-httplib server that streams like an OpenAI completions endpoint: the concurrency cap
// holds, every request is recorded, HTTP errors / refused connections / timeouts become
// failures with reasons, Poisson arrival times have the asked rate; multi-turn conversations
// send their turns in order, one at a time, and the server's cached_tokens reach the records.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "tools/loadgen/runner.h"
#include "tools/loadgen/stats.h"

using namespace oasis::loadgen;
using nlohmann::json;

namespace {

// A streaming server on a free loopback port, stopped and joined on destruction. It plays a
// prefix cache: a prompt's cached_tokens (usage.prompt_tokens_details) is the length of the
// longest prompt answered before that begins it. It logs every request with its server-side
// start and end, keyed by the prompt's first token id (a conversation in the multi-turn tests).
class StreamingServer {
 public:
  struct Logged {
    int64_t key = 0;  // the prompt's first token id
    int prompt_tokens = 0;
    BenchClock::time_point start, end;
  };

  StreamingServer() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const json body = json::parse(req.body);
      const int max_tokens = body.at("max_tokens").get<int>();
      const auto prompt = body.at("prompt").get<std::vector<int64_t>>();
      const int prompt_tokens = static_cast<int>(prompt.size());
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
      int cached = 0;
      size_t log_index;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& done : answered_) {
          if (done.size() <= prompt.size() && std::equal(done.begin(), done.end(), prompt.begin()))
            cached = std::max(cached, static_cast<int>(done.size()));
        }
        const int64_t key = prompt.empty() ? -1 : prompt[0];
        max_per_key_[key] = std::max(max_per_key_[key], ++in_flight_per_key_[key]);
        log_.push_back({key, prompt_tokens, BenchClock::now(), {}});
        log_index = log_.size() - 1;
      }
      // The request is over for the bookkeeping just before its last chunk is written: the
      // client may send its next request as soon as it reads that chunk, on a new connection
      // (httplib's server closes one after 5 requests) whose thread does not wait for this
      // one's releaser. Called again by the releaser (for a stream cut short): once only.
      auto finished = std::make_shared<std::atomic<bool>>(false);
      auto finish = [this, prompt, log_index, finished] {
        if (finished->exchange(true)) return;
        {
          std::lock_guard<std::mutex> lock(mu_);
          answered_.push_back(prompt);
          --in_flight_per_key_[prompt.empty() ? -1 : prompt[0]];
          log_[log_index].end = BenchClock::now();
        }
        --in_flight_;
      };
      const int delay_ms = max_tokens == 99 ? 1500 : 2;  // 99 tokens: a stalled server
      res.set_chunked_content_provider(
          "text/event-stream",
          [max_tokens, prompt_tokens, cached, delay_ms, finish, sent = 0](
              size_t, httplib::DataSink& sink) mutable {
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
            json usage = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", max_tokens}};
            if (cached > 0) usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
            out = "data: " + json({{"choices", json::array()}, {"usage", usage}}).dump() +
                  "\n\ndata: [DONE]\n\n";
            finish();
            sink.write(out.data(), out.size());
            sink.done();
            return true;
          },
          [finish](bool) { finish(); });
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
  // The most requests in flight at once with `key` as their first token id.
  int max_in_flight_of(int64_t key) {
    std::lock_guard<std::mutex> lock(mu_);
    return max_per_key_[key];
  }
  std::vector<Logged> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::mutex mu_;
  std::vector<std::vector<int64_t>> answered_;  // prompts whose response ended
  std::map<int64_t, int> in_flight_per_key_, max_per_key_;
  std::vector<Logged> log_;
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

namespace {

// `n` conversations of `turns` turns (first_len + (t - 1) * inc tokens, output `out`) whose
// first token id is 1000 + the conversation's index, so the server can tell them apart.
std::vector<MultiTurnConversation> Conversations(int64_t n, int64_t turns, int64_t first_len,
                                                 int64_t inc, int64_t out) {
  MultiTurnWorkloadOptions o;
  o.num_conversations = n;
  o.num_turns = turns;
  o.first_len = first_len;
  o.increment_len = inc;
  o.output_len = out;
  o.vocab_size = 1000;
  o.seed = 5;
  auto made = MakeMultiTurnWorkload(o);
  REQUIRE(made.ok());
  for (int64_t c = 0; c < n; ++c) (*made)[c].last.token_ids[0] = 1000 + c;
  return std::move(*made);
}

}  // namespace

TEST_CASE("multi-turn run: turns in order, one at a time per conversation, concurrency capped") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.max_concurrency = 2;
  const auto conversations = Conversations(5, 3, 20, 10, 6);
  const RunResult result = RunConversations(o, conversations, nullptr);
  REQUIRE(result.records.size() == 15);
  for (int64_t c = 0; c < 5; ++c) {
    for (int64_t t = 0; t < 3; ++t) {
      const RequestRecord& r = result.records[c * 3 + t];
      CAPTURE(c, t, r.error);
      REQUIRE(r.success);
      CHECK(r.index == c * 3 + t);
      CHECK(r.conversation == c);
      CHECK(r.turn == t + 1);
      CHECK(r.prompt_tokens == 20 + 10 * t);
      CHECK(r.output_tokens == 6);
      // The server's cache held the previous turn's prompt, and only that.
      CHECK(r.cached_tokens == (t == 0 ? 0 : 20 + 10 * (t - 1)));
      if (t > 0) {  // sent only after the previous turn's response ended
        const RequestRecord& prev = result.records[c * 3 + t - 1];
        CHECK(r.start_s >= prev.start_s + prev.e2el_s);
      }
    }
    CHECK(server.max_in_flight_of(1000 + c) == 1);  // never two turns of one at once
  }
  // Server side: each conversation's requests arrive in turn order, each after the last ended.
  std::map<int64_t, std::vector<StreamingServer::Logged>> by_conversation;
  for (const auto& l : server.log()) by_conversation[l.key].push_back(l);
  REQUIRE(by_conversation.size() == 5);
  for (auto& [key, requests] : by_conversation) {
    CAPTURE(key);
    std::sort(requests.begin(), requests.end(),
              [](const auto& a, const auto& b) { return a.start < b.start; });
    REQUIRE(requests.size() == 3);
    for (size_t t = 0; t < 3; ++t) {
      CHECK(requests[t].prompt_tokens == 20 + 10 * static_cast<int>(t));
      if (t > 0) CHECK(requests[t].start >= requests[t - 1].end);
    }
  }
  CHECK(server.max_in_flight() == 2);  // five conversations, two at a time: reached, not passed
  CHECK(result.duration_s > 0);

  Summary s = Summarize(result.records, result.duration_s, {99});
  REQUIRE(s.per_turn.size() == 3);
  CHECK(s.per_turn[0].mean_cached_tokens == 0);
  CHECK(s.per_turn[1].mean_cached_tokens == 20);
  CHECK(s.per_turn[2].mean_cached_tokens == 30);
  CHECK(s.cached_token_ratio == Approx(50.0 / 90.0));
}

TEST_CASE("multi-turn run: without a cap every conversation starts at once") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  const auto conversations = Conversations(4, 2, 8, 50, 50);  // 50 tokens: about 100 ms a turn
  const RunResult result = RunConversations(o, conversations, nullptr);
  REQUIRE(result.records.size() == 8);
  for (const RequestRecord& r : result.records) REQUIRE(r.success);
  CHECK(server.max_in_flight() == 4);
  for (int64_t c = 0; c < 4; ++c) CHECK(server.max_in_flight_of(1000 + c) == 1);
}

TEST_CASE("multi-turn run: think time between a response and the next turn") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.think_time_s = 0.08;
  const auto conversations = Conversations(2, 3, 8, 4, 2);
  const RunResult result = RunConversations(o, conversations, nullptr);
  REQUIRE(result.records.size() == 6);
  for (size_t i = 0; i < 6; ++i) {
    const RequestRecord& r = result.records[i];
    REQUIRE(r.success);
    if (r.turn == 1) continue;
    const RequestRecord& prev = result.records[i - 1];
    CHECK(r.start_s - (prev.start_s + prev.e2el_s) >= 0.08);
  }
}

TEST_CASE("multi-turn run: a request rate paces the conversation starts") {
  StreamingServer server;
  RunOptions o = Options(server.port());
  o.request_rate = 20;
  o.seed = 2;
  const auto conversations = Conversations(6, 2, 4, 4, 2);
  const RunResult result = RunConversations(o, conversations, nullptr);
  const auto arrivals = ArrivalTimes(6, 20, 1.0, 2);
  CHECK(arrivals.back() > 0.05);  // the pacing is visible
  for (size_t c = 0; c < 6; ++c) {
    const RequestRecord& first = result.records[c * 2];
    REQUIRE(first.success);
    CHECK(first.turn == 1);
    CHECK(first.start_s >= arrivals[c] - 1e-3);
    CHECK(first.start_s < arrivals[c] + 0.2);
  }
}

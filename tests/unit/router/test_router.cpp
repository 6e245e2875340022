// oasis-router: the pure helpers (addresses, settings, body rewriting, SSE synthesis) and the
// whole protocol against small in-process httplib servers standing in for prefill and decode
// instances on 127.0.0.1 (port 0).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "disagg/staging_pool.h"
#include "disagg/staging_server.h"
#include "disagg/ticket.h"
#include "disagg/ucx.h"
#include "router/router.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::router;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Writes to closed sockets must fail with EPIPE, not kill the test.
const bool kIgnoreSigpipe = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

// A well-formed handoff ticket (the router checks the tickets it passes on) for lease `lease_id`
// of the staging server at `staging_address`, in base64 as a prefill instance answers it.
std::string TicketFor(const std::string& staging_address, uint64_t lease_id) {
  disagg::HandoffTicket t;
  t.staging_address = staging_address;
  t.pool_id = 7;
  t.lease_id = lease_id;
  t.lease_ttl_ms = 30000;
  t.geometry = {
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 16, .dtype_bytes = 2, .num_blocks = 1};
  t.prompt_length = 4;
  t.position = 5;
  t.tokens = {7, 8};
  auto layout = disagg::StagedKvLayout::Create(t.geometry);  // (no REQUIRE: static init)
  if (!layout.ok()) throw std::runtime_error(layout.status().ToString());
  t.extents = {{0, static_cast<uint32_t>(layout->num_slots())}};
  t.admission = {{0}};
  const std::string bytes = disagg::EncodeHandoffTicket(t);
  if (auto parsed = disagg::ParseHandoffTicket(bytes); !parsed.ok())
    throw std::runtime_error(parsed.status().ToString());
  return Base64Encode(bytes);
}
// Its staging address is a port nobody listens on: an abort fails quickly.
const std::string kTicket = TicketFor("127.0.0.1:1", 1);

// Polls `cond` every 5 ms until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  bool WaitFor(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [this] { return open; });
  }
};

// A stand-in instance: /health (200 unless health_status says otherwise), /v1/models and the two
// generation routes, whose answer `generate` gives. Records every generation body.
class Fake {
 public:
  using Generate = std::function<void(Fake&, const httplib::Request&, httplib::Response&)>;

  explicit Fake(Generate generate) : generate_(std::move(generate)) {
    server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      ++health_hits;
      res.status = health_status.load();
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(health_body, "application/json");
    });
    server_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      Record(req, Json::object());
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    auto gen = [this](const httplib::Request& req, httplib::Response& res) {
      Json body = Json::parse(req.body, nullptr, false);
      Record(req, body);
      generate_(*this, req, res);
    };
    server_.Post("/v1/completions", gen);
    server_.Post("/v1/chat/completions", gen);
    port = server_.bind_to_any_port("127.0.0.1");
    REQUIRE(port > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    REQUIRE(Eventually([this] { return server_.is_running(); }));
  }
  ~Fake() { Stop(); }

  void Stop() {
    if (thread_.joinable()) {
      server_.stop();
      thread_.join();
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  Address addr() const { return Address{"127.0.0.1", port}; }

  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(bodies_.size());
  }
  Json body(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_.at(i);
  }
  std::string auth(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return auth_.at(i);
  }
  std::string path(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return paths_.at(i);
  }

  void SetHealthBody(std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    health_body = std::move(body);
  }

  int port = 0;
  std::atomic<int> health_status{200};
  std::string health_body = "{}";  // guarded by mu_
  std::atomic<int> health_hits{0};

 private:
  void Record(const httplib::Request& req, Json body) {
    std::lock_guard<std::mutex> lock(mu_);
    bodies_.push_back(std::move(body));
    auth_.push_back(req.get_header_value("Authorization"));
    paths_.push_back(req.path);
  }

  Generate generate_;
  httplib::Server server_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Json> bodies_;
  std::vector<std::string> auth_, paths_;
};

// A port on 127.0.0.1 that refuses connections (bound, not listening) while this lives.
class DeadPort {
 public:
  DeadPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~DeadPort() { ::close(fd_); }
  Address addr() const { return Address{"127.0.0.1", port}; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;

 private:
  int fd_ = -1;
};

// A hostile instance on 127.0.0.1, raw TCP: answers GET /health with 200 (so the router
// counts it healthy) and treats every other request as `mode` says. Closes everything when
// destroyed.
class Hostile {
 public:
  enum class Mode {
    kClose,              // read the request, close without a byte
    kSilent,             // read the request, then say nothing (a hung or stopped process)
    kHeadersThenSilent,  // 200 SSE headers, then nothing
  };
  explicit Hostile(Mode mode) : mode_(mode) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 64) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Hostile() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
    std::lock_guard<std::mutex> lock(mu_);
    for (int c : held_) ::close(c);
  }
  Address addr() const { return Address{"127.0.0.1", port}; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::atomic<int> posts{0};
  // Whether the peer (the router) closed a held connection.
  bool PeerClosedHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int c : held_) {
      char b[4096];
      ssize_t n;
      while ((n = ::recv(c, b, sizeof b, MSG_DONTWAIT)) > 0) {
      }                         // the rest of the request
      if (n == 0) return true;  // end of stream: closed by the peer
    }
    return false;
  }

 private:
  void Loop() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      if (head.rfind("GET /health", 0) == 0) {
        const std::string ok =
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        ::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
        ::close(c);
        continue;
      }
      ++posts;
      if (mode_ == Mode::kClose) {
        ::close(c);
        continue;
      }
      if (mode_ == Mode::kHeadersThenSilent) {
        const std::string h =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
            "chunked\r\n\r\n";
        ::send(c, h.data(), h.size(), MSG_NOSIGNAL);
      }
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(c);
    }
  }

  Mode mode_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> held_;
};

Json CompletionResponse(const std::string& text, const std::string& finish) {
  return {{"id", "cmpl-7"},
          {"object", "text_completion"},
          {"created", 1700000000},
          {"model", "fake-model"},
          {"choices",
           {{{"index", 0},
             {"text", text},
             {"logprobs", nullptr},
             {"finish_reason", finish},
             {"stop_reason", nullptr}}}},
          {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}}};
}

Json ChatResponse(const std::string& content, const std::string& finish) {
  return {{"id", "chatcmpl-7"},
          {"object", "chat.completion"},
          {"created", 1700000001},
          {"model", "fake-model"},
          {"choices",
           {{{"index", 0},
             {"message", {{"role", "assistant"}, {"content", content}}},
             {"logprobs", {{"content", {{{"token", "Hi"}, {"logprob", -0.5}}}}}},
             {"finish_reason", finish}}}},
          {"usage", {{"prompt_tokens", 4}, {"completion_tokens", 1}, {"total_tokens", 5}}}};
}

// Prefill answers: a handoff ticket, a finished response, or an error status.
Fake::Generate HandoffPrefill() {
  return [](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_content(Json{{"id", "cmpl-7"}, {"oasis_handoff", kTicket}}.dump(), "application/json");
  };
}
Fake::Generate FinishedPrefill(Json response) {
  return [response](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_content(response.dump(), "application/json");
  };
}
Fake::Generate StatusAnswer(int status, const std::string& message) {
  return [status, message](Fake&, const httplib::Request&, httplib::Response& res) {
    res.status = status;
    res.set_content(
        Json{{"error", {{"message", message}, {"type", "x"}, {"param", nullptr}, {"code", status}}}}
            .dump(),
        "application/json");
  };
}

int HttpStatus(const httplib::Result& r) { return r ? r->status : -1; }

std::string Event(const Json& j) { return "data: " + j.dump() + "\n\n"; }
Json TextChunk(const std::string& text) {
  return {{"id", "cmpl-7"},
          {"object", "text_completion"},
          {"created", 1},
          {"model", "fake-model"},
          {"choices",
           {{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}}}};
}

// Decode: checks the ticket (400 without it); not streaming: a completion "decoded"; streaming:
// the chunks "de", "coded" then [DONE].
Fake::Generate SimpleDecode() {
  return [](Fake&, const httplib::Request& req, httplib::Response& res) {
    Json body = Json::parse(req.body, nullptr, false);
    if (!body.is_object() || body.value("oasis_ticket", "") != kTicket) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"missing ticket"}})", "application/json");
      return;
    }
    if (!body.value("stream", false)) {
      res.set_content(CompletionResponse("decoded", "length").dump(), "application/json");
      return;
    }
    res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
      for (const std::string& e :
           {Event(TextChunk("de")), Event(TextChunk("coded")), std::string("data: [DONE]\n\n")}) {
        if (!sink.write(e.data(), e.size())) return false;
      }
      sink.done();
      return true;
    });
  };
}

RouterOptions TestOptions(std::vector<Address> prefill, std::vector<Address> decode) {
  RouterOptions o;
  o.prefill = std::move(prefill);
  o.decode = std::move(decode);
  o.timeout_s = 5;
  o.connect_timeout_s = 1;
  o.upstream_first_byte_timeout_s = 5;
  o.upstream_idle_timeout_s = 5;
  o.http_threads = 8;
  o.health_interval_ms = 50;
  o.health_timeout_ms = 500;
  return o;
}

// The router on 127.0.0.1:0, served on its own thread.
class RouterUnderTest {
 public:
  explicit RouterUnderTest(RouterOptions options) : router(std::move(options)) {
    StatusOr<int> p = router.Bind("127.0.0.1", 0);
    REQUIRE(p.ok());
    port = *p;
    thread_ = std::thread([this] { router.Run(); });
  }
  ~RouterUnderTest() {
    router.Stop();
    thread_.join();
  }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    return c;
  }
  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) const {
    return Client().Post(path, headers, body, "application/json");
  }
  std::string Metrics() const {
    auto r = Client().Get("/metrics");
    return r ? r->body : "";
  }

  Router router;
  int port = 0;

 private:
  std::thread thread_;
};

// A streamed POST: every piece of body as it arrives goes to `on_data` (return false to hang up).
struct Streamed {
  int status = 0;
  std::string content_type;
  std::string body;
  httplib::Error error = httplib::Error::Success;
};
Streamed PostStreamed(int port, const std::string& path, const std::string& body,
                      std::function<bool(const std::string& so_far)> on_data = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(5, 0);
  Streamed out;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    out.content_type = r.get_header_value("Content-Type");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.body.append(data, n);
    return on_data ? on_data(out.body) : true;
  };
  httplib::Response res;
  cli.send(req, res, out.error);
  return out;
}

// The JSON events of an SSE body ("[DONE]" as the string "[DONE]").
std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    out.push_back(payload == "[DONE]" ? Json("[DONE]") : Json::parse(payload));
    pos = end;
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------ pure helpers

TEST_CASE("router: addresses parse, bad ones are errors naming the value", "[router]") {
  StatusOr<Address> a = ParseAddress("10.0.0.1:8001");
  REQUIRE(a.ok());
  CHECK(a->host == "10.0.0.1");
  CHECK(a->port == 8001);
  CHECK(ParseAddress(" http://gpu-3:9000/ ")->ToString() == "gpu-3:9000");
  StatusOr<Address> v6 = ParseAddress("[::1]:8000");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->ToString() == "[::1]:8000");
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:80x", "::1:80",
                          "a b:80", "[::1]80"}) {
    INFO(bad);
    StatusOr<Address> r = ParseAddress(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find(std::string("'") + bad + "'") != std::string::npos);
  }
  StatusOr<std::vector<Address>> list = ParseAddressList("a:1, b:2,c:3", "--prefill");
  REQUIRE(list.ok());
  REQUIRE(list->size() == 3);
  CHECK((*list)[1] == Address{"b", 2});
  StatusOr<std::vector<Address>> empty_entry = ParseAddressList("a:1,,b:2", "--decode");
  REQUIRE_FALSE(empty_entry.ok());
  CHECK(empty_entry.status().message().find("--decode") != std::string::npos);
  StatusOr<std::vector<Address>> bad_port = ParseAddressList("a:1,b:99999", "--prefill");
  REQUIRE_FALSE(bad_port.ok());
  CHECK(bad_port.status().message().find("b:99999") != std::string::npos);
}

TEST_CASE("router: client bodies are checked and rewritten for prefill and decode", "[router]") {
  int status = 0;
  std::string message;
  CHECK_FALSE(ParseClientRequest("{not json", &status, &message));
  CHECK(status == 400);
  CHECK_FALSE(ParseClientRequest("[1,2]", &status, &message));
  CHECK(message.find("JSON object") != std::string::npos);
  const std::string deep =
      R"({"prompt":)" + std::string(60000, '[') + std::string(60000, ']') + "}";
  CHECK_FALSE(ParseClientRequest(deep, &status, &message));
  CHECK(status == 400);
  CHECK(message.find("deeper than 256 levels") != std::string::npos);
  CHECK(ErrorMessageOf(R"({"error":{"message":)" + std::string(60000, '[') + "}}").size() <= 200);
  for (const char* multi : {R"({"prompt":"x","n":2})", R"({"prompt":"x","n":1.5})"}) {
    INFO(multi);
    CHECK_FALSE(ParseClientRequest(multi, &status, &message));
    CHECK(status == 400);
    CHECK(message == "n > 1 is not supported by the disaggregated router");
  }
  CHECK_FALSE(ParseClientRequest(R"({"prompt":"x","best_of":3})", &status, &message));
  CHECK(message == "best_of > 1 is not supported by the disaggregated router");
  // stream_options by the instances' rules and messages (a decode instance would refuse them
  // after the prefill staged the request's KV).
  for (const auto& [body, want] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":"x","stream_options":{"include_usage":true}})",
            "'stream_options' is only allowed with stream=true"},
           {R"({"prompt":"x","stream":false,"stream_options":{}})",
            "'stream_options' is only allowed with stream=true"},
           {R"({"prompt":"x","stream":true,"stream_options":[1]})",
            "'stream_options' must be an object"},
           {R"({"prompt":"x","stream":true,"stream_options":{"x":true}})",
            "unknown parameter 'stream_options.x'"},
           {R"({"prompt":"x","stream":true,"stream_options":{"include_usage":1}})",
            "'stream_options.include_usage' must be a boolean"}}) {
    INFO(body);
    CHECK_FALSE(ParseClientRequest(body, &status, &message));
    CHECK(status == 400);
    CHECK(message == want);
  }
  CHECK(ParseClientRequest(R"({"prompt":"x","stream_options":null})", &status, &message));
  std::optional<ClientRequest> cont = ParseClientRequest(
      R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}})",
      &status, &message);
  REQUIRE(cont);
  CHECK(cont->continuous_usage);
  CHECK_FALSE(ParseClientRequest(R"({"prompt":"x","stream":"yes"})", &status, &message));
  CHECK(ParseClientRequest(R"({"prompt":"x","n":1,"best_of":1})", &status, &message));

  std::optional<ClientRequest> r = ParseClientRequest(
      R"({"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true},"max_tokens":7})",
      &status, &message);
  REQUIRE(r);
  CHECK(r->stream);
  CHECK(r->include_usage);
  const OrderedJson pre = PrefillBody(r->body);
  CHECK(pre.dump() ==
        R"({"model":"m","prompt":"hi","stream":false,"max_tokens":7})");  // key order kept
  const OrderedJson dec = DecodeBody(r->body, kTicket);
  CHECK(dec["stream"] == true);
  CHECK(dec["stream_options"]["include_usage"] == true);
  CHECK(dec["oasis_ticket"] == kTicket);
  CHECK(dec["max_tokens"] == 7);

  std::optional<ClientRequest> plain = ParseClientRequest(R"({"prompt":"x"})", &status, &message);
  REQUIRE(plain);
  CHECK_FALSE(plain->stream);
  CHECK_FALSE(plain->include_usage);
  CHECK(PrefillBody(plain->body).dump() == R"({"prompt":"x","stream":false})");

  const OrderedJson e = ErrorJson(503, "down");
  CHECK(
      e.dump() ==
      R"({"error":{"message":"down","type":"service_unavailable_error","param":null,"code":503}})");
  CHECK(ErrorJson(400, "x")["error"]["type"] == "invalid_request_error");
  CHECK(ErrorJson(404, "x")["error"]["type"] == "not_found_error");
  CHECK(ErrorJson(500, "x")["error"]["type"] == "server_error");
}

// oasis-server's own stream format (server/http_server.cpp, openai_response.cpp), which the
// synthesized stream must equal: chat's role chunk first, "stop_reason" in the choice,
// "usage": null in the choice chunks with include_usage (the usage so far with
// continuous_usage_stats), the usage chunk, [DONE]. e2e_disagg compares it with a real server.
TEST_CASE("router: SSE synthesized from a finished response", "[router]") {
  SECTION("completions, with usage and a stop string") {
    Json response = CompletionResponse("Hi!", "stop");
    response["choices"][0]["stop_reason"] = " a";
    const std::string sse = SynthesizeSse(OrderedJson(response), Endpoint::kCompletions, true);
    CHECK(sse.size() >= 14);
    CHECK(sse.substr(sse.size() - 14) == "data: [DONE]\n\n");
    std::vector<Json> ev = Events(sse);
    REQUIRE(ev.size() == 3);
    CHECK(ev[1]["choices"] == Json::array());
    CHECK(ev[1]["usage"]["total_tokens"] == 5);
    CHECK(ev[1]["object"] == "text_completion");
    CHECK(ev[2] == "[DONE]");
    // Field order and keys as the server's.
    CHECK(
        sse.rfind(
            R"(data: {"id":"cmpl-7","object":"text_completion","created":1700000000,"model":"fake-model","choices":[{"index":0,"text":"Hi!","logprobs":null,"finish_reason":"stop","stop_reason":" a"}],"usage":null})"
            "\n\n",
            0) == 0);
  }
  SECTION("completions without usage: no usage key; a stop token id stays a number") {
    Json response = CompletionResponse("Hi", "stop");
    response["choices"][0]["stop_reason"] = 13;
    std::vector<Json> ev =
        Events(SynthesizeSse(OrderedJson(response), Endpoint::kCompletions, false));
    REQUIRE(ev.size() == 2);
    CHECK_FALSE(ev[0].contains("usage"));
    CHECK(ev[0]["choices"][0]["stop_reason"] == 13);
  }
  SECTION("chat, without usage: a role chunk, then the content") {
    const std::string sse =
        SynthesizeSse(ChatResponse("Hi", "length"), Endpoint::kChatCompletions, false);
    CHECK(
        sse.rfind(
            R"(data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]})"
            "\n\n",
            0) == 0);
    std::vector<Json> ev = Events(sse);
    REQUIRE(ev.size() == 3);
    CHECK(ev[1]["object"] == "chat.completion.chunk");
    CHECK(ev[1]["id"] == "chatcmpl-7");
    CHECK(ev[1]["choices"][0]["delta"] == Json{{"content", "Hi"}});
    CHECK(ev[1]["choices"][0]["logprobs"]["content"][0]["token"] == "Hi");
    CHECK(ev[1]["choices"][0]["finish_reason"] == "length");
    CHECK(ev[1]["choices"][0].contains("stop_reason"));
    CHECK(ev[2] == "[DONE]");
  }
  SECTION("chat, with usage; an empty answer has an empty delta") {
    std::vector<Json> ev =
        Events(SynthesizeSse(ChatResponse("", "stop"), Endpoint::kChatCompletions, true));
    REQUIRE(ev.size() == 4);
    CHECK(ev[0]["usage"].is_null());
    CHECK(ev[0].contains("usage"));
    CHECK(ev[1]["choices"][0]["delta"] == Json::object());
    CHECK(ev[1]["usage"].is_null());
    CHECK(ev[2]["choices"] == Json::array());
    CHECK(ev[2]["usage"]["prompt_tokens"] == 4);
    CHECK(ev[2]["object"] == "chat.completion.chunk");
  }
  SECTION("continuous usage: every choice chunk carries the usage so far") {
    Json response = ChatResponse("Hi", "stop");
    response["usage"]["prompt_tokens_details"] = {{"cached_tokens", 2}};
    std::vector<Json> ev =
        Events(SynthesizeSse(OrderedJson(response), Endpoint::kChatCompletions, true, true));
    REQUIRE(ev.size() == 4);
    // The role chunk comes before admission in the server's stream: nothing cached yet.
    CHECK(ev[0]["usage"] ==
          Json{{"prompt_tokens", 4}, {"completion_tokens", 0}, {"total_tokens", 4}});
    CHECK(ev[1]["usage"] == Json{{"prompt_tokens", 4},
                                 {"completion_tokens", 1},
                                 {"total_tokens", 5},
                                 {"prompt_tokens_details", {{"cached_tokens", 2}}}});
    CHECK(ev[2]["usage"]["total_tokens"] == 5);
  }
  SECTION("chat with reasoning and tool calls: deltas as the server's") {
    Json response = ChatResponse("", "tool_calls");
    response["choices"][0]["message"] = {{"role", "assistant"},
                                         {"content", nullptr},
                                         {"reasoning_content", "think"},
                                         {"tool_calls",
                                          {{{"id", "call_1"},
                                            {"type", "function"},
                                            {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}};
    std::vector<Json> ev =
        Events(SynthesizeSse(OrderedJson(response), Endpoint::kChatCompletions, false));
    REQUIRE(ev.size() == 3);
    const Json delta = ev[1]["choices"][0]["delta"];
    CHECK(delta["reasoning_content"] == "think");
    CHECK_FALSE(delta.contains("content"));
    CHECK(delta["tool_calls"][0] == Json{{"index", 0},
                                         {"id", "call_1"},
                                         {"type", "function"},
                                         {"function", {{"name", "f"}, {"arguments", "{}"}}}});
  }
}

TEST_CASE("router: command line, config file and flag override", "[router]") {
  const auto dir = oasis::testing::MakeTempDir("router_config");
  const std::string path = (dir / "router.json").string();
  std::ofstream(path)
      << R"({"prefill": ["10.0.0.1:8001", "10.0.0.2:8001"], "decode": "10.0.0.3:8002",
                            "port": 9000, "timeout_s": 12.5, "api-key": "k", "_comment": "ignored"})";
  auto parse = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    static std::string prog = "oasis-router";
    argv.push_back(prog.data());
    for (std::string& a : args) argv.push_back(a.data());
    return ParseRouterCommandLine(static_cast<int>(argv.size()), argv.data());
  };
  {
    auto cmd = parse({"--config", path});
    REQUIRE(cmd.ok());
    CHECK(cmd->settings.port == 9000);
    CHECK(cmd->settings.host == "127.0.0.1");
    REQUIRE(cmd->options.prefill.size() == 2);
    CHECK(cmd->options.prefill[1] == Address{"10.0.0.2", 8001});
    REQUIRE(cmd->options.decode.size() == 1);
    CHECK(cmd->options.timeout_s == 12.5);
    CHECK(cmd->options.api_key == "k");
  }
  {
    auto cmd = parse({"--port", "9100", "--config=" + path, "--decode", "10.0.0.9:1,10.0.0.8:2"});
    REQUIRE(cmd.ok());
    CHECK(cmd->settings.port == 9100);
    REQUIRE(cmd->options.decode.size() == 2);
    CHECK(cmd->options.decode[0] == Address{"10.0.0.9", 1});
    CHECK(cmd->options.prefill.size() == 2);
  }
  {
    auto cmd = parse({"--prefill", "h:1", "--decode", "h:2"});
    REQUIRE(cmd.ok());
    CHECK(cmd->settings.port == 8000);
    CHECK(cmd->options.timeout_s == 600);
    CHECK(cmd->options.api_key.empty());
  }
  auto error_of = [&](std::vector<std::string> args) {
    auto cmd = parse(std::move(args));
    REQUIRE_FALSE(cmd.ok());
    return cmd.status().message();
  };
  CHECK(error_of({"--decode", "h:2"}).find("prefill") != std::string::npos);
  CHECK(error_of({"--prefill", "h:1"}).find("decode") != std::string::npos);
  CHECK(error_of({"--prefill", "h:1", "--decode", "gpu7"}).find("'gpu7'") != std::string::npos);
  CHECK(error_of({"--prefill", "h:1,h:70000", "--decode", "h:2"}).find("h:70000") !=
        std::string::npos);
  CHECK(error_of({"--prefill", "h:1", "--decode", "h:2", "--port", "70000"}).find("--port") !=
        std::string::npos);
  CHECK(error_of({"--prefill", "h:1", "--decode", "h:2", "--bogus", "1"}).find("--bogus") !=
        std::string::npos);
  CHECK(error_of({"--config", (dir / "missing.json").string()}).find("missing.json") !=
        std::string::npos);
  std::ofstream(dir / "bad.json") << R"({"prefill": ["h:1"], "decode": ["h:2"], "colour": 3})";
  CHECK(error_of({"--config", (dir / "bad.json").string()}).find("colour") != std::string::npos);
  std::ofstream(dir / "bad_type.json") << R"({"prefill": ["h:1"], "decode": [2]})";
  CHECK(error_of({"--config", (dir / "bad_type.json").string()}).find("decode") !=
        std::string::npos);
  auto help = parse({"--help"});
  REQUIRE(help.ok());
  CHECK(help->help);
  CHECK(help->usage.find("--prefill") != std::string::npos);
  CHECK(help->usage.find("--upstream-first-byte-timeout-s") != std::string::npos);
  CHECK(help->usage.find("--upstream-idle-timeout-s") != std::string::npos);
}

// oasis-router's command line with one prefill and one decode instance, then `args`.
StatusOr<RouterCommandLine> ParseWithInstances(std::vector<std::string> args) {
  std::vector<std::string> all = {"oasis-router", "--prefill", "h:1", "--decode", "h:2"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  return ParseRouterCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST_CASE("router: upstream timeouts, defaults and edges", "[router]") {
  auto parse = ParseWithInstances;
  {
    auto cmd = parse({});
    REQUIRE(cmd.ok());
    CHECK(cmd->options.timeout_s == 600);
    CHECK(cmd->options.connect_timeout_s == 5);
    CHECK(cmd->options.upstream_first_byte_timeout_s == 300);
    CHECK(cmd->options.upstream_idle_timeout_s == 60);
  }
  for (const std::string flag : {"--timeout-s", "--connect-timeout-s",
                                 "--upstream-first-byte-timeout-s", "--upstream-idle-timeout-s"}) {
    INFO(flag);
    for (const std::string bad : {"0", "-1", "-0", "nan", "inf", "-inf", "86400.5", "1e300"}) {
      INFO(bad);
      auto cmd = parse({flag, bad});
      REQUIRE_FALSE(cmd.ok());
      CHECK(cmd.status().message().find(
                flag + " must be a number of seconds in (0, 86400], got ") != std::string::npos);
    }
    CHECK_FALSE(parse({flag, "ten"}).ok());  // not a number: the flag parser's error
    for (const std::string good : {"0.001", "86400", "2.5"}) {
      INFO(good);
      auto cmd = parse({flag, good});
      REQUIRE(cmd.ok());
      const double want = std::stod(good);
      const RouterOptions& o = cmd->options;
      const double got = flag == "--timeout-s"           ? o.timeout_s
                         : flag == "--connect-timeout-s" ? o.connect_timeout_s
                         : flag == "--upstream-first-byte-timeout-s"
                             ? o.upstream_first_byte_timeout_s
                             : o.upstream_idle_timeout_s;
      CHECK(got == want);
    }
  }
  // The config file: the same names with '_' or '-', checked the same way.
  const auto dir = oasis::testing::MakeTempDir("router_timeouts");
  const std::string path = (dir / "router.json").string();
  std::ofstream(path) << R"({"upstream_first_byte_timeout_s": 900, "upstream-idle-timeout-s": 15})";
  auto cmd = parse({"--config", path});
  REQUIRE(cmd.ok());
  CHECK(cmd->options.upstream_first_byte_timeout_s == 900);
  CHECK(cmd->options.upstream_idle_timeout_s == 15);
  cmd = parse({"--config", path, "--upstream-idle-timeout-s", "30"});  // the flag wins
  REQUIRE(cmd.ok());
  CHECK(cmd->options.upstream_idle_timeout_s == 30);
  std::ofstream(dir / "zero.json") << R"({"upstream_idle_timeout_s": 0})";
  cmd = parse({"--config", (dir / "zero.json").string()});
  REQUIRE_FALSE(cmd.ok());
  CHECK(cmd.status().message().find("--upstream-idle-timeout-s") != std::string::npos);
  std::ofstream(dir / "string.json") << R"({"upstream_first_byte_timeout_s": "300"})";
  cmd = parse({"--config", (dir / "string.json").string()});
  REQUIRE_FALSE(cmd.ok());
  CHECK(cmd.status().message().find("upstream_first_byte_timeout_s") != std::string::npos);
}

TEST_CASE("router: the client side's limits, defaults and edges", "[router]") {
  auto parse = ParseWithInstances;
  {
    auto cmd = parse({});
    REQUIRE(cmd.ok());
    CHECK(cmd->options.http_threads == 256);
    CHECK(cmd->options.front.max_connections == 4096);
    CHECK(cmd->options.front.keep_alive_timeout_s == 5);
    CHECK(cmd->options.front.header_timeout_s == 10);
    CHECK(cmd->options.front.body_timeout_s == 60);
    CHECK(cmd->options.front.write_timeout_s == 30);
    CHECK(cmd->options.front.shutdown_timeout_s == 10);
    CHECK(cmd->usage.find("--max-connections") != std::string::npos);
  }
  auto cmd = parse({"--max-connections", "7", "--header-timeout-s", "0.5", "--shutdown-timeout-s",
                    "0", "--http-threads", "4096"});
  REQUIRE(cmd.ok());
  CHECK(cmd->options.front.max_connections == 7);
  CHECK(cmd->options.front.header_timeout_s == 0.5);
  CHECK(cmd->options.front.shutdown_timeout_s == 0);
  CHECK(cmd->options.http_threads == 4096);
  for (const auto& [flag, bad] :
       std::vector<std::pair<std::string, std::string>>{{"--max-connections", "0"},
                                                        {"--max-connections", "1000001"},
                                                        {"--http-threads", "0"},
                                                        {"--http-threads", "4097"},
                                                        {"--keep-alive-timeout-s", "0"},
                                                        {"--header-timeout-s", "nan"},
                                                        {"--body-timeout-s", "-1"},
                                                        {"--write-timeout-s", "86401"},
                                                        {"--shutdown-timeout-s", "-0.5"}}) {
    INFO(flag << " " << bad);
    auto r = parse({flag, bad});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find(flag) != std::string::npos);
  }
}

TEST_CASE("router: a client that hangs up during the prefill call cancels it at once", "[router]") {
  for (const bool stream : {false, true}) {
    INFO("stream " << stream);
    Hostile prefill(Hostile::Mode::kSilent);  // never answers: the prefill "runs" forever
    Fake decode(SimpleDecode());
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    const auto start = Clock::now();
    std::thread client([&] {
      httplib::Client c("127.0.0.1", r.port);
      c.set_read_timeout(0, 300'000);  // gives up after 0.3 s: closes its connection
      c.Post("/v1/completions", stream ? R"({"prompt":"x","stream":true})" : R"({"prompt":"x"})",
             "application/json");
    });
    REQUIRE(Eventually([&] { return prefill.posts.load() == 1; }));
    // The router closes the prefill connection once the client is gone: 0.3 s and a 50 ms
    // poll, not the first-byte timeout (5 s here).
    CHECK(Eventually([&] { return prefill.PeerClosedHeld(); }, std::chrono::seconds(3)));
    CHECK(Clock::now() - start < std::chrono::seconds(2));
    client.join();
    CHECK(decode.calls() == 0);
    CHECK(Eventually([&] {
      return r.Metrics().find("oasis:router_client_disconnects_total 1\n") != std::string::npos;
    }));
  }
}

TEST_CASE("router: past --http-threads requests in flight, a fast 503 with Retry-After",
          "[router]") {
  Hostile prefill(Hostile::Mode::kSilent);
  Fake decode(SimpleDecode());
  RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
  o.http_threads = 2;
  RouterUnderTest r(o);
  std::vector<std::thread> held;
  for (int i = 0; i < 2; ++i) {
    held.emplace_back([&] {
      httplib::Client c("127.0.0.1", r.port);
      c.set_read_timeout(1, 0);
      c.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
    });
  }
  REQUIRE(Eventually([&] { return prefill.posts.load() == 2; }));
  const auto start = Clock::now();
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  CHECK(Clock::now() - start < std::chrono::milliseconds(500));
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->get_header_value("Retry-After") == "1");
  CHECK(Json::parse(res->body)["error"]["message"].get<std::string>().find("--http-threads") !=
        std::string::npos);
  CHECK(prefill.posts.load() == 2);  // the refused one reached no instance
  // /health and /metrics need no request thread.
  auto health = r.Client().Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(r.Metrics().find("oasis:router_busy_total 1\n") != std::string::npos);
  for (std::thread& t : held) t.join();
  // The held requests' clients gave up after 1 s: their threads end, a new request is taken.
  CHECK(Eventually([&] { return prefill.PeerClosedHeld(); }, std::chrono::seconds(3)));
  std::thread again([&] {
    httplib::Client c("127.0.0.1", r.port);
    c.set_read_timeout(0, 300'000);
    c.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  });
  CHECK(Eventually([&] { return prefill.posts.load() == 3; }));
  again.join();
}

TEST_CASE("router: idle and trickling connections hold no thread and do not starve /health",
          "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
  o.http_threads = 4;
  RouterUnderTest r(o);
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(r.port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    if (i % 2 == 0) REQUIRE(send(fd, "POST /v1/comp", 13, 0) == 13);  // half a request line
    fds.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    auto health = r.Client().Get("/health");
    REQUIRE(health);
    CHECK(health->status == 200);
    CHECK(Clock::now() - start < std::chrono::milliseconds(500));
  }
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(r.Metrics().find("oasis:router_http_connections_open ") != std::string::npos);
  for (int fd : fds) close(fd);
}

TEST_CASE("router: SSE framing of a relayed stream", "[router]") {
  CHECK(CompleteEventsEnd("") == 0);
  CHECK(CompleteEventsEnd("data: {\"a\":1}") == 0);
  CHECK(CompleteEventsEnd("data: {\"a\":1}\n") == 0);
  CHECK(CompleteEventsEnd("data: 1\n\n") == 9);
  CHECK(CompleteEventsEnd("data: 1\n\ndata: 2\n\ndata: {\"x") == 18);
  CHECK(CompleteEventsEnd("data: 1\r\n\r\ndata: 2") == 11);
  CHECK(CompleteEventsEnd(": keep-alive\n\n") == 14);
  CHECK(HasDoneEvent("data: [DONE]\n\n"));
  CHECK(HasDoneEvent("data: 1\n\ndata: [DONE]\n\n"));
  CHECK_FALSE(HasDoneEvent("data: {\"text\":\"data: [DONE]\"}\n\n"));  // inside a chunk's text
  CHECK_FALSE(HasDoneEvent("data: 1\n\n"));
}

// ---------------------------------------------------------------------------- with instances

TEST_CASE("router: handoff, not streaming", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  auto res = r.Post("/v1/completions",
                    R"({"model":"m","prompt":"hello","max_tokens":8,"stream_options":null})",
                    {{"Authorization", "Bearer abc"}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "application/json");
  CHECK(Json::parse(res->body) == CompletionResponse("decoded", "length"));
  REQUIRE(prefill.calls() == 1);
  CHECK(prefill.path(0) == "/v1/completions");
  CHECK(prefill.body(0) ==
        Json{{"model", "m"}, {"prompt", "hello"}, {"max_tokens", 8}, {"stream", false}});
  CHECK(prefill.auth(0) == "Bearer abc");
  REQUIRE(decode.calls() == 1);
  CHECK(decode.path(0) == "/v1/completions");
  CHECK(decode.body(0) == Json{{"model", "m"},
                               {"prompt", "hello"},
                               {"max_tokens", 8},
                               {"stream_options", nullptr},
                               {"oasis_ticket", kTicket}});
  CHECK(decode.auth(0) == "Bearer abc");
}

TEST_CASE("router: handoff, streaming, relayed as it arrives", "[router]") {
  Gate client_saw_first;
  std::atomic<bool> last_sent{false}, decode_saw_client{false}, decode_saw_ticket{false};
  Fake prefill(HandoffPrefill());
  Fake decode([&](Fake&, const httplib::Request& req, httplib::Response& res) {
    Json body = Json::parse(req.body, nullptr, false);
    decode_saw_ticket = body.is_object() && body.value("oasis_ticket", "") == kTicket &&
                        body.value("stream", false);
    res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
      const std::string first = Event(TextChunk("first"));
      if (!sink.write(first.data(), first.size())) return false;
      // The last chunk only once the client has the first (or after 1.5 s: a buffering router).
      decode_saw_client = client_saw_first.WaitFor(std::chrono::milliseconds(1500));
      const std::string rest = Event(TextChunk("last")) + "data: [DONE]\n\n";
      last_sent = true;
      if (!sink.write(rest.data(), rest.size())) return false;
      sink.done();
      return true;
    });
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  bool first_before_last = false, seen = false;
  Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"hello","stream":true})",
                            [&](const std::string& so_far) {
                              if (!seen && so_far.find("\"first\"") != std::string::npos) {
                                seen = true;
                                first_before_last = !last_sent.load();
                                client_saw_first.Open();
                              }
                              return true;
                            });
  CHECK(decode_saw_ticket);
  CHECK(s.error == httplib::Error::Success);
  CHECK(s.status == 200);
  CHECK(s.content_type == "text/event-stream");
  CHECK(first_before_last);
  CHECK(decode_saw_client);
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["choices"][0]["text"] == "first");
  CHECK(ev[1]["choices"][0]["text"] == "last");
  CHECK(ev[2] == "[DONE]");
  CHECK(prefill.body(0)["stream"] == false);
}

TEST_CASE("router: finished at prefill, with and without stream", "[router]") {
  SECTION("completions") {
    Fake prefill(FinishedPrefill(CompletionResponse("Hi", "stop")));
    Fake decode(SimpleDecode());
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    auto res = r.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})");
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(res->body == CompletionResponse("Hi", "stop").dump());  // as is
    Streamed s =
        PostStreamed(r.port, "/v1/completions",
                     R"({"prompt":"x","stream":true,"stream_options":{"include_usage":true}})");
    CHECK(s.status == 200);
    CHECK(s.content_type == "text/event-stream");
    std::vector<Json> ev = Events(s.body);
    REQUIRE(ev.size() == 3);
    CHECK(ev[0]["object"] == "text_completion");
    CHECK(ev[0]["choices"][0]["text"] == "Hi");
    CHECK(ev[0]["choices"][0]["finish_reason"] == "stop");
    CHECK(ev[1]["choices"] == Json::array());
    CHECK(ev[1]["usage"]["completion_tokens"] == 2);
    CHECK(ev[2] == "[DONE]");
    CHECK(decode.calls() == 0);
    CHECK(prefill.calls() == 2);
    CHECK(prefill.body(1).count("stream_options") == 0);
  }
  SECTION("chat") {
    Fake prefill(FinishedPrefill(ChatResponse("Yo", "length")));
    Fake decode(SimpleDecode());
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    Streamed s = PostStreamed(r.port, "/v1/chat/completions",
                              R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
    CHECK(s.status == 200);
    std::vector<Json> ev = Events(s.body);
    REQUIRE(ev.size() == 3);
    CHECK(ev[0]["object"] == "chat.completion.chunk");
    CHECK(ev[0]["choices"][0]["delta"] == Json{{"role", "assistant"}, {"content", ""}});
    CHECK(ev[1]["choices"][0]["delta"] == Json{{"content", "Yo"}});
    CHECK(ev[1]["choices"][0]["finish_reason"] == "length");
    CHECK(ev[2] == "[DONE]");
    CHECK(prefill.path(0) == "/v1/chat/completions");
    CHECK(decode.calls() == 0);
  }
}

TEST_CASE("router: bad client bodies are 400 OpenAI errors and reach no instance", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  for (const char* body : {R"({"prompt":"x","n":2})", "{\"prompt\": ", R"("just a string")"}) {
    INFO(body);
    auto res = r.Post("/v1/completions", body);
    REQUIRE(res);
    CHECK(res->status == 400);
    Json e = Json::parse(res->body);
    CHECK(e["error"]["type"] == "invalid_request_error");
    CHECK(e["error"]["code"] == 400);
    CHECK(e["error"]["param"].is_null());
    CHECK(e["error"]["message"].is_string());
  }
  auto multi = r.Post("/v1/chat/completions", R"({"messages":[],"n":3})");
  REQUIRE(multi);
  CHECK(Json::parse(multi->body)["error"]["message"] ==
        "n > 1 is not supported by the disaggregated router");
  CHECK(prefill.calls() == 0);
  auto unknown = r.Client().Get("/v1/nothing");
  REQUIRE(unknown);
  CHECK(unknown->status == 404);
  CHECK(Json::parse(unknown->body)["error"]["code"] == 404);
  CHECK(Json::parse(unknown->body)["error"]["type"] == "not_found_error");
}

TEST_CASE("router: prefill errors are relayed as they are", "[router]") {
  Fake prefill(StatusAnswer(400, "prompt too long"));
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(Json::parse(res->body)["error"]["message"] == "prompt too long");
  CHECK(Json::parse(res->body)["error"]["type"] == "x");  // the instance's body, untouched
  CHECK(prefill.calls() == 1);
  CHECK(decode.calls() == 0);
}

TEST_CASE("router: a busy (429/503) prefill instance sends the request to the next", "[router]") {
  Fake busy(StatusAnswer(429, "queue full"));
  Fake good(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({busy.addr(), good.addr()}, {decode.addr()}));
  for (int i = 0; i < 2; ++i) {  // round-robin: one of the two starts at the busy instance
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(res->status == 200);
  }
  CHECK(busy.calls() == 1);
  CHECK(good.calls() == 2);
  CHECK(r.router.InstanceHealthy(Router::Role::kPrefill, 0));  // busy is not down
  CHECK(r.Metrics().find("oasis:router_instance_failures_total{role=\"prefill\",address=\"" +
                         busy.address() + "\"} 1") != std::string::npos);
}

TEST_CASE(
    "router: a prefill instance that went down: the next one is used and it is marked unhealthy",
    "[router]") {
  auto down = std::make_unique<Fake>(HandoffPrefill());
  const Address down_addr = down->addr();
  Fake good(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterOptions o = TestOptions({down_addr, good.addr()}, {decode.addr()});
  o.health_interval_ms = 60000;  // one poll at start only
  RouterUnderTest r(o);
  REQUIRE(Eventually([&] { return down->health_hits.load() > 0; }));
  down.reset();  // port closed: connection refused
  REQUIRE(r.router.InstanceHealthy(Router::Role::kPrefill, 0));
  auto res =
      r.Post("/v1/completions", R"({"prompt":"x"})");  // round-robin starts at the first instance
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(good.calls() == 1);
  CHECK_FALSE(r.router.InstanceHealthy(Router::Role::kPrefill, 0));
  CHECK(r.router.InstanceHealthy(Router::Role::kPrefill, 1));
}

TEST_CASE("router: all prefill instances down is a 503 naming them", "[router]") {
  DeadPort a, b;
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({a.addr(), b.addr()}, {decode.addr()}));
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 503);
  Json e = Json::parse(res->body);
  CHECK(e["error"]["code"] == 503);
  CHECK(e["error"]["type"] == "service_unavailable_error");
  const std::string message = e["error"]["message"];
  CHECK(message.find(a.address()) != std::string::npos);
  CHECK(message.find(b.address()) != std::string::npos);
  CHECK(decode.calls() == 0);
}

TEST_CASE("router: a decode instance answering 503 sends the request to the next", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake bad(StatusAnswer(503, "draining"));
  Fake good(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {bad.addr(), good.addr()}));
  Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
  CHECK(s.status == 200);
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["choices"][0]["text"] == "de");
  CHECK(bad.calls() == 1);
  CHECK(good.calls() == 1);
  CHECK(bad.body(0) == good.body(0));  // the same body
  CHECK(good.body(0)["oasis_ticket"] == kTicket);

  // Both failing: 503.
  Fake bad2(StatusAnswer(503, "draining too"));
  DeadPort dead;
  RouterUnderTest r2(TestOptions({prefill.addr()}, {bad2.addr(), dead.addr()}));
  auto res = r2.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 503);
  const std::string message = Json::parse(res->body)["error"]["message"];
  CHECK(message.find("draining too") != std::string::npos);
  CHECK(message.find(dead.address()) != std::string::npos);
}

TEST_CASE("router: a client that disconnects mid-stream closes the decode connection", "[router]") {
  std::atomic<bool> write_failed{false};
  std::atomic<int> written{0};
  Fake prefill(HandoffPrefill());
  Fake decode([&](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
      for (int i = 0; i < 150; ++i) {  // 3 s at most
        const std::string e = Event(TextChunk("t" + std::to_string(i)));
        if (!sink.write(e.data(), e.size())) {
          write_failed = true;
          return false;
        }
        ++written;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      sink.done();
      return true;
    });
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  Streamed s = PostStreamed(
      r.port, "/v1/completions", R"({"prompt":"x","stream":true})",
      [](const std::string& so_far) { return so_far.find("\"t1\"") == std::string::npos; });
  CHECK(s.error == httplib::Error::Canceled);
  CHECK(Eventually([&] { return write_failed.load(); }));
  CHECK(written.load() < 60);
  CHECK(Eventually([&] {
    return r.Metrics().find("oasis:router_client_disconnects_total 1") != std::string::npos;
  }));
}

TEST_CASE(
    "router: a decode answer that breaks off ends the client's stream with an error event and "
    "[DONE]",
    "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
      // A whole event, then half of one: the router relays only the whole one.
      const std::string e = Event(TextChunk("partial")) + "data: {\"id\":\"cmpl-7\",\"choi";
      sink.write(e.data(), e.size());
      return false;  // connection dropped, no terminating chunk
    });
  });
  Fake spare(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr(), spare.addr()}));
  for (int i = 0; i < 2; ++i) {  // round-robin: one of the two requests starts at `decode`
    Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
    CHECK(s.status == 200);
    CHECK(s.error == httplib::Error::Success);  // a terminated body, not a truncated one
    std::vector<Json> ev = Events(s.body);      // every event parses (no half event relayed)
    REQUIRE(ev.size() >= 2);
    CHECK(ev.back() == "[DONE]");
    if (ev[0]["choices"][0]["text"] != "partial") continue;
    REQUIRE(ev.size() == 3);
    CHECK(ev[1]["error"]["code"] == 502);
    CHECK(ev[1]["error"]["type"] == "server_error");
    CHECK(ev[1]["error"]["message"].get<std::string>().find("broke off") != std::string::npos);
  }
  // Bytes had reached the client: no retry on the spare instance.
  CHECK(decode.calls() == 1);
  CHECK(spare.calls() == 1);
  std::string m = r.Metrics();
  CHECK(m.find("oasis:router_upstream_failures_total{role=\"decode\",reason=\"closed\"} 1\n") !=
        std::string::npos);
  CHECK(m.find("oasis:router_stream_errors_total 1\n") != std::string::npos);
  CHECK(m.find("oasis:router_upstream_retries_total{role=\"decode\"} 0\n") != std::string::npos);
}

TEST_CASE(
    "router: a stream whose [DONE] was relayed before the connection dropped gets no error event",
    "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
      const std::string e = Event(TextChunk("all")) + "data: [DONE]\n\n";
      sink.write(e.data(), e.size());
      return false;  // dropped before the terminating chunk
    });
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
  CHECK(s.error == httplib::Error::Success);
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0]["choices"][0]["text"] == "all");
  CHECK(ev[1] == "[DONE]");
}

TEST_CASE("router: a stalled stream ends after the idle timeout with an error event and [DONE]",
          "[router]") {
  std::atomic<bool> upstream_closed{false};
  Fake prefill(HandoffPrefill());
  Fake decode([&](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
      const std::string e = Event(TextChunk("before"));
      if (!sink.write(e.data(), e.size())) return false;
      const auto end = Clock::now() + std::chrono::seconds(8);  // stalled (bounded for the test)
      while (Clock::now() < end) {
        if (!sink.is_writable()) {
          upstream_closed = true;
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      sink.done();
      return true;
    });
  });
  RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
  o.upstream_idle_timeout_s = 0.6;
  o.health_interval_ms = 60000;  // one poll at start only: the failure's mark is not undone
  RouterUnderTest r(o);
  const auto start = Clock::now();
  Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
  const auto took = Clock::now() - start;
  CHECK(s.error == httplib::Error::Success);
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["choices"][0]["text"] == "before");
  CHECK(ev[1]["error"]["code"] == 504);
  CHECK(ev[1]["error"]["message"].get<std::string>().find("idle timeout") != std::string::npos);
  CHECK(ev[2] == "[DONE]");
  CHECK(took >= std::chrono::milliseconds(550));
  CHECK(took < std::chrono::seconds(5));
  CHECK(Eventually([&] { return upstream_closed.load(); }));  // the instance sees the request end
  CHECK_FALSE(r.router.InstanceHealthy(Router::Role::kDecode, 0));  // no poll undoes the mark
  CHECK(r.Metrics().find(
            "oasis:router_upstream_failures_total{role=\"decode\",reason=\"idle_timeout\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("router: a stream cut by the router stopping ends with an error event and [DONE]",
          "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [](size_t, httplib::DataSink& sink) {
      const std::string e = Event(TextChunk("one"));
      if (!sink.write(e.data(), e.size())) return false;
      const auto end = Clock::now() + std::chrono::seconds(3);
      while (Clock::now() < end && sink.is_writable())
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return false;
    });
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  std::thread stopper;
  Streamed s = PostStreamed(
      r.port, "/v1/completions", R"({"prompt":"x","stream":true})", [&](const std::string& so_far) {
        if (!stopper.joinable() && so_far.find("\"one\"") != std::string::npos)
          stopper = std::thread([&r] { r.router.Stop(); });
        return true;
      });
  if (stopper.joinable()) stopper.join();
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["choices"][0]["text"] == "one");
  CHECK(ev[1]["error"]["code"] == 503);
  CHECK(ev[1]["error"]["message"] == "the router is shutting down");
  CHECK(ev[2] == "[DONE]");
}

TEST_CASE(
    "router: a stream whose instance sends headers and then nothing ends after the first-byte "
    "timeout",
    "[router]") {
  Fake prefill(HandoffPrefill());
  Hostile decode(Hostile::Mode::kHeadersThenSilent);
  RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
  o.upstream_first_byte_timeout_s = 0.6;
  RouterUnderTest r(o);
  const auto start = Clock::now();
  Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
  CHECK(Clock::now() - start < std::chrono::seconds(5));
  CHECK(s.status == 200);
  std::vector<Json> ev = Events(s.body);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0]["error"]["code"] == 504);
  CHECK(ev[0]["error"]["message"].get<std::string>().find("first-byte timeout") !=
        std::string::npos);
  CHECK(ev[1] == "[DONE]");
  CHECK(Eventually([&] { return decode.PeerClosedHeld(); }));
}

TEST_CASE("router: a silent prefill instance is a 504 after the first-byte timeout, not retried",
          "[router]") {
  Hostile silent(Hostile::Mode::kSilent);
  Fake other(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterOptions o = TestOptions({silent.addr(), other.addr()}, {decode.addr()});
  o.upstream_first_byte_timeout_s = 0.5;
  o.health_interval_ms = 60000;  // the silent instance stays healthy (it answers /health)
  RouterUnderTest r(o);
  int timeouts = 0;
  for (int i = 0; i < 2; ++i) {  // round-robin: one of the two starts at the silent instance
    const auto start = Clock::now();
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(Clock::now() - start < std::chrono::seconds(4));
    if (res->status == 200) continue;
    ++timeouts;
    CHECK(res->status == 504);
    Json e = Json::parse(res->body);
    CHECK(e["error"]["code"] == 504);
    CHECK(e["error"]["message"].get<std::string>().find(silent.address()) != std::string::npos);
    CHECK(res->get_header_value("Retry-After").empty());
  }
  CHECK(timeouts == 1);
  CHECK(other.calls() == 1);  // the timed-out request was not sent on
  CHECK(silent.posts.load() == 1);
}

TEST_CASE(
    "router: an instance that closes the connection before answering: the next one takes the "
    "request",
    "[router]") {
  Fake prefill(HandoffPrefill());
  Hostile closer(Hostile::Mode::kClose);
  Fake good(SimpleDecode());
  RouterOptions o = TestOptions({prefill.addr()}, {closer.addr(), good.addr()});
  o.health_interval_ms = 60000;
  RouterUnderTest r(o);
  REQUIRE(Eventually([&] {
    return closer.posts.load() == 0 && r.router.InstanceHealthy(Router::Role::kDecode, 0);
  }));
  for (int i = 0; i < 2; ++i) {
    Streamed s = PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})");
    CHECK(s.status == 200);
    std::vector<Json> ev = Events(s.body);
    REQUIRE(ev.size() == 3);
    CHECK(ev[0]["choices"][0]["text"] == "de");
  }
  CHECK(closer.posts.load() == 1);  // then marked unhealthy: not tried again
  CHECK(good.calls() == 2);
  CHECK_FALSE(r.router.InstanceHealthy(Router::Role::kDecode, 0));
  std::string m = r.Metrics();
  CHECK(m.find("oasis:router_upstream_retries_total{role=\"decode\"} 1\n") != std::string::npos);
  CHECK(m.find("oasis:router_upstream_failures_total{role=\"decode\",reason=\"closed\"} 1\n") !=
        std::string::npos);
}

TEST_CASE(
    "router: not streamed, a decode answer that breaks off or stalls is a 502 or 504 JSON error",
    "[router]") {
  Fake prefill(HandoffPrefill());
  SECTION("breaks off") {
    Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
      res.set_content_provider(1000, "application/json",
                               [](size_t, size_t, httplib::DataSink& sink) {
                                 const std::string half = R"({"id":"cmpl-7","choices":[)";
                                 sink.write(half.data(), half.size());
                                 return false;  // 1000 bytes announced, fewer sent
                               });
    });
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(res->status == 502);
    Json e = Json::parse(res->body);
    CHECK(e["error"]["code"] == 502);
    CHECK(e["error"]["message"].get<std::string>().find(decode.address()) != std::string::npos);
  }
  SECTION("stalls midway (the idle timeout)") {
    Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
      res.set_content_provider(1000, "application/json",
                               [](size_t offset, size_t, httplib::DataSink& sink) {
                                 if (offset > 0) {
                                   std::this_thread::sleep_for(std::chrono::milliseconds(3000));
                                   return false;
                                 }
                                 const std::string half = R"({"id":"cmpl-7","choices":[)";
                                 return sink.write(half.data(), half.size());
                               });
    });
    RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
    o.upstream_idle_timeout_s = 0.5;
    RouterUnderTest r(o);
    const auto start = Clock::now();
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(Clock::now() - start < std::chrono::milliseconds(2500));
    CHECK(res->status == 504);
    CHECK(Json::parse(res->body)["error"]["message"].get<std::string>().find("idle timeout") !=
          std::string::npos);
  }
  SECTION("stalls (--timeout-s bounds a whole non-streamed answer)") {
    Fake decode([](Fake&, const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      res.set_content(CompletionResponse("late", "length").dump(), "application/json");
    });
    RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
    o.timeout_s = 0.6;
    o.upstream_first_byte_timeout_s = 60;  // not what bounds a non-streamed decode answer
    RouterUnderTest r(o);
    const auto start = Clock::now();
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(Clock::now() - start < std::chrono::milliseconds(2400));
    CHECK(res->status == 504);
    CHECK(Json::parse(res->body)["error"]["code"] == 504);
  }
}

TEST_CASE("router: no healthy instance is a quick 503 with Retry-After, and nothing is prefilled",
          "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  decode.health_status = 503;
  REQUIRE(Eventually([&] { return !r.router.InstanceHealthy(Router::Role::kDecode, 0); }));
  const auto start = Clock::now();
  for (const bool stream : {false, true}) {
    auto res = r.Post("/v1/completions", Json{{"prompt", "x"}, {"stream", stream}}.dump());
    REQUIRE(res);
    CHECK(res->status == 503);
    CHECK(res->get_header_value("Retry-After") == "1");
    Json e = Json::parse(res->body);
    CHECK(e["error"]["type"] == "service_unavailable_error");
    CHECK(e["error"]["message"].get<std::string>().find("no healthy decode instance") !=
          std::string::npos);
  }
  auto models = r.Client().Get("/v1/models");
  REQUIRE(models);
  CHECK(models->status == 503);
  CHECK(models->get_header_value("Retry-After") == "1");
  CHECK(Clock::now() - start < std::chrono::seconds(2));
  CHECK(prefill.calls() == 0);
  CHECK(decode.calls() == 0);
  CHECK(r.Metrics().find("oasis:router_no_healthy_instance_total{role=\"decode\"} 3\n") !=
        std::string::npos);
  // Back: served again.
  decode.health_status = 200;
  REQUIRE(Eventually([&] { return r.router.InstanceHealthy(Router::Role::kDecode, 0); }));
  CHECK(HttpStatus(r.Post("/v1/completions", R"({"prompt":"x"})")) == 200);
  // No healthy prefill instance: the same.
  prefill.health_status = 503;
  REQUIRE(Eventually([&] { return !r.router.InstanceHealthy(Router::Role::kPrefill, 0); }));
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(res->get_header_value("Retry-After") == "1");
  CHECK(prefill.calls() == 1);
}

TEST_CASE(
    "router: a request waiting on an instance its health check marks unhealthy goes to the next",
    "[router]") {
  Gate release;
  std::atomic<bool> slow_entered{false};
  Fake slow([&](Fake& f, const httplib::Request& req, httplib::Response& res) {
    slow_entered = true;
    release.WaitFor(
        std::chrono::milliseconds(4000));  // a stopped process, as far as the router sees
    HandoffPrefill()(f, req, res);
  });
  Fake good(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({slow.addr(), good.addr()}, {decode.addr()}));
  std::thread flip([&] {
    if (Eventually([&] { return slow_entered.load(); }, std::chrono::milliseconds(4000)))
      slow.health_status = 503;
  });
  int ok = 0;
  const auto start = Clock::now();
  for (int i = 0; i < 2; ++i) {  // round-robin: one of the two starts at the slow instance
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    ok += HttpStatus(res) == 200;
  }
  const auto took = Clock::now() - start;
  flip.join();
  release.Open();
  CHECK(ok == 2);
  CHECK(took < std::chrono::milliseconds(3000));
  CHECK(good.calls() == 2);
  CHECK(slow.calls() == 1);
  std::string m = r.Metrics();
  CHECK(m.find("oasis:router_upstream_failures_total{role=\"prefill\",reason=\"unhealthy\"} 1\n") !=
        std::string::npos);
  CHECK(m.find("oasis:router_upstream_retries_total{role=\"prefill\"} 1\n") != std::string::npos);
}

TEST_CASE("router: /health is 200 with every role healthy, else 503", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  DeadPort dead;
  {
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    REQUIRE(Eventually(
        [&] { return prefill.health_hits.load() > 0 && decode.health_hits.load() > 0; }));
    auto res = r.Client().Get("/health");
    REQUIRE(res);
    CHECK(res->status == 200);
    Json h = Json::parse(res->body);
    CHECK(h["prefill"] == Json::array({{{"address", prefill.address()}, {"healthy", true}}}));
    CHECK(h["decode"] == Json::array({{{"address", decode.address()}, {"healthy", true}}}));
    // An instance whose /health says 503 (still loading) is unhealthy, and back when it is 200.
    decode.health_status = 503;
    CHECK(Eventually([&] {
      auto x = r.Client().Get("/health");
      return x && x->status == 503;
    }));
    decode.health_status = 200;
    CHECK(Eventually([&] {
      auto x = r.Client().Get("/health");
      return x && x->status == 200;
    }));
  }
  {
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr(), dead.addr()}));
    REQUIRE(Eventually([&] { return !r.router.InstanceHealthy(Router::Role::kDecode, 1); }));
    auto res = r.Client().Get("/health");
    REQUIRE(res);
    CHECK(res->status == 200);  // one healthy decode instance is enough
    CHECK(Json::parse(res->body)["decode"][1] ==
          Json{{"address", dead.address()},
               {"healthy", false},
               {"reason", "GET /health failed (Connection)"}});
  }
  {
    RouterUnderTest r(TestOptions({dead.addr()}, {decode.addr()}));
    REQUIRE(Eventually([&] {
      auto x = r.Client().Get("/health");
      return x && x->status == 503;
    }));
    auto res = r.Client().Get("/health");
    REQUIRE(res);
    Json h = Json::parse(res->body);
    CHECK(h["prefill"][0]["healthy"] == false);
    CHECK(h["decode"][0]["healthy"] == true);
  }
}

TEST_CASE("router: /metrics counts requests, handoffs and finishes at prefill", "[router]") {
  std::atomic<bool> finish{false};
  Fake prefill([&](Fake& f, const httplib::Request& req, httplib::Response& res) {
    if (finish) return FinishedPrefill(CompletionResponse("x", "stop"))(f, req, res);
    HandoffPrefill()(f, req, res);
  });
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  CHECK(PostStreamed(r.port, "/v1/completions", R"({"prompt":"x","stream":true})").status == 200);
  finish = true;
  CHECK(HttpStatus(r.Post("/v1/completions", R"({"prompt":"x"})")) == 200);
  CHECK(HttpStatus(r.Post("/v1/completions", R"({"prompt":"x","n":5})")) == 400);
  std::string m;
  CHECK(Eventually([&] {
    m = r.Metrics();
    return m.find("oasis:router_requests_total{route=\"/v1/completions\",status=\"200\"} 2") !=
               std::string::npos &&
           m.find("oasis:router_requests_total{route=\"/v1/completions\",status=\"400\"} 1") !=
               std::string::npos;
  }));
  CHECK(m.find("oasis:router_handoffs_total 1\n") != std::string::npos);
  CHECK(m.find("oasis:router_finished_at_prefill_total 1\n") != std::string::npos);
  CHECK(m.find("oasis:router_instance_failures_total{role=\"prefill\",address=\"" +
               prefill.address() + "\"} 0") != std::string::npos);
  CHECK(m.find("oasis:router_instance_failures_total{role=\"decode\",address=\"" +
               decode.address() + "\"} 0") != std::string::npos);
  CHECK(m.find("# TYPE oasis:router_time_to_first_token_seconds histogram") != std::string::npos);
  CHECK(m.find("oasis:router_time_to_first_token_seconds_count 1\n") != std::string::npos);
  CHECK(m.find("oasis:router_prefill_seconds_count 2\n") != std::string::npos);
  CHECK(m.find("oasis:router_prefill_seconds_bucket{le=\"+Inf\"} 2\n") != std::string::npos);
}

TEST_CASE("router: --api-key guards everything but /health and /metrics", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterOptions o = TestOptions({prefill.addr()}, {decode.addr()});
  o.api_key = "sekrit";
  RouterUnderTest r(o);
  auto none = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(none);
  CHECK(none->status == 401);
  CHECK(Json::parse(none->body)["error"]["code"] == 401);
  auto wrong = r.Post("/v1/completions", R"({"prompt":"x"})", {{"Authorization", "Bearer sekriT"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  CHECK(HttpStatus(r.Client().Get("/v1/models")) == 401);
  CHECK(prefill.calls() == 0);
  auto ok = r.Post("/v1/completions", R"({"prompt":"x"})", {{"Authorization", "Bearer sekrit"}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(prefill.auth(0) == "Bearer sekrit");
  CHECK(HttpStatus(r.Client().Get("/health")) == 200);
  CHECK(HttpStatus(r.Client().Get("/metrics")) == 200);
}

TEST_CASE("router: /v1/models comes from a decode instance", "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  auto res = r.Client().Get("/v1/models", {{"Authorization", "Bearer z"}});
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(Json::parse(res->body)["data"][0]["id"] == "fake-model");
  REQUIRE(decode.calls() == 1);
  CHECK(decode.path(0) == "/v1/models");
  CHECK(decode.auth(0) == "Bearer z");
  CHECK(prefill.calls() == 0);
}

TEST_CASE("router: a client that disconnects while the decode instance is silent closes it too",
          "[router]") {
  std::atomic<bool> upstream_closed{false};
  Fake prefill(HandoffPrefill());
  Fake decode([&](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
      const std::string e = Event(TextChunk("only"));
      if (!sink.write(e.data(), e.size())) return false;
      // Silent from now on (a long admission fetch, say): only the router closing the
      // connection ends this.
      const auto end = Clock::now() + std::chrono::milliseconds(1500);
      while (Clock::now() < end) {
        if (!sink.is_writable()) {
          upstream_closed = true;
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      sink.done();
      return true;
    });
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  const auto start = Clock::now();
  Streamed s = PostStreamed(
      r.port, "/v1/completions", R"({"prompt":"x","stream":true})",
      [](const std::string& so_far) { return so_far.find("\"only\"") == std::string::npos; });
  CHECK(s.error == httplib::Error::Canceled);
  CHECK(Eventually([&] { return upstream_closed.load(); }, std::chrono::milliseconds(1400)));
  CHECK(Clock::now() - start < std::chrono::milliseconds(1400));
}

TEST_CASE("router: answers larger than the relay buffer pass through whole", "[router]") {
  const std::string big(6 << 20, 'a');  // past the 4 MiB a relayed answer may hold
  std::atomic<bool> finish{true};
  Fake prefill([&](Fake& f, const httplib::Request& req, httplib::Response& res) {
    if (finish) return FinishedPrefill(CompletionResponse(big, "length"))(f, req, res);
    HandoffPrefill()(f, req, res);
  });
  Fake decode([&](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_content(CompletionResponse(big + "b", "length").dump(), "application/json");
  });
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  auto at_prefill = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(at_prefill);
  CHECK(at_prefill->status == 200);
  CHECK(at_prefill->body.size() > big.size());
  CHECK(Json::parse(at_prefill->body)["choices"][0]["text"].get<std::string>().size() ==
        big.size());
  finish = false;
  auto decoded = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(decoded);
  CHECK(decoded->status == 200);
  CHECK(Json::parse(decoded->body)["choices"][0]["text"].get<std::string>().size() ==
        big.size() + 1);
}

// ------------------------------------------------------------------------------ QA fixes

TEST_CASE("router: stream_options on a non-streamed request is refused before any prefill",
          "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  for (const char* body :
       {R"({"prompt":"Hello there","max_tokens":8,"stream_options":{"include_usage":true}})",
        R"({"prompt":"Hello there","max_tokens":2,"stream_options":{"include_usage":true}})",
        R"({"prompt":"x","stream":true,"stream_options":{"bogus":true}})"}) {
    INFO(body);
    auto res = r.Post("/v1/completions", body);
    REQUIRE(res);
    CHECK(res->status == 400);
    CHECK(Json::parse(res->body)["error"]["message"].get<std::string>().find("stream_options") !=
          std::string::npos);
  }
  CHECK(prefill.calls() == 0);
  CHECK(decode.calls() == 0);
}

TEST_CASE("router: a malformed ticket from a prefill instance is a 502 naming it", "[router]") {
  for (const char* ticket : {"!!!notbase64", "", "T0tIVAMAAAAAAAAAAAAAAAAAAAAAAA=="}) {
    INFO(ticket);
    Fake prefill([ticket](Fake&, const httplib::Request&, httplib::Response& res) {
      res.set_content(Json{{"oasis_handoff", ticket}}.dump(), "application/json");
    });
    Fake decode(SimpleDecode());
    RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
    auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
    REQUIRE(res);
    CHECK(res->status == 502);
    const Json e = Json::parse(res->body);
    CHECK(e["error"]["type"] == "server_error");
    CHECK_THAT(e["error"]["message"].get<std::string>(),
               Catch::StartsWith("prefill instance " + prefill.address() +
                                 " returned a malformed ticket"));
    CHECK(decode.calls() == 0);
    CHECK(r.Metrics().find("oasis:router_bad_tickets_total 1") != std::string::npos);
  }
}

// A real staging pool and server in this process (UCX on loopback), so that the router's abort
// is seen where it lands.
struct StagingUnderTest {
  StagingUnderTest() {
    auto ctx = disagg::UcxContext::Create({"tcp"});
    REQUIRE(ctx.ok());
    context = *ctx;
    auto p = disagg::StagingPool::Create(context, {.block_bytes = 4096, .num_blocks = 8});
    REQUIRE(p.ok());
    pool = std::move(*p);
    auto s = disagg::StagingServer::Start(context, pool.get(), {.listen_address = "127.0.0.1:0"});
    REQUIRE(s.ok());
    server = std::move(*s);
  }
  std::shared_ptr<disagg::UcxContext> context;
  std::unique_ptr<disagg::StagingPool> pool;
  std::unique_ptr<disagg::StagingServer> server;
};

TEST_CASE("router: a decode leg that refuses after the handoff aborts the staged lease at once",
          "[router]") {
  StagingUnderTest staging;
  const int decode_status = GENERATE(400, 429, 503);
  const bool stream = GENERATE(false, true);
  INFO("decode answers " << decode_status << (stream ? ", streamed" : ""));
  auto lease = staging.pool->Acquire(2);
  REQUIRE(lease.ok());
  const std::string ticket = TicketFor(staging.server->address(), lease->id);
  Fake prefill([ticket](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_content(Json{{"id", "cmpl-7"}, {"oasis_handoff", ticket}}.dump(), "application/json");
  });
  Fake decode(StatusAnswer(decode_status, "refused"));
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  auto res =
      r.Post("/v1/completions", stream ? R"({"prompt":"x","stream":true})" : R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == (decode_status == 400 ? 400 : 503));
  CHECK(Eventually([&] { return staging.pool->Stats().leases_aborted == 1; },
                   std::chrono::milliseconds(5000)));
  CHECK(staging.pool->Stats().requests_held == 0);
  CHECK(Eventually([&] {
    return r.Metrics().find("oasis:router_leases_aborted_total 1") != std::string::npos;
  }));
}

TEST_CASE(
    "router: a decode instance that cannot be reached after the handoff: the lease is aborted",
    "[router]") {
  StagingUnderTest staging;
  auto lease = staging.pool->Acquire(1);
  REQUIRE(lease.ok());
  const std::string ticket = TicketFor(staging.server->address(), lease->id);
  Fake prefill([ticket](Fake&, const httplib::Request&, httplib::Response& res) {
    res.set_content(Json{{"oasis_handoff", ticket}}.dump(), "application/json");
  });
  Fake decode(SimpleDecode());
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  REQUIRE(Eventually([&] { return decode.health_hits.load() > 0; }));
  decode.Stop();  // healthy until its next poll: the call fails to connect
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 503);
  CHECK(Eventually([&] { return staging.pool->Stats().leases_aborted == 1; },
                   std::chrono::milliseconds(5000)));
}

TEST_CASE("router: an instance whose /health names another role is unhealthy, saying why",
          "[router]") {
  Fake prefill(HandoffPrefill());
  Fake decode(SimpleDecode());
  prefill.SetHealthBody(R"({"status":"ok","role":"decode"})");
  decode.SetHealthBody(R"({"status":"ok","role":"both"})");
  RouterUnderTest r(TestOptions({prefill.addr()}, {decode.addr()}));
  REQUIRE(Eventually([&] {
    return !r.router.InstanceHealthy(Role::kPrefill, 0) &&
           !r.router.InstanceHealthy(Role::kDecode, 0);
  }));
  auto health = r.Client().Get("/health");
  REQUIRE(health);
  CHECK(health->status == 503);
  const Json h = Json::parse(health->body);
  CHECK(h["prefill"][0]["healthy"] == false);
  CHECK_THAT(h["prefill"][0]["reason"].get<std::string>(), Catch::Contains("role 'decode'"));
  CHECK_THAT(h["decode"][0]["reason"].get<std::string>(), Catch::Contains("role 'both'"));
  CHECK(r.Metrics().find("oasis:router_instance_healthy{role=\"prefill\",address=\"" +
                         prefill.address() + "\"} 0") != std::string::npos);
  auto res = r.Post("/v1/completions", R"({"prompt":"x"})");
  REQUIRE(res);
  CHECK(res->status == 503);  // not the client's 400
  CHECK(prefill.calls() == 0);
  // Fixed: healthy again, no reason shown.
  prefill.SetHealthBody(R"({"role":"prefill"})");
  decode.SetHealthBody(R"({"role":"decode"})");
  REQUIRE(Eventually([&] {
    return r.router.InstanceHealthy(Role::kPrefill, 0) &&
           r.router.InstanceHealthy(Role::kDecode, 0);
  }));
  const Json ok = Json::parse(r.Client().Get("/health")->body);
  CHECK_FALSE(ok["prefill"][0].contains("reason"));
}

TEST_CASE("router: an instance listed twice is refused", "[router]") {
  auto dup = ParseWithInstances({"--prefill", "127.0.0.1:9001,127.0.0.1:9001"});
  REQUIRE_FALSE(dup.ok());
  CHECK_THAT(std::string(dup.status().message()),
             Catch::Contains("127.0.0.1:9001 is listed twice"));
  auto both = ParseWithInstances({"--prefill", "h:2"});
  REQUIRE_FALSE(both.ok());
  CHECK_THAT(std::string(both.status().message()),
             Catch::Contains("both as a prefill and as a decode instance"));
}

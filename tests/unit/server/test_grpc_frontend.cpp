// GrpcFrontend on loopback with the real parts: the Service over the tiny fixture model on the
// CPU backend, grpc++'s server, and a real grpc++ client (the oasis.v1 stubs and the standard
// grpc.health.v1 ones). Covers the bound on live streams, the health services, cancellation
// and deadlines freeing the engine request, streams holding no thread, and shutdown with live
// streams (one of them a client that stopped reading) finishing within the deadline.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "health.grpc.pb.h"
#include "oasis.grpc.pb.h"
#include "server/grpc_service.h"
#include "server/model_host.h"
#include "server/serving.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;
using namespace oasis::server;
using Clock = std::chrono::steady_clock;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

// Generous bounds: the CPU runs this beside other builds.
constexpr auto kWait = std::chrono::seconds(20);

ServerConfig TinyConfig(int64_t max_calls, int64_t max_num_seqs) {
  ServerConfig c;
  c.model = oasis::testing::FixturePath("tiny-default").string();
  c.backend = "cpu";
  c.threads = 1;
  c.max_num_seqs = max_num_seqs;
  c.grpc_max_concurrent_calls = max_calls;
  c.log_level = "warn";
  return c;
}

// Polls `done` until it holds or kWait passes.
bool WaitFor(const std::function<bool()>& done) {
  const auto deadline = Clock::now() + kWait;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

int ProcessThreads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

struct Rig {
  explicit Rig(int64_t max_calls = 256, int64_t max_num_seqs = 8, bool publish = true)
      : service(TinyConfig(max_calls, max_num_seqs)), frontend(service) {
    StatusOr<int> bound = frontend.Start("127.0.0.1", 0);
    REQUIRE(bound.ok());
    port = *bound;
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials());
    stub = v1::Oasis::NewStub(channel);
    health = grpc::health::v1::Health::NewStub(channel);
    // A client whose receive window stays at HTTP/2's 64 KiB (no BDP probing): a stream of
    // StallRequest() it does not read cannot end, its writes wait on flow control.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    stall_stub = v1::Oasis::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
    if (publish) Publish();
  }
  ~Rig() {
    frontend.Shutdown(std::chrono::seconds(5));
    service.StopEngine();
    service.TakeHost().reset();
  }
  void Publish() {
    StatusOr<std::unique_ptr<ModelHost>> host = LoadModelHost(service.config());
    REQUIRE(host.ok());
    service.Publish(std::move(host).value());
    engine = service.host()->engine.get();
  }
  // The engine's running + waiting requests.
  int64_t EngineRequests() const {
    const EngineStats st = engine->Stats();
    return st.requests.num_running + st.requests.num_waiting;
  }
  HealthCheckResponse::ServingStatus Health(const std::string& name, grpc::Status* st = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kWait);
    HealthCheckRequest req;
    req.set_service(name);
    HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, req, &resp);
    if (st != nullptr) *st = s;
    return s.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
  }

  Service service;
  GrpcFrontend frontend;
  Engine* engine = nullptr;
  int port = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Oasis::Stub> stub;
  std::unique_ptr<v1::Oasis::Stub> stall_stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

v1::GenerateRequest Request(int64_t max_tokens) {
  v1::GenerateRequest r;
  for (int id : {5, 17, 42, 99}) r.mutable_token_ids()->add_ids(id);
  r.mutable_sampling()->set_temperature(0);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

// About 200 KiB of responses (1000 tokens with 20 alternatives each): far more than one
// receive window.
constexpr int kStallTokens = 1000;
v1::GenerateRequest StallRequest() {
  v1::GenerateRequest r = Request(kStallTokens);
  r.set_logprobs(true);
  r.set_top_logprobs(20);
  return r;
}

// One whole Generate call: its status and the tokens received.
struct Outcome {
  grpc::Status status;
  int tokens = 0;
  std::string finish_reason;
};

Outcome RunCall(v1::Oasis::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kWait);
  auto reader = stub.Generate(&ctx, req);
  Outcome o;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    o.tokens += resp.token_ids_size();
    if (resp.finished()) o.finish_reason = resp.finish_reason();
  }
  o.status = reader->Finish();
  return o;
}

// A stream that is open on the server: the client has its first response (so the engine runs
// it) and reads nothing more until told to.
struct OpenStream {
  OpenStream(v1::Oasis::Stub& stub, const v1::GenerateRequest& req, bool read_first = true) {
    reader = stub.Generate(&ctx, req);
    if (read_first) REQUIRE(reader->Read(&first));
  }
  // Reads what is left and the status.
  grpc::Status Drain() {
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    return reader->Finish();
  }
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  v1::GenerateResponse first;
};

}  // namespace

TEST_CASE("gRPC health: NOT_SERVING while loading, SERVING when ready, NOT_SERVING on shutdown") {
  Rig rig(256, 8, /*publish=*/false);
  CHECK(rig.Health("") == HealthCheckResponse::NOT_SERVING);
  CHECK(rig.Health("oasis.v1.Oasis") == HealthCheckResponse::NOT_SERVING);
  grpc::Status unknown;
  rig.Health("no.such.Service", &unknown);
  CHECK(unknown.error_code() == grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext ctx;
    v1::HealthResponse resp;
    REQUIRE(rig.stub->Health(&ctx, v1::HealthRequest(), &resp).ok());
    CHECK(resp.status() == v1::HealthResponse::LOADING);
  }
  // Generate while loading: UNAVAILABLE with a message.
  Outcome loading = RunCall(*rig.stub, Request(4));
  CHECK(loading.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(loading.status.error_message().find("loading") != std::string::npos);

  rig.Publish();
  CHECK(WaitFor([&] { return rig.Health("") == HealthCheckResponse::SERVING; }));
  CHECK(rig.Health("oasis.v1.Oasis") == HealthCheckResponse::SERVING);
  Outcome ok = RunCall(*rig.stub, Request(4));
  CHECK(ok.status.ok());
  CHECK(ok.tokens == 4);
  CHECK(ok.finish_reason == "length");

  rig.service.BeginShutdown();
  CHECK(WaitFor([&] { return rig.Health("") == HealthCheckResponse::NOT_SERVING; }));
  CHECK(rig.Health("oasis.v1.Oasis") == HealthCheckResponse::NOT_SERVING);
  grpc::ClientContext ctx;
  v1::HealthResponse resp;
  REQUIRE(rig.stub->Health(&ctx, v1::HealthRequest(), &resp).ok());
  CHECK(resp.status() == v1::HealthResponse::NOT_SERVING);
  Outcome late = RunCall(*rig.stub, Request(4));
  CHECK(late.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(late.status.error_message().find("shutting down") != std::string::npos);
}

TEST_CASE(
    "gRPC: past --grpc-max-concurrent-calls a call gets RESOURCE_EXHAUSTED, others complete") {
  // Three live streams, the cap, whose clients read nothing yet: they cannot end.
  Rig rig(/*max_calls=*/3);
  OpenStream a(*rig.stall_stub, StallRequest());
  OpenStream b(*rig.stall_stub, StallRequest(), /*read_first=*/false);
  OpenStream c(*rig.stall_stub, StallRequest(), /*read_first=*/false);
  REQUIRE(WaitFor([&] { return rig.frontend.live_calls() == 3; }));

  const auto t0 = Clock::now();
  Outcome d = RunCall(*rig.stub, Request(4));
  CHECK(d.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(d.status.error_message().find("--grpc-max-concurrent-calls") != std::string::npos);
  CHECK(d.tokens == 0);
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));  // at once, not after A
  CHECK(rig.frontend.live_calls() == 3);

  a.ctx.TryCancel();
  const grpc::Status a_status = a.Drain();
  CHECK(a_status.error_code() == grpc::StatusCode::CANCELLED);
  CHECK_FALSE(a_status.error_message().empty());
  // B and C, read now, complete.
  for (OpenStream* s : {&b, &c}) {
    int tokens = 0;
    v1::GenerateResponse resp;
    while (s->reader->Read(&resp)) tokens += resp.token_ids_size();
    CHECK(s->reader->Finish().ok());
    CHECK(tokens == kStallTokens);
  }
  CHECK(WaitFor([&] { return rig.frontend.live_calls() == 0 && rig.EngineRequests() == 0; }));

  // Below the cap again: calls are served.
  CHECK(RunCall(*rig.stub, Request(3)).status.ok());
}

TEST_CASE("gRPC: at the cap, a server shutting down says UNAVAILABLE, not RESOURCE_EXHAUSTED") {
  Rig rig(/*max_calls=*/1);
  OpenStream a(*rig.stall_stub, StallRequest(), /*read_first=*/false);
  REQUIRE(WaitFor([&] { return rig.frontend.live_calls() == 1; }));
  // The shutdown has begun (the HTTP side answers 503); the live stream still holds its slot.
  rig.service.BeginShutdown();
  Outcome late = RunCall(*rig.stub, Request(2));
  CHECK(late.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(late.status.error_message() == "the server is shutting down");
  a.ctx.TryCancel();
  a.Drain();
}

TEST_CASE("gRPC errors always carry a message") {
  Rig rig;
  v1::GenerateRequest none;
  Outcome no_prompt = RunCall(*rig.stub, none);
  CHECK(no_prompt.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_FALSE(no_prompt.status.error_message().empty());
  v1::GenerateRequest unknown = Request(4);
  unknown.set_model("nope");
  Outcome not_found = RunCall(*rig.stub, unknown);
  CHECK(not_found.status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK_FALSE(not_found.status.error_message().empty());
  v1::GenerateRequest bad = Request(4);
  bad.mutable_sampling()->set_top_p(0);
  Outcome invalid = RunCall(*rig.stub, bad);
  CHECK(invalid.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(invalid.status.error_message().find("top_p") != std::string::npos);
  // request_id is echoed in every response: at most 256 bytes.
  v1::GenerateRequest long_id = Request(2);
  long_id.set_request_id(std::string(GrpcFrontend::kMaxRequestIdBytes + 1, 'x'));
  Outcome too_long = RunCall(*rig.stub, long_id);
  CHECK(too_long.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(too_long.status.error_message() == "'request_id' is at most 256 bytes, got 257");
  long_id.set_request_id(std::string(GrpcFrontend::kMaxRequestIdBytes, 'x'));
  CHECK(RunCall(*rig.stub, long_id).status.ok());
}

TEST_CASE("gRPC: a cancelled call or a passed deadline aborts the engine request at once") {
  Rig rig;
  const int64_t free_slots = rig.engine->Stats().kv.num_free_slots;
  const int64_t aborted = rig.engine->Stats().requests.abort_total;

  // Long requests (the whole context, with logprobs: seconds on this CPU) on the client that
  // cannot take them unread: only the cancellation can end them early.
  v1::GenerateRequest long_request = StallRequest();
  long_request.set_max_tokens(4000);
  SECTION("cancelled by the client") {
    OpenStream s(*rig.stall_stub, long_request);
    // (The engine publishes its counts after the step whose token the client may read first.)
    CHECK(WaitFor([&] { return rig.EngineRequests() == 1; }));
    s.ctx.TryCancel();
    const grpc::Status st = s.Drain();
    CHECK(st.error_code() == grpc::StatusCode::CANCELLED);
    CHECK_FALSE(st.error_message().empty());
  }
  SECTION("deadline exceeded") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto reader = rig.stall_stub->Generate(&ctx, long_request);
    v1::GenerateResponse resp;
    REQUIRE(reader->Read(&resp));  // running; then the client stops reading
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    while (reader->Read(&resp)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  SECTION("the client goes away (its channel closes)") {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(rig.port),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Oasis::NewStub(channel);
    auto s = std::make_unique<OpenStream>(*stub, long_request);
    REQUIRE(rig.frontend.live_calls() == 1);
    s.reset();  // no Finish: the call is dropped (RST_STREAM), then the connection closes
    stub.reset();
    channel.reset();
  }
  // The engine forgets the request and frees its KV without the 4000 tokens being generated.
  CHECK(WaitFor([&] { return rig.frontend.live_calls() == 0 && rig.EngineRequests() == 0; }));
  CHECK(WaitFor([&] { return rig.engine->Stats().kv.num_free_slots == free_slots; }));
  const EngineStats st = rig.engine->Stats();
  CHECK(st.requests.abort_total == aborted + 1);
  CHECK(st.requests.generation_tokens_total < 4000);
}

TEST_CASE("gRPC: a live stream holds no server thread") {
  // Two running requests, the rest waiting in the engine's queue: every stream is live and
  // idle. A thread per call (grpc++'s synchronous API) would add kStreams threads.
  constexpr int kStreams = 96;
  Rig rig(/*max_calls=*/kStreams, /*max_num_seqs=*/2);
  auto warm = std::make_unique<OpenStream>(*rig.stall_stub, StallRequest());
  const int before = ProcessThreads();
  REQUIRE(before > 0);
  std::vector<std::unique_ptr<OpenStream>> streams;
  for (int i = 1; i < kStreams; ++i)
    streams.push_back(
        std::make_unique<OpenStream>(*rig.stall_stub, StallRequest(), /*read_first=*/false));
  REQUIRE(WaitFor([&] { return rig.frontend.live_calls() == kStreams; }));
  // grpc.health.v1 Watch streams are live calls too (grpc++'s service must not take threads).
  constexpr int kWatches = 32;
  std::vector<std::unique_ptr<grpc::ClientContext>> watch_ctx;
  std::vector<std::unique_ptr<grpc::ClientReader<HealthCheckResponse>>> watches;
  for (int i = 0; i < kWatches; ++i) {
    watch_ctx.push_back(std::make_unique<grpc::ClientContext>());
    watches.push_back(rig.health->Watch(watch_ctx.back().get(), HealthCheckRequest()));
    HealthCheckResponse resp;
    REQUIRE(watches.back()->Read(&resp));
    CHECK(resp.status() == HealthCheckResponse::SERVING);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int during = ProcessThreads();
  INFO("threads before " << before << ", with " << kStreams << " live streams and " << kWatches
                         << " health watches " << during);
  CHECK(during - before < kStreams / 4);
  for (auto& c : watch_ctx) c->TryCancel();
  for (auto& w : watches) CHECK(w->Finish().error_code() == grpc::StatusCode::CANCELLED);

  // The cap holds here too, and cancelling them all frees everything.
  CHECK(RunCall(*rig.stub, Request(2)).status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  streams.push_back(std::move(warm));
  for (auto& s : streams) s->ctx.TryCancel();
  for (auto& s : streams) CHECK(s->Drain().error_code() == grpc::StatusCode::CANCELLED);
  CHECK(WaitFor([&] { return rig.frontend.live_calls() == 0 && rig.EngineRequests() == 0; }));
}

TEST_CASE("gRPC shutdown ends live streams within the deadline") {
  Rig rig(/*max_calls=*/16, /*max_num_seqs=*/2);
  // Two clients that stopped reading: their writes wait on flow control even once the engine
  // has generated everything; and one that reads slowly until the shutdown starts.
  OpenStream stalled(*rig.stall_stub, StallRequest());
  OpenStream stalled2(*rig.stall_stub, StallRequest(), /*read_first=*/false);
  OpenStream reading(*rig.stall_stub, StallRequest());
  std::atomic<bool> hurry{false};
  auto reader = std::async(std::launch::async, [&] {
    v1::GenerateResponse resp;
    while (reading.reader->Read(&resp)) {
      if (!hurry.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return reading.reader->Finish();
  });
  // Every engine request is done, yet the three streams are live: only their clients can end
  // them, or the shutdown.
  REQUIRE(WaitFor([&] { return rig.EngineRequests() == 0; }));
  REQUIRE(rig.frontend.live_calls() == 3);

  const auto deadline = std::chrono::seconds(1);
  const auto t0 = Clock::now();
  std::thread shutdown([&] { rig.frontend.Shutdown(deadline); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  hurry = true;
  shutdown.join();
  const auto took = Clock::now() - t0;
  INFO("Shutdown took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                        << " ms");
  CHECK(took < deadline + std::chrono::seconds(2));
  CHECK(rig.frontend.live_calls() == 0);

  // The reading client gets the shutdown's status after what was already sent.
  const grpc::Status r = reader.get();
  CHECK(r.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(r.error_message().find("shutting down") != std::string::npos);
  // The stalled ones were cut at the deadline (grpc cancels what is left).
  for (OpenStream* s : {&stalled, &stalled2}) {
    const grpc::Status st = s->Drain();
    CHECK_FALSE(st.ok());
    CHECK_FALSE(st.error_message().empty());
  }
}

// The logits processing fields of SamplingParams reach the engine as the HTTP API's do:
// logit_bias forces a token, allowed_token_ids restricts, bad_words (tokenized by the server)
// bans, and bad values are INVALID_ARGUMENT naming the field.
TEST_CASE("gRPC: penalties, logit_bias, allowed_token_ids and bad_words are honoured") {
  Rig rig;
  auto tokens_of = [&](const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kWait);
    auto reader = rig.stub->Generate(&ctx, req);
    std::vector<int32_t> ids;
    v1::GenerateResponse resp;
    while (reader->Read(&resp))
      ids.insert(ids.end(), resp.token_ids().begin(), resp.token_ids().end());
    CHECK(reader->Finish().ok());
    return ids;
  };
  const std::vector<int32_t> base = tokens_of(Request(12));
  REQUIRE(base.size() == 12);

  v1::GenerateRequest biased = Request(12);
  (*biased.mutable_sampling()->mutable_logit_bias())[300] = 100.0f;
  CHECK(tokens_of(biased) == std::vector<int32_t>(12, 300));

  v1::GenerateRequest allowed = Request(12);
  for (int32_t t : {40, 41, 42}) allowed.mutable_sampling()->add_allowed_token_ids(t);
  for (int32_t t : tokens_of(allowed)) CHECK((t >= 40 && t <= 42));

  v1::GenerateRequest penalised = Request(12);
  penalised.mutable_sampling()->set_frequency_penalty(2.0f);
  penalised.mutable_sampling()->set_repetition_penalty(1.5f);
  CHECK(tokens_of(penalised) != base);

  // A byte-level word: the token of "a" (and " a") never comes.
  v1::GenerateRequest banned = Request(12);
  (*banned.mutable_sampling()->mutable_logit_bias())[97] = 50.0f;  // 'a' in the byte vocabulary
  banned.mutable_sampling()->add_bad_words("a");
  for (int32_t t : tokens_of(banned)) CHECK(t != 97);

  v1::GenerateRequest bad = Request(4);
  bad.mutable_sampling()->set_presence_penalty(3.0f);
  Outcome o = RunCall(*rig.stub, bad);
  CHECK(o.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(o.status.error_message().find("presence_penalty") != std::string::npos);
  bad = Request(4);
  (*bad.mutable_sampling()->mutable_logit_bias())[1 << 20] = 1.0f;
  o = RunCall(*rig.stub, bad);
  CHECK(o.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(o.status.error_message().find("logit_bias") != std::string::npos);
}

// A ChatPrompt is rendered with the model's template (or the request's) and tokenized as the
// HTTP chat route does; n > 1 streams every choice, each tagged by its index and finished once.
TEST_CASE("gRPC: chat prompts and n choices") {
  Rig rig;
  auto run = [&](const v1::GenerateRequest& req, std::vector<std::vector<int32_t>>* per_choice,
                 std::vector<int>* finished, int64_t* prompt_tokens) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kWait);
    auto reader = rig.stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      const size_t i = static_cast<size_t>(resp.index());
      if (per_choice->size() <= i) per_choice->resize(i + 1);
      if (finished->size() <= i) finished->resize(i + 1);
      (*per_choice)[i].insert((*per_choice)[i].end(), resp.token_ids().begin(),
                              resp.token_ids().end());
      if (resp.finished()) ++(*finished)[i];
      *prompt_tokens = resp.usage().prompt_tokens();
    }
    return reader->Finish();
  };
  v1::GenerateRequest chat = Request(6);
  chat.clear_token_ids();
  for (const auto& [role, content] :
       {std::pair{"system", "be brief"}, std::pair{"user", "hello there"}}) {
    v1::ChatMessage* m = chat.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  // What the HTTP chat route would feed the engine for these messages.
  ApiError err;
  std::optional<GenerateSpec> spec =
      ParseChatRequest(Json::parse(R"({"messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hello there"}]})"),
                       rig.service.limits(), &err);
  REQUIRE(spec);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo;
  REQUIRE_FALSE(rig.service.BuildPrompts(*spec, &prompts, &echo));
  REQUIRE(prompts.size() == 1);
  v1::GenerateRequest plain = Request(6);
  plain.mutable_token_ids()->clear_ids();
  for (int32_t id : prompts[0]) plain.mutable_token_ids()->add_ids(id);

  std::vector<std::vector<int32_t>> got, expect;
  std::vector<int> fin, fin_plain;
  int64_t pt = 0, pt_plain = 0;
  REQUIRE(run(chat, &got, &fin, &pt).ok());
  REQUIRE(run(plain, &expect, &fin_plain, &pt_plain).ok());
  CHECK(pt == static_cast<int64_t>(prompts[0].size()));
  CHECK(pt == pt_plain);
  REQUIRE(got.size() == 1);
  CHECK(got == expect);
  CHECK(got[0].size() == 6);
  CHECK(fin == std::vector<int>{1});

  // The request's own template and its kwargs: only the user's words, so a different prompt.
  v1::GenerateRequest own = chat;
  own.mutable_chat()->set_chat_template(
      "{% for m in messages %}{% if m.role == 'user' %}{{ prefix }}{{ m.content }}{% endif %}{% "
      "endfor %}");
  own.mutable_chat()->set_chat_template_kwargs_json(R"({"prefix": "say: "})");
  std::vector<std::vector<int32_t>> own_out;
  std::vector<int> own_fin;
  int64_t own_pt = 0;
  REQUIRE(run(own, &own_out, &own_fin, &own_pt).ok());
  CHECK(own_pt > 0);
  CHECK(own_pt < pt);
  CHECK(own_pt == static_cast<int64_t>(
                      rig.service.host()
                          ->tokenizer->Encode("say: hello there", tokenizer::AddSpecialTokens::kNo)
                          .size()));

  // n = 3 seeded choices: three indexes, 6 tokens and one finished response each.
  for (v1::GenerateRequest req : {chat, Request(6)}) {
    req.set_n(3);
    req.mutable_sampling()->set_temperature(0.9f);
    req.mutable_sampling()->set_seed(11);
    std::vector<std::vector<int32_t>> choices;
    std::vector<int> done;
    int64_t p = 0;
    REQUIRE(run(req, &choices, &done, &p).ok());
    REQUIRE(choices.size() == 3);
    for (const auto& c : choices) CHECK(c.size() == 6);
    CHECK(done == std::vector<int>{1, 1, 1});
  }

  // Bad values are INVALID_ARGUMENT naming the field.
  auto refused = [&](const v1::GenerateRequest& req, const std::string& field) {
    INFO("refused: " << field);
    Outcome o = RunCall(*rig.stub, req);
    CHECK(o.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(o.status.error_message().find(field) != std::string::npos);
  };
  v1::GenerateRequest bad = chat;
  bad.set_n(0);
  refused(bad, "'n'");
  bad = chat;
  bad.mutable_chat()->set_chat_template_kwargs_json("[1, ");
  refused(bad, "chat_template_kwargs_json");
  bad = chat;
  bad.mutable_chat()->set_chat_template_kwargs_json(std::string(2000, '[') +
                                                    std::string(2000, ']'));
  refused(bad, "chat_template_kwargs_json");
  bad = chat;
  bad.mutable_chat()->set_chat_template_kwargs_json("[]");
  refused(bad, "chat_template_kwargs");
  bad = chat;
  bad.mutable_chat()->set_chat_template("{% for %}");
  refused(bad, "chat_template");
  bad = chat;
  bad.mutable_chat()->clear_messages();
  refused(bad, "messages");
  CHECK(WaitFor([&] { return rig.EngineRequests() == 0; }));
}

namespace {

// The Service alone (no front end) over the tiny fixture model, for what both front ends share.
struct ServiceRig {
  explicit ServiceRig(int64_t max_waiting = 4096, int64_t num_kv_slots = 0)
      : service([&] {
          ServerConfig c = TinyConfig(256, 8);
          c.max_waiting = max_waiting;
          c.num_kv_slots = num_kv_slots;
          return c;
        }()) {
    StatusOr<std::unique_ptr<ModelHost>> host = LoadModelHost(service.config());
    INFO(host.status().ToString());
    REQUIRE(host.ok());
    service.Publish(std::move(host).value());
  }
  ~ServiceRig() {
    service.StopEngine();
    service.TakeHost().reset();
  }
  GenerateSpec Parse(const std::string& body, bool chat = false) const {
    ApiError err;
    std::optional<GenerateSpec> spec =
        chat ? ParseChatRequest(Json::parse(body), service.limits(), &err)
             : ParseCompletionRequest(Json::parse(body), service.limits(), &err);
    INFO(err.message);
    REQUIRE(spec);
    return *spec;
  }
  // Start's refusal of `spec` (prompt: a few ids; nothing may start).
  ApiError Refusal(const GenerateSpec& spec, std::vector<std::vector<int32_t>> prompts = {{5, 6}}) {
    ApiError err;
    std::unique_ptr<GenerationJob> job = service.Start(spec, prompts, "r", &err);
    CHECK(job == nullptr);
    return err;
  }
  Service service;
};

}  // namespace

// continue_final_message as Hugging Face's apply_chat_template (and vLLM): the prompt ends right
// after the final message, also when the template trims its content; a template that changes
// the content beyond its surrounding whitespace is a 400 naming continue_final_message (the old
// code kept the whole text, end-of-turn marker included).
TEST_CASE("Service: continue_final_message cuts after the final message, trimmed or not") {
  ServiceRig rig;
  auto render = [&](const std::string& tmpl, const std::string& last, std::string* text) {
    Json body = Json::parse(R"({"messages": [{"role": "user", "content": "Tell a story"}],
                                "continue_final_message": true, "add_generation_prompt": false})");
    body["messages"].push_back({{"role", "assistant"}, {"content", last}});
    body["chat_template"] = tmpl;
    const GenerateSpec spec = rig.Parse(body.dump(), /*chat=*/true);
    return rig.service.RenderChatPrompt(spec, text);
  };
  const std::string trim =
      "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content|trim}}<|im_end|>\n{% endfor %}";
  const std::string keep =
      "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>\n{% endfor %}";
  std::string text;
  REQUIRE_FALSE(render(trim, "Once upon a time ", &text));
  CHECK(text ==
        "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  REQUIRE_FALSE(render(trim, "\n  Once upon a time \t", &text));
  CHECK(text ==
        "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  // A template that keeps the spacing: the content's trailing whitespace stays.
  REQUIRE_FALSE(render(keep, "Once upon a time ", &text));
  CHECK(text ==
        "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\nOnce upon a time ");
  REQUIRE_FALSE(render(keep, "Once", &text));
  CHECK(text == "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\nOnce");
  // An empty final message: nothing to cut after (HF finds "" at the end).
  REQUIRE_FALSE(render(keep, "", &text));
  CHECK(text == "<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
  // The template changed the content: refused, not silently left uncut.
  std::optional<ApiError> e =
      render("{% for m in messages %}{{m.content|upper}}\n{% endfor %}", "Once upon", &text);
  REQUIRE(e);
  CHECK(e->http_status == 400);
  CHECK(e->param == "continue_final_message");
  CHECK(e->message.find("does not appear in the rendered chat") != std::string::npos);
  // The chat route refuses it the same way (BuildPrompts renders through RenderChatPrompt).
  Json body = Json::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "Once upon"}], "continue_final_message": true,
      "add_generation_prompt": false,
      "chat_template": "{% for m in messages %}{{m.content|upper}}{% endfor %}"})");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo;
  e = rig.service.BuildPrompts(rig.Parse(body.dump(), true), &prompts, &echo);
  REQUIRE(e);
  CHECK(e->param == "continue_final_message");
}

// An engine refusal names the request field it is about (it used to say "prompt" for all), and
// a request that can never be admitted is a 400 saying why, not a 429 a client retries forever.
TEST_CASE("Service: engine refusals name their field; never-admissible requests are 400s") {
  {
    ServiceRig rig(/*max_waiting=*/4);
    const GenerateSpec base = rig.Parse(R"({"prompt": [5, 6], "max_tokens": 2})");
    GenerateSpec s = base;
    s.sampling.temperature = std::numeric_limits<float>::infinity();
    ApiError e = rig.Refusal(s);
    CHECK(e.http_status == 400);
    CHECK(e.param == "temperature");
    s = base;
    s.sampling.top_p = 0;
    CHECK(rig.Refusal(s).param == "top_p");
    s = base;
    s.sampling.repetition_penalty = 0;
    CHECK(rig.Refusal(s).param == "repetition_penalty");
    s = base;
    s.forced_output_ids = {100000};
    CHECK(rig.Refusal(s).param == "forced_output_ids");
    s = base;
    s.min_tokens = 3;
    CHECK(rig.Refusal(s).param == "min_tokens");
    s = base;
    CHECK(rig.Refusal(s, {{5, 100000}}).param == "prompt");
    // More sequences than the waiting queue ever holds (5 prompts x n 1 > 4): a 400 with no
    // field, saying it can never be queued.
    e = rig.Refusal(base, std::vector<std::vector<int32_t>>(5, {5, 6}));
    CHECK(e.http_status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param.empty());
    CHECK(e.message.find("can never be queued") != std::string::npos);
  }
  {
    // Two head-blocks of 16 tokens for 2 KV heads: the whole pool holds 16 tokens of the
    // 4,096-token context. (Where the server refuses such a pool at start, naming
    // --num-kv-slots, no request meets it.)
    ServerConfig c = TinyConfig(256, 8);
    c.num_kv_slots = 2;
    StatusOr<std::unique_ptr<ModelHost>> host = LoadModelHost(c);
    if (!host.ok()) {
      CHECK(host.status().message().find("--num-kv-slots") != std::string::npos);
    } else {
      Service service(c);
      service.Publish(std::move(host).value());
      ApiError err;
      GenerateSpec spec;
      spec.max_tokens = 40;
      CHECK(service.Start(spec, {{5, 6}}, "r", &err) == nullptr);
      CHECK(err.http_status == 400);
      CHECK(err.type == "invalid_request_error");
      CHECK(err.param.empty());
      CHECK(err.message.find("whole pool") != std::string::npos);
      CHECK(err.message.find("can never run") != std::string::npos);
      service.StopEngine();
      service.TakeHost().reset();
    }
  }
}

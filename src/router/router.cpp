#include "router/router.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <system_error>

#include "common/http_front.h"
#include "common/http_front_settings.h"
#include "router/upstream.h"

namespace oasis::router {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);
// A slow client's backlog of relayed bytes the front has not sent yet: past it the relay stops
// taking the instance's answer (which then waits in TCP) until the client catches up or the
// front's write timeout cuts it.
constexpr size_t kMaxClientBacklog = size_t{1} << 20;
// The longest the router waits to abort a staged lease (connecting to the staging server
// included); the request's thread waits, after the client was answered.
constexpr double kMaxAbortWaitS = 2;

void SendJson(HttpExchange& ex, const OrderedJson& body, int status, HttpHeaders extra = {}) {
  ex.Reply(status, "application/json", Dump(body), std::move(extra));
}

void SendError(HttpExchange& ex, int status, const std::string& message, HttpHeaders extra = {}) {
  SendJson(ex, ErrorJson(status, message), status, std::move(extra));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string HeaderOr(const HttpRequest& req, std::string_view name) {
  const std::string* v = req.Header(name);
  return v != nullptr ? *v : std::string();
}

}  // namespace

Router::Router(RouterOptions options)
    : options_(std::move(options)),
      pool_(options_, &metrics_),
      aborter_(options_.staging_secret,
               std::chrono::milliseconds(static_cast<int64_t>(
                   std::min(options_.connect_timeout_s, kMaxAbortWaitS) * 1000))) {
  HttpFrontOptions o;
  o.io_threads = 2;
  o.worker_threads = 1;  // nothing runs on it: generations and /v1/models have their threads
  o.max_body_bytes = static_cast<size_t>(options_.max_body_bytes);
  options_.front.ApplyTo(&o);
  front_ = std::make_unique<HttpFront>(o);
  Routes();
}

Router::~Router() {
  Stop();
  JoinRequestThreads(/*all=*/true);
}

StatusOr<int> Router::Bind(const std::string& host, int port) { return front_->Bind(host, port); }

bool Router::Run() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_requested_) return true;
    running_ = true;
  }
  pool_.StartHealthChecks();
  front_->Start();
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_cv_.wait(lock, [this] { return stop_requested_; });
  }
  // stopping_ is set: waiting calls give up, live streams end with an error event; the front
  // lets those answers go out until the deadline, then cuts what is left.
  front_->Stop(options_.front.shutdown_deadline());
  JoinRequestThreads(/*all=*/true);
  pool_.JoinHealthChecks();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  return true;
}

void Router::Stop() {
  if (stopping_.exchange(true)) return;
  pool_.StopHealthChecks();
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  stop_cv_.notify_all();
}

bool Router::GiveUp(const HttpExchange& ex) const { return stopping_.load() || ex.closed(); }

void Router::Launch(HttpRequest& req, const Exchange& ex, Handler handler) {
  auto request = std::make_shared<HttpRequest>(std::move(req));
  JoinRequestThreads(/*all=*/false);  // those that ended no longer count
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) {
      refused = "the router is shutting down";
    } else if (threads_.size() >= static_cast<size_t>(options_.http_threads)) {
      refused = "the router relays " + std::to_string(options_.http_threads) +
                " requests at once (--http-threads); try again";
      metrics_.CountBusy();
    } else {
      auto done = std::make_shared<std::atomic<bool>>(false);
      try {
        threads_.push_back({std::thread([this, request, ex, handler = std::move(handler), done] {
                              try {
                                handler(*request, ex);
                              } catch (const std::exception& e) {
                                spdlog::error("{} {}: {}", request->method, request->path,
                                              e.what());
                                SendError(*ex, 500, "internal error in " + request->path);
                              }
                              done->store(true);
                            }),
                            done});
      } catch (const std::system_error& e) {
        refused = std::string("the router could not start a request thread: ") + e.what();
      }
    }
  }
  if (!refused.empty()) {
    SendError(*ex, 503, refused, {{"Retry-After", std::to_string(pool_.RetryAfterSeconds())}});
  }
}

void Router::JoinRequestThreads(bool all) {
  std::list<RequestThread> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = threads_.begin(); it != threads_.end();) {
      auto next = std::next(it);
      if (all || it->done->load()) ended.splice(ended.end(), threads_, it);
      it = next;
    }
  }
  for (RequestThread& t : ended) t.thread.join();
}

bool Router::InstanceHealthy(Role role, size_t index) const {
  return pool_.InstanceHealthy(role, index);
}

OrderedJson Router::HealthJson(bool* all_roles_healthy) const {
  return pool_.HealthJson(all_roles_healthy);
}

std::string Router::RenderMetrics() const {
  return metrics_.Render(pool_.RenderInstanceMetrics(), front_->Stats(), aborter_.aborted(),
                         aborter_.failed());
}

void Router::Relay(UpstreamCall& call, size_t index, HttpExchange& ex, bool sse, bool record_ttft,
                   Clock::time_point arrival) {
  // An SSE event longer than this without its blank line is relayed as it is (an instance
  // that does not frame its events must not grow the router's memory).
  constexpr size_t kMaxHeldEvent = size_t{1} << 20;
  std::string held;  // SSE: the start of an event not complete yet (never relayed half)
  bool first_byte_sent = false;
  bool done_sent = false;  // SSE: "data: [DONE]" relayed
  std::string data;
  auto write = [&](std::string bytes) {
    if (bytes.empty()) return;
    ex.Write(std::move(bytes));
    if (!first_byte_sent) {
      first_byte_sent = true;
      if (record_ttft) metrics_.ObserveTtft(SecondsSince(arrival));
    }
  };
  // An SSE answer that cannot go on ends with an error event and [DONE] (not [DONE] twice),
  // then the end of the body: never silently truncated. Any other answer is cut (its body
  // ends without its last chunk: the client sees it broken).
  auto end_with_error = [&](int status, const std::string& message) {
    if (!sse) return ex.Abort();
    metrics_.CountStreamError();
    if (!done_sent) write(ErrorEvent(status, message) + "data: [DONE]\n\n");
    ex.End();
  };
  while (true) {
    if (stopping_.load()) {
      call.Cancel();
      return end_with_error(503, "the router is shutting down");
    }
    if (ex.closed()) {
      call.Cancel();
      metrics_.CountClientDisconnect();
      return;
    }
    if (ex.pending_bytes() > kMaxClientBacklog) {  // a slow client: let the instance wait
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    bool finished = false;
    call.Next(&data, kPoll, &finished);
    if (!data.empty()) {
      if (sse) {
        held += data;
        size_t end = CompleteEventsEnd(held);
        if (end == 0 && held.size() > kMaxHeldEvent) end = held.size();
        std::string out = held.substr(0, end);
        held.erase(0, end);
        done_sent = done_sent || HasDoneEvent(out);
        write(std::move(out));
      } else {
        write(std::move(data));
        data.clear();
      }
    }
    if (!finished) continue;
    if (call.complete()) {
      write(std::move(held));
      return ex.End();
    }
    const UpstreamFailure failure = call.failure();
    if (failure == UpstreamFailure::kCancelled) {  // given up: the client or the router
      if (ex.closed()) metrics_.CountClientDisconnect();
      return end_with_error(503, "the router is shutting down");
    }
    const std::string why = call.ErrorText();
    pool_.ReportBrokenAnswer(Role::kDecode, index, failure, why);
    spdlog::warn("the decode instance's answer {}: {}",
                 IsTimeout(failure) ? "timed out" : "broke off", why);
    if (!held.empty()) spdlog::debug("dropped an incomplete SSE event of {} bytes", held.size());
    return end_with_error(IsTimeout(failure) ? 504 : 502,
                          std::string("the decode instance's answer ") +
                              (IsTimeout(failure) ? "timed out: " : "broke off: ") + why);
  }
}

void Router::SendDispatchError(HttpExchange& ex, const UpstreamPool::Dispatched& d,
                               const std::string& unavailable) {
  if (d.given_up && !stopping_.load()) {  // the client went away: nobody to answer
    metrics_.CountClientDisconnect();
    return;
  }
  std::string message;
  HttpHeaders extra;
  switch (d.status) {
    case 504:
      message = "an instance did not answer in time: " + d.failures;
      break;
    case 502:
      message = "an instance's answer broke off: " + d.failures;
      break;
    default:
      message = d.given_up ? "the router is shutting down" : unavailable + ": " + d.failures;
      extra.push_back({"Retry-After", std::to_string(pool_.RetryAfterSeconds())});
  }
  SendError(ex, d.status, message, std::move(extra));
}

void Router::HandleGenerate(const HttpRequest& req, const Exchange& ex, Endpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  int status = 400;
  std::string message;
  std::optional<ClientRequest> parsed = ParseClientRequest(req.body, &status, &message);
  if (!parsed) return SendError(*ex, status, message);

  UpstreamRequest up;
  up.method = "POST";
  up.path = req.path;
  up.body = Dump(PrefillBody(parsed->body));
  up.authorization = HeaderOr(req, "Authorization");

  // No healthy decode instance: 503 at once, before a prefill instance stages KV that no
  // decode instance would take (its lease would wait for its TTL).
  if (!pool_.AnyHealthy(Role::kDecode)) {
    UpstreamPool::Dispatched none;
    none.no_healthy = true;
    none.failures = "no healthy decode instance";
    if (!pool_.AnyHealthy(Role::kPrefill)) {
      none.failures = "no healthy prefill instance and no healthy decode instance";
      metrics_.CountNoHealthyInstance(RoleName(Role::kPrefill));
    }
    metrics_.CountNoHealthyInstance(RoleName(Role::kDecode));
    return SendDispatchError(*ex, none, "no decode instance could take the request");
  }

  // 1. Prefill.
  const std::function<bool()> give_up = [this, &ex] { return GiveUp(*ex); };
  UpstreamPool::Dispatched p =
      pool_.Dispatch(Role::kPrefill, up, UpstreamPool::DispatchOptions{}, give_up);
  if (!p.call) return SendDispatchError(*ex, p, "no prefill instance could take the request");
  const int prefill_status = p.call->status();
  std::string prefill_type = p.call->content_type();
  if (prefill_type.empty()) prefill_type = "application/json";
  std::string prefill_body = p.call->TakeBody();
  if (prefill_status != 200) {  // the client's error (400, 404, 413, 500...): relayed as is
    return ex->Reply(prefill_status, prefill_type, std::move(prefill_body));
  }
  metrics_.ObservePrefill(SecondsSince(arrival));
  const OrderedJson answer = OrderedJson::parse(prefill_body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) {
    return SendError(
        *ex, 502,
        "prefill instance " + p.label + " answered 200 with a body that is not a JSON object");
  }
  auto handoff = answer.find("oasis_handoff");
  if (handoff != answer.end() && !handoff->is_null() && !handoff->is_string()) {
    return SendError(
        *ex, 502,
        "prefill instance " + p.label + " answered an 'oasis_handoff' that is not a string");
  }
  if (handoff == answer.end() || handoff->is_null()) {
    return AnswerFinishedAtPrefill(*ex, *parsed, answer, std::move(prefill_body), prefill_type,
                                   endpoint, arrival);
  }
  // The ticket is the prefill instance's: one no decode instance could take is its fault
  // (502), not the client's.
  const std::string ticket = handoff->get<std::string>();
  StatusOr<TicketLease> lease = CheckHandoffTicket(ticket);
  if (!lease.ok()) {
    metrics_.CountBadTicket();
    spdlog::warn("prefill instance {} returned a malformed ticket: {}", p.label,
                 lease.status().message());
    return SendError(*ex, 502,
                     "prefill instance " + p.label +
                         " returned a malformed ticket: " + std::string(lease.status().message()));
  }
  metrics_.CountHandoff();
  prefill_body.clear();
  // 2. Decode with the ticket. A decode leg that refuses or fails before a decode instance
  // took the request leaves the staged KV to nobody: its lease is aborted at once.
  if (!RelayDecode(ex, &up, *parsed, ticket, arrival)) AbortLease(*lease, p.label);
}

void Router::AbortLease(const TicketLease& lease, const std::string& prefill_label) {
  const Status st = aborter_.Abort(lease.staging_address, lease.lease_id);
  if (st.ok()) {
    spdlog::info("aborted lease {} of prefill instance {} (staging {}): its decode leg failed",
                 lease.lease_id, prefill_label, lease.staging_address);
  } else {
    spdlog::warn(
        "could not abort lease {} of prefill instance {} (staging {}; it ends at its TTL): {}",
        lease.lease_id, prefill_label, lease.staging_address, st.ToString());
  }
}

void Router::AnswerFinishedAtPrefill(HttpExchange& ex, const ClientRequest& request,
                                     const OrderedJson& answer, std::string body,
                                     const std::string& content_type, Endpoint endpoint,
                                     Clock::time_point arrival) {
  // Finished on the prefill instance (it stopped within its first two tokens).
  metrics_.CountFinishedAtPrefill();
  if (!request.stream) return ex.Reply(200, content_type, std::move(body));
  ex.Reply(200, "text/event-stream",
           SynthesizeSse(answer, endpoint, request.include_usage, request.continuous_usage),
           {{"Cache-Control", "no-cache"}});
  metrics_.ObserveTtft(SecondsSince(arrival));
}

bool Router::RelayDecode(const Exchange& ex, UpstreamRequest* up, const ClientRequest& request,
                         const std::string& ticket, Clock::time_point arrival) {
  up->body = Dump(DecodeBody(request.body, ticket));
  // Not streamed: the answer comes whole at the end of the generation (--timeout-s), and is
  // taken whole before the client's status is sent, so that a failure is a 502/504 error.
  // Streamed: relayed from its headers on; a failure after them ends the stream with an error
  // event and [DONE].
  UpstreamPool::DispatchOptions how;
  how.buffered = !request.stream;
  if (how.buffered) how.first_byte_timeout_s = options_.timeout_s;
  UpstreamPool::Dispatched d =
      pool_.Dispatch(Role::kDecode, *up, how, [this, &ex] { return GiveUp(*ex); });
  if (!d.call) {
    SendDispatchError(*ex, d, "no decode instance could take the request");
    // Every instance refused (429/503), could not be reached or had none healthy: none holds
    // the lease. A timeout or a give-up cancelled a call an instance may be working on (it
    // sees the connection closed and ends the lease itself).
    return d.given_up || d.status == 504;
  }
  const int status = d.call->status();
  std::string type = d.call->content_type();
  if (type.empty()) type = "application/json";
  // An answer other than 200 is a refusal (400, 413...) or a failure that ended the request
  // there: the decode instance reads the lease no more.
  if (how.buffered) {
    ex->Reply(status, type, d.call->TakeBody());
    return status == 200;
  }
  const bool sse = type.rfind("text/event-stream", 0) == 0;
  HttpHeaders extra;
  if (sse) extra.push_back({"Cache-Control", "no-cache"});
  ex->StartStream(status, type, std::move(extra));
  Relay(*d.call, d.index, *ex, sse, /*record_ttft=*/status == 200, arrival);
  return status == 200;
}

void Router::HandleModels(const HttpRequest& req, const Exchange& ex) {
  UpstreamRequest up;
  up.method = "GET";
  up.path = "/v1/models";
  up.authorization = HeaderOr(req, "Authorization");
  UpstreamPool::Dispatched d = pool_.Dispatch(Role::kDecode, up, UpstreamPool::DispatchOptions{},
                                              [this, &ex] { return GiveUp(*ex); });
  if (!d.call) return SendDispatchError(*ex, d, "no decode instance could answer /v1/models");
  std::string type = d.call->content_type();
  ex->Reply(d.call->status(), type.empty() ? "application/json" : type, d.call->TakeBody());
}

void Router::Routes() {
  HttpFront& f = *front_;
  HttpFrontHooks hooks;
  hooks.before = [this](const HttpRequest& req, HttpExchange& ex) {
    const std::string& key = options_.api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics" || HasBearerKey(req, key)) {
      return false;
    }
    SendError(ex, 401, "Unauthorized: send 'Authorization: Bearer <api key>'");
    return true;
  };
  // The front's own errors (unknown route, body over the limit, timeouts, bad framing).
  hooks.error_body = [this](int status, const std::string&, const std::string& message) {
    std::string text = message;
    if (status == 413) {
      text = "request body larger than the router's limit (--max-body-bytes " +
             std::to_string(options_.max_body_bytes) + ")";
    }
    return std::make_pair(std::string("application/json"), Dump(ErrorJson(status, text)));
  };
  hooks.log = [this](const std::string& method, const std::string& path, int status) {
    metrics_.CountRequest(RouteLabel(path), status);
    spdlog::debug("{} {} {}", method, path, status);
  };
  f.SetHooks(std::move(hooks));

  using D = HttpDispatch;
  f.Route("GET", "/health", D::kInline, [this](HttpRequest&, Exchange ex) {
    bool ok = false;
    OrderedJson body = HealthJson(&ok);
    SendJson(*ex, body, ok ? 200 : 503);
  });
  f.Route("GET", "/metrics", D::kInline, [this](HttpRequest&, Exchange ex) {
    ex->Reply(200, "text/plain; version=0.0.4; charset=utf-8", RenderMetrics());
  });
  f.Route("GET", "/v1/models", D::kInline, [this](HttpRequest& req, Exchange ex) {
    Launch(req, ex, [this](const HttpRequest& r, const Exchange& e) { HandleModels(r, e); });
  });
  for (const auto& [path, endpoint] : {std::pair{"/v1/completions", Endpoint::kCompletions},
                                       {"/v1/chat/completions", Endpoint::kChatCompletions}}) {
    // (A copy: clang before 16 cannot capture a structured binding.)
    f.Route("POST", path, D::kInline, [this, ep = endpoint](HttpRequest& req, Exchange ex) {
      Launch(req, ex,
             [this, ep](const HttpRequest& r, const Exchange& e) { HandleGenerate(r, e, ep); });
    });
  }
}

}  // namespace oasis::router

#include "router/router.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "common/http_listener.h"
#include "router/upstream.h"

namespace oasis::router {
namespace {

using httplib::Request;
using httplib::Response;

constexpr auto kPoll = std::chrono::milliseconds(50);

void SendJson(Response& res, const OrderedJson& body, int status) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(Response& res, int status, const std::string& message) {
  SendJson(res, ErrorJson(status, message), status);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Wraps a handler: everything thrown becomes a 500 OpenAI error (the router never dies).
template <class Handler>
auto Guard(Handler handler) {
  return GuardHandler(
      handler, [](Response& res, const std::string& message) { SendError(res, 500, message); });
}

}  // namespace

Router::Router(RouterOptions options) : options_(std::move(options)), pool_(options_, &metrics_) {
  listener_ = std::make_unique<HttpListener>(
      HttpListenerOptions{static_cast<size_t>(std::max<int64_t>(1, options_.http_threads)),
                          static_cast<size_t>(options_.max_body_bytes)});
  Routes();
}

Router::~Router() {
  if (run_started_.load()) Stop();
}

StatusOr<int> Router::Bind(const std::string& host, int port) {
  return listener_->Bind(host, port);
}

bool Router::Run() {
  run_started_ = true;
  pool_.StartHealthChecks();
  const bool ok = listener_->Run();
  pool_.JoinHealthChecks();
  return ok;
}

void Router::Stop() {
  if (stopping_.exchange(true)) return;
  listener_->Stop();
  pool_.StopHealthChecks();
}

bool Router::InstanceHealthy(Role role, size_t index) const {
  return pool_.InstanceHealthy(role, index);
}

OrderedJson Router::HealthJson(bool* all_roles_healthy) const {
  return pool_.HealthJson(all_roles_healthy);
}

std::string Router::RenderMetrics() const { return metrics_.Render(pool_.RenderInstanceMetrics()); }

// What Relay keeps between the content provider's calls.
struct Router::RelayState {
  std::string held;  // SSE: the start of an event not complete yet (never relayed half)
  bool first_byte_sent = false;
  bool done_sent = false;  // SSE: "data: [DONE]" relayed
};

bool Router::Relay(UpstreamCall& call, size_t index, httplib::DataSink& sink, bool sse,
                   bool record_ttft, Clock::time_point arrival, RelayState* state) {
  // An SSE event longer than this without its blank line is relayed as it is (an instance
  // that does not frame its events must not grow the router's memory).
  constexpr size_t kMaxHeldEvent = size_t{1} << 20;
  std::string data;
  auto client_gone = [&] {
    call.Cancel();
    metrics_.CountClientDisconnect();
    return false;
  };
  auto write = [&](const std::string& bytes) {
    if (bytes.empty()) return true;
    if (!sink.write(bytes.data(), bytes.size())) return false;
    if (!state->first_byte_sent) {
      state->first_byte_sent = true;
      if (record_ttft) metrics_.ObserveTtft(SecondsSince(arrival));
    }
    return true;
  };
  // An SSE answer that cannot go on ends with an error event and [DONE] (not [DONE] twice),
  // then the end of the body: never silently truncated.
  auto end_with_error = [&](int status, const std::string& message) {
    metrics_.CountStreamError();
    const std::string tail =
        state->done_sent ? "" : ErrorEvent(status, message) + "data: [DONE]\n\n";
    if (!tail.empty() && !sink.write(tail.data(), tail.size())) return false;
    sink.done();
    return true;
  };
  while (true) {
    if (stopping_.load()) {
      call.Cancel();
      return sse && end_with_error(503, "the router is shutting down");
    }
    bool finished = false;
    call.Next(&data, kPoll, &finished);
    if (!data.empty()) {
      std::string out;
      if (sse) {
        state->held += data;
        size_t end = CompleteEventsEnd(state->held);
        if (end == 0 && state->held.size() > kMaxHeldEvent) end = state->held.size();
        out = state->held.substr(0, end);
        state->held.erase(0, end);
        state->done_sent = state->done_sent || HasDoneEvent(out);
      } else {
        out.swap(data);
      }
      if (!write(out)) return client_gone();
    } else if (!finished && !sink.is_writable()) {
      return client_gone();
    }
    if (!finished) continue;
    if (call.complete()) {
      if (!write(state->held)) return client_gone();
      sink.done();
      return true;
    }
    const UpstreamFailure failure = call.failure();
    if (failure == UpstreamFailure::kCancelled) return false;  // the client went away
    const std::string why = call.ErrorText();
    pool_.ReportBrokenAnswer(Role::kDecode, index, failure, why);
    spdlog::warn("the decode instance's answer {}: {}",
                 IsTimeout(failure) ? "timed out" : "broke off", why);
    if (!state->held.empty()) {
      spdlog::debug("dropped an incomplete SSE event of {} bytes", state->held.size());
      state->held.clear();
    }
    if (!sse) return false;  // not SSE, status already sent: the body ends unterminated
    return end_with_error(IsTimeout(failure) ? 504 : 502,
                          std::string("the decode instance's answer ") +
                              (IsTimeout(failure) ? "timed out: " : "broke off: ") + why);
  }
}

void Router::SendDispatchError(Response& res, const UpstreamPool::Dispatched& d,
                               const std::string& unavailable) {
  std::string message;
  switch (d.status) {
    case 504:
      message = "an instance did not answer in time: " + d.failures;
      break;
    case 502:
      message = "an instance's answer broke off: " + d.failures;
      break;
    default:
      message = unavailable + ": " + d.failures;
      res.set_header("Retry-After", std::to_string(pool_.RetryAfterSeconds()));
  }
  SendError(res, d.status, message);
}

void Router::HandleGenerate(const Request& req, Response& res, Endpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  int status = 400;
  std::string message;
  std::optional<ClientRequest> parsed = ParseClientRequest(req.body, &status, &message);
  if (!parsed) return SendError(res, status, message);

  UpstreamRequest up;
  up.method = "POST";
  up.path = req.path;
  up.body = Dump(PrefillBody(parsed->body));
  up.authorization = req.get_header_value("Authorization");

  // No healthy decode instance: 503 at once, before a prefill instance stages KV that no
  // decode instance would take (its lease would wait for its TTL).
  if (!pool_.AnyHealthy(Role::kDecode)) {
    UpstreamPool::Dispatched none;
    none.no_healthy = true;
    none.failures = "no healthy decode instance";
    metrics_.CountNoHealthyInstance(RoleName(Role::kDecode));
    return SendDispatchError(res, none, "no decode instance could take the request");
  }

  // 1. Prefill.
  UpstreamPool::Dispatched p =
      pool_.Dispatch(Role::kPrefill, up, UpstreamPool::DispatchOptions{}, stopping_);
  if (!p.call) return SendDispatchError(res, p, "no prefill instance could take the request");
  const int prefill_status = p.call->status();
  std::string prefill_type = p.call->content_type();
  if (prefill_type.empty()) prefill_type = "application/json";
  std::string prefill_body = p.call->TakeBody();
  if (prefill_status != 200) {  // the client's error (400, 404, 413, 500...): relayed as is
    res.status = prefill_status;
    res.set_content(prefill_body, prefill_type);
    return;
  }
  metrics_.ObservePrefill(SecondsSince(arrival));
  const OrderedJson answer = OrderedJson::parse(prefill_body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) {
    return SendError(
        res, 502,
        "prefill instance " + p.label + " answered 200 with a body that is not a JSON object");
  }
  auto handoff = answer.find("oasis_handoff");
  if (handoff != answer.end() && !handoff->is_null() && !handoff->is_string()) {
    return SendError(
        res, 502,
        "prefill instance " + p.label + " answered an 'oasis_handoff' that is not a string");
  }
  if (handoff == answer.end() || handoff->is_null()) {
    return AnswerFinishedAtPrefill(res, *parsed, answer, std::move(prefill_body), prefill_type,
                                   endpoint, arrival);
  }
  metrics_.CountHandoff();
  prefill_body.clear();
  // 2. Decode with the ticket.
  RelayDecode(res, &up, *parsed, handoff->get<std::string>(), arrival);
}

void Router::AnswerFinishedAtPrefill(Response& res, const ClientRequest& request,
                                     const OrderedJson& answer, std::string body,
                                     const std::string& content_type, Endpoint endpoint,
                                     Clock::time_point arrival) {
  // Finished on the prefill instance (it stopped within its first two tokens).
  metrics_.CountFinishedAtPrefill();
  res.status = 200;
  if (!request.stream) {
    res.set_content(body, content_type);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_content(SynthesizeSse(answer, endpoint, request.include_usage), "text/event-stream");
  metrics_.ObserveTtft(SecondsSince(arrival));
}

void Router::RelayDecode(Response& res, UpstreamRequest* up, const ClientRequest& request,
                         const std::string& ticket, Clock::time_point arrival) {
  up->body = Dump(DecodeBody(request.body, ticket));
  // Not streamed: the answer comes whole at the end of the generation (--timeout-s), and is
  // taken whole before the client's status is sent, so that a failure is a 502/504 error.
  // Streamed: relayed from its headers on; a failure after them ends the stream with an error
  // event and [DONE].
  UpstreamPool::DispatchOptions how;
  how.buffered = !request.stream;
  if (how.buffered) how.first_byte_timeout_s = options_.timeout_s;
  UpstreamPool::Dispatched d = pool_.Dispatch(Role::kDecode, *up, how, stopping_);
  if (!d.call) return SendDispatchError(res, d, "no decode instance could take the request");
  res.status = d.call->status();
  std::string type = d.call->content_type();
  if (type.empty()) type = "application/json";
  if (how.buffered) {
    res.set_content(d.call->TakeBody(), type);
    return;
  }
  const bool sse = type.rfind("text/event-stream", 0) == 0;
  if (sse) res.set_header("Cache-Control", "no-cache");
  const bool record_ttft = request.stream && res.status == 200;
  std::shared_ptr<UpstreamCall> call = d.call;
  auto state = std::make_shared<RelayState>();
  const size_t index = d.index;
  res.set_chunked_content_provider(
      type,
      [this, call, index, sse, record_ttft, arrival, state](size_t, httplib::DataSink& sink) {
        try {
          return Relay(*call, index, sink, sse, record_ttft, arrival, state.get());
        } catch (const std::exception& e) {
          spdlog::error("relaying the decode answer: {}", e.what());
          call->Cancel();
          return false;
        }
      },
      [call](bool) { call->Cancel(); });
}

void Router::HandleModels(const Request& req, Response& res) {
  UpstreamRequest up;
  up.method = "GET";
  up.path = "/v1/models";
  up.authorization = req.get_header_value("Authorization");
  UpstreamPool::Dispatched d =
      pool_.Dispatch(Role::kDecode, up, UpstreamPool::DispatchOptions{}, stopping_);
  if (!d.call) return SendDispatchError(res, d, "no decode instance could answer /v1/models");
  std::string type = d.call->content_type();
  res.status = d.call->status();
  res.set_content(d.call->TakeBody(), type.empty() ? "application/json" : type);
}

void Router::Routes() {
  httplib::Server& s = listener_->server();

  s.set_pre_routing_handler([this](const Request& req, Response& res) {
    const std::string& key = options_.api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics" || HasBearerKey(req, key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendError(res, 401, "Unauthorized: send 'Authorization: Bearer <api key>'");
    return httplib::Server::HandlerResponse::Handled;
  });

  // httplib's own errors (unknown route, body over the limit, unreadable request) have no body.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        switch (res.status) {
          case 404:
            SendError(res, 404, "no route " + req.method + " " + req.path);
            break;
          case 413:
            SendError(res, 413,
                      "request body larger than the router's limit (--max-body-bytes " +
                          std::to_string(options_.max_body_bytes) + ")");
            break;
          default:
            SendError(res, res.status,
                      "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path);
        }
        return httplib::Server::HandlerResponse::Handled;
      }));

  s.set_exception_handler([](const Request& req, Response& res, std::exception_ptr) {
    SendError(res, 500, "internal error in " + req.path);
  });

  s.set_logger([this](const Request& req, const Response& res) {
    metrics_.CountRequest(RouteLabel(req.path), res.status);
    spdlog::debug("{} {} {}", req.method, req.path, res.status);
  });

  s.Get("/health", Guard([this](const Request&, Response& res) {
          bool ok = false;
          OrderedJson body = HealthJson(&ok);
          SendJson(res, body, ok ? 200 : 503);
        }));
  s.Get("/metrics", Guard([this](const Request&, Response& res) {
          res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
        }));
  s.Get("/v1/models", Guard([this](const Request& req, Response& res) { HandleModels(req, res); }));
  s.Post("/v1/completions", Guard([this](const Request& req, Response& res) {
           HandleGenerate(req, res, Endpoint::kCompletions);
         }));
  s.Post("/v1/chat/completions", Guard([this](const Request& req, Response& res) {
           HandleGenerate(req, res, Endpoint::kChatCompletions);
         }));
}

}  // namespace oasis::router

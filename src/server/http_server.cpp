#include "server/http_server.h"

#include "common/base64.h"
#include "common/http_listener.h"
#include "common/http_util.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <set>
#include <type_traits>
#include <utility>

#include "server/connection_probe.h"
#include "tokenizer/tokenizer.h"

namespace oasis::server {
namespace {

using httplib::Request;
using httplib::Response;

constexpr auto kPollInterval = std::chrono::milliseconds(50);

void SendJson(Response& res, const OrderedJson& body, int status = 200) {
  res.status = status;
  res.set_content(DumpJson(body), "application/json");
}

void SendError(Response& res, const ApiError& error) {
  SendJson(res, error.ToJson(), error.http_status);
}

ApiError Unauthorized() {
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = "Unauthorized: send 'Authorization: Bearer <api key>'";
  return e;
}

ApiError Loading() {
  return FromStatus(Unavailable("the model is still loading; retry when /health answers 200"));
}

// Routes whose label is the path; everything else counts as "other" (bounded label set).
const std::set<std::string>& KnownRoutes() {
  static const std::set<std::string> routes = {
      "/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
      "/tokenize",       "/detokenize",          "/metrics",   "/version"};
  return routes;
}

// Streams one generation job as server-sent events. Owned (shared) by the chunked content
// provider and its releaser; runs on the connection's worker thread.
struct SseStream {
  GenerateSpec spec;
  std::unique_ptr<GenerationJob> job;
  std::unique_ptr<ResponseBuilder> builder;
  std::vector<std::string> echo;  // per choice
  std::vector<char> echo_sent;
  ConnectionProbe probe;
  HttpMetrics* metrics;

  bool Write(httplib::DataSink& sink, const OrderedJson& j) {
    const std::string event = "data: " + DumpJson(j) + "\n\n";
    return sink.write(event.data(), event.size());
  }
  bool Disconnected() {
    job->Abort();
    metrics->CountClientDisconnect();
    return false;
  }
  // The whole stream in one call; false aborts (client gone).
  bool Run(httplib::DataSink& sink) {
    if (spec.endpoint == Endpoint::kChatCompletions) {
      for (const ChoiceState& c : job->choices()) {
        if (!Write(sink, builder->RoleChunk(c.index))) return Disconnected();
      }
    }
    while (!job->finished()) {
      std::optional<JobEvent> ev = job->Next(kPollInterval);
      if (probe.PeerClosed()) return Disconnected();
      if (!ev) continue;
      ChoiceState& state = job->choices()[ev->choice];
      if (ev->out.finished && ev->out.finish_reason == FinishReasonKind::kError) {
        const Status& st = ev->out.error;
        if (!Write(sink, ResponseBuilder::ErrorChunk(FromStatus(
                             st.ok() ? Internal("the engine failed the request") : st)))) {
          return Disconnected();
        }
      }
      std::string prefix;
      if (!echo.empty() && !echo_sent[ev->choice]) {
        prefix = echo[ev->choice];
        echo_sent[ev->choice] = 1;
      }
      OrderedJson chunk = builder->Chunk(state, ev->out, prefix);
      if (!chunk.is_null() && !Write(sink, chunk)) return Disconnected();
    }
    if (spec.include_usage && !Write(sink, builder->UsageChunk(job->usage())))
      return Disconnected();
    static const std::string kDone = "data: [DONE]\n\n";
    if (!sink.write(kDone.data(), kDone.size())) return Disconnected();
    sink.done();
    return true;
  }
};

ApiError InternalError(const std::string& message) { return FromStatus(Internal(message)); }

// Wraps a handler: everything thrown becomes a 500 OpenAI error (the server never dies).
template <class Handler>
auto Guard(Handler handler) {
  return GuardHandler(handler, [](Response& res, const std::string& message) {
    SendError(res, InternalError(message));
  });
}

// API keys, httplib's own errors (as OpenAI error JSON), the request counters.
void InstallErrorHandling(httplib::Server& s, Service& svc) {
  s.set_pre_routing_handler([&svc](const Request& req, Response& res) {
    const std::string& key = svc.config().api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics" || req.path == "/version") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (HasBearerKey(req, key)) return httplib::Server::HandlerResponse::Unhandled;
    SendError(res, Unauthorized());
    return httplib::Server::HandlerResponse::Handled;
  });

  // httplib's own errors (unknown route, body over the limit, unreadable request) have no
  // body: give them OpenAI error JSON.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    switch (res.status) {
      case 404:
        e.type = "not_found_error";
        e.message = "no route " + req.method + " " + req.path;
        break;
      case 413:
        e.message = "request body larger than the server's limit (--max-body-bytes)";
        e.code = "request_too_large";
        break;
      default:
        e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
        e.message = "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path;
    }
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));

  s.set_exception_handler([](const Request& req, Response& res, std::exception_ptr) {
    SendError(res, InternalError("internal error in " + req.path));
  });

  s.set_logger([&svc](const Request& req, const Response& res) {
    const std::string route = KnownRoutes().count(req.path) ? req.path : "other";
    svc.http_metrics().Count(req.method, route, res.status);
    spdlog::debug("{} {} {}", req.method, req.path, res.status);
  });
}

void HandleHealth(Service& svc, Response& res) {
  const ModelHost* h = svc.host();
  if (h == nullptr) return SendError(res, Loading());
  // What oasis-router may weigh: the role, queued and running requests, free host KV.
  const EngineStats st = h->engine->Stats();
  SendJson(res, {{"role", h->role},
                 {"num_running", st.requests.num_running},
                 {"num_waiting", st.requests.num_waiting + st.disagg.num_importing},
                 {"free_host_kv_blocks", st.sparse.num_free_host_kv_slots}});
}

// A prefill instance's staging pool and server.
StagingMetrics StagingMetricsOf(const ModelHost& h) {
  const disagg::StagingPoolStats p = h.staging_pool->Stats();
  StagingMetrics m;
  m.bytes_total = p.blocks_total * p.block_bytes;
  m.bytes_held = p.bytes_held;
  m.requests_held = p.requests_held;
  m.completed = p.leases_completed;
  m.aborted = p.leases_aborted;
  m.expired = p.leases_expired;
  m.acquire_failures = p.acquire_failures;
  m.connections_open = h.staging_server->Stats().connections_open;
  return m;
}

void HandleMetrics(Service& svc, Response& res) {
  std::string text;
  if (const ModelHost* h = svc.host()) {
    text = RenderEngineMetrics(h->engine->Stats(), svc.model_name());
    if (h->staging_pool) text += RenderStagingMetrics(StagingMetricsOf(*h), svc.model_name());
  }
  text += svc.http_metrics().Render(svc.model_name());
  res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
}

void HandleModels(Service& svc, Response& res) {
  const ModelHost* h = svc.host();
  if (h == nullptr) return SendError(res, Loading());
  OrderedJson model = {{"id", svc.model_name()},
                       {"object", "model"},
                       {"created", std::time(nullptr)},
                       {"owned_by", "oasiskv"},
                       {"root", h->model_dir},
                       {"parent", nullptr},
                       {"max_model_len", h->max_model_len()}};
  SendJson(res, {{"object", "list"}, {"data", OrderedJson::array({model})}});
}

// An optional field of a tokenizer route's body: absent or null -> `fallback`; another type
// than T -> nullopt with a 400 naming it.
template <typename T>
std::optional<T> OptionalField(const Json& body, const char* name, T fallback, ApiError* err) {
  auto f = body.find(name);
  if (f == body.end() || f->is_null()) return fallback;
  const bool ok = std::is_same_v<T, bool> ? f->is_boolean() : f->is_string();
  if (!ok) {
    *err = BadRequest(std::string("'") + name + "' must be " +
                          (std::is_same_v<T, bool> ? "a boolean" : "a string"),
                      name);
    return std::nullopt;
  }
  return f->get<T>();
}

// The text /tokenize encodes (a prompt, or chat messages rendered) and whether special tokens
// are added; nullopt with `*err` on a bad request.
std::optional<std::pair<std::string, bool>> TokenizeInput(Service& svc, const Json& body,
                                                          ApiError* err) {
  std::string text;
  bool add_special = true;
  if (body.contains("messages")) {
    std::optional<GenerateSpec> spec = ParseChatRequest(body, svc.limits(), err);
    if (!spec) return std::nullopt;
    StatusOr<std::string> rendered = svc.RenderChat(*spec);
    if (!rendered.ok()) {
      *err = FromStatus(rendered.status(), "messages");
      return std::nullopt;
    }
    text = *rendered;
    add_special = false;
  } else {
    auto p = body.find("prompt");
    if (p == body.end() || !p->is_string()) {
      *err = BadRequest("'prompt' must be a string", "prompt");
      return std::nullopt;
    }
    text = p->get<std::string>();
  }
  std::optional<bool> a = OptionalField(body, "add_special_tokens", add_special, err);
  if (!a) return std::nullopt;
  return std::pair{text, *a};
}

// The tokenizer routes' common start: a loaded model with a tokenizer, and a JSON body. Sends
// the error and returns nullopt otherwise.
std::optional<Json> TokenizerRouteBody(Service& svc, const Request& req, Response& res) {
  const ModelHost* h = svc.host();
  if (h == nullptr) return SendError(res, Loading()), std::nullopt;
  ApiError err;
  std::optional<Json> body = ParseJsonBody(req.body, &err);
  if (!body) return SendError(res, err), std::nullopt;
  if (h->tokenizer == nullptr) {
    return SendError(res, BadRequest("this model has no tokenizer")), std::nullopt;
  }
  return body;
}

void HandleTokenize(Service& svc, const Request& req, Response& res) {
  std::optional<Json> body = TokenizerRouteBody(svc, req, res);
  if (!body) return;
  const ModelHost* h = svc.host();
  ApiError err;
  std::optional<std::pair<std::string, bool>> input = TokenizeInput(svc, *body, &err);
  if (!input) return SendError(res, err);
  const auto& [text, add_special] = *input;
  const std::optional<std::string> model = OptionalField(*body, "model", std::string(), &err);
  const std::optional<bool> strs_wanted = OptionalField(*body, "return_token_strs", false, &err);
  if (!model || !strs_wanted) return SendError(res, err);
  if (auto e = svc.CheckModel(*model)) return SendError(res, *e);
  const std::vector<int32_t> ids = h->tokenizer->Encode(
      text, add_special ? tokenizer::AddSpecialTokens::kYes : tokenizer::AddSpecialTokens::kNo);
  OrderedJson out = {{"count", ids.size()}, {"max_model_len", h->max_model_len()}, {"tokens", ids}};
  if (*strs_wanted) {
    OrderedJson strs = OrderedJson::array();
    for (int32_t id : ids) strs.push_back(h->tokenizer->IdToToken(id).value_or(""));
    out["token_strs"] = strs;
  } else {
    out["token_strs"] = nullptr;
  }
  SendJson(res, out);
}

void HandleDetokenize(Service& svc, const Request& req, Response& res) {
  std::optional<Json> body = TokenizerRouteBody(svc, req, res);
  if (!body) return;
  const ModelHost* h = svc.host();
  ApiError err;
  const std::optional<std::string> model = OptionalField(*body, "model", std::string(), &err);
  if (!model) return SendError(res, err);
  if (auto e = svc.CheckModel(*model)) return SendError(res, *e);
  auto t = body->find("tokens");
  if (t == body->end() || !t->is_array())
    return SendError(res, BadRequest("'tokens' must be a list of token ids", "tokens"));
  std::vector<int32_t> ids;
  for (const Json& id : *t) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        !h->tokenizer->IsKnown(static_cast<int32_t>(id.get<int64_t>()))) {
      std::string shown = id.dump();
      if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
      return SendError(
          res,
          BadRequest("'tokens' holds " + shown + ", not a token id of this tokenizer", "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  SendJson(res, {{"prompt", h->tokenizer->Decode(ids, tokenizer::SkipSpecialTokens::kNo)}});
}

// A non-streamed generation: waits for the whole job, then answers it (or the handoff ticket
// on a prefill instance).
void AnswerWhole(SseStream& stream, Response& res) {
  GenerationJob& j = *stream.job;
  while (!j.finished()) {
    j.Next(kPollInterval);
    if (stream.probe.PeerClosed()) {
      stream.Disconnected();
      res.status = 499;  // nginx's "client closed request"; nobody reads it
      return;
    }
  }
  for (const ChoiceState& c : j.choices()) {
    if (c.finish_reason == FinishReasonKind::kError) {
      return SendError(
          res, FromStatus(c.error.ok() ? Internal("the engine failed the request") : c.error));
    }
    // A prefill instance: the request goes on at a decode instance (oasis-router sends it).
    if (c.finish_reason == FinishReasonKind::kHandoff) {
      return SendJson(res, {{"oasis_handoff", Base64Encode(c.handoff_ticket)}});
    }
  }
  SendJson(res, stream.builder->Final(j.choices(), j.usage(), stream.echo));
}

void HandleGenerate(Service& svc, Endpoint endpoint, const Request& req, Response& res) {
  if (svc.host() == nullptr) return SendError(res, Loading());
  ApiError err;
  std::optional<Json> body = ParseJsonBody(req.body, &err);
  if (!body) return SendError(res, err);
  const ProtocolLimits limits = svc.limits();
  std::optional<GenerateSpec> parsed = endpoint == Endpoint::kChatCompletions
                                           ? ParseChatRequest(*body, limits, &err)
                                           : ParseCompletionRequest(*body, limits, &err);
  if (!parsed) return SendError(res, err);
  if (auto e = svc.CheckModel(parsed->model)) return SendError(res, *e);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_per_prompt;
  if (auto e = svc.BuildPrompts(*parsed, &prompts, &echo_per_prompt)) return SendError(res, *e);
  const std::string id =
      svc.NewRequestId(endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl");
  std::unique_ptr<GenerationJob> job = svc.Start(*parsed, prompts, id, &err);
  if (!job) return SendError(res, err);
  std::vector<std::string> echo;  // per choice
  for (const std::string& text : echo_per_prompt) {
    for (int64_t j = 0; j < parsed->n; ++j) echo.push_back(text);
  }
  const ModelHost* h = svc.host();
  const tokenizer::Tokenizer* tok = h != nullptr ? h->tokenizer.get() : nullptr;
  auto stream = std::make_shared<SseStream>(
      SseStream{std::move(*parsed),
                std::move(job),
                nullptr,
                std::move(echo),
                {},
                ConnectionProbe(req.local_addr, req.local_port, req.remote_addr, req.remote_port),
                &svc.http_metrics()});
  stream->builder = std::make_unique<ResponseBuilder>(stream->spec, id, svc.model_name(),
                                                      std::time(nullptr), tok);
  stream->echo_sent.assign(stream->echo.size(), 0);
  if (!stream->spec.stream) return AnswerWhole(*stream, res);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [stream](size_t, httplib::DataSink& sink) { return stream->Run(sink); },
      [stream](bool) { stream->job->Abort(); });
}

}  // namespace

HttpFrontend::HttpFrontend(Service& service) : service_(service) {
  const ServerConfig& c = service_.config();
  const size_t threads = c.http_threads > 0
                             ? static_cast<size_t>(c.http_threads)
                             : static_cast<size_t>(std::max<int64_t>(64, c.max_num_seqs + 16));
  listener_ = std::make_unique<HttpListener>(
      HttpListenerOptions{threads, static_cast<size_t>(c.max_body_bytes)});
  Routes();
}

HttpFrontend::~HttpFrontend() = default;

StatusOr<int> HttpFrontend::Bind(const std::string& host, int port) {
  return listener_->Bind(host, port);
}

bool HttpFrontend::Run() { return listener_->Run(); }

void HttpFrontend::Stop() { listener_->Stop(); }

void HttpFrontend::Routes() {
  httplib::Server& s = listener_->server();
  Service& svc = service_;
  InstallErrorHandling(s, svc);
  s.Get("/health", Guard([&svc](const Request&, Response& res) { HandleHealth(svc, res); }));
  s.Get("/version", Guard([](const Request&, Response& res) {
          SendJson(res, {{"version", "0.1.0"}});
        }));
  s.Get("/metrics", Guard([&svc](const Request&, Response& res) { HandleMetrics(svc, res); }));
  s.Get("/v1/models", Guard([&svc](const Request&, Response& res) { HandleModels(svc, res); }));
  s.Post("/tokenize",
         Guard([&svc](const Request& req, Response& res) { HandleTokenize(svc, req, res); }));
  s.Post("/detokenize",
         Guard([&svc](const Request& req, Response& res) { HandleDetokenize(svc, req, res); }));
  s.Post("/v1/completions", Guard([&svc](const Request& req, Response& res) {
           HandleGenerate(svc, Endpoint::kCompletions, req, res);
         }));
  s.Post("/v1/chat/completions", Guard([&svc](const Request& req, Response& res) {
           HandleGenerate(svc, Endpoint::kChatCompletions, req, res);
         }));
}

}  // namespace oasis::server

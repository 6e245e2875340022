#include "server/http_server.h"

#include "common/base64.h"
#include "common/http_listener.h"
#include "common/http_util.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <thread>
#include <set>

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

void SendError(Response& res, const ApiError& error) { SendJson(res, error.ToJson(), error.http_status); }

ApiError Unauthorized() {
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = "Unauthorized: send 'Authorization: Bearer <api key>'";
  return e;
}

ApiError Loading() { return FromStatus(Unavailable("the model is still loading; retry when /health answers 200")); }

// Routes whose label is the path; everything else counts as "other" (bounded label set).
const std::set<std::string>& KnownRoutes() {
  static const std::set<std::string> routes = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                               "/tokenize", "/detokenize", "/metrics", "/version"};
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
        if (!Write(sink, ResponseBuilder::ErrorChunk(FromStatus(st.ok() ? Internal("the engine failed the request") : st)))) {
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
    if (spec.include_usage && !Write(sink, builder->UsageChunk(job->usage()))) return Disconnected();
    static const std::string kDone = "data: [DONE]\n\n";
    if (!sink.write(kDone.data(), kDone.size())) return Disconnected();
    sink.done();
    return true;
  }
};

}  // namespace

HttpFrontend::HttpFrontend(Service& service) : service_(service), server_(std::make_unique<HttpListener>()) {
  const ServerConfig& c = service_.config();
  const size_t threads = c.http_threads > 0 ? static_cast<size_t>(c.http_threads)
                                            : static_cast<size_t>(std::max<int64_t>(64, c.max_num_seqs + 16));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(static_cast<size_t>(c.max_body_bytes));
  server_->set_keep_alive_timeout(5);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);
  Routes();
}

HttpFrontend::~HttpFrontend() = default;

StatusOr<int> HttpFrontend::Bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind an HTTP port on " + host);
  } else if (!server_->bind_to_port(host, port)) {
    return Unavailable("cannot bind HTTP " + host + ":" + std::to_string(port) + " (in use, or a bad --host)");
  }
  if (!static_cast<HttpListener&>(*server_).RaiseBacklog()) {
    return Unavailable("cannot set the listen backlog of HTTP " + host + ":" + std::to_string(bound) + ": " +
                       std::strerror(errno));
  }
  return bound;
}

bool HttpFrontend::Run() { return server_->listen_after_bind(); }

void HttpFrontend::Stop() {
  // httplib's stop() is a no-op until listen_after_bind() runs; a listener that came up
  // later would serve forever.
  for (int i = 0; i < 500 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server_->stop();
}

void HttpFrontend::Routes() {
  httplib::Server& s = *server_;
  Service& svc = service_;

  // Wraps a handler: everything thrown becomes a 500 OpenAI error (the server never dies).
  auto guard = [](auto handler) {
    return [handler](const Request& req, Response& res) {
      try {
        handler(req, res);
      } catch (const std::exception& e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        SendError(res, FromStatus(Internal(std::string("internal error: ") + e.what())));
      } catch (...) {
        SendError(res, FromStatus(Internal("internal error")));
      }
    };
  };

  s.set_pre_routing_handler([&svc](const Request& req, Response& res) {
    const std::string& key = svc.config().api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics" || req.path == "/version") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0 && KeyMatches(auth.substr(7), key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
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
    SendError(res, FromStatus(Internal("internal error in " + req.path)));
  });

  s.set_logger([&svc](const Request& req, const Response& res) {
    const std::string route = KnownRoutes().count(req.path) ? req.path : "other";
    svc.http_metrics().Count(req.method, route, res.status);
    spdlog::debug("{} {} {}", req.method, req.path, res.status);
  });

  s.Get("/health", guard([&svc](const Request&, Response& res) {
          const ModelHost* h = svc.host();
          if (h == nullptr) return SendError(res, Loading());
          // What oasis-router may weigh: the role, queued and running requests, free host KV.
          const EngineStats st = h->engine->Stats();
          SendJson(res, {{"role", h->role},
                         {"num_running", st.num_running},
                         {"num_waiting", st.num_waiting + st.num_importing},
                         {"free_host_kv_blocks", st.num_free_host_kv_slots}});
        }));

  s.Get("/version", guard([](const Request&, Response& res) { SendJson(res, {{"version", "0.1.0"}}); }));

  s.Get("/metrics", guard([&svc](const Request&, Response& res) {
          std::string text;
          if (const ModelHost* h = svc.host()) {
            text = RenderEngineMetrics(h->engine->Stats(), svc.model_name());
            if (h->staging_pool) {
              const disagg::StagingPoolStats p = h->staging_pool->Stats();
              StagingMetrics m;
              m.bytes_total = p.blocks_total * p.block_bytes;
              m.bytes_held = p.bytes_held;
              m.requests_held = p.requests_held;
              m.completed = p.leases_completed;
              m.aborted = p.leases_aborted;
              m.expired = p.leases_expired;
              m.acquire_failures = p.acquire_failures;
              m.connections_open = h->staging_server->Stats().connections_open;
              text += RenderStagingMetrics(m, svc.model_name());
            }
          }
          text += svc.http_metrics().Render(svc.model_name());
          res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
        }));

  s.Get("/v1/models", guard([&svc](const Request&, Response& res) {
          const ModelHost* h = svc.host();
          if (h == nullptr) return SendError(res, Loading());
          OrderedJson model = {{"id", svc.model_name()}, {"object", "model"}, {"created", std::time(nullptr)},
                               {"owned_by", "oasiskv"}, {"root", h->model_dir}, {"parent", nullptr},
                               {"max_model_len", h->max_model_len()}};
          SendJson(res, {{"object", "list"}, {"data", OrderedJson::array({model})}});
        }));

  s.Post("/tokenize", guard([&svc](const Request& req, Response& res) {
           const ModelHost* h = svc.host();
           if (h == nullptr) return SendError(res, Loading());
           ApiError err;
           std::optional<Json> body = ParseJsonBody(req.body, &err);
           if (!body) return SendError(res, err);
           if (h->tokenizer == nullptr) return SendError(res, BadRequest("this model has no tokenizer"));
           std::string text;
           bool add_special = true;
           if (body->contains("messages")) {
             std::optional<GenerateSpec> spec = ParseChatRequest(*body, svc.limits(), &err);
             if (!spec) return SendError(res, err);
             StatusOr<std::string> rendered = svc.RenderChat(*spec);
             if (!rendered.ok()) return SendError(res, FromStatus(rendered.status(), "messages"));
             text = *rendered;
             add_special = false;
           } else {
             auto p = body->find("prompt");
             if (p == body->end() || !p->is_string()) return SendError(res, BadRequest("'prompt' must be a string", "prompt"));
             text = p->get<std::string>();
           }
           auto a = body->find("add_special_tokens");
           if (a != body->end() && !a->is_null()) {
             if (!a->is_boolean()) return SendError(res, BadRequest("'add_special_tokens' must be a boolean", "add_special_tokens"));
             add_special = a->get<bool>();
           }
           if (auto e = svc.CheckModel(body->value("model", std::string()))) return SendError(res, *e);
           const std::vector<int32_t> ids =
               h->tokenizer->Encode(text, add_special ? tokenizer::AddSpecialTokens::kYes : tokenizer::AddSpecialTokens::kNo);
           OrderedJson out = {{"count", ids.size()}, {"max_model_len", h->max_model_len()}, {"tokens", ids}};
           if (body->value("return_token_strs", false)) {
             OrderedJson strs = OrderedJson::array();
             for (int32_t id : ids) strs.push_back(h->tokenizer->IdToToken(id).value_or(""));
             out["token_strs"] = strs;
           } else {
             out["token_strs"] = nullptr;
           }
           SendJson(res, out);
         }));

  s.Post("/detokenize", guard([&svc](const Request& req, Response& res) {
           const ModelHost* h = svc.host();
           if (h == nullptr) return SendError(res, Loading());
           ApiError err;
           std::optional<Json> body = ParseJsonBody(req.body, &err);
           if (!body) return SendError(res, err);
           if (h->tokenizer == nullptr) return SendError(res, BadRequest("this model has no tokenizer"));
           if (auto e = svc.CheckModel(body->value("model", std::string()))) return SendError(res, *e);
           auto t = body->find("tokens");
           if (t == body->end() || !t->is_array()) return SendError(res, BadRequest("'tokens' must be a list of token ids", "tokens"));
           std::vector<int32_t> ids;
           for (const Json& id : *t) {
             if (!id.is_number_integer() || id.get<int64_t>() < 0 || !h->tokenizer->IsKnown(static_cast<int32_t>(id.get<int64_t>()))) {
               return SendError(res, BadRequest("'tokens' holds " + id.dump() + ", not a token id of this tokenizer", "tokens"));
             }
             ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
           }
           SendJson(res, {{"prompt", h->tokenizer->Decode(ids, tokenizer::SkipSpecialTokens::kNo)}});
         }));

  auto generate = [&svc](Endpoint endpoint) {
    return [&svc, endpoint](const Request& req, Response& res) {
      if (svc.host() == nullptr) return SendError(res, Loading());
      ApiError err;
      std::optional<Json> body = ParseJsonBody(req.body, &err);
      if (!body) return SendError(res, err);
      const ProtocolLimits limits = svc.limits();
      std::optional<GenerateSpec> parsed = endpoint == Endpoint::kChatCompletions ? ParseChatRequest(*body, limits, &err)
                                                                                   : ParseCompletionRequest(*body, limits, &err);
      if (!parsed) return SendError(res, err);
      if (auto e = svc.CheckModel(parsed->model)) return SendError(res, *e);
      std::vector<std::vector<int32_t>> prompts;
      std::vector<std::string> echo_per_prompt;
      if (auto e = svc.BuildPrompts(*parsed, &prompts, &echo_per_prompt)) return SendError(res, *e);
      const std::string id = svc.NewRequestId(endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl");
      std::unique_ptr<GenerationJob> job = svc.Start(*parsed, prompts, id, &err);
      if (!job) return SendError(res, err);
      std::vector<std::string> echo;  // per choice
      for (const std::string& text : echo_per_prompt) {
        for (int64_t j = 0; j < parsed->n; ++j) echo.push_back(text);
      }
      const ModelHost* h = svc.host();
      const tokenizer::Tokenizer* tok = h != nullptr ? h->tokenizer.get() : nullptr;
      auto stream = std::make_shared<SseStream>(SseStream{std::move(*parsed), std::move(job), nullptr, std::move(echo), {},
                                                          ConnectionProbe(req.local_addr, req.local_port, req.remote_addr,
                                                                          req.remote_port),
                                                          &svc.http_metrics()});
      stream->builder = std::make_unique<ResponseBuilder>(stream->spec, id, svc.model_name(), std::time(nullptr), tok);
      stream->echo_sent.assign(stream->echo.size(), 0);
      if (stream->spec.stream) {
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream", [stream](size_t, httplib::DataSink& sink) { return stream->Run(sink); },
            [stream](bool) { stream->job->Abort(); });
        return;
      }
      GenerationJob& j = *stream->job;
      while (!j.finished()) {
        j.Next(kPollInterval);
        if (stream->probe.PeerClosed()) {
          stream->Disconnected();
          res.status = 499;  // nginx's "client closed request"; nobody reads it
          return;
        }
      }
      for (const ChoiceState& c : j.choices()) {
        if (c.finish_reason == FinishReasonKind::kError) {
          return SendError(res, FromStatus(c.error.ok() ? Internal("the engine failed the request") : c.error));
        }
        // A prefill instance: the request goes on at a decode instance (oasis-router sends it).
        if (c.finish_reason == FinishReasonKind::kHandoff) {
          return SendJson(res, {{"oasis_handoff", Base64Encode(c.handoff_ticket)}});
        }
      }
      SendJson(res, stream->builder->Final(j.choices(), j.usage(), stream->echo));
    };
  };
  s.Post("/v1/completions", guard(generate(Endpoint::kCompletions)));
  s.Post("/v1/chat/completions", guard(generate(Endpoint::kChatCompletions)));
}

}  // namespace oasis::server

#include "server/http_server.h"

#include "common/base64.h"
#include "common/http_front.h"
#include "common/http_front_settings.h"
#include "common/http_util.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>
#include <limits>
#include <mutex>
#include <set>
#include <string_view>
#include <type_traits>
#include <utility>

#include "tokenizer/tokenizer.h"

namespace oasis::server {
namespace {

using Exchange = std::shared_ptr<HttpExchange>;

void SendJson(HttpExchange& ex, const OrderedJson& body, int status = 200) {
  ex.Reply(status, "application/json", DumpJson(body));
}

// A 429 (the waiting queue is full for now) says when to retry, as the front's own 503 does;
// a request that can never be served is a 400, never a 429 a client would retry forever.
void SendError(HttpExchange& ex, const ApiError& error) {
  HttpHeaders extra;
  if (error.http_status == 429) extra.push_back({"Retry-After", "1"});
  ex.Reply(error.http_status, "application/json", DumpJson(error.ToJson()), std::move(extra));
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

// One generation, driven without a thread: the job's streams wake Pump (posted to the front's
// worker pool; never two at once), which formats what arrived and queues it on the exchange —
// SSE chunks, or the whole answer when the job finishes. A closed connection aborts the job.
// Owned by the wakeup closure its streams hold, until it ends.
class GenerationPump : public std::enable_shared_from_this<GenerationPump> {
 public:
  static constexpr size_t kMaxStreamBacklog = size_t{8} << 20;  // 8 MiB unread by the client

  GenerationPump(HttpFront& front, Exchange ex, HttpMetrics& metrics)
      : front_(front), ex_(std::move(ex)), metrics_(metrics) {}

  GenerateSpec spec;
  std::unique_ptr<GenerationJob> job;
  std::unique_ptr<ResponseBuilder> builder;
  std::vector<std::string> echo;  // per choice
  std::vector<char> echo_sent;

  // Starts the response (a stream's head and role chunks) and pumps once, here; wakeups
  // meanwhile only mark the pump to run again.
  void Begin() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = true;
    }
    if (spec.stream) {
      ex_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (spec.endpoint == Endpoint::kChatCompletions) {
        for (const ChoiceState& c : job->choices())
          Write(WithUsage(builder->RoleChunk(c.index), c));
      }
    }
    std::weak_ptr<GenerationPump> weak = weak_from_this();
    ex_->OnClose([weak] {
      if (auto self = weak.lock()) {
        self->client_gone_ = true;
        self->Wake();
      }
    });
    // The streams hold the pump (a cycle, broken when it ends).
    job->SetWakeup([self = shared_from_this()] { self->Wake(); });
    Pump();
  }

 private:
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_) {
        again_ = true;
        return;
      }
      running_ = true;
    }
    front_.Post([self = shared_from_this()] { self->Pump(); });
  }
  void Pump() {
    for (;;) {
      Drain();
      std::lock_guard<std::mutex> lock(mu_);
      if (!again_) {
        running_ = false;
        return;
      }
      again_ = false;
    }
  }
  void Write(const OrderedJson& j) { ex_->Write("data: " + DumpJson(j) + "\n\n"); }
  // stream_options.continuous_usage_stats: every chunk carries its choice's usage so far — its
  // prompt and its completion tokens (vLLM's, also for n > 1 and lists of prompts).
  OrderedJson WithUsage(OrderedJson chunk, const ChoiceState& state) const {
    if (spec.continuous_usage) {
      Usage u;
      u.prompt_tokens = state.prompt_tokens;
      u.completion_tokens = state.completion_tokens;
      u.cached_tokens = state.cached_tokens;
      chunk["usage"] = u.ToJson();
    }
    return chunk;
  }
  void Drain() {
    if (ended_) return;
    if (client_gone_ || ex_->closed()) {
      metrics_.CountClientDisconnect();
      return End();  // destroying the job aborts its engine requests
    }
    // A stream whose client has stopped reading: more than kMaxStreamBacklog bytes it has not
    // taken. The generation would otherwise run on and pile its events up in memory until the
    // write timeout: the request is aborted and the connection cut (as a disconnect).
    if (spec.stream && ex_->pending_bytes() > kMaxStreamBacklog) {
      metrics_.CountClientDisconnect();
      ex_->Abort();
      return End();
    }
    while (std::optional<JobEvent> ev = job->Poll()) {
      if (!spec.stream) continue;
      ChoiceState& state = job->choices()[ev->choice];
      if (ev->out.finished && ev->out.finish_reason == FinishReasonKind::kError) {
        const Status& st = ev->out.error;
        Write(ResponseBuilder::ErrorChunk(
            FromStatus(st.ok() ? Internal("the engine failed the request") : st)));
      }
      std::string prefix;
      if (!echo.empty() && !echo_sent[ev->choice]) {
        prefix = echo[ev->choice];
        echo_sent[ev->choice] = 1;
      }
      OrderedJson chunk = builder->Chunk(state, ev->out, prefix);
      if (!chunk.is_null()) Write(WithUsage(std::move(chunk), state));
    }
    if (!job->finished()) return;
    if (spec.stream) {
      if (spec.include_usage) Write(builder->UsageChunk(job->usage()));
      ex_->Write("data: [DONE]\n\n");
      ex_->End();
    } else {
      AnswerWhole();
    }
    End();
  }
  // A non-streamed generation's answer (or the handoff ticket on a prefill instance).
  void AnswerWhole() {
    for (const ChoiceState& c : job->choices()) {
      if (c.finish_reason == FinishReasonKind::kError) {
        return SendError(
            *ex_, FromStatus(c.error.ok() ? Internal("the engine failed the request") : c.error));
      }
      // A prefill instance: the request goes on at a decode instance (oasis-router sends it).
      if (c.finish_reason == FinishReasonKind::kHandoff) {
        return SendJson(*ex_, {{"oasis_handoff", Base64Encode(c.handoff_ticket)}});
      }
    }
    SendJson(*ex_, builder->Final(job->choices(), job->usage(), echo));
  }
  // Breaks the cycle: the streams drop their wakeup; the job (aborting what is unfinished) goes.
  void End() {
    ended_ = true;
    job->SetWakeup(nullptr);
    job.reset();
  }

  HttpFront& front_;
  Exchange ex_;
  HttpMetrics& metrics_;
  std::mutex mu_;
  bool running_ = false, again_ = false;
  bool ended_ = false;  // touched by Pump only (never two at once)
  std::atomic<bool> client_gone_{false};
};

// API keys, the front's own errors as OpenAI error JSON, the request counters.
HttpFrontHooks ErrorHandling(Service& svc) {
  HttpFrontHooks hooks;
  hooks.before = [&svc](const HttpRequest& req, HttpExchange& ex) {
    const std::string& key = svc.config().api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics" || req.path == "/version") {
      return false;
    }
    if (HasBearerKey(req, key)) return false;
    SendError(ex, Unauthorized());
    return true;
  };
  hooks.error_body = [](int status, const std::string& code, const std::string& message) {
    ApiError e;
    e.http_status = status;
    e.type = status == 404   ? "not_found_error"
             : status >= 500 ? "server_error"
                             : "invalid_request_error";
    e.code = code;
    e.message = message;
    return std::pair<std::string, std::string>{"application/json", DumpJson(e.ToJson())};
  };
  hooks.log = [&svc](const std::string& method, const std::string& path, int status) {
    const std::string route = KnownRoutes().count(path) ? path : "other";
    svc.http_metrics().Count(method.empty() ? "other" : method, route, status);
    spdlog::debug("{} {} {}", method, path, status);
  };
  return hooks;
}

void HandleHealth(Service& svc, HttpExchange& res) {
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

void HandleMetrics(Service& svc, const HttpFront& front, HttpExchange& res) {
  std::string text;
  if (const ModelHost* h = svc.host()) {
    text = RenderEngineMetrics(h->engine->Stats(), svc.model_name());
    if (h->staging_pool) text += RenderStagingMetrics(StagingMetricsOf(*h), svc.model_name());
  }
  text += svc.http_metrics().Render(svc.model_name());
  text += RenderFrontMetrics(front.Stats(), svc.model_name());
  res.Reply(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
}

void HandleModels(Service& svc, HttpExchange& res) {
  const ModelHost* h = svc.host();
  if (h == nullptr) return SendError(res, Loading());
  OrderedJson model = {{"id", svc.model_name()},
                       {"object", "model"},
                       {"created", std::time(nullptr)},
                       {"owned_by", "oasiskv"},
                       {"root", h->model_dir},
                       {"parent", nullptr},
                       {"max_model_len", h->max_model_len()},
                       {"vocab_size", h->config.vocab_size}};
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

// A 400 naming the first field of `body` that is not in `known` (the tokenizer routes, like the
// generation routes, honour every field they accept; null counts as absent); true when all are
// known.
bool OnlyKnownFields(const Json& body, std::initializer_list<std::string_view> known,
                     ApiError* err) {
  for (const auto& [key, value] : body.items()) {
    if (!value.is_null() && std::find(known.begin(), known.end(), key) == known.end()) {
      *err = BadRequest("unknown parameter '" + key + "' for this endpoint", key);
      return false;
    }
  }
  return true;
}

// The text /tokenize encodes (a prompt, or chat messages rendered as the chat route renders
// them) and whether special tokens are added; nullopt with `*err` on a bad request. A null
// field counts as absent.
std::optional<std::pair<std::string, bool>> TokenizeInput(Service& svc, const Json& body,
                                                          ApiError* err) {
  auto messages = body.find("messages");
  if (messages != body.end() && !messages->is_null()) {
    // A chat request's fields (add_special_tokens included: default false, the template writes
    // the special tokens); /tokenize's own return_token_strs is read by the caller.
    Json chat = body;
    chat.erase("return_token_strs");
    std::optional<GenerateSpec> spec = ParseChatRequest(chat, svc.limits(), err);
    if (!spec) return std::nullopt;
    std::string text;
    if (std::optional<ApiError> e = svc.RenderChatPrompt(*spec, &text)) {
      *err = std::move(*e);
      return std::nullopt;
    }
    return std::pair{std::move(text), spec->add_special_tokens.value_or(false)};
  }
  if (!OnlyKnownFields(body, {"model", "prompt", "add_special_tokens", "return_token_strs"}, err))
    return std::nullopt;
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) {
    *err = BadRequest("'prompt' or 'messages' is required", "prompt");
    return std::nullopt;
  }
  if (!p->is_string()) {
    *err = BadRequest("'prompt' must be a string", "prompt");
    return std::nullopt;
  }
  std::optional<bool> add_special = OptionalField(body, "add_special_tokens", true, err);
  if (!add_special) return std::nullopt;
  return std::pair{p->get<std::string>(), *add_special};
}

// The tokenizer routes' common start: a loaded model with a tokenizer, and a JSON body. Sends
// the error and returns nullopt otherwise.
std::optional<Json> TokenizerRouteBody(Service& svc, const HttpRequest& req, HttpExchange& res) {
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

void HandleTokenize(Service& svc, const HttpRequest& req, HttpExchange& res) {
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

void HandleDetokenize(Service& svc, const HttpRequest& req, HttpExchange& res) {
  std::optional<Json> body = TokenizerRouteBody(svc, req, res);
  if (!body) return;
  const ModelHost* h = svc.host();
  ApiError err;
  if (!OnlyKnownFields(*body, {"model", "tokens"}, &err)) return SendError(res, err);
  const std::optional<std::string> model = OptionalField(*body, "model", std::string(), &err);
  if (!model) return SendError(res, err);
  if (auto e = svc.CheckModel(*model)) return SendError(res, *e);
  auto t = body->find("tokens");
  if (t == body->end() || !t->is_array())
    return SendError(res, BadRequest("'tokens' must be a list of token ids", "tokens"));
  std::vector<int32_t> ids;
  for (const Json& id : *t) {
    // As every token id of the API (JsonTokenId): an exact integer (5 or 5.0) in range, so
    // that 2^32 + 5 does not wrap onto token 5 nor 1.5 round to 1.
    const std::optional<int32_t> v = JsonTokenId(id);
    if (!v || !h->tokenizer->IsKnown(*v)) {
      return SendError(res, BadRequest("'tokens' holds " + Clip(id.dump(), 40) +
                                           ", not a token id of this tokenizer",
                                       "tokens"));
    }
    ids.push_back(*v);
  }
  SendJson(res, {{"prompt", h->tokenizer->Decode(ids, tokenizer::SkipSpecialTokens::kNo)}});
}

void HandleGenerate(Service& svc, HttpFront& front, Endpoint endpoint, const HttpRequest& req,
                    Exchange ex) {
  HttpExchange& res = *ex;
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
  std::string chat_text;
  if (auto e = svc.BuildPrompts(*parsed, &prompts, &echo_per_prompt, &chat_text))
    return SendError(res, *e);
  // A template that opens <think> in the generation prompt: the answer starts inside it.
  parsed->output.reasoning_open_at_start = PromptOpensThinking(chat_text);
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
  auto pump = std::make_shared<GenerationPump>(front, ex, svc.http_metrics());
  pump->spec = std::move(*parsed);
  pump->job = std::move(job);
  pump->builder =
      std::make_unique<ResponseBuilder>(pump->spec, id, svc.model_name(), std::time(nullptr), tok);
  pump->echo = std::move(echo);
  pump->echo_sent.assign(pump->echo.size(), 0);
  pump->Begin();
}

}  // namespace

HttpFrontend::HttpFrontend(Service& service) : service_(service) {
  const ServerConfig& c = service_.config();
  HttpFrontOptions o;
  o.io_threads = 2;
  o.worker_threads = c.http_threads > 0 ? static_cast<size_t>(c.http_threads) : 4;
  o.max_body_bytes = static_cast<size_t>(c.max_body_bytes);
  c.ApplyTo(&o);
  front_ = std::make_unique<HttpFront>(o);
  Routes();
}

HttpFrontend::~HttpFrontend() = default;

StatusOr<int> HttpFrontend::Bind(const std::string& host, int port) {
  return front_->Bind(host, port);
}

void HttpFrontend::Start() { front_->Start(); }

void HttpFrontend::Stop(std::chrono::milliseconds deadline) { front_->Stop(deadline); }

HttpFrontStats HttpFrontend::Stats() const { return front_->Stats(); }

void HttpFrontend::Routes() {
  HttpFront& f = *front_;
  Service& svc = service_;
  f.SetHooks(ErrorHandling(svc));
  using D = HttpDispatch;
  // Quick ones on the I/O threads (answered even when every worker is busy).
  f.Route("GET", "/health", D::kInline,
          [&svc](HttpRequest&, Exchange ex) { HandleHealth(svc, *ex); });
  f.Route("GET", "/version", D::kInline, [](HttpRequest&, Exchange ex) {
    SendJson(*ex, {{"version", "0.1.0"}});
  });
  f.Route("GET", "/metrics", D::kInline,
          [&svc, &f](HttpRequest&, Exchange ex) { HandleMetrics(svc, f, *ex); });
  f.Route("GET", "/v1/models", D::kInline,
          [&svc](HttpRequest&, Exchange ex) { HandleModels(svc, *ex); });
  f.Route("POST", "/tokenize", D::kWorker,
          [&svc](HttpRequest& req, Exchange ex) { HandleTokenize(svc, req, *ex); });
  f.Route("POST", "/detokenize", D::kWorker,
          [&svc](HttpRequest& req, Exchange ex) { HandleDetokenize(svc, req, *ex); });
  f.Route("POST", "/v1/completions", D::kWorker, [&svc, &f](HttpRequest& req, Exchange ex) {
    HandleGenerate(svc, f, Endpoint::kCompletions, req, std::move(ex));
  });
  f.Route("POST", "/v1/chat/completions", D::kWorker, [&svc, &f](HttpRequest& req, Exchange ex) {
    HandleGenerate(svc, f, Endpoint::kChatCompletions, req, std::move(ex));
  });
}

}  // namespace oasis::server

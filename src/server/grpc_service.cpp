#include "server/grpc_service.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>

#include "common/http_util.h"
#include "oasis.grpc.pb.h"

namespace oasis::server {
namespace {

grpc::StatusCode GrpcCode(int http_status) {
  switch (http_status) {
    case 400:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case 401:
      return grpc::StatusCode::UNAUTHENTICATED;
    case 404:
      return grpc::StatusCode::NOT_FOUND;
    case 413:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;  // KV beyond the host store (bodies: HTTP only)
    case 429:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 499:
      return grpc::StatusCode::CANCELLED;
    case 501:
      return grpc::StatusCode::UNIMPLEMENTED;
    case 503:
      return grpc::StatusCode::UNAVAILABLE;
    default:
      return grpc::StatusCode::INTERNAL;
  }
}

// Every error status carries a message: an empty one gets the code's plain description.
grpc::Status Error(grpc::StatusCode code, std::string message) {
  if (message.empty()) {
    switch (code) {
      case grpc::StatusCode::CANCELLED:
        message = "the call was cancelled";
        break;
      case grpc::StatusCode::INVALID_ARGUMENT:
        message = "invalid request";
        break;
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        message = "the server is out of capacity; retry later";
        break;
      case grpc::StatusCode::UNAVAILABLE:
        message = "the server is unavailable; retry later";
        break;
      default:
        message = "internal error (no detail was given)";
        break;
    }
  }
  // Bounded: a status message travels in a header (grpc-message), and one of 100 KB never
  // reached the client and stalled its connection.
  return grpc::Status(code, Clip(message, 2048));
}

grpc::Status ToGrpc(const ApiError& e) {
  std::string message = e.message;
  if (!e.param.empty()) message += " (param: " + e.param + ")";
  return Error(GrpcCode(e.http_status), message);
}

// The proto request as the JSON body of /v1/completions (a text or token prompt) or of
// /v1/chat/completions (a ChatPrompt), so both APIs share one validator. nullopt with `*err`
// when chat_template_kwargs_json is not a JSON object.
std::optional<Json> ToRequestJson(const v1::GenerateRequest& r, ApiError* err) {
  Json body = Json::object();
  if (!r.model().empty()) body["model"] = r.model();
  const bool chat = r.has_chat();
  if (r.has_token_ids()) {
    Json ids = Json::array();
    for (int32_t id : r.token_ids().ids()) ids.push_back(id);
    body["prompt"] = ids;
  } else if (r.has_text()) {
    body["prompt"] = r.text();
  } else if (chat) {
    const v1::ChatPrompt& c = r.chat();
    Json messages = Json::array();
    for (const v1::ChatMessage& m : c.messages())
      messages.push_back({{"role", m.role()}, {"content", m.content()}});
    body["messages"] = std::move(messages);
    if (c.has_add_generation_prompt()) body["add_generation_prompt"] = c.add_generation_prompt();
    if (c.continue_final_message()) body["continue_final_message"] = true;
    if (!c.chat_template().empty()) body["chat_template"] = c.chat_template();
    if (!c.chat_template_kwargs_json().empty()) {
      // The HTTP body's parser: its depth limit and errors.
      std::optional<Json> kwargs = ParseJsonBody(c.chat_template_kwargs_json(), err);
      if (!kwargs) {
        err->message = "chat_template_kwargs_json: " + err->message;
        err->param = "chat_template_kwargs_json";
        return std::nullopt;
      }
      body["chat_template_kwargs"] = std::move(*kwargs);  // (not an object: a 400 naming it)
    }
  }
  if (r.has_n()) body["n"] = r.n();
  if (r.has_sampling()) {
    const v1::SamplingParams& s = r.sampling();
    if (s.has_temperature()) body["temperature"] = s.temperature();
    if (s.has_top_p()) body["top_p"] = s.top_p();
    if (s.has_top_k()) body["top_k"] = s.top_k();
    if (s.has_min_p()) body["min_p"] = s.min_p();
    if (s.has_seed()) body["seed"] = s.seed();
    if (s.has_presence_penalty()) body["presence_penalty"] = s.presence_penalty();
    if (s.has_frequency_penalty()) body["frequency_penalty"] = s.frequency_penalty();
    if (s.has_repetition_penalty()) body["repetition_penalty"] = s.repetition_penalty();
    if (s.logit_bias_size() > 0) {
      Json bias = Json::object();
      for (const auto& [id, value] : s.logit_bias()) bias[std::to_string(id)] = value;
      body["logit_bias"] = bias;
    }
    if (s.allowed_token_ids_size() > 0) {
      Json ids = Json::array();
      for (int32_t id : s.allowed_token_ids()) ids.push_back(id);
      body["allowed_token_ids"] = ids;
    }
    if (s.bad_words_size() > 0) {
      Json words = Json::array();
      for (const std::string& w : s.bad_words()) words.push_back(w);
      body["bad_words"] = words;
    }
  }
  if (r.has_max_tokens()) body["max_tokens"] = r.max_tokens();
  if (r.min_tokens() != 0) body["min_tokens"] = r.min_tokens();
  if (r.stop_size() > 0) {
    Json stop = Json::array();
    for (const std::string& s : r.stop()) stop.push_back(s);
    body["stop"] = stop;
  }
  if (r.stop_token_ids_size() > 0) {
    Json ids = Json::array();
    for (int32_t id : r.stop_token_ids()) ids.push_back(id);
    body["stop_token_ids"] = ids;
  }
  body["ignore_eos"] = r.ignore_eos();
  if (!r.cache_salt().empty()) body["cache_salt"] = r.cache_salt();
  body["include_stop_str_in_output"] = r.include_stop_str_in_output();
  if (chat) {  // chat's logprobs are a boolean and top_logprobs a count
    if (r.logprobs() || r.top_logprobs() != 0) body["logprobs"] = true;
    if (r.top_logprobs() != 0) body["top_logprobs"] = r.top_logprobs();
  } else if (r.logprobs() || r.top_logprobs() != 0) {
    body["logprobs"] = r.top_logprobs();
  }
  return body;
}

// The proto response of one engine event.
void FillResponse(const RequestOutput& out, size_t choice, const std::string& id, bool logprobs,
                  v1::GenerateResponse* response) {
  response->Clear();
  response->set_request_id(id);
  response->set_index(static_cast<int32_t>(choice));
  for (const GeneratedToken& t : out.tokens) {
    response->add_token_ids(t.token);
    if (logprobs) {
      v1::GeneratedToken* g = response->add_tokens();
      g->set_token_id(t.token);
      g->set_logprob(t.logprob);
      for (const TokenLogprob& alt : t.top_logprobs) {
        v1::TokenLogprob* a = g->add_top_logprobs();
        a->set_token_id(alt.token);
        a->set_logprob(alt.logprob);
      }
    }
  }
  response->set_text(out.text);
  response->set_finished(out.finished);
  if (out.finished) {
    response->set_finish_reason(FinishReasonName(out.finish_reason));
    response->set_stop_reason(out.stop_reason);
  }
  v1::Usage* usage = response->mutable_usage();
  usage->set_prompt_tokens(out.prompt_tokens);
  usage->set_completion_tokens(out.completion_tokens);
  usage->set_total_tokens(out.prompt_tokens + out.completion_tokens);
  usage->set_cached_tokens(out.cached_tokens);
}

// A Generate call that ends before it starts (refused, invalid): its status is sent as soon
// as grpc binds the reactor.
class FinishedCall final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit FinishedCall(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

template <typename F>
grpc::Status Guard(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    spdlog::error("gRPC handler: {}", e.what());
    return Error(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return Error(grpc::StatusCode::INTERNAL, "internal error (unknown exception)");
  }
}

}  // namespace

class GenerateCall;

// One pump thread: drives the Generate streams handed to it (see grpc_service.h). Only the
// pump thread touches its calls' jobs; grpc's threads only set flags and wake it.
class GrpcPump {
 public:
  // What engine wakeups hold: the pump while it exists (a wakeup can run after a stream's
  // call is gone, on the engine's thread).
  struct Waker {
    std::mutex mu;
    GrpcPump* pump = nullptr;  // guarded by mu
    void Wake() {
      std::lock_guard<std::mutex> lock(mu);
      if (pump != nullptr) pump->Wake();
    }
  };

  explicit GrpcPump(std::function<void()> each_pass)
      : each_pass_(std::move(each_pass)), thread_([this] { Run(); }) {
    waker_->pump = this;
  }
  ~GrpcPump() {
    {
      std::lock_guard<std::mutex> lock(waker_->mu);
      waker_->pump = nullptr;
    }
    Stop();
  }
  const std::shared_ptr<Waker>& waker() const { return waker_; }

  void Add(GenerateCall* call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.push_back(call);
      wake_ = true;
    }
    cv_.notify_one();
  }
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake_ = true;
    }
    cv_.notify_one();
  }
  // Returns once every call it was given has finished (grpc's Shutdown ends them all).
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      wake_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  void set_draining() { draining_.store(true, std::memory_order_release); }

 private:
  void Run();

  std::function<void()> each_pass_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GenerateCall*> incoming_;  // guarded by mu_
  bool wake_ = false;                    // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  std::atomic<bool> draining_{false};
  std::vector<GenerateCall*> calls_;  // the pump thread's own
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
  std::thread thread_;  // last: starts after the members above exist
};

class OasisGrpcService final : public v1::Oasis::CallbackService {
 public:
  explicit OasisGrpcService(server::Service& service)
      : service_(service), max_calls_(service.config().grpc_max_concurrent_calls) {}

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* ctx, const v1::HealthRequest*,
                                   v1::HealthResponse* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(Guard([&] {
      switch (State()) {
        case HealthState::kLoading:
          out->set_status(v1::HealthResponse::LOADING);
          break;
        case HealthState::kServing:
          out->set_status(v1::HealthResponse::SERVING);
          break;
        case HealthState::kStopping:
          out->set_status(v1::HealthResponse::NOT_SERVING);
          break;
      }
      return grpc::Status::OK;
    }));
    return reactor;
  }

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const v1::ListModelsRequest*,
                                       v1::ListModelsResponse* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(Guard([&] {
      if (grpc::Status st = Authorize(*ctx); !st.ok()) return st;
      const ModelHost* h = service_.host();
      if (h == nullptr) return Error(grpc::StatusCode::UNAVAILABLE, NotReadyMessage());
      v1::ModelInfo* m = out->add_models();
      m->set_id(service_.model_name());
      m->set_max_model_len(h->max_model_len());
      m->set_owned_by("oasiskv");
      return grpc::Status::OK;
    }));
    return reactor;
  }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;

  // Start(): the pumps (after the server exists, for the health service).
  void StartPumps(grpc::HealthCheckServiceInterface* health) {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_ = health;
    }
    UpdateHealth();
    for (int i = 0; i < GrpcFrontend::kPumpThreads; ++i) {
      std::function<void()> each_pass;
      if (i == 0) each_pass = [this] { UpdateHealth(); };
      pumps_.push_back(std::make_unique<GrpcPump>(std::move(each_pass)));
    }
  }
  // Shutdown(), before grpc's: new calls refused, live streams ended, health NOT_SERVING.
  void BeginDrain() {
    draining_.store(true, std::memory_order_release);
    UpdateHealth();
    for (auto& p : pumps_) {
      p->set_draining();
      p->Wake();
    }
  }
  // Shutdown(), after grpc's (every call has finished by then).
  void StopPumps() {
    for (auto& p : pumps_) p->Stop();
    pumps_.clear();
    std::lock_guard<std::mutex> lock(health_mu_);
    health_ = nullptr;
  }

  bool stopping() { return State() == HealthState::kStopping; }
  void CallDone() { live_.fetch_sub(1, std::memory_order_acq_rel); }
  int64_t live_calls() const { return live_.load(std::memory_order_acquire); }

 private:
  enum class HealthState { kLoading, kServing, kStopping };

  HealthState State() {
    if (draining_.load(std::memory_order_acquire)) return HealthState::kStopping;
    if (service_.host() != nullptr) {
      was_serving_.store(true, std::memory_order_release);
      return HealthState::kServing;
    }
    // Service::BeginShutdown() takes the model away: after serving, that is the shutdown.
    return was_serving_.load(std::memory_order_acquire) ? HealthState::kStopping
                                                        : HealthState::kLoading;
  }

  std::string NotReadyMessage() {
    return State() == HealthState::kStopping ? "the server is shutting down"
                                             : "the model is still loading";
  }

  // Mirrors State() into grpc.health.v1 (service "" and "oasis.v1.Oasis") on changes.
  void UpdateHealth() {
    std::lock_guard<std::mutex> lock(health_mu_);
    const HealthState state = State();
    if (health_ == nullptr || state == health_state_) return;
    health_state_ = state;
    const bool serving = state == HealthState::kServing;
    health_->SetServingStatus(serving);
    health_->SetServingStatus(v1::Oasis::service_full_name(), serving);
    spdlog::debug("gRPC health: {}", serving ? "SERVING" : "NOT_SERVING");
  }

  grpc::Status Authorize(const grpc::ServerContextBase& ctx) const {
    const std::string& key = service_.config().api_key;
    if (key.empty()) return grpc::Status::OK;
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    const std::string presented =
        it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    if (presented.rfind("Bearer ", 0) == 0 && KeyMatches(presented.substr(7), key))
      return grpc::Status::OK;
    return Error(grpc::StatusCode::UNAUTHENTICATED,
                 "missing or invalid 'authorization: Bearer <api key>' metadata");
  }

  // Validates the request and starts its engine job.
  grpc::Status Prepare(const grpc::CallbackServerContext& ctx, const v1::GenerateRequest& request,
                       std::unique_ptr<GenerationJob>* job, std::string* id, bool* logprobs) {
    if (grpc::Status st = Authorize(ctx); !st.ok()) return st;
    if (service_.host() == nullptr) return Error(grpc::StatusCode::UNAVAILABLE, NotReadyMessage());
    // The label is echoed in every response: bounded, so that it cannot multiply a request's
    // size into its answer's.
    if (request.request_id().size() > GrpcFrontend::kMaxRequestIdBytes) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   "'request_id' is at most " + std::to_string(GrpcFrontend::kMaxRequestIdBytes) +
                       " bytes, got " + std::to_string(request.request_id().size()));
    }
    if (service_.host()->role != "both") {
      return Error(
          grpc::StatusCode::FAILED_PRECONDITION,
          "a " + service_.host()->role + " instance serves oasis-router over HTTP, not gRPC");
    }
    if (request.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
      return Error(grpc::StatusCode::INVALID_ARGUMENT,
                   "a prompt (text, token_ids or chat) is required");
    }
    ApiError err;
    std::optional<Json> body = ToRequestJson(request, &err);
    if (!body) return ToGrpc(err);
    std::optional<GenerateSpec> spec = request.has_chat()
                                           ? ParseChatRequest(*body, service_.limits(), &err)
                                           : ParseCompletionRequest(*body, service_.limits(), &err);
    if (!spec) return ToGrpc(err);
    if (auto e = service_.CheckModel(spec->model)) return ToGrpc(*e);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> echo;
    if (auto e = service_.BuildPrompts(*spec, &prompts, &echo)) return ToGrpc(*e);
    // The engine gets a fresh id (a client's label may repeat); the label is echoed back.
    *id = request.request_id().empty() ? service_.NewRequestId("grpc") : request.request_id();
    *job = service_.Start(*spec, prompts, service_.NewRequestId("grpc"), &err);
    if (!*job) return ToGrpc(err);
    *logprobs = spec->logprobs;
    return grpc::Status::OK;
  }

  GrpcPump& NextPump() {
    const uint64_t n = next_pump_.fetch_add(1, std::memory_order_relaxed);
    return *pumps_[n % pumps_.size()];
  }

  server::Service& service_;  // (plain `Service` names the generated base class here)
  const int64_t max_calls_;
  std::atomic<int64_t> live_{0};
  std::atomic<bool> draining_{false};
  std::atomic<bool> was_serving_{false};
  std::atomic<uint64_t> next_pump_{0};
  std::mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ = nullptr;  // guarded by health_mu_ once pumping
  std::optional<HealthState> health_state_;              // guarded by health_mu_
  std::vector<std::unique_ptr<GrpcPump>> pumps_;         // fixed between Start and Shutdown
};

// A live Generate stream. grpc's threads only set flags (OnWriteDone, OnCancel) and wake the
// pump; the pump thread owns the job, writes, and calls Finish exactly once, after which it
// drops the call (OnDone deletes it).
class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  enum class Step { kIdle, kProgress, kDone };

  GenerateCall(OasisGrpcService& owner, GrpcPump& pump, std::unique_ptr<GenerationJob> job,
               std::string id, bool logprobs)
      : owner_(owner), pump_(pump), job_(std::move(job)), id_(std::move(id)), logprobs_(logprobs) {
    // The engine wakes the pump when an event arrives (RequestStream::SetWakeup). The closure
    // may run after the call (or the pump) is gone, as the engine holds the streams: it shares
    // only the flag and the pump's Waker.
    job_->SetWakeup([ready = ready_, waker = pump.waker()] {
      ready->store(true, std::memory_order_release);
      waker->Wake();
    });
  }
  ~GenerateCall() override {
    if (job_) job_->SetWakeup(nullptr);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) write_failed_.store(true, std::memory_order_release);
    write_in_flight_.store(false, std::memory_order_release);
    ready_->store(true, std::memory_order_release);  // events may have queued meanwhile
    pump_.Wake();
  }
  void OnCancel() override {
    cancelled_.store(true, std::memory_order_release);
    pump_.Wake();
  }
  void OnDone() override {
    owner_.CallDone();
    delete this;
  }

  // Pump thread. kDone: Finish was called; the pump must not touch the call again.
  Step Pump(bool draining, std::chrono::steady_clock::time_point now) {
    if (!finish_) {
      if (cancelled_.load(std::memory_order_acquire)) {
        finish_ = Error(grpc::StatusCode::CANCELLED,
                        "the call was cancelled (by the client, or its deadline passed)");
      } else if (write_failed_.load(std::memory_order_acquire)) {
        finish_ = Error(grpc::StatusCode::CANCELLED, "the client went away");
      } else if (draining) {
        finish_ = Error(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down; the request was aborted");
      }
    }
    if (finish_) {
      if (job_) job_->SetWakeup(nullptr);
      job_.reset();  // aborts the engine request now: its KV is freed without waiting for grpc
      if (write_in_flight_.load(std::memory_order_acquire)) return Step::kIdle;
      Finish(*finish_);
      return Step::kDone;
    }
    if (write_in_flight_.load(std::memory_order_acquire)) return Step::kIdle;
    // Polled when the engine woke it (or a write completed), and every kSafetyPoll anyway.
    if (!ready_->exchange(false, std::memory_order_acq_rel) && now < next_poll_) {
      return Step::kIdle;
    }
    next_poll_ = now + kSafetyPoll;
    try {
      std::optional<JobEvent> ev = job_->Poll();
      if (!ev) {
        if (!job_->finished()) return Step::kIdle;
        finish_ =
            Error(grpc::StatusCode::INTERNAL, "the engine ended the request without a result");
        return Step::kProgress;
      }
      ready_->store(true, std::memory_order_release);  // more may be queued: look again
      const RequestOutput& out = ev->out;
      if (out.finished && out.finish_reason == FinishReasonKind::kError) {
        std::string message = out.error.ok() ? std::string() : out.error.message();
        if (message.empty()) message = "the engine failed the request";
        finish_ = Error(grpc::StatusCode::INTERNAL, std::move(message));
        return Step::kProgress;
      }
      if (out.finished && out.finish_reason == FinishReasonKind::kAbort && owner_.stopping()) {
        // Service::StopEngine() aborted it: the same status as a stream the drain ends.
        finish_ = Error(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down; the request was aborted");
        return Step::kProgress;
      }
      FillResponse(out, ev->choice, id_, logprobs_, &response_);
      if (job_->finished()) {  // the last choice's last event
        job_->SetWakeup(nullptr);
        job_.reset();
        StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
        return Step::kDone;
      }
      write_in_flight_.store(true, std::memory_order_release);
      StartWrite(&response_);
      return Step::kProgress;
    } catch (const std::exception& e) {
      spdlog::error("gRPC Generate: {}", e.what());
      finish_ = Error(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
      return Step::kProgress;
    }
  }

 private:
  OasisGrpcService& owner_;
  GrpcPump& pump_;
  std::unique_ptr<GenerationJob> job_;  // pump thread only
  const std::string id_;
  const bool logprobs_;
  v1::GenerateResponse response_;       // the write in flight
  std::optional<grpc::Status> finish_;  // pump thread only: the status to end with
  static constexpr std::chrono::milliseconds kSafetyPoll{50};
  std::shared_ptr<std::atomic<bool>> ready_ = std::make_shared<std::atomic<bool>>(true);
  std::chrono::steady_clock::time_point next_poll_;  // pump thread only
  std::atomic<bool> write_in_flight_{false};
  std::atomic<bool> write_failed_{false};
  std::atomic<bool> cancelled_{false};
};

grpc::ServerWriteReactor<v1::GenerateResponse>* OasisGrpcService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  // A server going away (or not there yet) says so before anything else: UNAVAILABLE, which
  // clients retry elsewhere, never RESOURCE_EXHAUSTED from the slots of streams that are
  // ending. State() covers the whole shutdown: Service::BeginShutdown (the HTTP side's 503)
  // comes before BeginDrain here.
  if (State() != HealthState::kServing)
    return new FinishedCall(Error(grpc::StatusCode::UNAVAILABLE, NotReadyMessage()));
  // Reserve a slot first, so that a flood is refused before any parsing or tokenizing.
  const int64_t before = live_.fetch_add(1, std::memory_order_acq_rel);
  if (before >= max_calls_) {
    live_.fetch_sub(1, std::memory_order_acq_rel);
    return new FinishedCall(
        Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
              "too many concurrent gRPC calls: " + std::to_string(max_calls_) +
                  " Generate streams are live (--grpc-max-concurrent-calls); retry later"));
  }
  std::unique_ptr<GenerationJob> job;
  std::string id;
  bool logprobs = false;
  grpc::Status st = Guard([&] { return Prepare(*ctx, *request, &job, &id, &logprobs); });
  if (!st.ok()) {
    live_.fetch_sub(1, std::memory_order_acq_rel);
    return new FinishedCall(st);
  }
  GrpcPump& pump = NextPump();
  auto* call = new GenerateCall(*this, pump, std::move(job), std::move(id), logprobs);
  pump.Add(call);  // the slot is released in the call's OnDone
  return call;
}

void GrpcPump::Run() {
  bool progressed = true;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!progressed && !wake_)
        cv_.wait_for(lock, GrpcFrontend::kPumpIdleWait, [&] { return wake_; });
      wake_ = false;
      calls_.insert(calls_.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
      if (stop_ && calls_.empty()) return;
    }
    if (each_pass_) each_pass_();
    progressed = false;
    const bool draining = draining_.load(std::memory_order_acquire);
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < calls_.size();) {
      const GenerateCall::Step step = calls_[i]->Pump(draining, now);
      if (step != GenerateCall::Step::kIdle) progressed = true;
      if (step == GenerateCall::Step::kDone) {
        calls_[i] = calls_.back();  // the call may already be deleted: only its slot is touched
        calls_.pop_back();
      } else {
        ++i;
      }
    }
  }
}

GrpcFrontend::GrpcFrontend(Service& service)
    : service_(service), impl_(std::make_unique<OasisGrpcService>(service)) {}

GrpcFrontend::~GrpcFrontend() { Shutdown(); }

int64_t GrpcFrontend::live_calls() const { return impl_->live_calls(); }

namespace {
constexpr int kGrpcIdleMs = 30'000;
}  // namespace

StatusOr<int> GrpcFrontend::Start(const std::string& host, int port) {
  // grpc.health.v1.Health, served by grpc++ itself (it starts SERVING: set right below).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string bare = UnbracketHost(host);
  const std::string address =
      (bare.find(':') != std::string::npos ? "[" + bare + "]" : bare) + ":" + std::to_string(port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(impl_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(service_.config().max_body_bytes, INT32_MAX)));
  // A connection with no call for kGrpcIdle is sent GOAWAY and closed (clients reconnect when
  // they next call): idle HTTP/2 connections must not pile up and take the descriptors the
  // HTTP front needs (grpc++ 1.51 has no cap on connections).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kGrpcIdleMs);
  // A connection must finish its HTTP/2 handshake within the HTTP front's header timeout.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(std::clamp<double>(
                                 service_.config().header_timeout_s * 1000.0, 1.0, INT32_MAX)));
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) {
    server_.reset();
    return Unavailable("cannot listen for gRPC on " + address);
  }
  impl_->StartPumps(server_->GetHealthCheckService());
  return bound;
}

void GrpcFrontend::Shutdown(std::chrono::milliseconds timeout) {
  if (!server_) return;
  impl_->BeginDrain();
  const auto started = std::chrono::steady_clock::now();
  server_->Shutdown(std::chrono::system_clock::now() + timeout);
  impl_->StopPumps();
  server_.reset();
  spdlog::debug("gRPC stopped in {} ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::steady_clock::now() - started)
                                             .count());
}

}  // namespace oasis::server

#include "server/grpc_service.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>

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

grpc::Status ToGrpc(const ApiError& e) {
  std::string message = e.message;
  if (!e.param.empty()) message += " (param: " + e.param + ")";
  return grpc::Status(GrpcCode(e.http_status), message);
}

// The proto request as the JSON body of /v1/completions, so both APIs share one validator.
Json ToCompletionJson(const v1::GenerateRequest& r) {
  Json body = Json::object();
  if (!r.model().empty()) body["model"] = r.model();
  if (r.has_token_ids()) {
    Json ids = Json::array();
    for (int32_t id : r.token_ids().ids()) ids.push_back(id);
    body["prompt"] = ids;
  } else if (r.has_text()) {
    body["prompt"] = r.text();
  }
  if (r.has_sampling()) {
    const v1::SamplingParams& s = r.sampling();
    if (s.has_temperature()) body["temperature"] = s.temperature();
    if (s.has_top_p()) body["top_p"] = s.top_p();
    if (s.has_top_k()) body["top_k"] = s.top_k();
    if (s.has_min_p()) body["min_p"] = s.min_p();
    if (s.has_seed()) body["seed"] = s.seed();
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
  body["include_stop_str_in_output"] = r.include_stop_str_in_output();
  if (r.logprobs() || r.top_logprobs() != 0) body["logprobs"] = r.top_logprobs();
  return body;
}

}  // namespace

class OasisGrpcService final : public v1::Oasis::Service {
 public:
  explicit OasisGrpcService(server::Service& service) : service_(service) {}

  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*,
                      v1::HealthResponse* out) override {
    return Guard([&] {
      out->set_status(service_.host() != nullptr ? v1::HealthResponse::SERVING
                                                 : v1::HealthResponse::LOADING);
      return grpc::Status::OK;
    });
  }

  grpc::Status ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* out) override {
    return Guard([&] {
      if (grpc::Status st = Authorize(*ctx); !st.ok()) return st;
      const ModelHost* h = service_.host();
      if (h == nullptr)
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading");
      v1::ModelInfo* m = out->add_models();
      m->set_id(service_.model_name());
      m->set_max_model_len(h->max_model_len());
      m->set_owned_by("oasiskv");
      return grpc::Status::OK;
    });
  }

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    return Guard([&] { return DoGenerate(*ctx, *request, *writer); });
  }

 private:
  template <typename F>
  grpc::Status Guard(F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      spdlog::error("gRPC handler: {}", e.what());
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
    } catch (...) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "internal error");
    }
  }

  grpc::Status Authorize(const grpc::ServerContext& ctx) const {
    const std::string& key = service_.config().api_key;
    if (key.empty()) return grpc::Status::OK;
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    const std::string presented =
        it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    if (presented.rfind("Bearer ", 0) == 0 && KeyMatches(presented.substr(7), key))
      return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or invalid 'authorization: Bearer <api key>' metadata");
  }

  grpc::Status DoGenerate(grpc::ServerContext& ctx, const v1::GenerateRequest& request,
                          grpc::ServerWriter<v1::GenerateResponse>& writer) {
    if (grpc::Status st = Authorize(ctx); !st.ok()) return st;
    if (service_.host() == nullptr)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading");
    if (service_.host()->role != "both") {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          "a " + service_.host()->role + " instance serves oasis-router over HTTP, not gRPC");
    }
    if (request.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a prompt (text or token_ids) is required");
    }
    ApiError err;
    std::optional<GenerateSpec> spec =
        ParseCompletionRequest(ToCompletionJson(request), service_.limits(), &err);
    if (!spec) return ToGrpc(err);
    if (auto e = service_.CheckModel(spec->model)) return ToGrpc(*e);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> echo;
    if (auto e = service_.BuildPrompts(*spec, &prompts, &echo)) return ToGrpc(*e);
    const std::string id =
        request.request_id().empty() ? service_.NewRequestId("grpc") : request.request_id();
    std::unique_ptr<GenerationJob> job =
        service_.Start(*spec, prompts, service_.NewRequestId("grpc"), &err);
    if (!job) return ToGrpc(err);
    while (!job->finished()) {
      std::optional<JobEvent> ev = job->Next(std::chrono::milliseconds(50));
      if (ctx.IsCancelled()) {
        job->Abort();
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      }
      if (!ev) continue;
      const RequestOutput& out = ev->out;
      v1::GenerateResponse response;
      response.set_request_id(id);
      for (const GeneratedToken& t : out.tokens) {
        response.add_token_ids(t.token);
        if (spec->logprobs) {
          v1::GeneratedToken* g = response.add_tokens();
          g->set_token_id(t.token);
          g->set_logprob(t.logprob);
          for (const TokenLogprob& alt : t.top_logprobs) {
            v1::TokenLogprob* a = g->add_top_logprobs();
            a->set_token_id(alt.token);
            a->set_logprob(alt.logprob);
          }
        }
      }
      response.set_text(out.text);
      response.set_finished(out.finished);
      if (out.finished) {
        if (out.finish_reason == FinishReasonKind::kError) {
          return grpc::Status(grpc::StatusCode::INTERNAL, out.error.ok()
                                                              ? "the engine failed the request"
                                                              : out.error.message());
        }
        response.set_finish_reason(FinishReasonName(out.finish_reason));
        response.set_stop_reason(out.stop_reason);
      }
      v1::Usage* usage = response.mutable_usage();
      usage->set_prompt_tokens(out.prompt_tokens);
      usage->set_completion_tokens(out.completion_tokens);
      usage->set_total_tokens(out.prompt_tokens + out.completion_tokens);
      if (!writer.Write(response)) {
        job->Abort();
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    return grpc::Status::OK;
  }

  server::Service& service_;  // (plain `Service` names the generated base class here)
};

GrpcFrontend::GrpcFrontend(Service& service)
    : service_(service), impl_(std::make_unique<OasisGrpcService>(service)) {}

GrpcFrontend::~GrpcFrontend() { Shutdown(); }

StatusOr<int> GrpcFrontend::Start(const std::string& host, int port) {
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string address =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(impl_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(service_.config().max_body_bytes, INT32_MAX)));
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) return Unavailable("cannot listen for gRPC on " + address);
  return bound;
}

void GrpcFrontend::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

}  // namespace oasis::server

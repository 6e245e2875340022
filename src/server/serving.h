// Service: the part of oasis-server both front ends (HTTP and gRPC) share. It knows whether
// the model is loaded, turns a validated GenerateSpec into engine requests (tokenizing text
// prompts or rendering chat messages with the model's template, n choices per prompt with
// derived seeds) and hands back a GenerationJob that multiplexes their output streams.
//
// Service is thread-safe: the ModelHost is published once (atomically) and read-only
// afterwards. A GenerationJob belongs to the one request thread that started it; destroying
// it aborts its unfinished engine requests (so an early return or a disconnected client
// frees the KV cache). A job may also be driven without a thread: SetWakeup, then Poll.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/chat_template_cache.h"
#include "server/metrics.h"
#include "server/model_host.h"
#include "server/openai_protocol.h"
#include "server/openai_response.h"
#include "server/server_config.h"

namespace oasis::server {

// vLLM's tokenization of bad_words (SamplingParams.update_from_tokenizer): each word, left-
// stripped, without and with a leading space (the latter kept only when it is a different word
// token of the same length); ids outside [0, vocab) or a missing tokenizer are a 400 naming
// bad_words.
std::optional<ApiError> TokenizeBadWords(const std::vector<std::string>& words,
                                         const tokenizer::Tokenizer* tok, int64_t vocab,
                                         std::vector<std::vector<int32_t>>* out);

// One event of one choice of a job.
struct JobEvent {
  size_t choice = 0;
  RequestOutput out;
};

class GenerationJob {
 public:
  GenerationJob(Engine& engine, std::vector<std::shared_ptr<RequestStream>> streams,
                std::vector<ChoiceState> choices, int64_t prompt_tokens);
  ~GenerationJob();
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // The next event of any unfinished choice (already added to its ChoiceState), waiting up to
  // `timeout`; nullopt on timeout or once every choice has finished.
  std::optional<JobEvent> Next(std::chrono::milliseconds timeout);
  // The next event without waiting (nullopt: none queued now, or every choice finished).
  std::optional<JobEvent> Poll();
  // Runs `wakeup` whenever one of the job's streams receives an event (RequestStream::SetWakeup:
  // on the engine's thread, so it must only post work). For readers that Poll instead of Next.
  void SetWakeup(const std::function<void()>& wakeup);
  bool finished() const { return unfinished_ == 0; }
  // Aborts every unfinished choice in the engine (they finish with "abort").
  void Abort();

  std::vector<ChoiceState>& choices() { return choices_; }
  Usage usage() const;

 private:
  // Records stream i's event (its choice, finished state, the round-robin cursor).
  JobEvent Take(size_t i, RequestOutput out);

  Engine& engine_;
  std::vector<std::shared_ptr<RequestStream>> streams_;
  std::vector<ChoiceState> choices_;
  std::vector<char> done_;
  size_t unfinished_;
  size_t cursor_ = 0;
  int64_t prompt_tokens_;
};

class Service {
 public:
  explicit Service(ServerConfig config);

  const ServerConfig& config() const { return config_; }
  const std::string& model_name() const { return model_name_; }
  HttpMetrics& http_metrics() { return http_metrics_; }

  // While loading (and after shutdown begins) host() is null and requests get 503.
  const ModelHost* host() const {
    return ready_.load(std::memory_order_acquire) ? host_.get() : nullptr;
  }
  void Publish(std::unique_ptr<ModelHost> host);
  // Starts refusing new requests (503); live ones keep running until the engine stops.
  void BeginShutdown() { ready_.store(false, std::memory_order_release); }
  // BeginShutdown() and stops the engine: live requests finish with "abort" (their handler
  // threads then return). The ModelHost itself lives until TakeHost().
  void StopEngine();
  // Hands the model over for destruction, once no front-end thread uses it any more.
  std::unique_ptr<ModelHost> TakeHost() { return std::move(host_); }

  ProtocolLimits limits() const;
  // Checks the requested model name (404 for an unknown one).
  std::optional<ApiError> CheckModel(const std::string& requested) const;

  // Prompt token ids for each prompt of `spec` (chat: the rendered conversation, also stored
  // in `*chat_text` when given) and, with echo, their text. Errors are API errors (400 for a
  // prompt longer than the context).
  std::optional<ApiError> BuildPrompts(const GenerateSpec& spec,
                                       std::vector<std::vector<int32_t>>* prompts,
                                       std::vector<std::string>* echo_texts,
                                       std::string* chat_text = nullptr) const;
  // Submits len(prompts) × n engine requests with ids "<request_id>-<choice>".
  std::unique_ptr<GenerationJob> Start(const GenerateSpec& spec,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       const std::string& request_id, ApiError* error) const;

  // A fresh id: "<prefix>-<32 hex digits>".
  std::string NewRequestId(const char* prefix);
  // Renders chat messages into the prompt text: with the request's chat_template when it has
  // one, else the model's; with continue_final_message the text ends right after the final
  // message's content (HF's apply_chat_template: a 400 naming continue_final_message when the
  // template changed that content beyond its surrounding whitespace). Template errors are 400s
  // naming ChatTemplateParam(spec).
  std::optional<ApiError> RenderChatPrompt(const GenerateSpec& spec, std::string* text) const;
  static const char* ChatTemplateParam(const GenerateSpec& spec) {
    return spec.chat_template ? "chat_template" : "messages";
  }

 private:
  // The template rendered as it is (RenderChatPrompt's first step).
  StatusOr<std::string> RenderChat(const GenerateSpec& spec) const;

  ServerConfig config_;
  std::string model_name_;
  HttpMetrics http_metrics_;
  std::unique_ptr<ModelHost> host_;
  mutable ChatTemplateCache request_templates_;  // requests' own chat_template
  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_;
};

}  // namespace oasis::server

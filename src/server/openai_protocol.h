// OpenAI protocol, request side: parses and validates the JSON bodies of /v1/completions and
// /v1/chat/completions (vLLM's extensions included: top_k, min_p, stop_token_ids, ignore_eos,
// min_tokens, include_stop_str_in_output, chat_template_kwargs, repetition_penalty,
// allowed_token_ids, bad_words) into a GenerateSpec, and
// turns errors into OpenAI error JSON with the HTTP status that fits.
//
// Pure functions over nlohmann::json; no tokenizer, no engine. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "oasis/sampling.h"
#include "oasis/status.h"
#include "server/chat_output.h"
#include "tokenizer/structured/grammar.h"

namespace oasis::server {

// Ordered, so that messages and tools reach the chat template with their keys in request order.
using Json = nlohmann::ordered_json;
using OrderedJson = nlohmann::ordered_json;

// An error as the API reports it: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null

  OrderedJson ToJson() const;
  std::string Body() const { return ToJson().dump(); }
};

ApiError BadRequest(std::string message, std::string param = "");
// A Status from a lower layer → the API error (InvalidArgument/OutOfRange 400, NotFound 404,
// ResourceExhausted 429, Unavailable 503, Cancelled 499, the rest 500).
ApiError FromStatus(const Status& status, std::string param = "");
int HttpStatusFor(StatusCode code);
// A request whose KV can never fit the sparse host KV store (Engine::CheckHostKvRoom): 413,
// code "host_kv_exhausted" (gRPC: RESOURCE_EXHAUSTED).
ApiError HostKvTooLarge(const Status& status);

enum class Endpoint { kCompletions, kChatCompletions };

// One prompt of /v1/completions: text (tokenized by the server) or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

// A validated generation request, common to both endpoints (and the gRPC API).
struct GenerateSpec {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                 // empty: the served model
  std::vector<PromptInput> prompts;  // completions: one or more
  OrderedJson messages;              // chat: content normalised to strings (null: ""), tool
                                     // calls' arguments parsed into objects (as vLLM)
  OrderedJson tools;                 // chat: passed to the template when present
  // chat: how the answer's text is parsed (tool calls for tool_choice "auto", reasoning);
  // reasoning_open_at_start is set once the prompt is rendered (PromptOpensThinking).
  OutputParsing output;
  OrderedJson chat_template_kwargs = OrderedJson::object();
  // chat: vLLM's per-request Jinja template, rendered instead of the model's (unset or empty:
  // the model's). Parsed by the Service (ChatTemplateCache); its errors are 400s naming it.
  std::optional<std::string> chat_template;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool echo = false;  // completions: prepend the prompt to the text
  // vLLM's add_special_tokens: whether the tokenizer adds its special tokens (e.g. Llama 3's
  // <|begin_of_text|>) to a text prompt or the rendered chat. Unset: the endpoint's default
  // (completions: yes; chat: no, the template writes them). Token-id prompts are left as sent.
  std::optional<bool> add_special_tokens;

  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool continuous_usage = false;      // stream_options.continuous_usage_stats (with include_usage)
  std::optional<int64_t> max_tokens;  // unset: until the context is full
  // The field max_tokens came from (chat: "max_completion_tokens" when that was sent), for the
  // errors about it.
  std::string max_tokens_param = "max_tokens";
  // vLLM's truncate_prompt_tokens: each prompt keeps its last N tokens (-1: max_model_len);
  // 0: no truncation (Service::BuildPrompts applies it after tokenization and the template).
  int64_t truncate_prompt_tokens = 0;
  int64_t min_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  // vLLM's bad_words: tokenized by the server (TokenizeBadWords) into
  // sampling.bad_words_token_ids.
  std::vector<std::string> bad_words;
  // Structured output (response_format json_object / json_schema, guided_json, guided_choice,
  // structured_outputs): the grammar the text must follow, and the parameter that asked for
  // it; null: free text. The Service turns it into each sequence's sampling.constraint.
  std::shared_ptr<const structured::Grammar> grammar;
  std::string grammar_param;
  // Teacher forcing ("forced_output_ids", an OasisKV extension for evaluation): the first
  // generated tokens are these ids; their log-probs are the model's (EngineRequest::forced_output).
  std::vector<int32_t> forced_output_ids;
  bool ignore_eos = false;
  std::string cache_salt;  // vLLM's cache_salt: prefix caching shares blocks only within one
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;  // vLLM's (EngineRequest's)
  bool logprobs = false;
  int top_logprobs = 0;
  // vLLM's prompt_logprobs (0..max_top_logprobs): every prompt token's log-probability, rank
  // and the top-k there (EngineRequest::prompt_logprobs); not with stream (as vLLM).
  std::optional<int> prompt_logprobs;
  bool return_tokens_as_token_ids = false;  // vLLM's: logprobs name tokens "token_id:<id>" //
                                            // alternatives per position (0..20)
  // Disaggregation: the base64 handoff ticket oasis-router adds for a decode instance
  // ("oasis_ticket"; docs/disaggregation.md).
  std::string oasis_ticket;
};

struct ProtocolLimits {
  int64_t max_n = 128;
  int64_t max_model_len = 0;  // > 0: max_tokens above this is rejected up front
  int64_t vocab_size = 0;     // > 0: token ids of logit_bias / allowed_token_ids checked
  int max_top_logprobs = 20;
  // The server's chat output parsing (--enable-auto-tool-choice, --tool-call-parser,
  // --reasoning-parser): what tool_choice may ask for.
  bool enable_auto_tool_choice = false;
  ToolParserKind tool_parser = ToolParserKind::kNone;
  ReasoningParserKind reasoning_parser = ReasoningParserKind::kNone;
  // The values of sampling parameters a request leaves out: the neutral ones, or the model's
  // generation_config.json (--generation-config; server/generation_defaults.h). The seed is
  // never defaulted.
  SamplingParams default_sampling;
};

// The chat-template variables the server sets itself: from the validated request (messages,
// tools, add_generation_prompt, continue_final_message) or from the model's tokenizer files
// (bos_token, eos_token). `chat_template_kwargs` may not name them (400 naming the key):
// otherwise a client could replace the validated conversation, e.g. inject a system turn.
inline constexpr std::string_view kServerChatTemplateKeys[] = {
    "messages",  "tools",    "add_generation_prompt", "continue_final_message",
    "bos_token", "eos_token"};
bool IsServerChatTemplateKey(std::string_view key);

// Parses a request body; on failure returns nullopt and sets `*error` (400, naming the
// parameter).
std::optional<GenerateSpec> ParseCompletionRequest(const Json& body, const ProtocolLimits& limits,
                                                   ApiError* error);
std::optional<GenerateSpec> ParseChatRequest(const Json& body, const ProtocolLimits& limits,
                                             ApiError* error);

// Parses a body string as a JSON object (400 "malformed JSON" otherwise).
std::optional<Json> ParseJsonBody(const std::string& body, ApiError* error);

// A number as error messages write it: the shortest text that reads back as the same double
// ("0.5", "1e+300", "inf"), never std::to_string's fixed 6 decimals or 300 digits.
std::string FormatNumber(double v);

// A token id in a request (prompt ids, stop_token_ids, allowed_token_ids, forced_output_ids,
// /detokenize's tokens): a JSON number that is an exact integer in [0, 2^31 - 1] — 5, and as
// pydantic's lax mode (vLLM) 5.0 or 5e0 too; nullopt for anything else (1.5, -1, 2^32 + 5, "5",
// true).
std::optional<int32_t> JsonTokenId(const Json& v);

}  // namespace oasis::server

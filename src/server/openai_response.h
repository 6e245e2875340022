// OpenAI protocol, response side: accumulates a choice's engine events (ChoiceState) and
// builds the JSON of completions, chat completions, their SSE chunks, usage and logprobs
// (completions: tokens / token_logprobs / top_logprobs / text_offset; chat: content[{token,
// logprob, bytes, top_logprobs}]).
//
// ResponseBuilder holds a tokenizer pointer (may be null: token strings are then "<id>")
// which must outlive it; it is immutable after construction and thread-safe. ChoiceState
// is a plain value owned by one request handler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_protocol.h"

namespace oasis::tokenizer {
class Tokenizer;
}

namespace oasis::server {

// JSON text with invalid UTF-8 replaced (never throws).
std::string DumpJson(const OrderedJson& j);

// Everything one choice (one engine request) produced so far.
struct ChoiceState {
  int index = 0;
  std::string text;
  std::vector<GeneratedToken> tokens;
  FinishReasonKind finish_reason = FinishReasonKind::kNone;
  std::string stop_reason;
  Status error = Status::Ok();
  int64_t cached_tokens = 0;  // prompt tokens from the prefix cache
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool finished = false;
  size_t text_offset = 0;      // completions logprobs: offset of the next token's text
  std::string handoff_ticket;  // finish_reason kHandoff (a prefill instance): the ticket
  std::vector<PromptTokenLogprob> prompt_logprobs;  // GenerateSpec::prompt_logprobs: the prompt's
  // Completions with echo and logprobs: the prompt's token ids (their logprobs lead the
  // choice's; Service::Start sets them). Empty otherwise.
  std::vector<int32_t> echo_prompt;
  // A chat stream's reasoning / tool-call parsing (GenerateSpec::output), made by the first chunk.
  std::shared_ptr<ChatOutputParser> parser;

  void Add(const RequestOutput& out);
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // > 0: usage.prompt_tokens_details.cached_tokens (prefix cache)
  OrderedJson ToJson() const;
};

class ResponseBuilder {
 public:
  ResponseBuilder(const GenerateSpec& spec, std::string id, std::string model, int64_t created,
                  const tokenizer::Tokenizer* tok);

  const std::string& id() const { return id_; }

  // Non-streaming body with every choice (in index order) and the usage.
  OrderedJson Final(const std::vector<ChoiceState>& choices, const Usage& usage,
                    const std::vector<std::string>& echo_prefixes) const;

  // One streaming chunk for `out`, an event of choice `index` (tokens from `state`, which
  // has already Add()ed it and advances text_offset). `prefix` is prepended to the text
  // (echo). null when the event carries nothing to send.
  OrderedJson Chunk(ChoiceState& state, const RequestOutput& out, const std::string& prefix) const;
  // Chat streams open each choice with {"role": "assistant", "content": ""}.
  OrderedJson RoleChunk(int index) const;
  // The final usage chunk (choices: []).
  OrderedJson UsageChunk(const Usage& usage) const;
  // An in-stream error: {"error": {...}}.
  static OrderedJson ErrorChunk(const ApiError& error);

  // vLLM's prompt_logprobs list: null for the first prompt token, then per token
  // {"<id>": {"logprob", "rank", "decoded_token"}} for it and the top ones.
  OrderedJson PromptLogprobs(const std::vector<PromptTokenLogprob>& entries) const;

  // Logprobs objects over `tokens` (empty list: null). `text_offset` advances (completions).
  OrderedJson Logprobs(const std::vector<GeneratedToken>& tokens, size_t* text_offset) const;

 private:
  OrderedJson StopReason(const ChoiceState& s) const;
  // Completions logprobs over `tokens`, led by `echo`'s prompt tokens when it has them.
  OrderedJson CompletionLogprobs(const std::vector<GeneratedToken>& tokens, const ChoiceState* echo,
                                 size_t* text_offset) const;
  // A chat stream's delta for `text` (reasoning / tool-call parsing when asked for).
  OrderedJson ChatDeltaJson(ChoiceState& state, const std::string& text, bool finished) const;
  // "tool_calls" when tool calls were parsed out of an answer that stopped or ran out of length
  // (vLLM), else the engine's reason.
  static OrderedJson FinishReason(FinishReasonKind reason, int tool_calls);
  OrderedJson Envelope(const char* object) const;
  std::string TokenString(int32_t id) const;
  // The token's name in logprobs: its text, or "token_id:<id>" (return_tokens_as_token_ids).
  std::string TokenLabel(int32_t id) const;
  OrderedJson TokenBytes(int32_t id) const;

  const GenerateSpec& spec_;
  std::string id_;
  std::string model_;
  int64_t created_;
  const tokenizer::Tokenizer* tok_;
};

}  // namespace oasis::server

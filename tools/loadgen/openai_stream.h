// The OpenAI-compatible wire format of one benchmark request: the JSON body sent for a
// prompt, and StreamAccumulator, which turns the streamed response (SSE bytes with their
// arrival times) into a RequestRecord. No networking here, so all of it is unit-testable.
//
// Token events: a chunk whose first choice carries text (completions: "text"; chat:
// "delta.content" or "delta.reasoning_content") counts as one token event — an empty text
// counts too (a token whose bytes do not yet form a whole UTF-8 character), except on a chunk
// that only reports a finish_reason, or on the chat role chunk. TTFT is the first event's
// time, ITL every later gap. Output tokens come from the usage chunk
// (stream_options.include_usage) when the server sends one, otherwise from the event count;
// so do the cached prompt tokens (usage.prompt_tokens_details.cached_tokens, absent: 0).
//
// StreamAccumulator owns the parser state of one response. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/loadgen/request_record.h"
#include "tools/loadgen/sse_parser.h"
#include "tools/loadgen/workload.h"

namespace oasis::loadgen {

enum class EndpointType { kCompletions, kChat };

// How requests are written; shared read-only by all workers.
struct RequestOptions {
  EndpointType type = EndpointType::kCompletions;
  std::string model;
  bool ignore_eos = false;                               // send ignore_eos: true
  bool force_min_tokens = false;                         // send min_tokens = max_tokens
  std::optional<double> temperature;                     // unset: the server's default
  nlohmann::json extra_body = nlohmann::json::object();  // merged last (--extra-body)
};

// The request JSON for `prompt` (stream with usage, max_tokens = prompt.output_len). Chat
// sends the prompt's messages, or its text as one user message. Token-id prompts are an error
// for chat, chat messages one for completions (returned as InvalidArgument).
StatusOr<nlohmann::json> BuildRequestBody(const RequestOptions& options, const Prompt& prompt);

// The message of an error response body: {"error": {"message"}} (OpenAI), {"error": "..."},
// {"detail": ...} (FastAPI), {"message": ...}; else the body itself, shortened.
std::string ErrorMessageFromBody(std::string_view body);

class StreamAccumulator {
 public:
  // `start_s`: when the request was sent (seconds on the benchmark's clock).
  StreamAccumulator(EndpointType type, const Prompt& prompt, double start_s, bool save_text);

  // Response bytes that arrived at `now_s`.
  void OnBytes(std::string_view bytes, double now_s);
  // The stream ended cleanly at `now_s` (HTTP 200 fully read): completes the record — a
  // success when [DONE] arrived, at least one token came, and no error event was seen.
  RequestRecord Finish(double now_s);
  // Whether an error event or malformed chunk was seen (the caller may stop reading).
  bool failed() const { return !stream_error_.empty(); }

 private:
  void OnEvent(const SseEvent& event, double now_s);

  EndpointType type_;
  SseParser parser_;
  std::vector<SseEvent> events_;
  RequestRecord record_;
  bool save_text_;
  bool done_ = false;  // "[DONE]" seen
  int64_t token_events_ = 0;
  double last_event_s_ = 0;
  // When the finishing chunk came: the first token's time of a stream whose every token has
  // empty text (special tokens skipped) but whose usage counts them.
  double finish_event_s_ = -1;
  std::string stream_error_;
};

}  // namespace oasis::loadgen

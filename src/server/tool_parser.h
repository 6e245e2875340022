// Tool-call parsing of generated text, as vLLM's `--tool-call-parser` does, incrementally so that
// a stream can send calls as they are generated:
//  - hermes (Qwen3, Hermes): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, any
//    number of them anywhere in the text (an unclosed last one counts when its JSON is complete);
//  - llama3_json (Llama 3.x): JSON objects `{"name": ..., "parameters"|"arguments": {...}}` at the
//    start of the answer, optionally after `<|python_tag|>`, several separated by `;`.
// A call is announced (index, id, name, the arguments so far) once its name is complete and its
// arguments have started; its arguments then follow as fragments whose concatenation is the
// arguments' JSON text as generated. A call whose JSON turns out not to be a tool call before it
// was announced stays plain content; one that breaks after it was announced (only possible
// across Feed calls) ends there and the rest of its text is dropped. Text outside calls is
// content, without the whitespace that separates it from a call (pieces of text on either side
// of calls are joined by a newline); text that may be the start of
// a call (a partial `<tool_call>`, trailing whitespace) is held back until it is known.
//
// ToolCallParser is a plain value owned by one response; thread-compatible.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"
#include "server/json_scanner.h"

namespace oasis::server {

enum class ToolParserKind { kNone, kHermes, kLlama3Json };

// "hermes", "llama3_json" (empty: kNone); InvalidArgument naming the choices otherwise.
StatusOr<ToolParserKind> ParseToolParserKind(std::string_view name);
// A fresh call id: "chatcmpl-tool-" + 32 hex digits (vLLM's form).
std::string NewToolCallId();

// One piece of a call: its announcement (`announce`: id and name set) or an arguments fragment.
struct ToolCallDelta {
  int index = 0;
  bool announce = false;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
  void Append(ToolStreamDelta other);
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

class ToolCallParser {
 public:
  // `max_calls`: calls past it are parsed and dropped (parallel_tool_calls=false: 1).
  ToolCallParser(ToolParserKind kind, int max_calls);

  // The next piece of generated text; returns what can be sent now.
  ToolStreamDelta Feed(std::string_view text);
  // The end of the output (with its last piece of text): flushes what was held back.
  ToolStreamDelta Finish(std::string_view text = {});
  // Calls announced so far.
  int calls() const { return announced_; }

 private:
  // kStart: llama3_json before its first call; kOutside: hermes text between calls; kCall: in a
  // call's JSON; kAfterCall: past it (hermes: its closing tag; llama3_json: `;` or the end);
  // kDropCall: the rest of a call that broke after its announcement; kLiteralCall: a hermes call
  // that is no call, as text up to its closing tag; kPlain: the rest is text.
  enum class Mode { kStart, kOutside, kCall, kAfterCall, kDropCall, kLiteralCall, kPlain };
  ToolStreamDelta Run(bool at_end);
  void Outside(bool at_end, ToolStreamDelta* out);
  void Start(bool at_end, ToolStreamDelta* out);
  void InCall(bool at_end, ToolStreamDelta* out);
  void AfterCall(bool at_end, ToolStreamDelta* out);
  // Begins a call whose JSON starts at text_[pos_].
  void BeginCall(size_t call_start);
  // The call's JSON was no tool call: back to text (before announcement) or dropped.
  void FailCall(ToolStreamDelta* out);
  // Sends the call's announcement and/or its new arguments; false if its name is no string.
  bool Announce(bool complete, ToolStreamDelta* out);
  void Content(std::string_view text, ToolStreamDelta* out);

  ToolParserKind kind_;
  int max_calls_;
  Mode mode_;
  std::string text_;  // everything fed
  size_t pos_ = 0;    // text_ before pos_ is dealt with
  // The current call.
  JsonObjectScanner scanner_;
  size_t call_text_start_ = 0;  // its first byte (the tag, or its '{')
  size_t json_start_ = 0;       // where the scanner started
  std::string held_space_;      // whitespace cut before it (content again if it fails)
  bool call_announced_ = false;
  bool call_dropped_ = false;  // past max_calls: parsed, not sent
  size_t args_sent_ = 0;       // bytes of its arguments sent
  int announced_ = 0;          // calls sent
  bool skip_space_ = false;    // lstrip the text after a call
  bool content_sent_ = false;  // some text went out as content
};

// The whole output at once (non-streamed answers): the calls and the content outside them
// (nullopt when empty), the same as concatenating a stream's deltas.
struct ExtractedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ExtractedToolCalls ExtractToolCalls(ToolParserKind kind, int max_calls, std::string_view text);

}  // namespace oasis::server

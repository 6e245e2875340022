// The parsing of a chat answer's text a request asked for: reasoning first (`--reasoning-parser`),
// then tool calls in what follows it (`--tool-call-parser` with tool_choice "auto"). Streamed
// (ChatOutputParser, per choice) or whole (ParseChatOutput); both give the same result.
// Plain values; thread-compatible.
#pragma once

#include <climits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

namespace oasis::server {

// What one request's output goes through (resolved from the server's flags and the request).
struct OutputParsing {
  ToolParserKind tools = ToolParserKind::kNone;
  int max_tool_calls = INT_MAX;  // parallel_tool_calls=false: 1
  ReasoningParserKind reasoning = ReasoningParserKind::kNone;
  bool reasoning_open_at_start = false;  // the prompt ends inside <think>
  bool active() const {
    return tools != ToolParserKind::kNone || reasoning != ReasoningParserKind::kNone;
  }
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const OutputParsing& parsing);
  ChatDelta Feed(std::string_view text);
  ChatDelta Finish();
  int tool_calls() const { return tools_.calls(); }

 private:
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

struct ChatMessageParts {
  std::optional<std::string> reasoning;  // set when a thinking block was found
  std::optional<std::string> content;    // null when empty
  std::vector<ToolCall> tool_calls;
};
ChatMessageParts ParseChatOutput(const OutputParsing& parsing, std::string_view text);

}  // namespace oasis::server

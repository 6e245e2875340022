#include "server/chat_output.h"

namespace oasis::server {

ChatOutputParser::ChatOutputParser(const OutputParsing& parsing)
    : reasoning_(parsing.reasoning, parsing.reasoning_open_at_start),
      tools_(parsing.tools, parsing.max_tool_calls) {}

ChatDelta ChatOutputParser::Feed(std::string_view text) {
  ReasoningDelta r = reasoning_.Feed(text);
  ToolStreamDelta t = tools_.Feed(r.content);
  return ChatDelta{std::move(r.reasoning), std::move(t.content), std::move(t.calls)};
}

ChatDelta ChatOutputParser::Finish() {
  ReasoningDelta r = reasoning_.Finish();
  ToolStreamDelta t = tools_.Finish(r.content);
  return ChatDelta{std::move(r.reasoning), std::move(t.content), std::move(t.calls)};
}

ChatMessageParts ParseChatOutput(const OutputParsing& parsing, std::string_view text) {
  ReasoningParser reasoning(parsing.reasoning, parsing.reasoning_open_at_start);
  ReasoningDelta r = reasoning.Feed(text);
  ReasoningDelta rest = reasoning.Finish();
  r.reasoning += rest.reasoning;
  r.content += rest.content;
  ExtractedToolCalls t = ExtractToolCalls(parsing.tools, parsing.max_tool_calls, r.content);
  ChatMessageParts parts;
  if (reasoning.reasoned()) parts.reasoning = std::move(r.reasoning);
  parts.content = std::move(t.content);
  parts.tool_calls = std::move(t.calls);
  return parts;
}

}  // namespace oasis::server

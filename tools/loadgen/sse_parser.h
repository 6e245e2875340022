// SseParser: incremental parser for a text/event-stream body (the WHATWG server-sent
// events format that OpenAI-compatible servers stream). Bytes arrive in arbitrary pieces —
// a network read may end inside a line, inside a "\r\n" pair or inside a multi-byte UTF-8
// character — and complete events come out in order.
//
// Supported: `data:` lines (several lines of one event are joined with "\n"), `event:`
// names, comment lines (": ..."), other fields ignored, LF, CRLF and lone-CR line ends, a
// leading UTF-8 BOM. An event is dispatched on a blank line; Finish() dispatches a last
// event whose blank line never came (a server that closes right after its final data line).
//
// Owns its buffered partial line. Not thread-safe: one parser per response stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace oasis::loadgen {

struct SseEvent {
  std::string event;  // the `event:` field; empty means the default "message"
  std::string data;   // the `data:` lines joined with "\n"
};

class SseParser {
 public:
  // Consumes `bytes` and appends every event completed by them to `*out`.
  void Feed(std::string_view bytes, std::vector<SseEvent>* out);
  // End of stream: dispatches a pending event (data seen but no blank line yet).
  void Finish(std::vector<SseEvent>* out);

 private:
  void Consume(std::string_view bytes, std::vector<SseEvent>* out);
  void ProcessLine(std::string_view line, std::vector<SseEvent>* out);
  void Dispatch(std::vector<SseEvent>* out);

  std::string line_;          // the current, unterminated line
  bool last_was_cr_ = false;  // previous byte ended a line with '\r' (swallow a following '\n')
  bool bom_checked_ = false;
  std::string pending_bom_;  // leading bytes held until we know whether they are a BOM
  std::string event_;
  std::string data_;
  bool has_data_ = false;
};

}  // namespace oasis::loadgen

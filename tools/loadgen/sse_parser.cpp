// SseParser: see sse_parser.h.
#include "tools/loadgen/sse_parser.h"

namespace oasis::loadgen {

namespace {
constexpr std::string_view kBom = "\xEF\xBB\xBF";
}  // namespace

void SseParser::Feed(std::string_view bytes, std::vector<SseEvent>* out) {
  if (bom_checked_) {
    Consume(bytes, out);
    return;
  }
  // Hold back the leading bytes until we know whether they are a BOM.
  pending_bom_.append(bytes);
  if (pending_bom_.size() < kBom.size() && kBom.starts_with(pending_bom_)) return;
  bom_checked_ = true;
  const std::string held = std::move(pending_bom_);
  pending_bom_.clear();
  std::string_view rest = held;
  if (rest.starts_with(kBom)) rest.remove_prefix(kBom.size());
  Consume(rest, out);
}

void SseParser::Consume(std::string_view bytes, std::vector<SseEvent>* out) {
  if (bytes.empty()) return;
  size_t start = 0;
  if (last_was_cr_ && bytes.front() == '\n') start = 1;  // the '\n' of a split "\r\n"
  last_was_cr_ = false;
  for (size_t i = start; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c != '\n' && c != '\r') continue;
    line_.append(bytes.substr(start, i - start));
    ProcessLine(line_, out);
    line_.clear();
    if (c == '\r') {
      if (i + 1 == bytes.size()) {
        last_was_cr_ = true;
      } else if (bytes[i + 1] == '\n') {
        ++i;
      }
    }
    start = i + 1;
  }
  if (start < bytes.size()) line_.append(bytes.substr(start));
}

void SseParser::Finish(std::vector<SseEvent>* out) {
  if (!bom_checked_) {
    bom_checked_ = true;
    const std::string held = std::move(pending_bom_);
    pending_bom_.clear();
    Consume(held, out);
  }
  if (!line_.empty()) {
    ProcessLine(line_, out);
    line_.clear();
  }
  Dispatch(out);
}

void SseParser::ProcessLine(std::string_view line, std::vector<SseEvent>* out) {
  if (line.empty()) {
    Dispatch(out);
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive)
  std::string_view field = line;
  std::string_view value;
  if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_.assign(value);
  }
  // "id", "retry" and unknown fields do not matter to a load generator.
}

void SseParser::Dispatch(std::vector<SseEvent>* out) {
  if (has_data_) out->push_back(SseEvent{std::move(event_), std::move(data_)});
  event_.clear();
  data_.clear();
  has_data_ = false;
}

}  // namespace oasis::loadgen

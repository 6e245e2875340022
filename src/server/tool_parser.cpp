#include "server/tool_parser.h"

#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

namespace oasis::server {
namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

size_t SkipSpace(const std::string& s, size_t p) {
  while (p < s.size() && IsSpace(s[p])) ++p;
  return p;
}

// `rest` is a proper prefix of `tag` (it may still become the tag).
bool MayBecome(std::string_view rest, std::string_view tag) {
  return rest.size() < tag.size() && tag.substr(0, rest.size()) == rest;
}

void AddArguments(ToolStreamDelta* out, int index, std::string_view text) {
  if (text.empty()) return;
  if (!out->calls.empty() && out->calls.back().index == index) {
    out->calls.back().arguments += text;
    return;
  }
  ToolCallDelta d;
  d.index = index;
  d.arguments = std::string(text);
  out->calls.push_back(std::move(d));
}

}  // namespace

StatusOr<ToolParserKind> ParseToolParserKind(std::string_view name) {
  if (name.empty()) return ToolParserKind::kNone;
  if (name == "hermes") return ToolParserKind::kHermes;
  if (name == "llama3_json") return ToolParserKind::kLlama3Json;
  return InvalidArgument("--tool-call-parser must be one of hermes, llama3_json, got '" +
                         std::string(name) + "'");
}

std::string NewToolCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[48];
  std::snprintf(buf, sizeof buf, "chatcmpl-tool-%016llx%016llx",
                static_cast<unsigned long long>(rng()), static_cast<unsigned long long>(rng()));
  return buf;
}

void ToolStreamDelta::Append(ToolStreamDelta other) {
  content += other.content;
  for (ToolCallDelta& d : other.calls) {
    if (!d.announce) {
      AddArguments(this, d.index, d.arguments);
    } else {
      calls.push_back(std::move(d));
    }
  }
}

ToolCallParser::ToolCallParser(ToolParserKind kind, int max_calls)
    : kind_(kind),
      max_calls_(max_calls),
      mode_(kind == ToolParserKind::kLlama3Json ? Mode::kStart
            : kind == ToolParserKind::kHermes   ? Mode::kOutside
                                                : Mode::kPlain) {}

ToolStreamDelta ToolCallParser::Feed(std::string_view text) {
  text_.append(text);
  return Run(/*at_end=*/false);
}

ToolStreamDelta ToolCallParser::Finish(std::string_view text) {
  text_.append(text);
  return Run(/*at_end=*/true);
}

ToolStreamDelta ToolCallParser::Run(bool at_end) {
  ToolStreamDelta out;
  for (;;) {
    const Mode mode = mode_;
    const size_t pos = pos_;
    switch (mode_) {
      case Mode::kStart:
        Start(at_end, &out);
        break;
      case Mode::kOutside:
        Outside(at_end, &out);
        break;
      case Mode::kCall:
        InCall(at_end, &out);
        break;
      case Mode::kAfterCall:
        AfterCall(at_end, &out);
        break;
      case Mode::kDropCall:
        if (kind_ == ToolParserKind::kLlama3Json) {
          pos_ = text_.size();  // the call runs to the end of the output
        } else if (size_t close = text_.find(kCallClose, pos_); close != std::string::npos) {
          pos_ = close + kCallClose.size();
          mode_ = Mode::kOutside;
          skip_space_ = true;
        } else {
          pos_ = at_end ? text_.size()
                        : std::max(pos_, text_.size() - PartialSuffix(text_, kCallClose));
        }
        break;
      case Mode::kLiteralCall:
        if (size_t close = text_.find(kCallClose, pos_); close != std::string::npos) {
          Content(std::string_view(text_).substr(pos_, close + kCallClose.size() - pos_), &out);
          pos_ = close + kCallClose.size();
          mode_ = Mode::kOutside;
        } else {
          const size_t end = at_end
                                 ? text_.size()
                                 : std::max(pos_, text_.size() - PartialSuffix(text_, kCallClose));
          Content(std::string_view(text_).substr(pos_, end - pos_), &out);
          pos_ = end;
        }
        break;
      case Mode::kPlain:
        Content(std::string_view(text_).substr(pos_), &out);
        pos_ = text_.size();
        break;
    }
    if (mode_ == mode && pos_ == pos) break;
  }
  return out;
}

void ToolCallParser::Content(std::string_view text, ToolStreamDelta* out) {
  if (text.empty()) return;
  out->content.append(text);
  content_sent_ = true;
}

void ToolCallParser::Outside(bool at_end, ToolStreamDelta* out) {
  if (skip_space_) {
    pos_ = SkipSpace(text_, pos_);
    const std::string_view rest = std::string_view(text_).substr(pos_);
    if (rest.empty() || (!at_end && MayBecome(rest, kCallOpen))) return;
    skip_space_ = false;
    // Text resumes after a call: pieces of text separated by calls are joined by a newline.
    if (content_sent_ && rest.substr(0, kCallOpen.size()) != kCallOpen) Content("\n", out);
  }
  const size_t tag = text_.find(kCallOpen, pos_);
  if (tag != std::string::npos) {
    size_t end = tag;
    while (end > pos_ && IsSpace(text_[end - 1])) --end;
    Content(std::string_view(text_).substr(pos_, end - pos_), out);
    held_space_ = text_.substr(end, tag - end);
    call_text_start_ = tag;
    BeginCall(tag + kCallOpen.size());
    return;
  }
  size_t safe = text_.size();
  if (!at_end) {
    safe -= PartialSuffix(std::string_view(text_).substr(pos_), kCallOpen);
    while (safe > pos_ && IsSpace(text_[safe - 1])) --safe;  // may separate text from a call
  }
  Content(std::string_view(text_).substr(pos_, safe - pos_), out);
  pos_ = safe;
}

void ToolCallParser::Start(bool at_end, ToolStreamDelta* out) {
  (void)out;
  size_t p = SkipSpace(text_, pos_);
  const std::string_view rest = std::string_view(text_).substr(p);
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
    p = SkipSpace(text_, p + kPythonTag.size());
  } else if (!rest.empty() && MayBecome(rest, kPythonTag)) {
    if (at_end) mode_ = Mode::kPlain;
    return;
  }
  if (p == text_.size()) {
    if (at_end) mode_ = Mode::kPlain;
    return;
  }
  if (text_[p] != '{') {
    mode_ = Mode::kPlain;  // no call at the start: the whole output is text
    return;
  }
  held_space_ = text_.substr(pos_, p - pos_);
  call_text_start_ = pos_;
  BeginCall(p);
}

void ToolCallParser::BeginCall(size_t json_start) {
  scanner_ = JsonObjectScanner();
  json_start_ = json_start;
  pos_ = json_start;
  call_announced_ = false;
  call_dropped_ = false;
  args_sent_ = 0;
  mode_ = Mode::kCall;
}

void ToolCallParser::InCall(bool at_end, ToolStreamDelta* out) {
  pos_ += scanner_.Feed(std::string_view(text_).substr(pos_));
  switch (scanner_.state()) {
    case JsonObjectScanner::State::kError:
      return FailCall(out);
    case JsonObjectScanner::State::kComplete:
      // hermes: announced once its closing tag (or the end) confirms it is a call.
      if (kind_ == ToolParserKind::kLlama3Json && !Announce(/*complete=*/true, out))
        return FailCall(out);
      mode_ = Mode::kAfterCall;
      return;
    case JsonObjectScanner::State::kIncomplete:
      if (at_end || !Announce(/*complete=*/false, out)) return FailCall(out);
      return;
  }
}

void ToolCallParser::AfterCall(bool at_end, ToolStreamDelta* out) {
  const size_t p = SkipSpace(text_, pos_);
  const std::string_view rest = std::string_view(text_).substr(p);
  if (kind_ == ToolParserKind::kHermes) {
    const bool closed = rest.substr(0, kCallClose.size()) == kCallClose;
    if (!closed && !(at_end && MayBecome(rest, kCallClose))) {
      if (MayBecome(rest, kCallClose)) return;  // wait for the rest of the tag
      return FailCall(out);                     // something else after the JSON
    }
    if (!Announce(/*complete=*/true, out)) return FailCall(out);
    pos_ = closed ? p + kCallClose.size() : text_.size();
    mode_ = Mode::kOutside;
    skip_space_ = true;
    return;
  }
  // llama3_json: `;` and the next call, or the end of the calls.
  if (rest.empty()) {
    if (at_end) pos_ = text_.size();
    return;
  }
  if (rest[0] != ';') {
    pos_ = p;
    mode_ = Mode::kPlain;  // text after the calls
    return;
  }
  const size_t q = SkipSpace(text_, p + 1);
  if (q == text_.size()) {
    if (at_end) pos_ = text_.size();
    return;
  }
  if (text_[q] != '{') {
    pos_ = q;
    mode_ = Mode::kPlain;
    return;
  }
  held_space_.clear();
  call_text_start_ = q;
  BeginCall(q);
}

void ToolCallParser::FailCall(ToolStreamDelta* out) {
  if (call_announced_) {
    mode_ = Mode::kDropCall;  // already sent: it ends here, the rest of its text is dropped
    return;
  }
  Content(held_space_, out);
  held_space_.clear();
  if (kind_ == ToolParserKind::kHermes) {
    Content(kCallOpen, out);
    pos_ = call_text_start_ + kCallOpen.size();
    mode_ = Mode::kLiteralCall;  // text up to its closing tag
  } else {
    pos_ = call_text_start_;
    mode_ = Mode::kPlain;
  }
}

bool ToolCallParser::Announce(bool complete, ToolStreamDelta* out) {
  const JsonObjectScanner::Member* args = scanner_.Find("arguments");
  if (args == nullptr && kind_ == ToolParserKind::kLlama3Json) args = scanner_.Find("parameters");
  if (!call_announced_) {
    const JsonObjectScanner::Member* name = scanner_.Find("name");
    if (name == nullptr || name->end == JsonObjectScanner::kOpen || args == nullptr ||
        args->begin == JsonObjectScanner::kOpen) {
      return !complete;  // not yet known (a complete object without them is no call)
    }
    const nlohmann::json value = nlohmann::json::parse(
        std::string_view(text_).substr(json_start_ + name->begin, name->end - name->begin), nullptr,
        false);
    if (!value.is_string()) return false;
    call_announced_ = true;
    call_dropped_ = announced_ >= max_calls_;
    if (!call_dropped_) {
      ToolCallDelta d;
      d.index = announced_++;
      d.announce = true;
      d.id = NewToolCallId();
      d.name = value.get<std::string>();
      out->calls.push_back(std::move(d));
    }
  }
  const size_t begin = json_start_ + args->begin;
  const size_t end = args->end != JsonObjectScanner::kOpen ? json_start_ + args->end : pos_;
  if (end > begin + args_sent_) {
    if (!call_dropped_) {
      AddArguments(out, announced_ - 1,
                   std::string_view(text_).substr(begin + args_sent_, end - begin - args_sent_));
    }
    args_sent_ = end - begin;
  }
  return true;
}

ExtractedToolCalls ExtractToolCalls(ToolParserKind kind, int max_calls, std::string_view text) {
  ToolCallParser parser(kind, max_calls);
  ToolStreamDelta all = parser.Finish(text);  // one pass: nothing is announced early
  ExtractedToolCalls out;
  for (const ToolCallDelta& d : all.calls) {
    if (d.announce) out.calls.push_back(ToolCall{d.id, d.name, ""});
    out.calls[static_cast<size_t>(d.index)].arguments += d.arguments;
  }
  if (!all.content.empty()) out.content = std::move(all.content);
  return out;
}

}  // namespace oasis::server

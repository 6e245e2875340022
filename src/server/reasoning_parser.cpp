#include "server/reasoning_parser.h"

namespace oasis::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialSuffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

StatusOr<ReasoningParserKind> ParseReasoningParserKind(std::string_view name) {
  if (name.empty()) return ReasoningParserKind::kNone;
  if (name == "qwen3") return ReasoningParserKind::kQwen3;
  if (name == "deepseek_r1") return ReasoningParserKind::kDeepSeekR1;
  return InvalidArgument("--reasoning-parser must be one of qwen3, deepseek_r1, got '" +
                         std::string(name) + "'");
}

bool PromptOpensThinking(std::string_view prompt) {
  while (!prompt.empty() && IsSpace(prompt.back())) prompt.remove_suffix(1);
  return prompt.size() >= kThinkOpen.size() &&
         prompt.substr(prompt.size() - kThinkOpen.size()) == kThinkOpen;
}

ReasoningParser::ReasoningParser(ReasoningParserKind kind, bool open_at_start)
    : open_at_start_(open_at_start || kind == ReasoningParserKind::kDeepSeekR1),
      mode_(kind == ReasoningParserKind::kNone ? Mode::kContent : Mode::kStart) {}

ReasoningDelta ReasoningParser::Feed(std::string_view text) {
  pending_.append(text);
  return Run(/*at_end=*/false);
}

ReasoningDelta ReasoningParser::Finish() { return Run(/*at_end=*/true); }

ReasoningDelta ReasoningParser::Run(bool at_end) {
  ReasoningDelta out;
  if (mode_ == Mode::kStart) {
    size_t p = 0;
    while (p < pending_.size() && IsSpace(pending_[p])) ++p;
    const std::string_view rest = std::string_view(pending_).substr(p);
    if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
      pending_.erase(0, p + kThinkOpen.size());
      mode_ = Mode::kReasoning;
    } else if (!at_end && kThinkOpen.substr(0, rest.size()) == rest) {
      return out;  // nothing yet, whitespace, or a partial <think>
    } else {
      mode_ = open_at_start_ ? Mode::kReasoning : Mode::kContent;
    }
    reasoned_ = mode_ == Mode::kReasoning;
  }
  if (mode_ == Mode::kReasoning) {
    const size_t close = pending_.find(kThinkClose);
    if (close == std::string::npos) {
      const size_t keep = at_end ? 0 : PartialSuffix(pending_, kThinkClose);
      out.reasoning = pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.reasoning = pending_.substr(0, close);
    pending_.erase(0, close + kThinkClose.size());
    mode_ = Mode::kContent;
  }
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace oasis::server

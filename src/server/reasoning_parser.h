// Reasoning parsing of generated text, as vLLM's `--reasoning-parser qwen3` / `deepseek_r1`:
// the thinking block `<think>…</think>` goes to `reasoning_content`, what follows to `content`.
// The block is open from the start when the output begins with `<think>` (leading whitespace
// allowed), when the prompt itself ended with `<think>` (templates that put it in the
// generation prompt), and always for deepseek_r1; then everything before `</think>` is reasoning
// (all of it if the output ends first). Otherwise the output is content, `<think>` in it
// included. Incremental: a partial `<think>` / `</think>` is held back until it is known.
//
// ReasoningParser is a plain value owned by one response; thread-compatible.
#pragma once

#include <string>
#include <string_view>

#include "oasis/status.h"

namespace oasis::server {

enum class ReasoningParserKind { kNone, kQwen3, kDeepSeekR1 };

// "qwen3", "deepseek_r1" (empty: kNone); InvalidArgument naming the choices otherwise.
StatusOr<ReasoningParserKind> ParseReasoningParserKind(std::string_view name);
// Whether a rendered chat prompt ends inside a thinking block: it ends with `<think>` (and
// whitespace), as templates that open the block in the generation prompt leave it.
bool PromptOpensThinking(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // kNone passes everything through as content.
  ReasoningParser(ReasoningParserKind kind, bool open_at_start);

  ReasoningDelta Feed(std::string_view text);
  ReasoningDelta Finish();
  // Whether a thinking block was found (reasoning_content is then reported, maybe empty).
  bool reasoned() const { return reasoned_; }

 private:
  enum class Mode { kStart, kReasoning, kContent };
  ReasoningDelta Run(bool at_end);

  bool open_at_start_;
  Mode mode_;
  std::string pending_;  // fed, not yet sent
  bool reasoned_ = false;
};

}  // namespace oasis::server

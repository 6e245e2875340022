// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered against a small fixed
// chat context with tight sandbox limits. Any input must yield a template or a Status error —
// never a crash, hang, leak or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/chat_template.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi <tool_response>x</tool_response> \u00e9\u4f60 {{ }}"},
      {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, true, null]}}},
                      {"function": {"name": "g", "arguments": "{\"b\": 1}"}}]},
      {"role": "tool", "content": {"ok": true}},
      {"role": "user", "content": ""}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "date_string": "1 Jan 2026"
  })");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = oasis::ChatTemplate::Parse(std::move(source));
  if (!tmpl.ok()) return 0;
  oasis::ChatTemplate::RenderOptions options;
  options.max_output_bytes = 1 << 16;
  options.max_iterations = 20000;
  options.max_call_depth = 16;
  options.now = std::chrono::system_clock::time_point{};
  auto out = tmpl->Render(Context(), options);
  (void)out;
  return 0;
}

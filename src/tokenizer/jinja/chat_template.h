// ChatTemplate: a model's Jinja chat template (from tokenizer_config.json or a file), parsed once
// and rendered per request exactly as transformers' apply_chat_template renders it with Python
// Jinja2 (trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now).
//
//   OASIS_ASSIGN_OR_RETURN(ChatTemplateFiles files, ChatTemplate::LoadFromTokenizerConfig(path));
//   OASIS_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Parse(files.chat_template));
//   nlohmann::ordered_json ctx = {{"messages", messages}, {"add_generation_prompt", true},
//                                 {"bos_token", *files.bos_token}};
//   OASIS_ASSIGN_OR_RETURN(std::string prompt, tmpl.Render(ctx));
//
// Errors (syntax errors, raise_exception, type errors, sandbox limits) are Status values whose
// message starts with "line:column: "; raise_exception's message follows verbatim. Render is
// const and thread-safe: a parsed ChatTemplate may be shared by all request threads. Copies share
// the immutable syntax tree.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "oasis/status.h"
#include "tokenizer/jinja/interpreter.h"

namespace oasis {

// What a tokenizer_config.json says about chat formatting.
struct ChatTemplateFiles {
  std::string chat_template;             // the "default" template
  std::optional<std::string> bos_token;  // absent when null / missing
  std::optional<std::string> eos_token;
};

class ChatTemplate {
 public:
  using RenderOptions = jinja::RenderOptions;

  static StatusOr<ChatTemplate> Parse(std::string source);

  // Renders with `context` as the template's variables (messages, tools, add_generation_prompt,
  // enable_thinking, bos_token, ...). `context` must be a JSON object.
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;
  StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                               const RenderOptions& options) const;

  const std::string& source() const { return *source_; }

  // Reads tokenizer_config.json: `chat_template` as a string or a list of {name, template}
  // (the one named "default"; else the only one); falls back to a chat_template.jinja file beside
  // it. bos/eos tokens may be strings or {"content": ...} objects.
  static StatusOr<ChatTemplateFiles> LoadFromTokenizerConfig(const std::filesystem::path& path);
  // The same from an already parsed tokenizer_config.json.
  static StatusOr<ChatTemplateFiles> FromTokenizerConfig(const nlohmann::ordered_json& config);

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, std::shared_ptr<const jinja::Template> t)
      : source_(std::move(source)), template_(std::move(t)) {}

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const jinja::Template> template_;
};

}  // namespace oasis

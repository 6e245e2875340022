#include "tokenizer/jinja/chat_template.h"

#include <fstream>
#include <sstream>

#include "common/json_depth.h"
#include "tokenizer/jinja/parser.h"

namespace oasis {
namespace {

StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss("cannot read " + path.string());
  return ss.str();
}

StatusOr<std::optional<std::string>> TokenString(const nlohmann::ordered_json& config,
                                                 const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return InvalidArgument(std::string("tokenizer_config.json: '") + key +
                         "' must be a string or an object with a string 'content'");
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string source) {
  auto parsed = jinja::ParseTemplate(source);
  if (!parsed.ok()) return parsed.status().WithContext("chat template");
  return ChatTemplate(std::make_shared<const std::string>(std::move(source)),
                      std::move(parsed).value());
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return Render(context, RenderOptions{});
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                           const RenderOptions& options) const {
  if (!context.is_object()) return InvalidArgument("chat template context must be a JSON object");
  auto value = jinja::FromJson(context);
  if (!value.ok()) return value.status().WithContext("chat template context");
  jinja::Interpreter interpreter(options);
  auto out = interpreter.Render(*template_, value.value().dict());
  if (!out.ok()) return out.status().WithContext("chat template");
  return out;
}

StatusOr<ChatTemplateFiles> ChatTemplate::FromTokenizerConfig(
    const nlohmann::ordered_json& config) {
  if (!config.is_object()) return InvalidArgument("tokenizer_config.json must hold a JSON object");
  ChatTemplateFiles files;
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    return NotFound("tokenizer_config.json has no chat_template");
  if (it->is_string()) {
    files.chat_template = it->get<std::string>();
  } else if (it->is_array()) {
    const nlohmann::ordered_json* chosen = nullptr;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        return InvalidArgument(
            "tokenizer_config.json: chat_template entries must be {name, template}");
      }
      if (entry["name"] == "default") chosen = &entry;
    }
    if (chosen == nullptr && it->size() == 1) chosen = &(*it)[0];
    if (chosen == nullptr)
      return NotFound("tokenizer_config.json: no chat_template named 'default'");
    files.chat_template = (*chosen)["template"].get<std::string>();
  } else {
    return InvalidArgument("tokenizer_config.json: chat_template must be a string or a list");
  }
  OASIS_ASSIGN_OR_RETURN(files.bos_token, TokenString(config, "bos_token"));
  OASIS_ASSIGN_OR_RETURN(files.eos_token, TokenString(config, "eos_token"));
  return files;
}

StatusOr<ChatTemplateFiles> ChatTemplate::LoadFromTokenizerConfig(
    const std::filesystem::path& path) {
  OASIS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (JsonNestedDeeperThan(text)) {
    return InvalidArgument(path.string() + ": JSON nested deeper than " +
                           std::to_string(kMaxJsonDepth) + " levels");
  }
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return InvalidArgument(path.string() + ": invalid JSON");
  if (config.is_object() &&
      (!config.contains("chat_template") || config["chat_template"].is_null())) {
    std::filesystem::path beside = path.parent_path() / "chat_template.jinja";
    if (std::filesystem::exists(beside)) {
      OASIS_ASSIGN_OR_RETURN(std::string tmpl, ReadFile(beside));
      config["chat_template"] = tmpl;
    }
  }
  auto files = FromTokenizerConfig(config);
  if (!files.ok()) return files.status().WithContext(path.string());
  return files;
}

}  // namespace oasis

// Helpers for the Jinja unit tests: render a template string, or get its error.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/chat_template.h"

namespace oasis::jinja_test {

inline StatusOr<std::string> TryRender(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                                       const ChatTemplate::RenderOptions& options = {}) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(context, options);
}

// Renders and requires success.
inline std::string Render(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  auto out = TryRender(source, context);
  INFO("template: " << source);
  INFO("error: " << out.status().ToString());
  REQUIRE(out.ok());
  return *out;
}

// Renders and requires failure; returns the error message.
inline std::string RenderError(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                               const ChatTemplate::RenderOptions& options = {}) {
  auto out = TryRender(source, context, options);
  INFO("template: " << source);
  REQUIRE_FALSE(out.ok());
  return out.status().message();
}

}  // namespace oasis::jinja_test

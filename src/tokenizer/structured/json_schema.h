// Grammars of structured output (docs/structured_output.md): a JSON schema, any JSON object,
// a choice of strings.
//
// The JSON schema subset: type (one or a list), properties / required / additionalProperties,
// items / minItems / maxItems, enum, const, anyOf / oneOf (as anyOf), allOf of one schema,
// $ref to "#" or a JSON pointer into the schema ($defs, definitions), minLength / maxLength,
// OpenAPI's nullable. Annotations (title, description, default, examples, format, ...) do not
// constrain. Properties appear in the order the schema lists them; optional ones may be left
// out; without additionalProperties no other member is generated (vLLM's default).
// Assertions outside the subset (pattern, minimum, uniqueItems, ...) and unknown keywords are
// refused (InvalidArgument naming the keyword and where it is) rather than ignored.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/structured/grammar.h"

namespace oasis::structured {

inline constexpr int32_t kMaxGrammarNodes = 200000;
inline constexpr int kMaxSchemaNesting = 300;  // schemas within schemas, references included

// (ordered_json: the properties keep the order the request wrote them in.)
// `compact`: no whitespace between tokens. `whitespace_pattern` (non-empty): a regular
// expression (regex.h) for the whitespace between tokens instead of the bounded default
// (vLLM's whitespace_pattern); refused unless it can only match ' ', '\t', '\n', '\r'.
StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(
    const nlohmann::ordered_json& schema, bool compact = false,
    std::string_view whitespace_pattern = {});
// Any JSON object (response_format {"type": "json_object"}).
StatusOr<std::shared_ptr<const Grammar>> JsonObjectGrammar(
    bool compact = false, std::string_view whitespace_pattern = {});
// Exactly one of `choices` (vLLM's guided_choice); InvalidArgument for an empty list.
StatusOr<std::shared_ptr<const Grammar>> ChoiceGrammar(const std::vector<std::string>& choices);

// Forced tool calls (tool_choice "required" or naming a function): one to `max_calls` calls
// `{"name": "<tool>", "parameters": <its schema>}` separated by `;` (the llama3_json tool-call
// format, which the server's tool-call parser reads back into tool_calls). A tool without
// parameters takes any object.
struct ToolSchema {
  std::string name;
  const nlohmann::ordered_json* parameters = nullptr;  // null: any object
};
StatusOr<std::shared_ptr<const Grammar>> ToolCallsGrammar(const std::vector<ToolSchema>& tools,
                                                          int max_calls, bool compact = false);

}  // namespace oasis::structured

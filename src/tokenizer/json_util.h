// Small typed accessors for reading tokenizer.json with errors that name the JSON path
// ("tokenizer.json: model.merges[3]: expected a string"). Stateless, thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "oasis/status.h"

namespace oasis::tokenizer {

using Json = nlohmann::json;

inline Status JsonError(std::string_view path, std::string_view what) {
  return InvalidArgument(std::string(path) + ": " + std::string(what));
}

// The member `key` of `obj`, or nullptr when it is absent or null.
inline const Json* FindMember(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline StatusOr<bool> GetBool(const Json& obj, std::string_view key, std::string_view path,
                              bool default_value) {
  const Json* v = FindMember(obj, key);
  if (v == nullptr) return default_value;
  if (!v->is_boolean())
    return JsonError(std::string(path) + "." + std::string(key), "expected a boolean");
  return v->get<bool>();
}

inline StatusOr<std::string> GetString(const Json& obj, std::string_view key,
                                       std::string_view path) {
  const Json* v = FindMember(obj, key);
  if (v == nullptr) return JsonError(std::string(path) + "." + std::string(key), "missing string");
  if (!v->is_string())
    return JsonError(std::string(path) + "." + std::string(key), "expected a string");
  return v->get<std::string>();
}

// The "type" of a component object, e.g. "BPE" or "Split".
inline StatusOr<std::string> GetType(const Json& obj, std::string_view path) {
  if (!obj.is_object()) return JsonError(path, "expected an object");
  return GetString(obj, "type", path);
}

}  // namespace oasis::tokenizer

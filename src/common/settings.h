// A program's settings as one table of (flag name, member of its settings struct, help), from
// which both the command line (FlagParser) and a --config JSON file are read, flags winning
// over the file. oasis-server (ServerConfig) and oasis-router (RouterSettings) use it.
// Plain functions and templates; thread-compatible.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "oasis/status.h"

namespace oasis {

template <class Config>
struct SettingField {
  const char* name;  // flag name (with '-')
  std::variant<std::string Config::*, int64_t Config::*, double Config::*, bool Config::*> field;
  const char* help;
};

// A JSON key as a flag name ('_' -> '-').
std::string FlagName(std::string key);
// Pass 1 of a command line: the --config FILE / --config=FILE paths, in order.
StatusOr<std::vector<std::string>> ConfigPaths(int argc, char** argv);
// A --config file's JSON (comments allowed): NotFound / InvalidArgument naming the file.
StatusOr<nlohmann::json> ReadConfigJson(const std::string& path);
// The JSON of a --config file's `text` as ReadConfigJson parses it (`path` names it in errors);
// `callback` (optional) sees every parse event.
StatusOr<nlohmann::json> ParseConfigJson(const std::string& text, const std::string& path,
                                         const nlohmann::json::parser_callback_t& callback = {});

// The setting named `name` in `table`, or null.
template <class Config>
const SettingField<Config>* FindSetting(const std::vector<SettingField<Config>>& table,
                                        const std::string& name) {
  for (const SettingField<Config>& s : table) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

// Sets `s`'s member of `config` from a JSON value; InvalidArgument naming `where` when its type
// does not fit.
template <class Config>
Status ApplyJsonSetting(const SettingField<Config>& s, const nlohmann::json& value,
                        const std::string& where, Config* config) {
  if (auto* str = std::get_if<std::string Config::*>(&s.field)) {
    if (!value.is_string()) return InvalidArgument(where + " must be a string");
    config->** str = value.get<std::string>();
  } else if (auto* i = std::get_if<int64_t Config::*>(&s.field)) {
    if (!value.is_number_integer()) return InvalidArgument(where + " must be an integer");
    // A value past int64 must not wrap into another (18446744073709551615 became -1).
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument(where + " is too large: " + value.dump());
    }
    config->** i = value.get<int64_t>();
  } else if (auto* d = std::get_if<double Config::*>(&s.field)) {
    if (!value.is_number()) return InvalidArgument(where + " must be a number");
    config->** d = value.get<double>();
  } else if (auto* b = std::get_if<bool Config::*>(&s.field)) {
    if (!value.is_boolean()) return InvalidArgument(where + " must be true or false");
    config->** b = value.get<bool>();
  }
  return Status::Ok();
}

// A JSON object of settings (a config file's contents, named `source` in errors) applied to
// `config`: keys are flag names with '-' or '_', keys starting with '_' ("_comment") are skipped,
// unknown keys and wrong types are InvalidArgument errors naming the key. `special(name, value,
// where)` sees every key first and returns the outcome for the keys it handles itself, nullopt
// for the others (the table's).
template <class Config, class Special>
Status ApplySettingsJson(const nlohmann::json& json, const std::string& source,
                         const std::vector<SettingField<Config>>& table, Config* config,
                         Special special) {
  if (!json.is_object()) return InvalidArgument(source + ": expected a JSON object of settings");
  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') continue;
    const std::string name = FlagName(key);
    const std::string where = source + ": '" + key + "'";
    if (std::optional<Status> handled = special(name, value, where)) {
      OASIS_RETURN_IF_ERROR(*handled);
      continue;
    }
    const SettingField<Config>* setting = FindSetting(table, name);
    if (setting == nullptr) return InvalidArgument(source + ": unknown setting '" + key + "'");
    OASIS_RETURN_IF_ERROR(ApplyJsonSetting(*setting, value, where, config));
  }
  return Status::Ok();
}

template <class Config>
Status ApplySettingsJson(const nlohmann::json& json, const std::string& source,
                         const std::vector<SettingField<Config>>& table, Config* config) {
  return ApplySettingsJson(
      json, source, table, config,
      [](const std::string&, const nlohmann::json&, const std::string&) -> std::optional<Status> {
        return std::nullopt;
      });
}

// Binds every setting of `table` to its member of `config` as a flag (pass 2: the defaults are
// then whatever the config file set).
template <class Config>
void AddSettingFlags(FlagParser& flags, const std::vector<SettingField<Config>>& table,
                     Config* config) {
  for (const SettingField<Config>& s : table) {
    if (auto* str = std::get_if<std::string Config::*>(&s.field))
      flags.AddString(s.name, &(config->**str), s.help);
    if (auto* i = std::get_if<int64_t Config::*>(&s.field))
      flags.AddInt(s.name, &(config->**i), s.help);
    if (auto* d = std::get_if<double Config::*>(&s.field))
      flags.AddDouble(s.name, &(config->**d), s.help);
    if (auto* b = std::get_if<bool Config::*>(&s.field))
      flags.AddBool(s.name, &(config->**b), s.help);
  }
}

}  // namespace oasis

#include "router/router_settings.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/flags.h"
#include "common/http_util.h"
#include "common/settings.h"
#include "disagg/wire.h"

namespace oasis::router {
namespace {

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

using Setting = SettingField<RouterSettings>;

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> settings = [] {
    std::vector<Setting> table = {
        {"prefill", &RouterSettings::prefill,
         "prefill instances, host:port[,host:port...] (required)"},
        {"decode", &RouterSettings::decode,
         "decode instances, host:port[,host:port...] (required)"},
        {"host", &RouterSettings::host, "address to listen on"},
        {"port", &RouterSettings::port, "port to listen on; 0 = any free port (printed at start)"},
        {"api-key", &RouterSettings::api_key,
         "when set, clients need 'Authorization: Bearer KEY' (not for /health, /metrics)"},
        {"timeout-s", &RouterSettings::timeout_s,
         "seconds a decode instance may take for a non-streamed answer (it comes whole, at the end "
         "of the generation); also the send timeout of every upstream request"},
        {"connect-timeout-s", &RouterSettings::connect_timeout_s,
         "upstream connect timeout in seconds"},
        {"upstream-first-byte-timeout-s", &RouterSettings::upstream_first_byte_timeout_s,
         "seconds from sending a request to an instance to the first byte of its answer's body "
         "(a prefill: queueing and the whole prefill; a stream: admission and the first token)"},
        {"upstream-idle-timeout-s", &RouterSettings::upstream_idle_timeout_s,
         "seconds an instance's answer may stay silent between two pieces once it started (a "
         "stalled stream then ends with an error event and [DONE])"},
        {"http-threads", &RouterSettings::http_threads,
         "requests relayed at once (each holds a thread while it waits on its instances; open "
         "connections hold none); more get 503 with Retry-After"},
        {"max-body-bytes", &RouterSettings::max_body_bytes, "larger request bodies get 413"},
        {"log-level", &RouterSettings::log_level, "trace, debug, info, warn, error, off"},
        {"staging-secret", &RouterSettings::staging_secret,
         "the prefill instances' staging secret, for aborting the staged KV of a request whose "
         "decode leg failed (default $OASIS_STAGING_SECRET; prefer --staging-secret-file)"},
        {"staging-secret-file", &RouterSettings::staging_secret_file,
         "a file holding the staging secret (trailing newlines ignored)"},
    };
    for (Setting& s : HttpFrontSettingFields<RouterSettings>()) table.push_back(s);
    return table;
  }();
  return settings;
}

Status LoadConfigFile(const std::string& path, RouterSettings* settings) {
  OASIS_ASSIGN_OR_RETURN(const nlohmann::json json, ReadConfigJson(path));
  return ApplyRouterConfigJson(json, path, settings);
}

// "prefill" / "decode" in a config file: a "host:port" list as an array or a comma-separated
// string; nullopt for the other keys.
std::optional<Status> ApplyInstanceList(const std::string& name, const nlohmann::json& value,
                                        const std::string& where, RouterSettings* settings) {
  if (name != "prefill" && name != "decode") return std::nullopt;
  std::string list;
  if (value.is_string()) {
    list = value.get<std::string>();
  } else if (value.is_array()) {
    for (const auto& item : value) {
      if (!item.is_string())
        return InvalidArgument(where + " must be a list of \"host:port\" strings");
      if (!list.empty()) list += ",";
      list += item.get<std::string>();
    }
  } else {
    return InvalidArgument(where + " must be a list of \"host:port\" strings");
  }
  (name == "prefill" ? settings->prefill : settings->decode) = list;
  return Status::Ok();
}

}  // namespace

std::string Address::ToString() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

StatusOr<Address> ParseAddress(std::string_view text) {
  const std::string original(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgument("bad address '" + original + "': " + why + " (expected host:port)");
  };
  std::string s = Trim(text);
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  if (!s.empty() && s.back() == '/') s.pop_back();
  if (s.empty()) return bad("empty");
  std::string host, port;
  if (s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return bad("malformed [IPv6]:port");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("an IPv6 host needs brackets, [::1]:8000");
  }
  if (host.empty()) return bad("no host");
  for (char c : host) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '@' || c == '?' ||
        c == '#' || c == ',') {
      return bad("invalid character in the host");
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("the port must be a number in 1-65535");
  }
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return bad("the port must be a number in 1-65535");
  return Address{host, p};
}

StatusOr<std::vector<Address>> ParseAddressList(std::string_view text, const std::string& what) {
  std::vector<Address> out;
  if (Trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (Trim(item).empty())
      return InvalidArgument(what + ": empty entry in '" + std::string(text) + "'");
    StatusOr<Address> a = ParseAddress(item);
    if (!a.ok()) return InvalidArgument(what + ": " + a.status().message());
    if (std::find(out.begin(), out.end(), *a) != out.end())
      return InvalidArgument(what + ": " + a->ToString() + " is listed twice");
    out.push_back(*a);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

StatusOr<RouterOptions> RouterSettings::ToOptions() const {
  RouterOptions o;
  OASIS_ASSIGN_OR_RETURN(o.prefill, ParseAddressList(prefill, "--prefill"));
  OASIS_ASSIGN_OR_RETURN(o.decode, ParseAddressList(decode, "--decode"));
  if (o.prefill.empty()) {
    return InvalidArgument(
        "at least one prefill instance is required: --prefill host:port[,host:port...] or "
        "\"prefill\" in --config");
  }
  if (o.decode.empty()) {
    return InvalidArgument(
        "at least one decode instance is required: --decode host:port[,host:port...] or \"decode\" "
        "in --config");
  }
  for (const Address& a : o.prefill) {
    if (std::find(o.decode.begin(), o.decode.end(), a) != o.decode.end()) {
      return InvalidArgument(a.ToString() +
                             " is listed both as a prefill and as a decode instance: an instance "
                             "has one role (--role prefill or --role decode)");
    }
  }
  OASIS_ASSIGN_OR_RETURN(o.staging_secret, ResolveSecret());
  if (host.empty()) return InvalidArgument("--host must not be empty");
  if (!IsListenAddress(host)) {
    return InvalidArgument("--host must be an IP address (IPv4 or IPv6) or localhost, got '" +
                           host + "'");
  }
  if (port < 0 || port > 65535)
    return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(port));
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"--timeout-s", timeout_s},
        {"--connect-timeout-s", connect_timeout_s},
        {"--upstream-first-byte-timeout-s", upstream_first_byte_timeout_s},
        {"--upstream-idle-timeout-s", upstream_idle_timeout_s}}) {
    // Written so that NaN fails too.
    if (!(value > 0 && value <= kMaxTimeoutS)) {
      return InvalidArgument(std::string(name) + " must be a number of seconds in (0, " +
                             Number(kMaxTimeoutS) + "], got " + Number(value));
    }
  }
  if (http_threads < 1 || http_threads > 4096) {
    return InvalidArgument("--http-threads must be in [1, 4096], got " +
                           std::to_string(http_threads));
  }
  if (max_body_bytes < 1)
    return InvalidArgument("--max-body-bytes must be positive, got " +
                           std::to_string(max_body_bytes));
  OASIS_RETURN_IF_ERROR(CheckHttpFront());
  o.front = *this;  // the HttpFrontSettings part
  o.api_key = api_key;
  o.timeout_s = timeout_s;
  o.connect_timeout_s = connect_timeout_s;
  o.upstream_first_byte_timeout_s = upstream_first_byte_timeout_s;
  o.upstream_idle_timeout_s = upstream_idle_timeout_s;
  o.http_threads = http_threads;
  o.max_body_bytes = max_body_bytes;
  return o;
}

StatusOr<std::string> RouterSettings::ResolveSecret() const {
  const size_t kMaxSecretBytes = disagg::kMaxSecretBytes;
  std::string secret, source;
  if (!staging_secret_file.empty()) {
    if (!staging_secret.empty())
      return InvalidArgument("--staging-secret and --staging-secret-file exclude each other");
    std::error_code ec;
    if (std::filesystem::is_directory(staging_secret_file, ec))
      return InvalidArgument("--staging-secret-file " + staging_secret_file + " is a directory");
    std::ifstream in(staging_secret_file, std::ios::binary);
    std::string text;
    char buf[4096];
    while (in && text.size() <= kMaxSecretBytes + 2) {
      in.read(buf, sizeof buf);
      text.append(buf, static_cast<size_t>(in.gcount()));
    }
    if (!in.eof())
      return InvalidArgument("--staging-secret-file " + staging_secret_file + ": cannot be read");
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty())
      return InvalidArgument("--staging-secret-file " + staging_secret_file + " is empty");
    secret = std::move(text);
    source = "--staging-secret-file " + staging_secret_file;
  } else if (!staging_secret.empty()) {
    secret = staging_secret;
    source = "--staging-secret";
  } else if (const char* env = std::getenv("OASIS_STAGING_SECRET"); env != nullptr) {
    secret = env;
    source = "$OASIS_STAGING_SECRET";
  }
  if (secret.size() > kMaxSecretBytes) {
    return InvalidArgument(source + ": the staging secret must be at most " +
                           std::to_string(kMaxSecretBytes) + " bytes");
  }
  return secret;
}

Status ApplyRouterConfigJson(const nlohmann::json& json, const std::string& source,
                             RouterSettings* settings) {
  return ApplySettingsJson(
      json, source, Settings(), settings,
      [settings](const std::string& name, const nlohmann::json& value, const std::string& where) {
        return ApplyInstanceList(name, value, where, settings);
      });
}

StatusOr<RouterCommandLine> ParseRouterCommandLine(int argc, char** argv) {
  RouterCommandLine out;
  // Pass 1: the config file, so that flags given on the command line override it.
  OASIS_ASSIGN_OR_RETURN(const std::vector<std::string> paths, ConfigPaths(argc, argv));
  for (const std::string& path : paths) OASIS_RETURN_IF_ERROR(LoadConfigFile(path, &out.settings));
  // Pass 2: flags, bound to the fields (their defaults now being the file's values).
  FlagParser flags(
      "oasis-router: the OpenAI HTTP front of disaggregated prefill/decode. Each request goes to "
      "a\n"
      "prefill instance (oasis-server --role prefill), then with its handoff ticket to a decode\n"
      "instance (--role decode), whose answer is streamed back. Holds no model.\n"
      "Settings come from --config FILE (JSON, keys = flag names; \"prefill\"/\"decode\" may be "
      "lists)\n"
      "and flags, flags winning.");
  std::string config_path;
  flags.AddString("config", &config_path, "JSON file of settings (keys: the flag names)");
  RouterSettings& s = out.settings;
  AddSettingFlags(flags, Settings(), &s);
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  out.help = flags.help_requested();
  out.usage = flags.Usage();
  if (!out.help) {
    OASIS_ASSIGN_OR_RETURN(out.options, s.ToOptions());
  }
  return out;
}

}  // namespace oasis::router

// oasis-router's settings: instance addresses, the settings table read from the command line
// and --config, and the validated options the Router runs with. Plain value types and pure
// functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http_front_settings.h"
#include "oasis/status.h"

namespace oasis::router {

struct Address {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port" ("[v6]:port")
  bool operator==(const Address&) const = default;
};

// "host:port", "[::1]:port" or "http://host:port[/]"; the port must be in [1, 65535].
// Errors name the value.
StatusOr<Address> ParseAddress(std::string_view text);
// A comma-separated list of addresses (blanks around entries ignored; no empty entries, no
// address twice). `what` names the list in errors ("--prefill").
StatusOr<std::vector<Address>> ParseAddressList(std::string_view text, const std::string& what);

// The longest any upstream timeout may be (one day): larger values, infinity and NaN are
// errors, not silent overflows of the socket timeouts.
inline constexpr double kMaxTimeoutS = 86400;

struct RouterOptions {
  std::vector<Address> prefill;
  std::vector<Address> decode;
  std::string api_key;  // empty: no authentication
  // Upstream timeouts (router.h §7), seconds, each in (0, kMaxTimeoutS].
  double timeout_s = 600;                      // a non-streamed decode answer, whole
  double connect_timeout_s = 5;                // TCP connect
  double upstream_first_byte_timeout_s = 300;  // request sent -> first byte of the answer's body
  double upstream_idle_timeout_s = 60;         // silence between two pieces of an answer
  int64_t http_threads = 256;  // requests in flight at most (each holds a thread); more: 503
  int64_t max_body_bytes = 32 << 20;
  HttpFrontSettings front;        // the client side's connection limit and timeouts
  int health_interval_ms = 1000;  // GET /health of every instance this often
  int health_timeout_ms = 1000;
  // The prefill instances' staging secret (--staging-secret-file, --staging-secret or
  // $OASIS_STAGING_SECRET; empty: none), sent when the router aborts a staged lease whose
  // decode leg failed (router.h §3).
  std::string staging_secret;
};

// Everything the command line and --config give (the flag names, '-' or '_' in the file); the
// HTTP front's limits and timeouts are the base's.
struct RouterSettings : HttpFrontSettings {
  std::string prefill;  // comma-separated host:port list (an array in the config file)
  std::string decode;
  std::string host = "127.0.0.1";
  int64_t port = 8000;  // 0: any free port
  std::string api_key;
  double timeout_s = 600;
  double connect_timeout_s = 5;
  double upstream_first_byte_timeout_s = 300;
  double upstream_idle_timeout_s = 60;
  int64_t http_threads = 256;
  int64_t max_body_bytes = 32 << 20;
  std::string log_level = "info";
  std::string staging_secret;       // as the instances' flags; $OASIS_STAGING_SECRET otherwise
  std::string staging_secret_file;  // excludes staging_secret

  // Range checks and address parsing.
  StatusOr<RouterOptions> ToOptions() const;
  // The staging secret from staging_secret_file, staging_secret or $OASIS_STAGING_SECRET.
  StatusOr<std::string> ResolveSecret() const;
};

struct RouterCommandLine {
  RouterSettings settings;
  RouterOptions options;  // valid unless help
  bool help = false;
  std::string usage;
};

// A JSON object of settings (the config file's contents) applied to `settings`; unknown keys and
// wrong types are errors naming the key.
Status ApplyRouterConfigJson(const nlohmann::json& json, const std::string& source,
                             RouterSettings* settings);
// Reads --config FILE (when given), applies the other flags on top, validates.
StatusOr<RouterCommandLine> ParseRouterCommandLine(int argc, char** argv);

}  // namespace oasis::router

// What oasis-server and oasis-router share about their HTTP front: its limits and timeouts as
// settings (docs/server.md, "Limits and timeouts"; ServerConfig and RouterSettings derive from
// HttpFrontSettings: one table of flags, one range check, one conversion to HttpFrontOptions).
// Plain value types and pure functions; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/http_front.h"
#include "common/settings.h"
#include "oasis/status.h"

namespace oasis {

struct HttpFrontSettings {
  int64_t max_connections = 4096;   // open HTTP connections at most
  double keep_alive_timeout_s = 5;  // an idle keep-alive connection is closed after this
  double header_timeout_s = 10;     // request line + headers, from their first byte
  double body_timeout_s = 60;       // the request body, after the headers
  double write_timeout_s = 30;      // a response write that makes no progress
  double shutdown_timeout_s = 10;   // SIGTERM: live responses end within this, then cut

  // InvalidArgument naming the flag: connections in [1, 1e6]; timeouts finite, in (0, 86400]
  // seconds (the shutdown timeout may be 0: cut at once).
  Status CheckHttpFront() const;
  // The limits and timeouts above into `options` (threads and the body limit are the caller's).
  void ApplyTo(HttpFrontOptions* options) const;
  std::chrono::milliseconds shutdown_deadline() const;
};

// Seconds as milliseconds, rounded.
std::chrono::milliseconds SecondsToMs(double seconds);

// The flags of HttpFrontSettings for a program whose settings struct derives from it.
template <class Config>
std::vector<SettingField<Config>> HttpFrontSettingFields() {
  using B = HttpFrontSettings;
  return {
      {"max-connections", static_cast<int64_t Config::*>(&B::max_connections),
       "open HTTP connections at most; past it the longest-idle keep-alive connection is closed, "
       "or the new one gets 503 with Retry-After"},
      {"keep-alive-timeout-s", static_cast<double Config::*>(&B::keep_alive_timeout_s),
       "an idle keep-alive HTTP connection is closed after this many seconds"},
      {"header-timeout-s", static_cast<double Config::*>(&B::header_timeout_s),
       "the request line and headers must arrive within this many seconds of their first byte "
       "(else 408)"},
      {"body-timeout-s", static_cast<double Config::*>(&B::body_timeout_s),
       "the request body must arrive within this many seconds of the headers (else 408)"},
      {"write-timeout-s", static_cast<double Config::*>(&B::write_timeout_s),
       "a response write that makes no progress for this many seconds cuts the connection"},
      {"shutdown-timeout-s", static_cast<double Config::*>(&B::shutdown_timeout_s),
       "on SIGINT/SIGTERM, live responses end (streams with an abort and [DONE]) within this "
       "many seconds; slower clients are cut"},
  };
}

}  // namespace oasis

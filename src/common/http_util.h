// Small helpers both HTTP front ends (oasis-server, oasis-router) share. Pure functions;
// thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace oasis {

// Constant-time comparison of a presented API key with the configured one: its time depends
// only on the presented key's length.
bool KeyMatches(const std::string& presented, const std::string& key);
// `s` without the blanks around it (a header value, an entry of a comma-separated list).
std::string Trim(std::string_view s);
// Escapes a Prometheus label value (backslash, quote, newline).
std::string EscapeLabel(const std::string& value);

}  // namespace oasis

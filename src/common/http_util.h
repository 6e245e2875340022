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
// A client's string as an error message quotes it: at most `max_bytes` bytes, cut at a UTF-8
// character boundary and marked "..." when cut (a 100 KB model name must not make a 100 KB
// error: a gRPC status that large never reaches the client).
std::string Clip(std::string_view s, size_t max_bytes);
// A listening address the front ends can bind: an IPv4 or IPv6 literal (IPv6 also in
// brackets, "[::1]"), or "localhost".
bool IsListenAddress(const std::string& host);
// `host` without the brackets around an IPv6 literal ("[::1]" -> "::1"); others as they are.
std::string UnbracketHost(const std::string& host);
// Escapes a Prometheus label value (backslash, quote, newline).
std::string EscapeLabel(const std::string& value);

}  // namespace oasis

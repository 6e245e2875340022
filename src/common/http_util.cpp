#include "common/http_util.h"

#include <arpa/inet.h>

#include <cctype>

namespace oasis {

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string Clip(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes > 3 ? max_bytes - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not mid-character
  return std::string(s.substr(0, n)) + "...";
}

std::string UnbracketHost(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

bool IsListenAddress(const std::string& host) {
  if (host == "localhost") return true;
  const std::string bare = UnbracketHost(host);
  unsigned char buf[sizeof(in6_addr)];
  if (bare != host) return inet_pton(AF_INET6, bare.c_str(), buf) == 1;  // [v6] only
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool KeyMatches(const std::string& presented, const std::string& key) {
  // Every presented byte is compared (against the key, repeated): the time depends on the
  // presented length only, never on the key's length or on where the two differ.
  unsigned char diff = presented.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < presented.size(); ++i) {
    const char k = key.empty() ? '\0' : key[i % key.size()];
    diff |= static_cast<unsigned char>(presented[i] ^ k);
  }
  return diff == 0;
}

std::string EscapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace oasis

#include "common/http_util.h"

#include <cctype>

namespace oasis {

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool KeyMatches(const std::string& presented, const std::string& key) {
  if (presented.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(presented[i] ^ key[i]);
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

#include "common/http_util.h"

namespace oasis {

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

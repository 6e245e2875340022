#include "tokenizer/byte_level.h"

#include <cstdint>

#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> alphabet;  // byte -> UTF-8 of its character
  std::array<int16_t, 324> char_to_byte;  // code point (< 324) -> byte, or -1
};

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.char_to_byte.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t c =
          printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
      AppendUtf8(c, &t.alphabet[b]);
      t.char_to_byte[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::array<std::string, 256>& ByteLevelAlphabet() { return GetTables().alphabet; }

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(token.size());
  const char* p = token.data();
  const char* end = p + token.size();
  while (p < end) {
    char32_t c;
    p += DecodeUtf8(p, end, &c);
    if (c >= t.char_to_byte.size() || t.char_to_byte[c] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.char_to_byte[c]));
  }
  return out;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  for (unsigned char b : bytes) out += t.alphabet[b];
  return out;
}

}  // namespace oasis::tokenizer

#include "random_text.h"

#include <vector>

#include "tokenizer/utf8.h"

namespace oasis::tokenizer::testing {

std::string RandomText(std::mt19937& rng, int max_chars) {
  // [first, last] code point ranges; the first ones are picked more often.
  static const std::vector<std::pair<char32_t, char32_t>> kRanges = {
      {'a', 'z'},         {' ', ' '},         {'0', '9'},         {'!', '/'},
      {'\t', '\r'},       {'A', 'Z'},         {0xA0, 0xFF},       {0x300, 0x36F},   // Latin-1, marks
      {0x391, 0x3C9},     {0x410, 0x44F},     {0x5D0, 0x5EA},     {0x627, 0x64A},   // Greek, Cyrillic, Hebrew, Arabic
      {0x905, 0x94D},     {0xE01, 0xE3A},     {0x1100, 0x1175},   {0xAC00, 0xD7A3}, // Devanagari, Thai, Jamo, Hangul
      {0x4E00, 0x9FFF},   {0x3040, 0x30FF},   {0x1F300, 0x1F64F}, {0x1F3FB, 0x1F3FF}, // CJK, kana, emoji, skin
      {0x200B, 0x200F},   {0x2028, 0x2029},   {0x1F1E6, 0x1F1FF}, {0x10000, 0x2FFFF}, // ZW*, LS/PS, flags, astral
      {0x85, 0x85},       {0xFE0F, 0xFE0F},   {0x0, 0x1F},        {0x20000, 0x2A6DF},
  };
  std::uniform_int_distribution<int> length(0, max_chars);
  std::geometric_distribution<int> pick(0.12);
  std::string out;
  const int n = length(rng);
  for (int i = 0; i < n; ++i) {
    const auto& [lo, hi] = kRanges[static_cast<size_t>(pick(rng)) % kRanges.size()];
    std::uniform_int_distribution<uint32_t> c(lo, hi);
    AppendUtf8(c(rng), &out);
  }
  return out;
}

}  // namespace oasis::tokenizer::testing

// Sets of Unicode code points for the grammars' character classes (regular expressions, GBNF
// grammars): normalised ranges, and the grammar node that matches one member as its UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/structured/grammar.h"

namespace oasis::structured {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, disjoint, non-adjacent ranges, without surrogates (they have no UTF-8 form).
using CodePoints = std::vector<std::pair<uint32_t, uint32_t>>;

CodePoints NormalizeCodePoints(const CodePoints& in);
inline CodePoints SingleCodePoint(uint32_t cp) { return {{cp, cp}}; }
// Every other code point (surrogates aside).
CodePoints NegateCodePoints(const CodePoints& set);

// Whether `cp` is a Unicode scalar value (in range, not a surrogate): what escapes may name.
inline bool IsScalarValue(uint32_t cp) {
  return cp <= kMaxCodePoint && (cp < 0xD800 || cp > 0xDFFF);
}
// A hex digit's value; -1 for anything else.
inline int HexDigit(uint32_t c) {
  return c >= '0' && c <= '9'   ? static_cast<int>(c - '0')
         : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
         : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10)
                                : -1;
}

std::string EncodeUtf8(uint32_t cp);
// The code points of `s`; false for bytes that are not UTF-8 (overlong forms and surrogates
// included).
bool DecodeUtf8(std::string_view s, std::vector<uint32_t>* out);
// How a code point is written between a JSON string's quotes: '"', '\' and controls as their
// escapes (\" \\ \b \f \n \r \t, else \u00XX), the rest as UTF-8.
std::string JsonEscaped(uint32_t cp);

// A node of `g` matching one code point of the (non-empty, normalised) `set` as its UTF-8 bytes
// — or, `json_string`, as JsonEscaped writes it: one byte-set node for the one-byte forms,
// sequences of byte ranges for the longer ones.
int32_t CodePointsNode(Grammar* g, const CodePoints& set, bool json_string);

}  // namespace oasis::structured

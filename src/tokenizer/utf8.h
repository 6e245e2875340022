// UTF-8 helpers for the tokenizer: validation, lossy repair (invalid bytes -> U+FFFD, one per
// maximal invalid subpart, exactly like Rust's String::from_utf8_lossy that HF tokenizers uses),
// the "complete prefix" test the incremental detokenizer needs, and the two character classes
// HF's added-token flags use. Free functions over byte strings; stateless and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace oasis::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// True when `bytes` is well-formed UTF-8 (Unicode Table 3-7: no overlongs, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// Appends `bytes` to `out`, replacing each maximal invalid subpart by U+FFFD.
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// The length of the longest prefix of `bytes` whose lossy decoding can not change whatever bytes
// follow: everything except a trailing, still possibly valid, incomplete sequence (at most 3
// bytes).
size_t StableUtf8PrefixLength(std::string_view bytes);

// Decodes the code point at `p` (well-formed UTF-8 assumed, at least one byte before `end`);
// returns its length in bytes.
int DecodeUtf8(const char* p, const char* end, char32_t* code_point);

// The length in bytes of the UTF-8 sequence led by `lead` (1 for an invalid lead byte).
inline int Utf8SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return lead <= 0xF4 ? 4 : 1;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC2) return 2;
  return 1;
}

void AppendUtf8(char32_t code_point, std::string* out);

// The Unicode White_Space property (Rust regex's \s, used by HF for lstrip/rstrip).
bool IsUnicodeWhitespace(char32_t c);
// Rust regex's Unicode \w (used by HF for single_word): Alphabetic, marks, decimal digits,
// connector punctuation and Join_Control — Alphabetic approximated by L*, Nl and circled letters.
bool IsUnicodeWordChar(char32_t c);

}  // namespace oasis::tokenizer

// UTF-8 helpers giving Python str semantics (code-point indexing, Unicode whitespace and case)
// over the UTF-8 bytes that Values hold. Invalid bytes decode to U+DC80..U+DCFF (Python's
// "surrogateescape") and encode back to the same byte, so no input is ever rejected or altered.
// Stateless free functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace oasis::jinja::utf8 {

std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view s);
void Append(std::string& out, char32_t c);
size_t Length(std::string_view s);  // in code points

// Python str.isspace().
bool IsSpace(char32_t c);
// Python str.isprintable() for one code point (repr escapes the others).
bool IsPrintable(char32_t c);
bool IsAlpha(char32_t c);
bool IsDigit(char32_t c);
bool IsUpper(char32_t c);
bool IsLower(char32_t c);
char32_t ToUpper(char32_t c);
char32_t ToLower(char32_t c);
char32_t ToTitle(char32_t c);

std::string Upper(std::string_view s);
std::string Lower(std::string_view s);

}  // namespace oasis::jinja::utf8

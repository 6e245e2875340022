// Regular expressions as byte grammars (structured output's guided_regex and JSON Schema's
// "pattern"). The whole output must match (as vLLM's backends do): a leading ^ and a trailing $
// are accepted and change nothing.
//
// The syntax is Python's `re` (which JSON schemas and vLLM's clients write): alternation,
// groups ((...), (?:...), (?P<name>...), (?<name>...)), the quantifiers * + ? {n} {n,} {,m}
// {n,m} and their lazy forms (the same language), classes [...] with ranges and negation,
// '.' (any character but a newline), \d \w \s and their negations (ASCII: [0-9],
// [A-Za-z0-9_], [ \t\n\r\f\v]), escapes \n \t \r \f \v \0 \xHH \uHHHH \UHHHHHHHH \u{H...}.
// Refused with a clear error: backreferences, lookaround, word boundaries, inline flags,
// anchors elsewhere than at the ends, possessive quantifiers, \p{...} classes, classes that
// match nothing, bounds above kMaxRegexRepeat, patterns longer than kMaxRegexBytes.
// Characters are Unicode code points, matched as their UTF-8 bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "oasis/status.h"
#include "tokenizer/structured/charset.h"
#include "tokenizer/structured/grammar.h"

namespace oasis::structured {

inline constexpr size_t kMaxRegexBytes = 16384;
inline constexpr int32_t kMaxRegexRepeat = 1000;

// Adds the nodes matching `pattern` to `g` and returns the top one. `json_string`: they match
// the text a JSON string holds between its quotes for a value that matches the pattern ('"',
// '\' and control characters written as their escapes: \" \\ \n \t \r \b \f, else \u00XX).
// `matched` (optional) gets every character a text of the pattern may hold.
StatusOr<int32_t> CompileRegex(std::string_view pattern, Grammar* g, bool json_string,
                               CodePoints* matched = nullptr);

// A grammar of exactly the texts `pattern` matches.
StatusOr<std::shared_ptr<const Grammar>> RegexGrammar(std::string_view pattern);

}  // namespace oasis::structured

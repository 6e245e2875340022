// GBNF grammars (structured output's guided_grammar, as vLLM's xgrammar backend and
// llama.cpp take them) as byte grammars.
//
//   root   ::= answer ("," ws answer)*     # rules: a name, "::=", alternatives; '#' comments
//   answer ::= "yes" | "no" | [0-9]{1,3}
//   ws     ::= [ \t\n]*
//
// Rule names are letters, digits, '-' and '_'; a rule ends where the next "name ::=" begins
// (newlines are whitespace). Elements: "literal" (escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH
// \uHHHH \UHHHHHHHH), character classes [a-z_] / [^"\\] (escapes as in literals), '.' (any
// character), rule references, groups ( ... ), and the quantifiers * + ? {m} {m,} {m,n} (bounds up
// to kMaxGbnfRepeat). The text must match the rule `root`. Refused with the line and the reason:
// syntax errors, undefined or twice-defined rules, a missing root, left recursion (a rule that
// reaches itself before any character), rules that can never end, classes that match nothing,
// grammars over kMaxGbnfBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "oasis/status.h"
#include "tokenizer/structured/grammar.h"

namespace oasis::structured {

inline constexpr size_t kMaxGbnfBytes = 65536;
inline constexpr int32_t kMaxGbnfRepeat = 1000;

StatusOr<std::shared_ptr<const Grammar>> GbnfGrammar(std::string_view text);

}  // namespace oasis::structured

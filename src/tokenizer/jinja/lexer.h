// Jinja lexer: template source -> tokens, reproducing Jinja2's lexer as transformers configures
// it (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False): newlines normalised to
// "\n", one trailing newline dropped, `{%-`/`-%}` whitespace control, `{%+`/`+%}`, comments,
// `{% raw %}`, Python string-literal escapes. Stateless; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "oasis/status.h"

namespace oasis::jinja {

enum class TokenKind {
  kData,        // literal template text (text)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier (text)
  kString,      // string literal, unescaped (text)
  kInteger,     // (integer)
  kFloat,       // (number)
  kOperator,    // punctuation / operator (text)
  kEnd,         // end of input
};

struct Token {
  TokenKind kind;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  int line = 1;
  int column = 1;  // 1-based, in bytes of the normalised source
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Errors are InvalidArgument("line:col: message").
StatusOr<std::vector<Token>> Tokenize(const std::string& source, const LexerOptions& options = {});

}  // namespace oasis::jinja

// Jinja parser: tokens -> syntax tree, following Jinja2's grammar and operator precedence
// (filters bind tighter than arithmetic, `-x|f` is f(-x), `a if b else c`, chained comparisons).
// Supports the statements chat templates use: if/elif/else, for (with `if` filter and else),
// set (incl. `ns.attr` and block set), macro, filter blocks, break/continue, and transformers'
// `{% generation %}`. Unsupported tags (include, extends, call, ...) are Unimplemented errors.
// Stateless; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "oasis/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace oasis::jinja {

// A parsed template. Immutable; shared by all renders (thread-safe to read).
struct Template {
  Body body;
};

struct ParseOptions {
  LexerOptions lexer;
  int max_nesting = 200;  // expression / statement nesting depth
};

// Errors are InvalidArgument / Unimplemented with "line:col: message".
StatusOr<std::shared_ptr<const Template>> ParseTemplate(const std::string& source,
                                                        const ParseOptions& options = {});

}  // namespace oasis::jinja

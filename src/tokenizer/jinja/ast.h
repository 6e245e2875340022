// The syntax tree of a parsed template. Nodes are plain structs owned through unique_ptr by
// their parent; the whole tree is owned by Template (parser.h) and is immutable after parsing,
// so it can be walked by many renders at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace oasis::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // [args...] (also tuples)
  kDict,      // {kwargs...} as (key expr in args[2i], value in args[2i+1])
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
  kCall,      // args[0](args[1..], kwargs)
  kFilter,    // args[0] | name(args[1..], kwargs)
  kTest,      // args[0] is [not] name(args[1..]); negated
  kUnary,     // op args[0]: "-", "+", "not"
  kBinary,    // args[0] op args[1]: + - * / // % ** ~ and or
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (== != < <= > >= in notin)
  kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;  // name, attribute, filter/test name, or unary/binary operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // comparison operators
  bool negated = false;
  // 1 + the tallest child's height (the parser's Adopt keeps it): evaluating and destroying an
  // expression recurse this deep, so the parser refuses trees taller than its nesting limit.
  int height = 1;
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (cond, body)...; else_body
  kFor,       // for targets in expr [if filter]: body [else else_body]
  kSet,       // set targets = expr   (namespace attribute when ns_attr is set)
  kSetBlock,  // set targets[0] [| filters] %} body {% endset
  kMacro,     // macro name(params) body
  kBreak,
  kContinue,
  kFilterBlock,  // filter expr (the filter chain applied to a placeholder) body
  kBlock,        // a plain body (e.g. transformers' {% generation %})
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // for-loop condition, or set-block filter chain (applied to a kName "")
  std::vector<std::string> targets;
  std::string ns_attr;  // `set ns.attr = ...`: targets = {ns}, ns_attr = attr
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

}  // namespace oasis::jinja

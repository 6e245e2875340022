// Expression grammar of the Jinja parser (precedence as in Jinja2's parser.py).
#include "tokenizer/jinja/parser_impl.h"

namespace oasis::jinja::detail {

// ---- expressions ------------------------------------------------------------------------------

StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr, bool explicit_parens) {
  const Token at = Cur();
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) OASIS_RETURN_IF_ERROR(ExpectOp(","));
    TokenKind k = Cur().kind;
    if (k == TokenKind::kVarEnd || k == TokenKind::kBlockEnd || IsOp(")") || IsName("recursive") ||
        (!items.empty() && IsName("if"))) {
      break;
    }
    OASIS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
    items.push_back(std::move(e));
    if (IsOp(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) return Error(at, "Expected an expression, got " + Describe(at));
  }
  ExprPtr list = Node(ExprKind::kList, at);
  list->name = "tuple";
  list->args = std::move(items);
  return list;
}

StatusOr<ExprPtr> Parser::ParseCondExpr() {
  DepthGuard guard(depth_);
  OASIS_RETURN_IF_ERROR(CheckDepth());
  OASIS_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*expr));
    const Token at = Cur();
    Next();
    ExprPtr e = Node(ExprKind::kCondExpr, at);
    OASIS_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr otherwise;
    if (SkipName("else")) {
      OASIS_ASSIGN_OR_RETURN(otherwise, ParseCondExpr());
    }
    Adopt(*e, std::move(expr));
    Adopt(*e, std::move(cond));
    Adopt(*e, std::move(otherwise));
    expr = std::move(e);
  }
  return expr;
}

StatusOr<ExprPtr> Parser::ParseOr() {
  OASIS_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName("or")) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*left));
    ExprPtr e = Node(ExprKind::kBinary, Cur());
    Next();
    e->name = "or";
    OASIS_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    Adopt(*e, std::move(left));
    Adopt(*e, std::move(right));
    left = std::move(e);
  }
  return left;
}

StatusOr<ExprPtr> Parser::ParseAnd() {
  OASIS_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName("and")) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*left));
    ExprPtr e = Node(ExprKind::kBinary, Cur());
    Next();
    e->name = "and";
    OASIS_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    Adopt(*e, std::move(left));
    Adopt(*e, std::move(right));
    left = std::move(e);
  }
  return left;
}

StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    DepthGuard guard(depth_);
    OASIS_RETURN_IF_ERROR(CheckDepth());
    ExprPtr e = Node(ExprKind::kUnary, Cur());
    Next();
    e->name = "not";
    OASIS_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    Adopt(*e, std::move(operand));
    return e;
  }
  return ParseCompare();
}

StatusOr<ExprPtr> Parser::ParseCompare() {
  const Token at = Cur();
  OASIS_ASSIGN_OR_RETURN(ExprPtr first, ParseBinary(0));
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (Cur().kind == TokenKind::kOperator &&
        (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
         Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      Next();
    } else if (IsName("in")) {
      op = "in";
      Next();
    } else if (IsName("not") && Peek().kind == TokenKind::kName && Peek().text == "in") {
      op = "notin";
      Next();
      Next();
    } else {
      break;
    }
    if (!cmp) {
      cmp = Node(ExprKind::kCompare, at);
      Adopt(*cmp, std::move(first));
    }
    OASIS_ASSIGN_OR_RETURN(ExprPtr operand, ParseBinary(0));
    cmp->ops.push_back(op);
    Adopt(*cmp, std::move(operand));
  }
  return cmp ? std::move(cmp) : std::move(first);
}

// Levels: 0: + -   1: ~   2: * / // %   3: **   then unary.
StatusOr<ExprPtr> Parser::ParseBinary(int level) {
  static const std::vector<std::vector<std::string>> kLevels = {
      {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  if (level == 4) return ParseUnary(true);
  OASIS_ASSIGN_OR_RETURN(ExprPtr left, ParseBinary(level + 1));
  while (Cur().kind == TokenKind::kOperator) {
    const auto& ops = kLevels[level];
    if (std::find(ops.begin(), ops.end(), Cur().text) == ops.end()) break;
    OASIS_RETURN_IF_ERROR(CheckHeight(*left));
    ExprPtr e = Node(ExprKind::kBinary, Cur());
    e->name = Cur().text;
    Next();
    OASIS_ASSIGN_OR_RETURN(ExprPtr right, ParseBinary(level + 1));
    Adopt(*e, std::move(left));
    Adopt(*e, std::move(right));
    left = std::move(e);
  }
  return left;
}

StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(depth_);
  OASIS_RETURN_IF_ERROR(CheckDepth());
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    node = Node(ExprKind::kUnary, Cur());
    node->name = Cur().text;
    Next();
    OASIS_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    Adopt(*node, std::move(operand));
  } else {
    OASIS_ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  OASIS_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) return ParseFilterExpr(std::move(node));
  return node;
}

StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token at = Cur();
  switch (at.kind) {
    case TokenKind::kName: {
      Next();
      ExprPtr e = Node(ExprKind::kLiteral, at);
      if (at.text == "true" || at.text == "True") {
        e->literal = Value(true);
      } else if (at.text == "false" || at.text == "False") {
        e->literal = Value(false);
      } else if (at.text == "none" || at.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = ExprKind::kName;
        e->name = at.text;
      }
      return e;
    }
    case TokenKind::kString: {
      std::string s;
      while (Cur().kind == TokenKind::kString) {
        s += Cur().text;
        Next();
      }
      ExprPtr e = Node(ExprKind::kLiteral, at);
      e->literal = Value(std::move(s));
      return e;
    }
    case TokenKind::kInteger:
    case TokenKind::kFloat: {
      Next();
      ExprPtr e = Node(ExprKind::kLiteral, at);
      e->literal = at.kind == TokenKind::kInteger ? Value(at.integer) : Value(at.number);
      return e;
    }
    default:
      break;
  }
  if (SkipOp("(")) {
    OASIS_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, true));
    OASIS_RETURN_IF_ERROR(ExpectOp(")"));
    return e;
  }
  if (SkipOp("[")) {
    ExprPtr e = Node(ExprKind::kList, at);
    while (!IsOp("]")) {
      if (!e->args.empty()) OASIS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      OASIS_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      Adopt(*e, std::move(item));
    }
    Next();
    return e;
  }
  if (SkipOp("{")) {
    ExprPtr e = Node(ExprKind::kDict, at);
    while (!IsOp("}")) {
      if (!e->args.empty()) OASIS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      OASIS_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
      OASIS_RETURN_IF_ERROR(ExpectOp(":"));
      OASIS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      Adopt(*e, std::move(key));
      Adopt(*e, std::move(value));
    }
    Next();
    return e;
  }
  return Error(at, "unexpected " + Describe(at));
}

StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*node));
    const Token at = Cur();
    if (SkipOp(".")) {
      if (Cur().kind == TokenKind::kName) {
        ExprPtr e = Node(ExprKind::kGetAttr, at);
        e->name = Cur().text;
        Adopt(*e, std::move(node));
        node = std::move(e);
      } else if (Cur().kind == TokenKind::kInteger) {
        ExprPtr e = Node(ExprKind::kGetItem, at);
        ExprPtr index = Node(ExprKind::kLiteral, Cur());
        index->literal = Value(Cur().integer);
        Adopt(*e, std::move(node));
        Adopt(*e, std::move(index));
        node = std::move(e);
      } else {
        return Unexpected("a name or number after '.'");
      }
      Next();
    } else if (SkipOp("[")) {
      OASIS_ASSIGN_OR_RETURN(ExprPtr sub, ParseSubscribed());
      OASIS_RETURN_IF_ERROR(ExpectOp("]"));
      if (sub->kind == ExprKind::kSlice && sub->args.size() == 3 && sub->name == "slice") {
        sub->name.clear();
        sub->height = std::max(sub->height, node->height + 1);
        sub->args.insert(sub->args.begin(), std::move(node));
        node = std::move(sub);
      } else {
        ExprPtr e = Node(ExprKind::kGetItem, at);
        Adopt(*e, std::move(node));
        Adopt(*e, std::move(sub));
        node = std::move(e);
      }
    } else if (IsOp("(")) {
      ExprPtr e = Node(ExprKind::kCall, at);
      Adopt(*e, std::move(node));
      OASIS_RETURN_IF_ERROR(ParseCallArgs(*e));
      node = std::move(e);
    } else {
      return node;
    }
  }
}

StatusOr<ExprPtr> Parser::ParseSubscribed() {
  const Token at = Cur();
  ExprPtr start;
  if (!IsOp(":")) {
    OASIS_ASSIGN_OR_RETURN(start, ParseExpression());
    if (!IsOp(":")) return start;
  }
  Next();  // ':'
  ExprPtr slice = Node(ExprKind::kSlice, at);
  slice->name = "slice";
  ExprPtr stop, step;
  if (!IsOp("]") && !IsOp(":")) {
    OASIS_ASSIGN_OR_RETURN(stop, ParseExpression());
  }
  if (SkipOp(":") && !IsOp("]")) {
    OASIS_ASSIGN_OR_RETURN(step, ParseExpression());
  }
  Adopt(*slice, std::move(start));
  Adopt(*slice, std::move(stop));
  Adopt(*slice, std::move(step));
  return slice;
}

Status Parser::ParseCallArgs(Expr& call) {
  OASIS_RETURN_IF_ERROR(ExpectOp("("));
  bool first = true;
  while (!IsOp(")")) {
    if (!first) {
      OASIS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
    }
    first = false;
    if (IsOp("*") || IsOp("**"))
      return Error(Cur(), "*args and **kwargs are not supported", StatusCode::kUnimplemented);
    if (Cur().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator &&
        Peek().text == "=") {
      std::string key = Cur().text;
      Next();
      Next();
      OASIS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      AdoptKwarg(call, std::move(key), std::move(value));
    } else {
      if (!call.kwargs.empty()) return Error(Cur(), "invalid syntax for function call expression");
      OASIS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      Adopt(call, std::move(value));
    }
  }
  Next();
  return Status::Ok();
}

StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*node));
    if (IsOp("|")) {
      OASIS_ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
    } else if (IsName("is")) {
      ExprPtr e = Node(ExprKind::kTest, Cur());
      Next();
      e->negated = SkipName("not");
      OASIS_ASSIGN_OR_RETURN(e->name, ExpectName());
      while (IsOp(".")) {
        Next();
        OASIS_ASSIGN_OR_RETURN(std::string part, ExpectName());
        e->name += "." + part;
      }
      Adopt(*e, std::move(node));
      if (IsOp("(")) {
        OASIS_RETURN_IF_ERROR(ParseCallArgs(*e));
      } else if ((Cur().kind == TokenKind::kName || Cur().kind == TokenKind::kString ||
                  Cur().kind == TokenKind::kInteger || Cur().kind == TokenKind::kFloat ||
                  IsOp("(") || IsOp("[") || IsOp("{")) &&
                 !IsName("else") && !IsName("or") && !IsName("and")) {
        if (IsName("is")) return Error(Cur(), "You cannot chain multiple tests with is");
        OASIS_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
        OASIS_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
        Adopt(*e, std::move(arg));
      }
      node = std::move(e);
    } else if (IsOp("(")) {
      ExprPtr e = Node(ExprKind::kCall, Cur());
      Adopt(*e, std::move(node));
      OASIS_RETURN_IF_ERROR(ParseCallArgs(*e));
      node = std::move(e);
    } else {
      return node;
    }
  }
}

StatusOr<ExprPtr> Parser::ParseFilter(ExprPtr node) {
  while (SkipOp("|")) {
    OASIS_RETURN_IF_ERROR(CheckHeight(*node));
    ExprPtr e = Node(ExprKind::kFilter, Cur());
    OASIS_ASSIGN_OR_RETURN(e->name, ExpectName());
    while (IsOp(".")) {
      Next();
      OASIS_ASSIGN_OR_RETURN(std::string part, ExpectName());
      e->name += "." + part;
    }
    Adopt(*e, std::move(node));
    if (IsOp("(")) OASIS_RETURN_IF_ERROR(ParseCallArgs(*e));
    node = std::move(e);
  }
  return node;
}

}  // namespace oasis::jinja::detail

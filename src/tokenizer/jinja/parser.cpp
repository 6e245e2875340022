#include "tokenizer/jinja/parser.h"

#include "tokenizer/jinja/parser_impl.h"

namespace oasis::jinja::detail {

StatusOr<Body> Parser::ParseBody(std::initializer_list<std::string_view> ends,
                                 std::string* matched) {
  DepthGuard guard(depth_);
  OASIS_RETURN_IF_ERROR(CheckDepth());
  Body body;
  while (true) {
    const Token& t = Cur();
    if (t.kind == TokenKind::kEnd) {
      if (ends.size() == 0) return body;
      std::string expected;
      for (auto e : ends) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
      return Error(t, "unexpected end of template, expected " + expected);
    }
    if (t.kind == TokenKind::kData) {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kText;
      s->line = t.line;
      s->column = t.column;
      s->text = t.text;
      body.push_back(std::move(s));
      Next();
    } else if (t.kind == TokenKind::kVarBegin) {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kOutput;
      s->line = t.line;
      s->column = t.column;
      Next();
      OASIS_ASSIGN_OR_RETURN(s->expr, ParseTuple(true, false));
      if (Cur().kind != TokenKind::kVarEnd) return Unexpected("'}}'");
      Next();
      body.push_back(std::move(s));
    } else if (t.kind == TokenKind::kBlockBegin) {
      const Token& name = Peek();
      if (name.kind == TokenKind::kName) {
        for (auto e : ends) {
          if (name.text == e) {
            *matched = name.text;
            Next();
            Next();
            return body;
          }
        }
      }
      OASIS_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
      body.push_back(std::move(s));
    } else {
      return Error(t, "unexpected " + Describe(t));
    }
  }
}

StatusOr<StmtPtr> Parser::ParseStatement() {
  Next();  // {%
  const Token at = Cur();
  if (at.kind != TokenKind::kName) return Error(at, "tag name expected");
  const std::string& n = at.text;
  Next();
  if (n == "for") return ParseFor(at);
  if (n == "if") return ParseIf(at);
  if (n == "set") return ParseSet(at);
  if (n == "macro") return ParseMacro(at);
  if (n == "filter") return ParseFilterBlock(at);
  auto s = std::make_unique<Stmt>();
  s->line = at.line;
  s->column = at.column;
  if (n == "break" || n == "continue") {
    if (loop_depth_ == 0) return Error(at, "'" + n + "' outside of a loop");
    s->kind = n == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }
  if (n == "generation") {
    s->kind = StmtKind::kBlock;
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string m;
    OASIS_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &m));
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }
  static const char* kKnownEnds[] = {"endfor",   "endif",     "elif",          "else",  "endset",
                                     "endmacro", "endfilter", "endgeneration", "endraw"};
  for (const char* e : kKnownEnds) {
    if (n == e) return Error(at, "unexpected tag '" + n + "'");
  }
  static const char* kUnsupported[] = {"include", "extends", "block", "import",     "from",
                                       "call",    "with",    "do",    "autoescape", "trans"};
  for (const char* u : kUnsupported) {
    if (n == u) return Error(at, "unsupported tag '" + n + "'", StatusCode::kUnimplemented);
  }
  return Error(at, "unknown tag '" + n + "'");
}

StatusOr<std::vector<std::string>> Parser::ParseTargets() {
  std::vector<std::string> names;
  bool parens = SkipOp("(");
  do {
    if (parens && IsOp(")")) break;
    OASIS_ASSIGN_OR_RETURN(std::string n, ExpectName());
    names.push_back(std::move(n));
  } while (SkipOp(","));
  if (parens) OASIS_RETURN_IF_ERROR(ExpectOp(")"));
  if (names.empty()) return Unexpected("an assignment target");
  return names;
}

StatusOr<StmtPtr> Parser::ParseFor(const Token& at) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFor;
  s->line = at.line;
  s->column = at.column;
  OASIS_ASSIGN_OR_RETURN(s->targets, ParseTargets());
  if (!SkipName("in")) return Unexpected("'in'");
  OASIS_ASSIGN_OR_RETURN(s->expr, ParseTuple(false, false));
  if (SkipName("if")) {
    OASIS_ASSIGN_OR_RETURN(s->filter, ParseExpression());
  }
  if (IsName("recursive"))
    return Error(Cur(), "recursive loops are not supported", StatusCode::kUnimplemented);
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string m;
  ++loop_depth_;
  auto body = ParseBody({"endfor", "else"}, &m);
  --loop_depth_;
  if (!body.ok()) return body.status();
  s->body = std::move(body).value();
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  if (m == "else") {
    OASIS_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &m));
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  }
  return s;
}

StatusOr<StmtPtr> Parser::ParseIf(const Token& at) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kIf;
  s->line = at.line;
  s->column = at.column;
  while (true) {
    OASIS_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false));
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string m;
    OASIS_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &m));
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (m == "elif") continue;
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    if (m == "else") {
      OASIS_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &m));
      OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    }
    return s;
  }
}

StatusOr<StmtPtr> Parser::ParseSet(const Token& at) {
  auto s = std::make_unique<Stmt>();
  s->line = at.line;
  s->column = at.column;
  if (Cur().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator && Peek().text == ".") {
    s->targets.push_back(Cur().text);
    Next();
    Next();
    OASIS_ASSIGN_OR_RETURN(s->ns_attr, ExpectName());
  } else {
    OASIS_ASSIGN_OR_RETURN(s->targets, ParseTargets());
  }
  if (SkipOp("=")) {
    s->kind = StmtKind::kSet;
    OASIS_ASSIGN_OR_RETURN(s->expr, ParseTuple(true, false));
    OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }
  if (!s->ns_attr.empty() || s->targets.size() != 1) return Unexpected("'='");
  s->kind = StmtKind::kSetBlock;
  if (IsOp("|")) {
    OASIS_ASSIGN_OR_RETURN(s->filter, ParseFilter(Node(ExprKind::kName, Cur())));
  }
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string m;
  OASIS_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &m));
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  return s;
}

StatusOr<StmtPtr> Parser::ParseMacro(const Token& at) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kMacro;
  s->line = at.line;
  s->column = at.column;
  OASIS_ASSIGN_OR_RETURN(s->text, ExpectName());
  OASIS_RETURN_IF_ERROR(ExpectOp("("));
  while (!IsOp(")")) {
    if (!s->params.empty()) OASIS_RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp(")")) break;
    MacroParam p;
    OASIS_ASSIGN_OR_RETURN(p.name, ExpectName());
    if (SkipOp("=")) {
      OASIS_ASSIGN_OR_RETURN(p.default_value, ParseExpression());
    } else {
      for (const MacroParam& q : s->params) {
        if (q.default_value) return Error(Cur(), "non-default argument follows default argument");
      }
    }
    s->params.push_back(std::move(p));
  }
  Next();
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string m;
  int saved_loops = loop_depth_;
  loop_depth_ = 0;
  auto body = ParseBody({"endmacro"}, &m);
  loop_depth_ = saved_loops;
  if (!body.ok()) return body.status();
  s->body = std::move(body).value();
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  return s;
}

StatusOr<StmtPtr> Parser::ParseFilterBlock(const Token& at) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFilterBlock;
  s->line = at.line;
  s->column = at.column;
  // The first filter has no leading '|': parse it as if it had one.
  if (Cur().kind != TokenKind::kName) return Unexpected("a filter name");
  ExprPtr node = Node(ExprKind::kName, Cur());
  do {
    OASIS_ASSIGN_OR_RETURN(std::string n, ExpectName());
    ExprPtr f = Node(ExprKind::kFilter, at);
    f->name = std::move(n);
    Adopt(*f, std::move(node));
    if (IsOp("(")) OASIS_RETURN_IF_ERROR(ParseCallArgs(*f));
    node = std::move(f);
    OASIS_RETURN_IF_ERROR(CheckHeight(*node));
  } while (SkipOp("|"));
  s->filter = std::move(node);
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  std::string m;
  OASIS_ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, &m));
  OASIS_RETURN_IF_ERROR(ExpectBlockEnd());
  return s;
}

}  // namespace oasis::jinja::detail

namespace oasis::jinja {

StatusOr<std::shared_ptr<const Template>> ParseTemplate(const std::string& source,
                                                        const ParseOptions& options) {
  OASIS_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source, options.lexer));
  detail::Parser parser(std::move(tokens), options);
  auto t = std::make_shared<Template>();
  OASIS_ASSIGN_OR_RETURN(t->body, parser.ParseAll());
  return std::shared_ptr<const Template>(std::move(t));
}

}  // namespace oasis::jinja

// Internal to the parser (parser.cpp: statements, parser_expr.cpp: expressions).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "tokenizer/jinja/parser.h"

namespace oasis::jinja::detail {

// Recursive-descent parser over the token vector. Owns nothing but its cursor; one per parse.
class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& o) : toks_(std::move(tokens)), opt_(o) {}

  StatusOr<Body> ParseAll() {
    std::string matched;
    OASIS_ASSIGN_OR_RETURN(Body body, ParseBody({}, &matched));
    return body;
  }

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(const char* op) const { return Cur().kind == TokenKind::kOperator && Cur().text == op; }
  bool IsName(std::string_view n) const {
    return Cur().kind == TokenKind::kName && Cur().text == n;
  }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view n) {
    if (!IsName(n)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd:
        return "end of template";
      case TokenKind::kVarEnd:
        return "'}}'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kVarBegin:
        return "'{{'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kData:
        return "template data";
      case TokenKind::kString:
        return "string";
      case TokenKind::kInteger:
      case TokenKind::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  Status Error(const Token& t, const std::string& msg,
               StatusCode code = StatusCode::kInvalidArgument) const {
    return Status(code, std::to_string(t.line) + ":" + std::to_string(t.column) + ": " + msg);
  }
  Status Unexpected(const std::string& expected) const {
    return Error(Cur(), "unexpected " + Describe(Cur()) + ", expected " + expected);
  }
  Status ExpectOp(const char* op) {
    if (!SkipOp(op)) return Unexpected(std::string("'") + op + "'");
    return Status::Ok();
  }
  Status ExpectBlockEnd() {
    if (Cur().kind != TokenKind::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return Status::Ok();
  }
  StatusOr<std::string> ExpectName() {
    if (Cur().kind != TokenKind::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }
  ExprPtr Node(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  // Nesting guard for the recursive productions.
  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(d) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  };
  Status CheckDepth() const {
    if (depth_ > opt_.max_nesting) return Error(Cur(), "template nested too deeply");
    return Status::Ok();
  }
  // `child` becomes the last argument of `parent` (null: an omitted one), whose height follows.
  static void Adopt(Expr& parent, ExprPtr child) {
    if (child) parent.height = std::max(parent.height, child->height + 1);
    parent.args.push_back(std::move(child));
  }
  static void AdoptKwarg(Expr& parent, std::string key, ExprPtr value) {
    parent.height = std::max(parent.height, value->height + 1);
    parent.kwargs.emplace_back(std::move(key), std::move(value));
  }
  // Chains built in a loop (a + b + c, x.y.z, x|f|g, x if c else y ...) grow the tree without
  // recursing, so the depth guard does not see them: their height is checked instead.
  Status CheckHeight(const Expr& e) const {
    if (e.height > opt_.max_nesting) return Error(Cur(), "template nested too deeply");
    return Status::Ok();
  }

  StatusOr<Body> ParseBody(std::initializer_list<std::string_view> ends, std::string* matched);
  StatusOr<StmtPtr> ParseStatement();
  StatusOr<StmtPtr> ParseFor(const Token& at);
  StatusOr<StmtPtr> ParseIf(const Token& at);
  StatusOr<StmtPtr> ParseSet(const Token& at);
  StatusOr<StmtPtr> ParseMacro(const Token& at);
  StatusOr<StmtPtr> ParseFilterBlock(const Token& at);
  StatusOr<std::vector<std::string>> ParseTargets();

  StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens);
  StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true) {
    OASIS_ASSIGN_OR_RETURN(ExprPtr e, with_condexpr ? ParseCondExpr() : ParseOr());
    OASIS_RETURN_IF_ERROR(CheckHeight(*e));
    return e;
  }
  StatusOr<ExprPtr> ParseCondExpr();
  StatusOr<ExprPtr> ParseOr();
  StatusOr<ExprPtr> ParseAnd();
  StatusOr<ExprPtr> ParseNot();
  StatusOr<ExprPtr> ParseCompare();
  StatusOr<ExprPtr> ParseBinary(int level);
  StatusOr<ExprPtr> ParseUnary(bool with_filter);
  StatusOr<ExprPtr> ParsePrimary();
  StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  StatusOr<ExprPtr> ParseFilter(ExprPtr node);
  StatusOr<ExprPtr> ParseSubscribed();
  Status ParseCallArgs(Expr& call);

  std::vector<Token> toks_;
  ParseOptions opt_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace oasis::jinja::detail

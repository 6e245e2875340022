// Expression evaluation of the Interpreter (statements are in interpreter.cpp).
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interpreter.h"

namespace oasis::jinja {

#define OASIS_AT(node, expr) AtNode((node).line, (node).column, (expr))

StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) return callee.callable()->Call(*this, args);
  if (callee.is_undefined()) return InvalidArgument(callee.undefined().message);
  return InvalidArgument("'" + callee.TypeName() + "' object is not callable");
}

StatusOr<Value> Interpreter::ApplyFilter(std::string_view name, const Value& value,
                                         CallArgs& args) {
  FilterFn f = FindFilter(name);
  if (f == nullptr) return InvalidArgument("No filter named '" + std::string(name) + "'.");
  return f(*this, value, args);
}

StatusOr<bool> Interpreter::ApplyTest(std::string_view name, const Value& value, CallArgs& args) {
  TestFn t = FindTest(name);
  if (t == nullptr) return InvalidArgument("No test named '" + std::string(name) + "'.");
  return t(*this, value, args);
}

Status Interpreter::EvalArgs(const Expr& e, size_t first, CallArgs& args) {
  for (size_t i = first; i < e.args.size(); ++i) {
    OASIS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [k, expr] : e.kwargs) {
    OASIS_ASSIGN_OR_RETURN(Value v, Eval(*expr));
    args.keyword.emplace_back(k, std::move(v));
  }
  return Status::Ok();
}

StatusOr<Value> Interpreter::Eval(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return e.name.empty() ? block_value_ : Lookup(e.name);
    case ExprKind::kList: {
      List items;
      for (const ExprPtr& a : e.args) {
        OASIS_ASSIGN_OR_RETURN(Value v, Eval(*a));
        items.push_back(std::move(v));
      }
      Value out = e.name == "tuple" ? Value::MakeTuple(std::move(items))
                                    : Value::MakeList(std::move(items));
      if (out.depth() > kMaxValueDepth)
        return OASIS_AT(e, InvalidArgument("list nested too deeply"));
      return out;
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        OASIS_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
        OASIS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
        if (!k.is_string()) return OASIS_AT(e, Unimplemented("dict keys must be strings"));
        d.Set(k.str(), std::move(v));
      }
      Value out = Value::MakeDict(std::move(d));
      if (out.depth() > kMaxValueDepth)
        return OASIS_AT(e, InvalidArgument("dict nested too deeply"));
      return out;
    }
    case ExprKind::kGetAttr: {
      OASIS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      auto r = GetAttr(obj, e.name);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return r;
    }
    case ExprKind::kGetItem: {
      OASIS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      OASIS_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      auto r = GetItem(obj, key);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return r;
    }
    case ExprKind::kSlice: {
      OASIS_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      Value parts[3] = {Value::None(), Value::None(), Value::None()};
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1]) {
          OASIS_ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1]));
        }
      }
      auto r = SliceValue(*this, obj, parts[0], parts[1], parts[2]);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return r;
    }
    case ExprKind::kCall: {
      OASIS_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
      CallArgs args;
      OASIS_RETURN_IF_ERROR(EvalArgs(e, 1, args));
      auto r = CallValue(callee, args);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return r;
    }
    case ExprKind::kFilter: {
      OASIS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      CallArgs args;
      OASIS_RETURN_IF_ERROR(EvalArgs(e, 1, args));
      auto r = ApplyFilter(e.name, v, args);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return r;
    }
    case ExprKind::kTest: {
      OASIS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      CallArgs args;
      OASIS_RETURN_IF_ERROR(EvalArgs(e, 1, args));
      auto r = ApplyTest(e.name, v, args);
      if (!r.ok()) return OASIS_AT(e, r.status());
      return Value(r.value() != e.negated);
    }
    case ExprKind::kUnary: {
      OASIS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (e.name == "not") return Value(!v.Truthy());
      if (v.is_float()) return Value(e.name == "-" ? -v.number() : v.number());
      if (v.is_integral()) {
        if (e.name == "+") return Value(v.integer());
        if (v.integer() == INT64_MIN) return OASIS_AT(e, OutOfRange("integer overflow"));
        return Value(-v.integer());
      }
      if (v.is_undefined()) return OASIS_AT(e, InvalidArgument(v.undefined().message));
      return OASIS_AT(
          e, InvalidArgument("bad operand type for unary " + e.name + ": '" + v.TypeName() + "'"));
    }
    case ExprKind::kBinary:
      return EvalBinary(e);
    case ExprKind::kCompare:
      return EvalCompare(e);
    case ExprKind::kCondExpr: {
      OASIS_ASSIGN_OR_RETURN(Value cond, Eval(*e.args[1]));
      if (cond.Truthy()) return Eval(*e.args[0]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::MakeUndefined("the inline if-expression on line " + std::to_string(e.line) +
                                  " evaluated to false and no else section was defined.");
    }
  }
  return OASIS_AT(e, Internal("unknown expression kind"));
}

StatusOr<Value> Interpreter::EvalBinary(const Expr& e) {
  OASIS_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
  if (e.name == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
  if (e.name == "or") return a.Truthy() ? a : Eval(*e.args[1]);
  OASIS_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
  auto r = BinaryOp(*this, e.name, a, b);
  if (!r.ok()) return OASIS_AT(e, r.status());
  return r;
}

StatusOr<Value> Interpreter::EvalCompare(const Expr& e) {
  OASIS_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    OASIS_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
    const std::string& op = e.ops[i];
    StatusOr<bool> r = false;
    if (op == "==") {
      r = ValuesEqual(left, right);
    } else if (op == "!=") {
      r = !ValuesEqual(left, right);
    } else if (op == "<") {
      r = ValueLess(left, right);
    } else if (op == ">") {
      r = ValueLess(right, left);
    } else if (op == "<=") {
      r = ValuesEqual(left, right) ? StatusOr<bool>(true) : ValueLess(left, right);
    } else if (op == ">=") {
      r = ValuesEqual(left, right) ? StatusOr<bool>(true) : ValueLess(right, left);
    } else if (op == "in" || op == "notin") {
      r = Contains(right, left);
      if (r.ok() && op == "notin") r = !r.value();
    }
    if (!r.ok()) return OASIS_AT(e, r.status());
    if (!r.value()) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace oasis::jinja

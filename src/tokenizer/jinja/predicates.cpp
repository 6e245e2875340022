// Jinja2 tests (`x is defined`, ...) and the global functions of a render.
#include <cmath>
#include <ctime>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

using Test = StatusOr<bool> (*)(Interpreter&, const Value&, CallArgs&);

StatusOr<Value> Other(const CallArgs& a, std::string_view test) {
  const Value* o = Arg(a, 0, "other");
  if (o == nullptr) return InvalidArgument("test '" + std::string(test) + "' needs an argument");
  return *o;
}

StatusOr<bool> Parity(const Value& v, int want) {
  if (v.is_integral()) return ((v.integer() % 2) + 2) % 2 == want;
  if (v.is_float()) return std::fmod(std::fabs(v.number()), 2.0) == want;
  if (v.is_undefined()) return InvalidArgument(v.undefined().message);
  return InvalidArgument("not all arguments converted during string formatting");
}

bool IsCasedString(const Value& v, bool upper) {
  std::string s = ToPythonStr(v);
  bool any = false;
  for (char32_t c : utf8::Decode(s)) {
    if (upper ? utf8::IsLower(c) : utf8::IsUpper(c)) return false;
    any = any || (upper ? utf8::IsUpper(c) : utf8::IsLower(c));
  }
  return any;
}

#define OASIS_SIMPLE_TEST(fn, expr) \
  StatusOr<bool> fn(Interpreter&, const Value& v, CallArgs&) { return (expr); }

OASIS_SIMPLE_TEST(Defined, !v.is_undefined())
OASIS_SIMPLE_TEST(IsUndefined, v.is_undefined())
OASIS_SIMPLE_TEST(IsNone, v.is_none())
OASIS_SIMPLE_TEST(IsString, v.is_string())
OASIS_SIMPLE_TEST(IsMapping, v.is_dict())
OASIS_SIMPLE_TEST(IsIterable, v.is_undefined() || v.is_string() || v.is_list() || v.is_dict())
OASIS_SIMPLE_TEST(IsSequence, v.is_undefined() || v.is_string() || v.is_list() || v.is_dict())
OASIS_SIMPLE_TEST(IsNumber, v.is_number())
OASIS_SIMPLE_TEST(IsInteger, v.is_int())
OASIS_SIMPLE_TEST(IsFloat, v.is_float())
OASIS_SIMPLE_TEST(IsBoolean, v.is_bool())
OASIS_SIMPLE_TEST(IsTrue, v.is_bool() && v.boolean())
OASIS_SIMPLE_TEST(IsFalse, v.is_bool() && !v.boolean())
OASIS_SIMPLE_TEST(IsCallable, v.is_callable())
OASIS_SIMPLE_TEST(IsLower, IsCasedString(v, false))
OASIS_SIMPLE_TEST(IsUpper, IsCasedString(v, true))
OASIS_SIMPLE_TEST(IsEscaped, false)

StatusOr<bool> Odd(Interpreter&, const Value& v, CallArgs&) { return Parity(v, 1); }
StatusOr<bool> Even(Interpreter&, const Value& v, CallArgs&) { return Parity(v, 0); }

StatusOr<bool> DivisibleBy(Interpreter& in, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value n, Other(a, "divisibleby"));
  OASIS_ASSIGN_OR_RETURN(Value r, BinaryOp(in, "%", v, n));
  return ValuesEqual(r, Value(int64_t{0}));
}

StatusOr<bool> Eq(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "eq"));
  return ValuesEqual(v, o);
}
StatusOr<bool> Ne(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "ne"));
  return !ValuesEqual(v, o);
}
StatusOr<bool> Lt(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "lt"));
  return ValueLess(v, o);
}
StatusOr<bool> Gt(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "gt"));
  return ValueLess(o, v);
}
StatusOr<bool> Le(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "le"));
  if (ValuesEqual(v, o)) return true;
  return ValueLess(v, o);
}
StatusOr<bool> Ge(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "ge"));
  if (ValuesEqual(v, o)) return true;
  return ValueLess(o, v);
}
StatusOr<bool> In(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value seq, Other(a, "in"));
  return Contains(seq, v);
}
StatusOr<bool> SameAs(Interpreter&, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value o, Other(a, "sameas"));
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kBool:
    case Value::Kind::kUndefined:
      return ValuesEqual(v, o);
    case Value::Kind::kList:
      return &v.list() == &o.list();
    case Value::Kind::kDict:
      return &v.dict() == &o.dict();
    case Value::Kind::kNamespace:
      return v.ns() == o.ns();
    case Value::Kind::kCallable:
      return v.callable() == o.callable();
    default:
      return ValuesEqual(v, o);  // small ints/strings: CPython identity is not defined
  }
}

// ---- globals ----------------------------------------------------------------------------------

// A global function implemented by a plain function pointer. Stateless.
class GlobalFunction : public Callable {
 public:
  using Fn = StatusOr<Value> (*)(Interpreter&, CallArgs&);
  GlobalFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(fn) {}
  StatusOr<Value> Call(Interpreter& in, CallArgs& args) const override { return fn_(in, args); }
  std::string Name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

StatusOr<Value> Range(Interpreter& in, CallArgs& a) {
  if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3) {
    return InvalidArgument("range expected 1 to 3 integer arguments");
  }
  for (const Value& v : a.positional) {
    if (!v.is_integral())
      return InvalidArgument("'" + v.TypeName() + "' object cannot be interpreted as an integer");
  }
  int64_t start = 0, stop, step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].integer();
  } else {
    start = a.positional[0].integer();
    stop = a.positional[1].integer();
    if (a.positional.size() == 3) step = a.positional[2].integer();
  }
  if (step == 0) return InvalidArgument("range() arg 3 must not be zero");
  __int128 count = step > 0 ? (static_cast<__int128>(stop) - start + step - 1) / step
                            : (static_cast<__int128>(start) - stop - step - 1) / -step;
  if (count < 0) count = 0;
  constexpr int64_t kMaxRange = 100000;  // Jinja2's sandbox MAX_RANGE
  if (count > kMaxRange) {
    return ResourceExhausted(
        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(count) / 16));
  List out;
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(start + i * step);
  return Value::MakeList(std::move(out));
}

StatusOr<Value> MakeNamespace(Interpreter&, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  if (a.positional.size() > 1)
    return InvalidArgument("namespace() takes at most one positional argument");
  if (!a.positional.empty()) {
    if (!a.positional[0].is_dict())
      return InvalidArgument("namespace() positional argument must be a dict");
    for (const auto& [k, v] : a.positional[0].dict().entries()) ns->attrs.Set(k, v);
  }
  for (const auto& [k, v] : a.keyword) {
    if (v.is_namespace())
      return Unimplemented("storing a namespace inside a namespace is not supported");
    ns->attrs.Set(k, v);
  }
  return Value(ns);
}

StatusOr<Value> MakeDictFn(Interpreter&, CallArgs& a) {
  Dict d;
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_dict())
      return InvalidArgument("dict() expects a mapping");
    for (const auto& [k, v] : a.positional[0].dict().entries()) d.Set(k, v);
  }
  for (const auto& [k, v] : a.keyword) d.Set(k, v);
  return Value::MakeDict(std::move(d));
}

StatusOr<Value> RaiseException(Interpreter&, CallArgs& a) {
  const Value* msg = Arg(a, 0, "message");
  return InvalidArgument(msg ? ToPythonStr(*msg) : std::string());
}

StatusOr<Value> StrftimeNow(Interpreter& in, CallArgs& a) {
  const Value* fmt = Arg(a, 0, "format");
  if (fmt == nullptr || !fmt->is_string())
    return InvalidArgument("strftime_now() requires a format string");
  if (fmt->str().size() > 256) return InvalidArgument("strftime_now() format too long");
  auto now = in.options().now.value_or(std::chrono::system_clock::now());
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[4096];
  size_t n = std::strftime(buf, sizeof(buf), fmt->str().c_str(), &tm);
  if (n == 0 && !fmt->str().empty())
    return InvalidArgument("strftime_now() result too long or empty");
  return Value(std::string(buf, n));
}

}  // namespace

TestFn FindTest(std::string_view name) {
  static const std::pair<std::string_view, Test> kTests[] = {{"defined", Defined},
                                                             {"undefined", IsUndefined},
                                                             {"none", IsNone},
                                                             {"string", IsString},
                                                             {"mapping", IsMapping},
                                                             {"iterable", IsIterable},
                                                             {"sequence", IsSequence},
                                                             {"number", IsNumber},
                                                             {"integer", IsInteger},
                                                             {"float", IsFloat},
                                                             {"boolean", IsBoolean},
                                                             {"true", IsTrue},
                                                             {"false", IsFalse},
                                                             {"callable", IsCallable},
                                                             {"lower", IsLower},
                                                             {"upper", IsUpper},
                                                             {"escaped", IsEscaped},
                                                             {"odd", Odd},
                                                             {"even", Even},
                                                             {"divisibleby", DivisibleBy},
                                                             {"eq", Eq},
                                                             {"equalto", Eq},
                                                             {"==", Eq},
                                                             {"ne", Ne},
                                                             {"!=", Ne},
                                                             {"lt", Lt},
                                                             {"lessthan", Lt},
                                                             {"<", Lt},
                                                             {"gt", Gt},
                                                             {"greaterthan", Gt},
                                                             {">", Gt},
                                                             {"le", Le},
                                                             {"<=", Le},
                                                             {"ge", Ge},
                                                             {">=", Ge},
                                                             {"in", In},
                                                             {"sameas", SameAs}};
  for (const auto& [n, t] : kTests) {
    if (n == name) return t;
  }
  return nullptr;
}

const Dict& Globals() {
  static const Dict* globals = [] {
    auto* d = new Dict();
    auto add = [&](const char* name, GlobalFunction::Fn fn) {
      d->Set(name, Value(Value::CallablePtr(std::make_shared<GlobalFunction>(name, fn))));
    };
    add("range", Range);
    add("namespace", MakeNamespace);
    add("dict", MakeDictFn);
    add("raise_exception", RaiseException);
    add("strftime_now", StrftimeNow);
    return d;
  }();
  return *globals;
}

}  // namespace oasis::jinja

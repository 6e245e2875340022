// Operators, slicing and membership with Python semantics.
#include <cmath>
#include <limits>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

Status TypeError(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return InvalidArgument(a.undefined().message);
  if (b.is_undefined()) return InvalidArgument(b.undefined().message);
  if (op == "+" && a.is_string()) {
    return InvalidArgument("can only concatenate str (not \"" + b.TypeName() + "\") to str");
  }
  if (op == "+" && a.is_list()) {
    return InvalidArgument("can only concatenate list (not \"" + b.TypeName() + "\") to list");
  }
  return InvalidArgument("unsupported operand type(s) for " + std::string(op) + ": '" +
                         a.TypeName() + "' and '" + b.TypeName() + "'");
}

StatusOr<Value> Repeat(Interpreter& in, const Value& seq, int64_t times) {
  if (times <= 0) return seq.is_string() ? Value(std::string()) : Value::MakeList({});
  if (seq.is_string()) {
    if (seq.str().empty()) return seq;
    OASIS_RETURN_IF_ERROR(in.CheckSize(seq.str().size() * static_cast<unsigned __int128>(times) >
                                               in.options().max_output_bytes
                                           ? in.options().max_output_bytes + 1
                                           : seq.str().size() * static_cast<size_t>(times)));
    std::string out;
    out.reserve(seq.str().size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(std::move(out));
  }
  size_t n = seq.list().size();
  if (n == 0) return seq;
  if (static_cast<unsigned __int128>(n) * static_cast<unsigned __int128>(times) * sizeof(Value) >
      in.options().max_output_bytes) {
    return ResourceExhausted("list repetition too large");
  }
  OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(n) * times));
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::MakeList(std::move(out));
}

double FloorMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

StatusOr<Value> BinaryOp(Interpreter& in, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = ToPythonStr(a) + ToPythonStr(b);
    OASIS_RETURN_IF_ERROR(in.CheckSize(s.size()));
    return Value(std::move(s));
  }
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    const int64_t x = ints ? a.integer() : 0, y = ints ? b.integer() : 0;
    const double p = a.number(), q = b.number();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value(p + q);
      if (__builtin_add_overflow(x, y, &r)) return OutOfRange("integer overflow");
      return Value(r);
    }
    if (op == "-") {
      if (!ints) return Value(p - q);
      if (__builtin_sub_overflow(x, y, &r)) return OutOfRange("integer overflow");
      return Value(r);
    }
    if (op == "*") {
      if (!ints) return Value(p * q);
      if (__builtin_mul_overflow(x, y, &r)) return OutOfRange("integer overflow");
      return Value(r);
    }
    if (op == "/") {
      if (q == 0) return InvalidArgument("division by zero");
      return Value(p / q);
    }
    if (op == "//" || op == "%") {
      if (ints ? y == 0 : q == 0) {
        return InvalidArgument(op == "//" ? "integer division or modulo by zero"
                                          : "modulo by zero");
      }
      if (ints) {
        if (x == INT64_MIN && y == -1) return OutOfRange("integer overflow");
        int64_t quot = x / y, rem = x % y;
        if (rem != 0 && ((rem < 0) != (y < 0))) {
          --quot;
          rem += y;
        }
        return Value(op == "//" ? quot : rem);
      }
      if (op == "%") return Value(FloorMod(p, q));
      // CPython's float_floor_div.
      double mod = std::fmod(p, q);
      double div = (p - mod) / q;
      if (mod != 0 && ((q < 0) != (mod < 0))) div -= 1.0;
      double floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
      return Value(div == 0 ? std::copysign(0.0, p / q) : floordiv);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x, e = y;
        while (e > 0) {
          if (e & 1) {
            if (__builtin_mul_overflow(result, base, &result))
              return OutOfRange("integer overflow");
          }
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base))
            return OutOfRange("integer overflow");
        }
        return Value(result);
      }
      if (p == 0 && q < 0) return InvalidArgument("0.0 cannot be raised to a negative power");
      return Value(std::pow(p, q));
    }
    return TypeError(op, a, b);
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      OASIS_RETURN_IF_ERROR(in.CheckSize(a.str().size() + b.str().size()));
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      OASIS_RETURN_IF_ERROR(in.CheckSize((a.list().size() + b.list().size()) * sizeof(Value)));
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && b.is_integral()) return Repeat(in, a, b.integer());
    if ((b.is_string() || b.is_list()) && a.is_integral()) return Repeat(in, b, a.integer());
  }
  if (op == "%" && a.is_string()) {
    return Unimplemented("printf-style string formatting ('%') is not supported");
  }
  return TypeError(op, a, b);
}

StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) return InvalidArgument(item.undefined().message);
        return InvalidArgument("'in <string>' requires string as left operand, not " +
                               item.TypeName());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (ValuesEqual(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return InvalidArgument("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

StatusOr<Value> SliceValue(Interpreter& in, const Value& obj, const Value& start, const Value& stop,
                           const Value& step) {
  if (obj.is_undefined()) return InvalidArgument(obj.undefined().message);
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_integral()) {
      return InvalidArgument("slice indices must be integers or None");
    }
  }
  int64_t st = step.is_none() ? 1 : step.integer();
  if (st == 0) return InvalidArgument("slice step cannot be zero");
  std::u32string chars;
  int64_t len;
  if (obj.is_string()) {
    chars = utf8::Decode(obj.str());
    len = static_cast<int64_t>(chars.size());
  } else if (obj.is_list()) {
    len = static_cast<int64_t>(obj.list().size());
  } else {
    return Value::MakeUndefined("'" + obj.TypeName() + "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = v.integer();
    if (i < 0) {
      i += len;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= len) {
      i = st < 0 ? len - 1 : len;
    }
    return i;
  };
  int64_t b = adjust(start, st < 0 ? len - 1 : 0);
  int64_t e = adjust(stop, st < 0 ? -1 : len);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(idx.size()) / 64));
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : idx) out.push_back(chars[static_cast<size_t>(i)]);
    return Value(utf8::Encode(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.list()[static_cast<size_t>(i)]);
  return obj.is_tuple() ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
}

std::string StripString(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string cps = utf8::Decode(s);
  std::u32string set = chars ? utf8::Decode(*chars) : std::u32string();
  auto strip = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : utf8::IsSpace(c);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return utf8::Encode(std::u32string_view(cps).substr(b, e - b));
}

}  // namespace oasis::jinja

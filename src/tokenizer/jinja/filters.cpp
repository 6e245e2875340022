// Jinja2 filters (with transformers' tojson override).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

using Fn = StatusOr<Value> (*)(Interpreter&, const Value&, CallArgs&);

StatusOr<Value> ToJson(Interpreter& in, const Value& v, CallArgs& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  OASIS_RETURN_IF_ERROR(
      CheckArgs(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions o;
  if (const Value* x = Arg(a, 0, "ensure_ascii")) o.ensure_ascii = x->Truthy();
  if (const Value* x = Arg(a, 1, "indent"); x && !x->is_none()) {
    o.has_indent = true;
    if (x->is_integral()) {
      o.indent.assign(static_cast<size_t>(std::clamp<int64_t>(x->integer(), 0, 256)), ' ');
    } else if (x->is_string()) {
      o.indent = x->str();
    } else {
      return InvalidArgument("tojson indent must be an integer or a string");
    }
  }
  if (const Value* x = Arg(a, 2, "separators"); x && !x->is_none()) {
    if (!x->is_list() || x->list().size() != 2 || !x->list()[0].is_string() ||
        !x->list()[1].is_string()) {
      return InvalidArgument("tojson separators must be a pair of strings");
    }
    o.has_separators = true;
    o.item_separator = x->list()[0].str();
    o.key_separator = x->list()[1].str();
  }
  if (const Value* x = Arg(a, 3, "sort_keys")) o.sort_keys = x->Truthy();
  OASIS_ASSIGN_OR_RETURN(std::string s, DumpJson(v, o));
  OASIS_RETURN_IF_ERROR(in.CheckSize(s.size()));
  return Value(std::move(s));
}

StatusOr<Value> Length(Interpreter&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value(int64_t{0});
    case Value::Kind::kString:
      return Value(static_cast<int64_t>(utf8::Length(v.str())));
    case Value::Kind::kList:
      return Value(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
      return Value(static_cast<int64_t>(v.dict().size()));
    case Value::Kind::kNamespace:
      return Value(static_cast<int64_t>(v.ns()->attrs.size()));
    default:
      return InvalidArgument("object of type '" + v.TypeName() + "' has no len()");
  }
}

StatusOr<Value> Trim(Interpreter&, const Value& v, CallArgs& a) {
  const Value* chars = Arg(a, 0, "chars");
  const std::string* set = chars && chars->is_string() ? &chars->str() : nullptr;
  return Value(StripString(ToPythonStr(v), set, true, true));
}

StatusOr<Value> StrMethod(Interpreter& in, const Value& v, const char* method, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(Value m, GetAttr(Value(ToPythonStr(v)), method));
  return in.CallValue(m, a);
}
StatusOr<Value> Upper(Interpreter& in, const Value& v, CallArgs& a) {
  return StrMethod(in, v, "upper", a);
}
StatusOr<Value> Lower(Interpreter& in, const Value& v, CallArgs& a) {
  return StrMethod(in, v, "lower", a);
}
StatusOr<Value> Capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  return StrMethod(in, v, "capitalize", a);
}
StatusOr<Value> Replace(Interpreter& in, const Value& v, CallArgs& a) {
  return StrMethod(in, v, "replace", a);
}

StatusOr<Value> Title(Interpreter&, const Value& v, CallArgs&) {
  // Jinja2: split on ([-\s({\[<]+), capitalise each piece's first character, lower the rest.
  std::string out;
  bool word_start = true;
  for (char32_t c : utf8::Decode(ToPythonStr(v))) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::IsSpace(c);
    if (sep) {
      utf8::Append(out, c);
      word_start = true;
    } else {
      utf8::Append(out, word_start ? utf8::ToUpper(c) : utf8::ToLower(c));
      word_start = false;
    }
  }
  return Value(std::move(out));
}

StatusOr<Value> First(Interpreter& in, const Value& v, CallArgs&) {
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  if (items.empty()) return Value::MakeUndefined("No first item, sequence was empty.");
  return items.front();
}
StatusOr<Value> Last(Interpreter& in, const Value& v, CallArgs&) {
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  if (items.empty()) return Value::MakeUndefined("No last item, sequence was empty.");
  return items.back();
}

StatusOr<Value> ToList(Interpreter& in, const Value& v, CallArgs&) {
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  return Value::MakeList(std::move(items));
}

// Maps each item through `attribute=` (dotted) if given.
StatusOr<List> Attributes(Interpreter& in, const Value& v, const Value* attribute,
                          const Value* dflt) {
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(items.size())));
  if (attribute == nullptr || attribute->is_none()) return items;
  for (Value& item : items) {
    if (attribute->is_integral()) {
      OASIS_ASSIGN_OR_RETURN(item, GetItem(item, *attribute));
    } else {
      std::string path = ToPythonStr(*attribute);
      size_t start = 0;
      while (true) {
        size_t dot = path.find('.', start);
        std::string part =
            path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
        OASIS_ASSIGN_OR_RETURN(item,
                               digits ? GetItem(item, Value(static_cast<int64_t>(std::stoll(part))))
                                      : GetItem(item, Value(part)));
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
    }
    if (item.is_undefined() && dflt != nullptr) item = *dflt;
  }
  return items;
}

StatusOr<Value> Join(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* sep = Arg(a, 0, "d");
  OASIS_ASSIGN_OR_RETURN(List items, Attributes(in, v, Arg(a, 1, "attribute"), nullptr));
  std::string d = sep ? ToPythonStr(*sep) : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += d;
    out += ToPythonStr(items[i]);
    OASIS_RETURN_IF_ERROR(in.CheckSize(out.size()));
  }
  return Value(std::move(out));
}

StatusOr<Value> Map(Interpreter& in, const Value& v, CallArgs& a) {
  if (const Value* attr = Arg(a, SIZE_MAX, "attribute")) {
    OASIS_ASSIGN_OR_RETURN(List items, Attributes(in, v, attr, Arg(a, SIZE_MAX, "default")));
    return Value::MakeList(std::move(items));
  }
  if (a.positional.empty() || !a.positional[0].is_string())
    return InvalidArgument("map requires a filter argument");
  std::string filter = a.positional[0].str();
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  for (Value& item : items) {
    OASIS_RETURN_IF_ERROR(in.CountIteration());
    CallArgs copy = rest;
    OASIS_ASSIGN_OR_RETURN(item, in.ApplyFilter(filter, item, copy));
  }
  return Value::MakeList(std::move(items));
}

// select / reject / selectattr / rejectattr.
StatusOr<Value> SelectImpl(Interpreter& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  const Value* attr = nullptr;
  if (by_attr) {
    if (a.positional.empty()) return InvalidArgument("selectattr/rejectattr need an attribute");
    attr = &a.positional[next++];
  }
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  OASIS_ASSIGN_OR_RETURN(List probes, Attributes(in, v, attr, nullptr));
  std::string test;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) return InvalidArgument("test name must be a string");
    test = a.positional[next++].str();
  }
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + static_cast<long>(next), a.positional.end());
  List out;
  for (size_t i = 0; i < items.size(); ++i) {
    bool pass;
    if (test.empty()) {
      pass = probes[i].Truthy();
    } else {
      CallArgs copy = rest;
      OASIS_ASSIGN_OR_RETURN(pass, in.ApplyTest(test, probes[i], copy));
    }
    if (pass == keep) out.push_back(items[i]);
  }
  return Value::MakeList(std::move(out));
}
StatusOr<Value> Select(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, true);
}
StatusOr<Value> Reject(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, false);
}
StatusOr<Value> SelectAttr(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, true);
}
StatusOr<Value> RejectAttr(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, false);
}

StatusOr<Value> Items(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, item] : v.dict().entries())
    out.push_back(Value::MakeTuple({Value(k), item}));
  return Value::MakeList(std::move(out));
}

StatusOr<Value> Default(Interpreter&, const Value& v, CallArgs& a) {
  const Value* d = Arg(a, 0, "default_value");
  const Value* boolean = Arg(a, 1, "boolean");
  bool use = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
  if (!use) return v;
  return d ? *d : Value(std::string());
}

StatusOr<Value> String(Interpreter&, const Value& v, CallArgs&) { return Value(ToPythonStr(v)); }

StatusOr<Value> Escape(Interpreter&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : ToPythonStr(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value(std::move(out));
}

std::string StripAscii(const std::string& s) { return StripString(s, nullptr, true, true); }

StatusOr<Value> Int(Interpreter&, const Value& v, CallArgs& a) {
  const Value* d = Arg(a, 0, "default");
  const Value* base_arg = Arg(a, 1, "base");
  Value dflt = d ? *d : Value(int64_t{0});
  int base = base_arg && base_arg->is_integral() ? static_cast<int>(base_arg->integer()) : 10;
  if (v.is_integral()) return Value(v.integer());
  if (v.is_float()) {
    double x = std::trunc(v.number());
    if (!std::isfinite(x) || std::fabs(x) > 9.2e18) return dflt;
    return Value(static_cast<int64_t>(x));
  }
  if (!v.is_string()) return dflt;
  std::string s = StripAscii(v.str());
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (!s.empty()) {
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(s.c_str(), &end, base);
    if (errno == 0 && end == s.c_str() + s.size()) return Value(static_cast<int64_t>(x));
    double f = std::strtod(s.c_str(), &end);
    if (end == s.c_str() + s.size() && std::isfinite(f) && std::fabs(f) < 9.2e18) {
      return Value(static_cast<int64_t>(std::trunc(f)));
    }
  }
  return dflt;
}

StatusOr<Value> Float(Interpreter&, const Value& v, CallArgs& a) {
  const Value* d = Arg(a, 0, "default");
  Value dflt = d ? *d : Value(0.0);
  if (v.is_number()) return Value(v.number());
  if (!v.is_string()) return dflt;
  std::string s = StripAscii(v.str());
  if (s.empty()) return dflt;
  char* end = nullptr;
  double f = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return dflt;
  return Value(f);
}

StatusOr<Value> Round(Interpreter&, const Value& v, CallArgs& a) {
  const Value* p = Arg(a, 0, "precision");
  const Value* m = Arg(a, 1, "method");
  int64_t precision = p && p->is_integral() ? p->integer() : 0;
  std::string method = m && m->is_string() ? m->str() : "common";
  if (!v.is_number()) return InvalidArgument("round() requires a number");
  if (method != "common" && method != "ceil" && method != "floor") {
    return InvalidArgument("method must be common, ceil or floor");
  }
  if (method == "common") {
    if (v.is_integral()) {  // Python round(int, n) stays an int
      if (precision >= 0) return Value(v.integer());
      if (precision < -18) return Value(int64_t{0});
      double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value(
          static_cast<int64_t>(std::nearbyint(static_cast<double>(v.integer()) / scale) * scale));
    }
    if (precision > 300 || !std::isfinite(v.number())) return Value(v.number());
    if (precision < 0) {
      double scale = std::pow(10.0, static_cast<double>(-precision));
      return Value(std::nearbyint(v.number() / scale) * scale);  // half-even, as Python
    }
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), v.number());  // half-even
    return Value(std::strtod(buf, nullptr));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.number() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

StatusOr<Value> Abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.number()));
  if (v.is_integral()) {
    if (v.integer() == INT64_MIN) return OutOfRange("integer overflow");
    return Value(v.integer() < 0 ? -v.integer() : v.integer());
  }
  return InvalidArgument("bad operand type for abs(): '" + v.TypeName() + "'");
}

// Sort key: the attribute (if any), lower-cased when strings compare case-insensitively.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(utf8::Lower(v.str()));
  return v;
}

StatusOr<List> SortedItems(Interpreter& in, const Value& v, CallArgs& a, bool* reverse_out) {
  const Value* reverse = Arg(a, 0, "reverse");
  const Value* cs = Arg(a, 1, "case_sensitive");
  const Value* attr = Arg(a, 2, "attribute");
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  OASIS_ASSIGN_OR_RETURN(List keys, Attributes(in, v, attr, nullptr));
  bool case_sensitive = cs && cs->Truthy();
  bool rev = reverse && reverse->Truthy();
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status error;
  // Python's sorted(reverse=True) keeps equal items in their original order.
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (rev) std::swap(x, y);
    auto less = ValueLess(SortKey(keys[x], case_sensitive), SortKey(keys[y], case_sensitive));
    if (!less.ok()) {
      if (error.ok()) error = less.status();
      return false;
    }
    return less.value();
  });
  OASIS_RETURN_IF_ERROR(error);
  if (reverse_out) *reverse_out = rev;
  List out;
  for (size_t i : order) out.push_back(items[i]);
  return out;
}

StatusOr<Value> Sort(Interpreter& in, const Value& v, CallArgs& a) {
  OASIS_ASSIGN_OR_RETURN(List out, SortedItems(in, v, a, nullptr));
  return Value::MakeList(std::move(out));
}

StatusOr<Value> MinMax(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  const Value* cs = Arg(a, 0, "case_sensitive");
  const Value* attr = Arg(a, 1, "attribute");
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  OASIS_ASSIGN_OR_RETURN(List keys, Attributes(in, v, attr, nullptr));
  if (items.empty())
    return Value::MakeUndefined(std::string("No aggregated item, sequence was empty."));
  bool case_sensitive = cs && cs->Truthy();
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    Value a_key = SortKey(keys[i], case_sensitive), b_key = SortKey(keys[best], case_sensitive);
    OASIS_ASSIGN_OR_RETURN(bool better,
                           want_max ? ValueLess(b_key, a_key) : ValueLess(a_key, b_key));
    if (better) best = i;
  }
  return items[best];
}
StatusOr<Value> Min(Interpreter& in, const Value& v, CallArgs& a) {
  return MinMax(in, v, a, false);
}
StatusOr<Value> Max(Interpreter& in, const Value& v, CallArgs& a) { return MinMax(in, v, a, true); }

StatusOr<Value> Unique(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* cs = Arg(a, 0, "case_sensitive");
  const Value* attr = Arg(a, 1, "attribute");
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  OASIS_ASSIGN_OR_RETURN(List keys, Attributes(in, v, attr, nullptr));
  bool case_sensitive = cs && cs->Truthy();
  List out, seen;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = SortKey(keys[i], case_sensitive);
    bool dup = false;
    for (const Value& s : seen) dup = dup || ValuesEqual(s, key);
    OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(seen.size()) / 64 + 1));
    if (dup) continue;
    seen.push_back(key);
    out.push_back(items[i]);
  }
  return Value::MakeList(std::move(out));
}

StatusOr<Value> DictSort(Interpreter& in, const Value& v, CallArgs& a) {
  if (!v.is_dict()) return InvalidArgument("dictsort requires a mapping");
  const Value* cs = Arg(a, 0, "case_sensitive");
  const Value* by = Arg(a, 1, "by");
  const Value* reverse = Arg(a, 2, "reverse");
  int pos = by && by->is_string() && by->str() == "value" ? 1 : 0;
  List pairs;
  for (const auto& [k, item] : v.dict().entries())
    pairs.push_back(Value::MakeTuple({Value(k), item}));
  CallArgs sort_args;
  sort_args.keyword = {{"reverse", reverse ? *reverse : Value(false)},
                       {"case_sensitive", cs ? *cs : Value(false)},
                       {"attribute", Value(static_cast<int64_t>(pos))}};
  return Sort(in, Value::MakeList(std::move(pairs)), sort_args);
}

StatusOr<Value> Indent(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* width = Arg(a, 0, "width");
  const Value* first = Arg(a, 1, "first");
  const Value* blank = Arg(a, 2, "blank");
  std::string ind =
      width == nullptr ? "    "
      : width->is_string()
          ? width->str()
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width->integer(), 0, 1 << 16)),
                        ' ');
  CallArgs none;
  OASIS_ASSIGN_OR_RETURN(Value lines_v,
                         StrMethod(in, Value(ToPythonStr(v) + "\n"), "splitlines", none));
  const List& lines = lines_v.list();
  OASIS_RETURN_IF_ERROR(in.CheckSize(ToPythonStr(v).size() + lines.size() * ind.size()));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].str();
    if (i > 0) out += "\n";
    if (i > 0 && (!line.empty() || (blank && blank->Truthy()))) out += ind;
    out += line;
  }
  if (first && first->Truthy()) out = ind + out;
  return Value(std::move(out));
}

StatusOr<Value> WordCount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8::Decode(ToPythonStr(v))) {
    bool w = c == '_' || utf8::IsAlpha(c) || utf8::IsDigit(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

StatusOr<Value> Reverse(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string c = utf8::Decode(v.str());
    std::reverse(c.begin(), c.end());
    return Value(utf8::Encode(c));
  }
  OASIS_ASSIGN_OR_RETURN(List items, in.Iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

StatusOr<Value> Sum(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* attr = Arg(a, 0, "attribute");
  const Value* start = Arg(a, 1, "start");
  OASIS_ASSIGN_OR_RETURN(List items, Attributes(in, v, attr, nullptr));
  Value total = start ? *start : Value(int64_t{0});
  for (const Value& item : items) {
    OASIS_ASSIGN_OR_RETURN(total, BinaryOp(in, "+", total, item));
  }
  return total;
}

StatusOr<Value> Attr(Interpreter&, const Value& v, CallArgs& a) {
  const Value* name = Arg(a, 0, "name");
  if (name == nullptr || !name->is_string()) return InvalidArgument("attr requires a name");
  return GetAttr(v, name->str());
}

StatusOr<Value> Safe(Interpreter&, const Value& v, CallArgs&) { return Value(ToPythonStr(v)); }

}  // namespace

FilterFn FindFilter(std::string_view name) {
  static const std::pair<std::string_view, Fn> kFilters[] = {{"tojson", ToJson},
                                                             {"length", Length},
                                                             {"count", Length},
                                                             {"trim", Trim},
                                                             {"upper", Upper},
                                                             {"lower", Lower},
                                                             {"title", Title},
                                                             {"capitalize", Capitalize},
                                                             {"replace", Replace},
                                                             {"first", First},
                                                             {"last", Last},
                                                             {"list", ToList},
                                                             {"join", Join},
                                                             {"map", Map},
                                                             {"select", Select},
                                                             {"reject", Reject},
                                                             {"selectattr", SelectAttr},
                                                             {"rejectattr", RejectAttr},
                                                             {"items", Items},
                                                             {"default", Default},
                                                             {"d", Default},
                                                             {"string", String},
                                                             {"safe", Safe},
                                                             {"escape", Escape},
                                                             {"e", Escape},
                                                             {"int", Int},
                                                             {"float", Float},
                                                             {"round", Round},
                                                             {"abs", Abs},
                                                             {"unique", Unique},
                                                             {"dictsort", DictSort},
                                                             {"indent", Indent},
                                                             {"wordcount", WordCount},
                                                             {"reverse", Reverse},
                                                             {"sort", Sort},
                                                             {"sum", Sum},
                                                             {"min", Min},
                                                             {"max", Max},
                                                             {"attr", Attr}};
  for (const auto& [n, f] : kFilters) {
    if (n == name) return f;
  }
  return nullptr;
}

}  // namespace oasis::jinja

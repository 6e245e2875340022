// Attribute and item access (Jinja2's getattr/getitem fallbacks), Python methods of str, dict
// and list as bound-method callables, and argument helpers.
#include <algorithm>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

bool OneOf(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const std::initializer_list<std::string_view> kStrMethods = {
    "startswith", "endswith", "split",      "rsplit",     "strip",   "lstrip",  "rstrip",
    "upper",      "lower",    "title",      "capitalize", "replace", "find",    "rfind",
    "index",      "count",    "join",       "isdigit",    "isalpha", "isspace", "isupper",
    "islower",    "isalnum",  "splitlines", "format"};
const std::initializer_list<std::string_view> kDictMethods = {"items", "keys", "values", "get"};
const std::initializer_list<std::string_view> kDictUnsafe = {"clear", "pop", "popitem",
                                                             "setdefault", "update"};
const std::initializer_list<std::string_view> kListMethods = {"index", "count"};
const std::initializer_list<std::string_view> kListUnsafe = {
    "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};

Value Unsafe(const Value& obj, const std::string& name) {
  return Value::MakeUndefined("access to attribute '" + name + "' of '" + obj.TypeName() +
                              "' object is unsafe.");
}
Value NoAttr(const Value& obj, const std::string& name) {
  return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
}

StatusOr<std::string> StrArg(const CallArgs& a, size_t pos, std::string_view name,
                             std::string_view fn) {
  const Value* v = Arg(a, pos, name);
  if (v == nullptr || !v->is_string()) {
    return InvalidArgument(std::string(fn) + "() argument '" + std::string(name) + "' must be str");
  }
  return v->str();
}

std::vector<std::string> SplitString(const std::string& s, const Value* sep, int64_t maxsplit,
                                     bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    std::u32string c = utf8::Decode(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end)
    if (!from_right) {
      size_t i = 0;
      while (i < c.size()) {
        while (i < c.size() && utf8::IsSpace(c[i])) ++i;
        if (i == c.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(i, c.size());  // the remainder keeps its trailing whitespace
          break;
        }
        size_t b = i;
        while (i < c.size() && !utf8::IsSpace(c[i])) ++i;
        words.emplace_back(b, i);
      }
    } else {
      size_t i = c.size();
      while (i > 0) {
        while (i > 0 && utf8::IsSpace(c[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, i);  // the remainder keeps its leading whitespace
          break;
        }
        size_t e = i;
        while (i > 0 && !utf8::IsSpace(c[i - 1])) --i;
        words.emplace_back(i, e);
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words)
      parts.push_back(utf8::Encode(std::u32string_view(c).substr(b, e - b)));
    return parts;
  }
  const std::string& d = sep->str();
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t at = s.find(d, start);
      if (at == std::string::npos) break;
      parts.push_back(s.substr(start, at - start));
      start = at + d.size();
    }
    parts.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < d.size()) break;
      size_t at = s.rfind(d, end - d.size());
      if (at == std::string::npos) break;
      parts.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

Value StringList(const std::vector<std::string>& parts) {
  List out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value::MakeList(std::move(out));
}

// Python str.title() / str.capitalize().
std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8::Decode(s)) {
    utf8::Append(out, prev_cased ? utf8::ToLower(c) : utf8::ToTitle(c));
    prev_cased = utf8::IsUpper(c) || utf8::IsLower(c);
  }
  return out;
}

StatusOr<Value> Format(Interpreter& in, const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos)
      return InvalidArgument("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      return Unimplemented("format specifications are not supported in str.format");
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.positional.size() ? &a.positional[auto_index++] : nullptr;
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t k = std::stoul(field);
      v = k < a.positional.size() ? &a.positional[k] : nullptr;
    } else {
      v = Arg(a, SIZE_MAX, field);
    }
    if (v == nullptr) return InvalidArgument("format field '" + field + "' not given");
    out += ToPythonStr(*v);
    OASIS_RETURN_IF_ERROR(in.CheckSize(out.size()));
    i = close;
  }
  return Value(std::move(out));
}

StatusOr<Value> CallStrMethod(Interpreter& in, const std::string& s, const std::string& m,
                              CallArgs& a) {
  if (m == "startswith" || m == "endswith") {
    const Value* p = Arg(a, 0, "prefix");
    if (p == nullptr) return InvalidArgument(m + "() takes at least 1 argument (0 given)");
    std::vector<std::string> options;
    if (p->is_string()) {
      options.push_back(p->str());
    } else if (p->is_list()) {
      for (const Value& v : p->list()) {
        if (!v.is_string()) return InvalidArgument(m + "() tuple items must be str");
        options.push_back(v.str());
      }
    } else {
      return InvalidArgument(m + " first arg must be str or a tuple of str, not " + p->TypeName());
    }
    for (const auto& o : options) {
      bool hit = m == "startswith"
                     ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                     : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
      if (hit) return Value(true);
    }
    return Value(false);
  }
  if (m == "split" || m == "rsplit") {
    const Value* sep = Arg(a, 0, "sep");
    const Value* maxsplit = Arg(a, 1, "maxsplit");
    if (sep && !sep->is_none() && !sep->is_string())
      return InvalidArgument("must be str or None, not " + sep->TypeName());
    if (sep && sep->is_string() && sep->str().empty()) return InvalidArgument("empty separator");
    if (maxsplit && !maxsplit->is_integral()) return InvalidArgument("maxsplit must be an integer");
    auto parts = SplitString(s, sep, maxsplit ? maxsplit->integer() : -1, m == "rsplit");
    OASIS_RETURN_IF_ERROR(in.CountIteration(static_cast<int64_t>(parts.size()) / 16));
    return StringList(parts);
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    const Value* chars = Arg(a, 0, "chars");
    if (chars && !chars->is_none() && !chars->is_string())
      return InvalidArgument(m + " arg must be None or str");
    const std::string* set = (chars && chars->is_string()) ? &chars->str() : nullptr;
    return Value(StripString(s, set, m != "rstrip", m != "lstrip"));
  }
  if (m == "upper") return Value(utf8::Upper(s));
  if (m == "lower") return Value(utf8::Lower(s));
  if (m == "title") return Value(PyTitle(s));
  if (m == "capitalize") {
    std::u32string c = utf8::Decode(s);
    std::string out;
    for (size_t i = 0; i < c.size(); ++i)
      utf8::Append(out, i == 0 ? utf8::ToTitle(c[i]) : utf8::ToLower(c[i]));
    return Value(std::move(out));
  }
  if (m == "replace") {
    OASIS_ASSIGN_OR_RETURN(std::string old, StrArg(a, 0, "old", m));
    OASIS_ASSIGN_OR_RETURN(std::string rep, StrArg(a, 1, "new", m));
    const Value* count = Arg(a, 2, "count");
    int64_t limit = count && count->is_integral() ? count->integer() : -1;
    std::string out;
    int64_t done = 0;
    if (old.empty()) {
      std::u32string c = utf8::Decode(s);
      for (size_t i = 0; i <= c.size(); ++i) {
        if (limit < 0 || done < limit) {
          out += rep;
          ++done;
        }
        if (i < c.size()) utf8::Append(out, c[i]);
        OASIS_RETURN_IF_ERROR(in.CheckSize(out.size()));
      }
      return Value(std::move(out));
    }
    size_t start = 0;
    while (limit < 0 || done < limit) {
      size_t at = s.find(old, start);
      if (at == std::string::npos) break;
      out.append(s, start, at - start);
      out += rep;
      start = at + old.size();
      ++done;
      OASIS_RETURN_IF_ERROR(in.CheckSize(out.size()));
    }
    out.append(s, start);
    return Value(std::move(out));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "count") {
    OASIS_ASSIGN_OR_RETURN(std::string sub, StrArg(a, 0, "sub", m));
    if (m == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(utf8::Length(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    }
    size_t at = m == "rfind" ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (m == "index") return InvalidArgument("substring not found");
      return Value(int64_t{-1});
    }
    return Value(static_cast<int64_t>(utf8::Length(std::string_view(s).substr(0, at))));
  }
  if (m == "join") {
    const Value* items = Arg(a, 0, "iterable");
    if (items == nullptr) return InvalidArgument("join() takes exactly one argument");
    OASIS_ASSIGN_OR_RETURN(List list, in.Iterate(*items));
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string())
        return InvalidArgument("sequence item " + std::to_string(i) + ": expected str instance, " +
                               list[i].TypeName() + " found");
      if (i) out += s;
      out += list[i].str();
      OASIS_RETURN_IF_ERROR(in.CheckSize(out.size()));
    }
    return Value(std::move(out));
  }
  if (m == "splitlines") {
    std::vector<std::string> parts;
    std::u32string c = utf8::Decode(s);
    std::u32string cur;
    for (size_t i = 0; i < c.size(); ++i) {
      char32_t ch = c[i];
      bool brk = ch == '\n' || ch == '\r' || ch == 0x0B || ch == 0x0C || ch == 0x1C || ch == 0x1D ||
                 ch == 0x1E || ch == 0x85 || ch == 0x2028 || ch == 0x2029;
      if (!brk) {
        cur.push_back(ch);
        continue;
      }
      if (ch == '\r' && i + 1 < c.size() && c[i + 1] == '\n') ++i;
      parts.push_back(utf8::Encode(cur));
      cur.clear();
    }
    if (!cur.empty()) parts.push_back(utf8::Encode(cur));
    return StringList(parts);
  }
  if (m == "format") return Format(in, s, a);
  // Predicates: isdigit isalpha isspace isupper islower isalnum.
  std::u32string c = utf8::Decode(s);
  if (c.empty()) return Value(false);
  bool all = true, any_cased = false, any_upper = false, any_lower = false;
  for (char32_t ch : c) {
    any_upper = any_upper || utf8::IsUpper(ch);
    any_lower = any_lower || utf8::IsLower(ch);
    any_cased = any_upper || any_lower;
    if (m == "isdigit") all = all && utf8::IsDigit(ch);
    if (m == "isalpha") all = all && utf8::IsAlpha(ch);
    if (m == "isalnum") all = all && (utf8::IsAlpha(ch) || utf8::IsDigit(ch));
    if (m == "isspace") all = all && utf8::IsSpace(ch);
  }
  if (m == "isupper") return Value(any_cased && !any_lower);
  if (m == "islower") return Value(any_cased && !any_upper);
  return Value(all);
}

StatusOr<Value> CallDictMethod(const Dict& d, const std::string& m, CallArgs& a) {
  if (m == "get") {
    const Value* key = Arg(a, 0, "key");
    const Value* dflt = Arg(a, 1, "default");
    if (key == nullptr) return InvalidArgument("get expected at least 1 argument, got 0");
    if (key->is_string()) {
      if (const Value* v = d.Find(key->str())) return *v;
    }
    return dflt ? *dflt : Value::None();
  }
  List out;
  for (const auto& [k, v] : d.entries()) {
    if (m == "keys") {
      out.emplace_back(k);
    } else if (m == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::MakeTuple({Value(k), v}));
    }
  }
  return Value::MakeList(std::move(out));
}

// `obj.method` bound to its receiver. Owns a (shared, immutable) copy of the receiver.
class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
  StatusOr<Value> Call(Interpreter& in, CallArgs& args) const override {
    if (self_.is_string()) return CallStrMethod(in, self_.str(), name_, args);
    if (self_.is_dict()) return CallDictMethod(self_.dict(), name_, args);
    const Value* x = Arg(args, 0, "value");
    if (x == nullptr) return InvalidArgument(name_ + "() takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < self_.list().size(); ++i) {
      if (!ValuesEqual(self_.list()[i], *x)) continue;
      if (name_ == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name_ == "index") return InvalidArgument(ToPythonRepr(*x) + " is not in list");
    return Value(n);
  }
  std::string Name() const override { return self_.TypeName() + "." + name_; }

 private:
  Value self_;
  std::string name_;
};

Value Bind(const Value& self, const std::string& name) {
  return Value(Value::CallablePtr(std::make_shared<BoundMethod>(self, name)));
}

}  // namespace

const Value* Arg(const CallArgs& args, size_t pos, std::string_view name) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return pos < args.positional.size() ? &args.positional[pos] : nullptr;
}

Status CheckArgs(const CallArgs& args, std::string_view fn, size_t max_positional,
                 std::initializer_list<std::string_view> names) {
  if (args.positional.size() > max_positional) {
    return InvalidArgument(std::string(fn) + "() takes at most " + std::to_string(max_positional) +
                           " positional argument(s)");
  }
  for (const auto& [k, v] : args.keyword) {
    if (!OneOf(k, names)) {
      return InvalidArgument(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
    }
  }
  return Status::Ok();
}

StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return InvalidArgument(obj.undefined().message);
    case Value::Kind::kDict:
      if (OneOf(name, kDictMethods)) return Bind(obj, name);
      if (OneOf(name, kDictUnsafe)) return Unsafe(obj, name);
      if (const Value* v = obj.dict().Find(name)) return *v;
      return NoAttr(obj, name);
    case Value::Kind::kNamespace:
      if (const Value* v = obj.ns()->attrs.Find(name)) return *v;
      return Value::MakeUndefined("'Namespace' object has no attribute '" + name + "'");
    case Value::Kind::kString:
      if (OneOf(name, kStrMethods)) return Bind(obj, name);
      return NoAttr(obj, name);
    case Value::Kind::kList:
      if (OneOf(name, kListMethods)) return Bind(obj, name);
      if (OneOf(name, kListUnsafe)) return Unsafe(obj, name);
      return NoAttr(obj, name);
    default:
      return NoAttr(obj, name);
  }
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return InvalidArgument(obj.undefined().message);
  if (key.is_integral() && (obj.is_list() || obj.is_string())) {
    int64_t i = key.integer();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[static_cast<size_t>(i)];
      return Value::MakeUndefined("list object has no element " + std::to_string(key.integer()));
    }
    std::u32string c = utf8::Decode(obj.str());
    int64_t n = static_cast<int64_t>(c.size());
    if (i < 0) i += n;
    if (i >= 0 && i < n) return Value(utf8::Encode(c.substr(static_cast<size_t>(i), 1)));
    return Value::MakeUndefined("str object has no element " + std::to_string(key.integer()));
  }
  if (key.is_string()) {
    if (obj.is_dict()) {
      if (const Value* v = obj.dict().Find(key.str())) return *v;
    }
    return GetAttr(obj, key.str());
  }
  return Value::MakeUndefined("'" + obj.TypeName() + " object' has no element " +
                              ToPythonRepr(key));
}

}  // namespace oasis::jinja

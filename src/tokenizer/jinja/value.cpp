#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/check.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : entries_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

Value Value::MakeList(List items) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth_);
  Value out;
  out.v_ = std::make_shared<const List>(std::move(items));
  out.depth_ = depth + 1;
  return out;
}

Value Value::MakeTuple(List items) {
  Value out = MakeList(std::move(items));
  out.tuple_ = true;
  return out;
}

Value Value::MakeDict(Dict dict) {
  int depth = 0;
  for (const auto& [k, v] : dict.entries()) depth = std::max(depth, v.depth_);
  Value out;
  out.v_ = std::make_shared<const Dict>(std::move(dict));
  out.depth_ = depth + 1;
  return out;
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return boolean();
    case Kind::kInt:
      return integer() != 0;
    case Kind::kFloat:
      return number() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().empty();
    case Kind::kDict:
      return dict().size() != 0;
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string FormatPythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout (fixed for 1e-4 <= |d| < 1e16).
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  OASIS_CHECK(res.ec == std::errc()) << "to_chars failed for a finite double";
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(static_cast<size_t>(exponent + 1 - digits.size()), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

static std::string ReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8::Decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!utf8::IsPrintable(c)) {
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      utf8::Append(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

std::string ToPythonRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return ReprString(v.str());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += ", ";
        out += ToPythonRepr(v.list()[i]);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict().entries()) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + ToPythonRepr(item);
      }
      return out + "}";
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return ToPythonStr(v);
  }
}

std::string ToPythonStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.boolean() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.integer());
    case Value::Kind::kFloat:
      return FormatPythonFloat(v.number());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return ToPythonRepr(v);
    case Value::Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, item] : v.ns()->attrs.entries()) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + (item.is_namespace() ? "<Namespace>" : ToPythonRepr(item));
      }
      return out + "}>";
    }
    case Value::Kind::kCallable:
      return "<function " + v.callable()->Name() + ">";
  }
  return "";
}

bool ValuesEqual(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() == b.number();
    return a.integer() == b.integer();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!ValuesEqual(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().entries()) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !ValuesEqual(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return a.ns() == b.ns();
    case Value::Kind::kCallable:
      return a.callable() == b.callable();
    default:
      return false;
  }
}

StatusOr<bool> ValueLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() < b.number();
    return a.integer() < b.integer();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // byte order == code point order
  if (a.is_list() && b.is_list()) {
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (ValuesEqual(x[i], y[i])) continue;
      return ValueLess(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined() || b.is_undefined()) {
    return InvalidArgument(a.is_undefined() ? a.undefined().message : b.undefined().message);
  }
  return InvalidArgument("'<' not supported between instances of '" + a.TypeName() + "' and '" +
                         b.TypeName() + "'");
}

// ---- json.dumps ------------------------------------------------------------------------------

static void DumpString(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : utf8::Decode(s)) {
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      utf8::Append(out, c);
    }
  }
  out.push_back('"');
}

static Status DumpValue(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  const std::string item_sep = o.has_separators ? o.item_separator : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) out += o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.boolean() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.integer());
      return Status::Ok();
    case Value::Kind::kFloat: {
      double d = v.number();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                             : FormatPythonFloat(d);
      return Status::Ok();
    }
    case Value::Kind::kString:
      DumpString(out, v.str(), o.ensure_ascii);
      return Status::Ok();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return Status::Ok();
      }
      out.push_back('[');
      bool first = true;
      for (const Value& item : v.list()) {
        if (!first) out += item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        OASIS_RETURN_IF_ERROR(DumpValue(out, item, o, level + 1));
      }
      if (o.has_indent) newline(level);
      out.push_back(']');
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      if (v.dict().size() == 0) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.dict().entries()) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out.push_back('{');
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += item_sep;
        first = false;
        if (o.has_indent) newline(level + 1);
        DumpString(out, e->first, o.ensure_ascii);
        out += key_sep;
        OASIS_RETURN_IF_ERROR(DumpValue(out, e->second, o, level + 1));
      }
      if (o.has_indent) newline(level);
      out.push_back('}');
      return Status::Ok();
    }
    default:
      return InvalidArgument("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

StatusOr<std::string> DumpJson(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  OASIS_RETURN_IF_ERROR(DumpValue(out, v, options, 0));
  return out;
}

// ---- nlohmann::ordered_json ------------------------------------------------------------------

static StatusOr<Value> FromJsonImpl(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) return InvalidArgument("JSON value nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) {
        OASIS_ASSIGN_OR_RETURN(Value item, FromJsonImpl(e, depth + 1));
        items.push_back(std::move(item));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = j.begin(); it != j.end(); ++it) {
        OASIS_ASSIGN_OR_RETURN(Value item, FromJsonImpl(it.value(), depth + 1));
        dict.Set(it.key(), std::move(item));
      }
      return Value::MakeDict(std::move(dict));
    }
    default:
      return InvalidArgument("unsupported JSON value (binary or discarded)");
  }
}

StatusOr<Value> FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j, 0); }

StatusOr<nlohmann::ordered_json> ToJson(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      return nlohmann::ordered_json(nullptr);
    case Value::Kind::kBool:
      return nlohmann::ordered_json(v.boolean());
    case Value::Kind::kInt:
      return nlohmann::ordered_json(v.integer());
    case Value::Kind::kFloat:
      return nlohmann::ordered_json(v.number());
    case Value::Kind::kString:
      return nlohmann::ordered_json(v.str());
    case Value::Kind::kList: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const Value& item : v.list()) {
        OASIS_ASSIGN_OR_RETURN(nlohmann::ordered_json j, ToJson(item));
        out.push_back(std::move(j));
      }
      return out;
    }
    case Value::Kind::kDict: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const auto& [k, item] : v.dict().entries()) {
        OASIS_ASSIGN_OR_RETURN(nlohmann::ordered_json j, ToJson(item));
        out[k] = std::move(j);
      }
      return out;
    }
    default:
      return InvalidArgument("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace oasis::jinja

#include "tokenizer/structured/json_schema.h"

#include "tokenizer/structured/regex.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>

namespace oasis::structured {
namespace {

using Json = nlohmann::ordered_json;

// Keywords that only annotate (JSON Schema's meta-data and format-annotation vocabularies,
// OpenAPI's and pydantic's extras): they constrain nothing.
const std::set<std::string_view> kAnnotations = {
    "title",     "description", "default",         "examples",         "example",
    "$schema",   "$id",         "$comment",        "deprecated",       "readOnly",
    "writeOnly", "format",      "contentEncoding", "contentMediaType", "discriminator",
    "strict",    "$defs",       "definitions"};

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::strict); }

// Integer bounds: as regular expressions over decimal digits (no leading zeros).
constexpr int kMaxIntegerDigits = 31;  // (with a sign: the grammar's 32-byte numbers)

// The digit strings of a's length from a to b (a <= b, as text), each alternative appended.
void SameLength(const std::string& a, const std::string& b, const std::string& prefix,
                std::vector<std::string>* out) {
  if (a.empty()) {
    out->push_back(prefix);
    return;
  }
  if (a[0] == b[0]) {
    SameLength(a.substr(1), b.substr(1), prefix + a[0], out);
    return;
  }
  const size_t n = a.size() - 1;
  const std::string any = n > 0 ? "[0-9]{" + std::to_string(n) + "}" : "";
  if (a.substr(1) == std::string(n, '0') && b.substr(1) == std::string(n, '9')) {
    out->push_back(prefix + "[" + a[0] + "-" + b[0] + "]" + any);
    return;
  }
  SameLength(a.substr(1), std::string(n, '9'), prefix + a[0], out);
  if (b[0] - a[0] > 1) {
    out->push_back(prefix + "[" + static_cast<char>(a[0] + 1) + "-" + static_cast<char>(b[0] - 1) +
                   "]" + any);
  }
  SameLength(std::string(n, '0'), b.substr(1), prefix + b[0], out);
}

// The largest integer of d digits (saturated past int64).
int64_t MaxOfDigits(size_t d) {
  int64_t v = 0;
  for (size_t i = 0; i < d; ++i) {
    if (v > (std::numeric_limits<int64_t>::max() - 9) / 10)
      return std::numeric_limits<int64_t>::max();
    v = v * 10 + 9;
  }
  return v;
}

// The integers a..b (b < 0: no upper bound) for 0 <= a <= 10^18.
void NonNegative(int64_t a, int64_t b, std::vector<std::string>* out) {
  const std::string as = std::to_string(a);
  const int64_t top = b >= 0 ? b : MaxOfDigits(as.size());
  for (size_t d = as.size(); d <= std::to_string(top).size(); ++d) {
    const int64_t lo = std::max(a, d == 1 ? int64_t{0} : MaxOfDigits(d - 1) + 1);
    const int64_t hi = std::min(top, MaxOfDigits(d));
    if (lo <= hi) SameLength(std::to_string(lo), std::to_string(hi), "", out);
  }
  if (b < 0) {  // every longer number
    out->push_back("[1-9][0-9]{" + std::to_string(as.size()) + "," +
                   std::to_string(kMaxIntegerDigits - 1) + "}");
  }
}

// The string formats enforced (the others stay annotations, as JSON Schema has them): their
// values as regular expressions (RFC 3339 dates and times, RFC 4122 UUIDs, dotted IPv4, e-mail
// addresses and host names as their RFCs' common forms). Null for any other format.
const char* FormatRegex(const std::string& format) {
  static const std::map<std::string, std::string> kFormats = [] {
    const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    const std::string time =
        R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
    const std::string octet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
    const std::string label = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
    return std::map<std::string, std::string>{
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
        {"ipv4", "(" + octet + R"(\.){3})" + octet},
        {"hostname", label + R"((\.)" + label + ")*"},
        {"email", R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)" +
                      label + R"((\.)" + label + ")+"},
    };
  }();
  auto it = kFormats.find(format);
  return it == kFormats.end() ? nullptr : it->second.c_str();
}

// The schema's string format ("" when it names none).
std::string FormatOf(const Json& s) {
  return s.contains("format") && s["format"].is_string() ? s["format"].get<std::string>() : "";
}

std::string Join(const std::vector<std::string>& alts) {
  std::string out;
  for (const std::string& a : alts) out += (out.empty() ? "" : "|") + a;
  return out;
}

class Compiler {
 public:
  // Compiles `root` (the document its "#" references point into) into `g`.
  Compiler(const Json& root, Grammar* g) : root_(root), g_(g) {}

  StatusOr<int32_t> CompileRoot() { return Compile(root_, "#"); }

 private:
  Status Refuse(const std::string& where, const std::string& what) {
    return InvalidArgument("JSON schema at " + where + ": " + what);
  }

  StatusOr<int32_t> Compile(const Json& s, const std::string& where) {
    // (References nest compiles beyond the document's own depth: bounded too.)
    struct Depth {
      explicit Depth(int& d) : d(d) { ++d; }
      ~Depth() { --d; }
      int& d;
    } depth(depth_);
    if (depth_ > kMaxSchemaNesting) {
      return InvalidArgument("the JSON schema nests deeper than " +
                             std::to_string(kMaxSchemaNesting) + " levels (with its references)");
    }
    if (g_->size() > kMaxGrammarNodes) {
      return InvalidArgument("the JSON schema is too large (more than " +
                             std::to_string(kMaxGrammarNodes) + " grammar nodes)");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return g_->AnyValue();
      return Refuse(where, "the schema false matches nothing");
    }
    if (!s.is_object()) return Refuse(where, "a schema must be an object or a boolean");
    // clang-format off
    static const std::set<std::string_view> kKnown = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
        "prefixItems", "additionalItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
        "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "nullable"};
    // clang-format on
    for (const auto& [key, v] : s.items()) {
      if (kAnnotations.count(key) != 0 || kKnown.count(key) != 0) continue;
      if (key == "uniqueItems" && v.is_boolean() && !v.get<bool>()) continue;
      return Refuse(where, "'" + key + "' is not supported by this server's structured output");
    }
    auto value = CompileValue(s, where);
    if (!value.ok()) return value;
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) return Refuse(where, "'nullable' must be a boolean");
      if (s["nullable"].get<bool>()) return g_->Alt({*value, g_->Literal("null")});
    }
    return value;
  }

  // The keywords of `s` that assert something, besides `except`.
  static std::vector<std::string> Assertions(const Json& s, std::set<std::string_view> except) {
    std::vector<std::string> out;
    for (const auto& [key, v] : s.items()) {
      if (kAnnotations.count(key) == 0 && except.count(key) == 0 && key != "nullable") {
        out.push_back(key);
      }
    }
    return out;
  }

  StatusOr<int32_t> CompileValue(const Json& s, const std::string& where) {
    if (s.contains("$ref")) {
      const auto others = Assertions(s, {"$ref"});
      if (!others.empty()) {
        return Refuse(where, "'$ref' together with '" + others[0] + "' is not supported");
      }
      if (!s["$ref"].is_string()) return Refuse(where, "'$ref' must be a string");
      return Ref(s["$ref"].get<std::string>(), where);
    }
    for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(combinator)) continue;
      const auto others = Assertions(s, {combinator});
      if (!others.empty()) {
        return Refuse(where, std::string("'") + combinator + "' together with '" + others[0] +
                                 "' is not supported");
      }
      const Json& list = s[combinator];
      if (!list.is_array() || list.empty()) {
        return Refuse(where, std::string("'") + combinator + "' must be a non-empty list");
      }
      if (std::string_view(combinator) == "allOf") {
        if (list.size() != 1)
          return Refuse(where, "'allOf' of more than one schema is not supported");
        return Compile(list[0], where + "/allOf/0");
      }
      std::vector<int32_t> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        auto n = Compile(list[i], where + "/" + combinator + "/" + std::to_string(i));
        if (!n.ok()) return n;
        alts.push_back(*n);
      }
      return alts.size() == 1 ? alts[0] : g_->Alt(std::move(alts));
    }
    if (s.contains("const")) return g_->Literal(Dump(s["const"]));
    if (s.contains("enum")) {
      const Json& list = s["enum"];
      if (!list.is_array() || list.empty()) return Refuse(where, "'enum' must be a non-empty list");
      std::vector<int32_t> alts;
      std::set<std::string> seen;
      for (const Json& v : list) {
        std::string text = Dump(v);
        if (seen.insert(text).second) alts.push_back(g_->Literal(std::move(text)));
      }
      return alts.size() == 1 ? alts[0] : g_->Alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Refuse(where, "'type' must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Refuse(where, "'type' must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems") ||
               s.contains("prefixItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
               FormatRegex(FormatOf(s)) != nullptr) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      return Refuse(where, "numeric bounds without a 'type' are not supported (say 'integer')");
    } else {
      return g_->AnyValue();
    }
    std::vector<int32_t> alts;
    for (const std::string& type : types) {
      auto n = Typed(s, type, where);
      if (!n.ok()) return n;
      alts.push_back(*n);
    }
    return alts.size() == 1 ? alts[0] : g_->Alt(std::move(alts));
  }

  StatusOr<int32_t> Count(const Json& s, const char* key, const std::string& where, int32_t* out) {
    if (!s.contains(key)) return 0;
    const Json& v = s[key];
    if (!v.is_number_integer() &&
        !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))) {
      return Refuse(where, std::string("'") + key + "' must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d < 0 || d > 1e6) {
      return Refuse(where, std::string("'") + key + "' must be an integer in [0, 1000000]");
    }
    *out = static_cast<int32_t>(d);
    return 0;
  }

  // A minimum (default 0) and a maximum (default -1: none) count, the maximum not below.
  StatusOr<int32_t> Bounds(const Json& s, const char* min_key, const char* max_key,
                           const std::string& where, int32_t* lo, int32_t* hi) {
    if (auto st = Count(s, min_key, where, lo); !st.ok()) return st;
    if (!s.contains(max_key)) return 0;
    if (auto st = Count(s, max_key, where, hi); !st.ok()) return st;
    if (*hi < *lo) {
      return Refuse(where, std::string("'") + max_key + "' is below '" + min_key + "'");
    }
    return 0;
  }

  // An integer within minimum / maximum / exclusiveMinimum / exclusiveMaximum (2020-12's
  // numeric forms), as a regular expression over its digits.
  StatusOr<int32_t> Integer(const Json& s, const std::string& where) {
    constexpr double kLimit = 1e18;
    std::optional<int64_t> lo, hi;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const Json& v = s[k];
      if (!v.is_number()) {
        return Refuse(where, std::string("'") + k + "' must be a number (JSON Schema 2020-12)");
      }
      const double d = v.get<double>();
      if (!(std::fabs(d) <= kLimit)) {
        return Refuse(where, std::string("'") + k + "' beyond ±10^18 is not supported");
      }
      // (Integers exactly: a double rounds past 2^53.)
      const bool exact = v.is_number_integer();
      const int64_t whole = exact ? v.get<int64_t>() : 0;
      const std::string_view key = k;
      if (key == "minimum" || key == "exclusiveMinimum") {
        const int64_t b = key == "minimum"
                              ? (exact ? whole : static_cast<int64_t>(std::ceil(d)))
                              : (exact ? whole + 1 : static_cast<int64_t>(std::floor(d)) + 1);
        lo = lo ? std::max(*lo, b) : b;
      } else {
        const int64_t b = key == "maximum"
                              ? (exact ? whole : static_cast<int64_t>(std::floor(d)))
                              : (exact ? whole - 1 : static_cast<int64_t>(std::ceil(d)) - 1);
        hi = hi ? std::min(*hi, b) : b;
      }
    }
    if (!lo && !hi) return g_->Number(true);
    if (lo && hi && *lo > *hi) return Refuse(where, "the bounds leave no integer");
    std::vector<std::string> alts;
    if (!hi || *hi >= 0) {  // 0.. (or lo..) up to hi
      NonNegative(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1, &alts);
    }
    if (!lo || *lo <= -1) {  // -(1.. or -hi..) down to lo
      std::vector<std::string> neg;
      NonNegative(hi ? std::max<int64_t>(-*hi, 1) : 1, lo ? -*lo : -1, &neg);
      alts.push_back("-(" + Join(neg) + ")");
    }
    auto n = CompileRegex(Join(alts), g_, false);
    if (!n.ok()) return Refuse(where, std::string(n.status().message()));
    return *n;
  }

  // A tuple: the listed item schemas in order (as many as minItems / maxItems ask; the array may
  // end after any item at or past minItems), then further items of `rest` (absent or true: any
  // value; false: none).
  StatusOr<int32_t> Tuple(const Json& list, const std::string& list_where, const Json* rest,
                          const std::string& rest_where, int32_t lo, int32_t hi,
                          const std::string& where) {
    if (!list.is_array()) return Refuse(list_where, "a list of schemas is expected");
    std::vector<int32_t> items;
    for (size_t i = 0; i < list.size(); ++i) {
      auto n = Compile(list[i], list_where + "/" + std::to_string(i));
      if (!n.ok()) return n;
      items.push_back(*n);
    }
    int32_t more = g_->AnyValue();  // -1: no further items
    if (rest != nullptr && rest->is_boolean()) {
      if (!rest->get<bool>()) more = -1;
    } else if (rest != nullptr) {
      auto n = Compile(*rest, rest_where);
      if (!n.ok()) return n;
      more = *n;
    }
    const auto k = static_cast<int32_t>(items.size());
    if (more < 0 && lo > k) {
      return Refuse(where,
                    "'minItems' past the tuple's items, with no further items, matches nothing");
    }
    if (k == 0) return more < 0 ? g_->Array(g_->AnyValue(), 0, 0) : g_->Array(more, lo, hi);
    const int32_t ws = g_->Ws();
    // after: what may follow once i items are written, built from the end.
    int32_t after = g_->Literal("");
    if (more >= 0 && (hi < 0 || hi > k)) {
      after = g_->Repeat(g_->Seq({ws, g_->Literal(","), ws, more}), std::max(0, lo - k),
                         hi < 0 ? -1 : hi - k);
    }
    for (int32_t i = k - 1; i >= 1; --i) {
      if (hi >= 0 && i >= hi) {
        after = g_->Literal("");
        continue;
      }
      const int32_t next =
          g_->Seq({ws, g_->Literal(","), ws, items[static_cast<size_t>(i)], after});
      after = i < lo ? next : g_->Alt({g_->Literal(""), next});
    }
    const int32_t first = g_->Seq({items[0], after});
    const int32_t body = hi == 0   ? g_->Literal("")
                         : lo >= 1 ? first
                                   : g_->Alt({g_->Literal(""), first});
    return g_->Seq({g_->Literal("["), ws, body, ws, g_->Literal("]")});
  }

  StatusOr<int32_t> Typed(const Json& s, const std::string& type, const std::string& where) {
    if (type == "null") return g_->Literal("null");
    if (type == "boolean") return g_->Alt({g_->Literal("true"), g_->Literal("false")});
    if (type == "integer") return Integer(s, where);
    if (type == "number") {
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k)) {
          return Refuse(where, std::string("'") + k +
                                   "' is supported on integers only (a number's bounds are not "
                                   "enforced)");
        }
      }
      return g_->Number(false);
    }
    const std::string format = FormatOf(s);
    const char* format_regex = FormatRegex(format);
    if (type == "string" && (s.contains("pattern") || format_regex != nullptr)) {
      // The pattern (or the format's) matches the whole value (as vLLM's backends read it),
      // written inside the string with JSON's escapes.
      const char* key = s.contains("pattern") ? "pattern" : "format";
      if (s.contains("pattern") && !s["pattern"].is_string()) {
        return Refuse(where, "'pattern' must be a string");
      }
      if (s.contains("pattern") && format_regex != nullptr) {
        return Refuse(where, "'pattern' together with 'format' '" + format + "' is not supported");
      }
      if (s.contains("minLength") || s.contains("maxLength")) {
        return Refuse(where, std::string("'") + key +
                                 "' together with 'minLength' or 'maxLength' is not supported");
      }
      auto body = CompileRegex(
          format_regex != nullptr ? std::string(format_regex) : s["pattern"].get<std::string>(), g_,
          true);
      if (!body.ok()) return Refuse(where + "/" + key, std::string(body.status().message()));
      return g_->Seq({g_->Literal("\""), *body, g_->Literal("\"")});
    }
    if (type == "string") {
      int32_t lo = 0, hi = -1;
      if (auto st = Bounds(s, "minLength", "maxLength", where, &lo, &hi); !st.ok()) return st;
      return g_->String(lo, hi);
    }
    if (type == "array") {
      int32_t lo = 0, hi = -1;
      if (auto st = Bounds(s, "minItems", "maxItems", where, &lo, &hi); !st.ok()) return st;
      // Tuples: 2020-12's prefixItems (then items for the rest), or 2019's list of items (then
      // additionalItems).
      if (s.contains("prefixItems")) {
        if (s.contains("additionalItems")) {
          return Refuse(where,
                        "'additionalItems' with 'prefixItems' is not supported (say 'items')");
        }
        return Tuple(s["prefixItems"], where + "/prefixItems",
                     s.contains("items") ? &s["items"] : nullptr, where + "/items", lo, hi, where);
      }
      if (s.contains("items") && s["items"].is_array()) {
        return Tuple(s["items"], where + "/items",
                     s.contains("additionalItems") ? &s["additionalItems"] : nullptr,
                     where + "/additionalItems", lo, hi, where);
      }
      if (s.contains("additionalItems")) {
        return Refuse(where, "'additionalItems' applies to a list of 'items' only");
      }
      int32_t item = -1;
      if (s.contains("items")) {
        const Json& items = s["items"];
        if (items.is_boolean() && !items.get<bool>()) {
          if (lo > 0) return Refuse(where, "'items' false with 'minItems' above 0 matches nothing");
          hi = 0;
          item = g_->AnyValue();
        } else {
          auto n = Compile(items, where + "/items");
          if (!n.ok()) return n;
          item = *n;
        }
      } else {
        item = g_->AnyValue();
      }
      return g_->Array(item, lo, hi);
    }
    if (type == "object") return Object(s, where);
    return Refuse(where, "unknown type '" + type + "'");
  }

  StatusOr<int32_t> Object(const Json& s, const std::string& where) {
    const int32_t object = g_->Object();
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) return Refuse(where, "'required' must be a list of strings");
      for (const Json& name : r) {
        if (!name.is_string()) return Refuse(where, "'required' must be a list of strings");
        required.insert(name.get<std::string>());
      }
    }
    std::vector<ObjectMember> members;
    std::set<std::string> listed;
    if (s.contains("properties")) {
      const Json& props = s["properties"];
      if (!props.is_object()) return Refuse(where, "'properties' must be an object");
      for (const auto& [name, sub] : props.items()) {
        auto value = Compile(sub, where + "/properties/" + name);
        if (!value.ok()) return value;
        members.push_back({g_->Member(Dump(Json(name)), *value), required.count(name) != 0});
        listed.insert(name);
      }
    }
    for (const std::string& name : required) {
      if (listed.count(name) == 0) {
        return Refuse(where, "required property '" + name + "' is not in 'properties'");
      }
    }
    int32_t additional = -1;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) additional = g_->AnyValue();
      } else {
        auto n = Compile(a, where + "/additionalProperties");
        if (!n.ok()) return n;
        additional = *n;
      }
    } else if (!s.contains("properties")) {
      additional = g_->AnyValue();  // {"type": "object"}: any object
    }
    Node& node = g_->node(object);
    node.members = std::move(members);
    if (additional >= 0) {
      const int32_t ws = g_->Ws();
      const int32_t key = g_->String();
      const int32_t colon = g_->Literal(":");
      g_->node(object).additional = g_->Seq({key, ws, colon, ws, additional});
    }
    return object;
  }

  // A JSON pointer into the root ("#", "#/$defs/Name"); references already being compiled
  // become cycles in the grammar.
  StatusOr<int32_t> Ref(const std::string& ref, const std::string& where) {
    if (ref.empty() || ref[0] != '#') {
      return Refuse(where, "'$ref' '" + ref +
                               "' is not supported (only references inside the schema, '#...')");
    }
    auto known = refs_.find(ref);
    if (known != refs_.end()) return known->second;
    const Json* target = &root_;
    std::string_view rest = std::string_view(ref).substr(1);
    while (!rest.empty()) {
      if (rest[0] != '/') return Refuse(where, "'$ref' '" + ref + "' is not a JSON pointer");
      rest.remove_prefix(1);
      const size_t end = std::min(rest.find('/'), rest.size());
      std::string token(rest.substr(0, end));
      rest.remove_prefix(end);
      std::string unescaped;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size() &&
            (token[i + 1] == '0' || token[i + 1] == '1')) {
          unescaped += token[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          unescaped += token[i];
        }
      }
      if (target->is_object() && target->contains(unescaped)) {
        target = &(*target)[unescaped];
      } else if (target->is_array() && !unescaped.empty() &&
                 std::all_of(unescaped.begin(), unescaped.end(), ::isdigit) &&
                 unescaped.size() < 9 && std::stoul(unescaped) < target->size()) {
        target = &(*target)[std::stoul(unescaped)];
      } else {
        return Refuse(where, "'$ref' '" + ref + "' points at nothing");
      }
    }
    // A placeholder alternative of one child, filled once the target is compiled.
    const int32_t slot = g_->Alt({});
    refs_[ref] = slot;
    auto n = Compile(*target, ref);
    if (!n.ok()) return n;
    g_->node(slot).children = {*n};
    return slot;
  }

  const Json& root_;
  Grammar* g_;
  std::map<std::string, int32_t> refs_;
  int depth_ = 0;
};

// The checks every finished grammar passes.
StatusOr<std::shared_ptr<const Grammar>> Finish(std::shared_ptr<Grammar> g) {
  if (g->size() > kMaxGrammarNodes) {
    return InvalidArgument("the JSON schema is too large (more than " +
                           std::to_string(kMaxGrammarNodes) + " grammar nodes)");
  }
  if (g->LeftRecursive()) {
    return InvalidArgument(
        "the JSON schema refers to itself without any JSON in between ($ref or anyOf cycle)");
  }
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace

// Makes `pattern` the whitespace between g's tokens, once checked to match whitespace only.
Status UseWhitespacePattern(Grammar* g, std::string_view pattern) {
  if (pattern.empty()) return Status::Ok();
  CodePoints matched;
  auto node = CompileRegex(pattern, g, false, &matched);
  if (!node.ok())
    return InvalidArgument("whitespace pattern: " + std::string(node.status().message()));
  for (const auto& [lo, hi] : matched) {
    for (uint64_t c = lo; c <= hi; ++c) {
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
        return InvalidArgument(
            "whitespace pattern: it matches more than JSON's whitespace (' ', '\\t', '\\n', "
            "'\\r')");
      }
    }
  }
  g->SetWs(*node);
  return Status::Ok();
}

StatusOr<std::shared_ptr<const Grammar>> JsonSchemaGrammar(const nlohmann::ordered_json& schema,
                                                           bool compact,
                                                           std::string_view whitespace_pattern) {
  try {
    auto g = std::make_shared<Grammar>();
    g->compact = compact;
    if (Status st = UseWhitespacePattern(g.get(), whitespace_pattern); !st.ok()) return st;
    const int32_t ws = g->Ws();
    auto value = Compiler(schema, g.get()).CompileRoot();
    if (!value.ok()) return value.status();
    g->root = g->Seq({ws, *value, ws});
    return Finish(std::move(g));
  } catch (const nlohmann::ordered_json::exception& e) {
    return InvalidArgument(std::string("JSON schema: ") + e.what());
  }
}

StatusOr<std::shared_ptr<const Grammar>> JsonObjectGrammar(bool compact,
                                                           std::string_view whitespace_pattern) {
  auto g = std::make_shared<Grammar>();
  g->compact = compact;
  if (Status st = UseWhitespacePattern(g.get(), whitespace_pattern); !st.ok()) return st;
  const int32_t any = g->AnyValue();
  (void)any;
  // The object alternative of AnyValue: '{' any members '}'.
  const int32_t object = g->node(any).children[0];
  const int32_t ws = g->Ws();
  g->root = g->Seq({ws, object, ws});
  return std::shared_ptr<const Grammar>(std::move(g));
}

StatusOr<std::shared_ptr<const Grammar>> ChoiceGrammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return InvalidArgument("the list of choices is empty");
  auto g = std::make_shared<Grammar>();
  std::vector<int32_t> alts;
  std::set<std::string> seen;
  for (const std::string& c : choices) {
    if (c.empty()) return InvalidArgument("a choice is the empty string");
    if (seen.insert(c).second) alts.push_back(g->Literal(c));
  }
  g->root = alts.size() == 1 ? alts[0] : g->Alt(std::move(alts));
  return std::shared_ptr<const Grammar>(std::move(g));
}

StatusOr<std::shared_ptr<const Grammar>> ToolCallsGrammar(const std::vector<ToolSchema>& tools,
                                                          int max_calls, bool compact) {
  if (tools.empty()) return InvalidArgument("no tools to call");
  if (max_calls < 1) return InvalidArgument("max_calls must be at least 1");
  try {
    auto g = std::make_shared<Grammar>();
    g->compact = compact;
    const int32_t ws = g->Ws();
    std::vector<int32_t> calls;
    for (const ToolSchema& tool : tools) {
      int32_t params = -1;
      if (tool.parameters == nullptr || tool.parameters->is_null()) {
        params = g->node(g->AnyValue()).children[0];  // (no schema: any object)
      } else {
        auto value = Compiler(*tool.parameters, g.get()).CompileRoot();
        if (!value.ok()) {
          return InvalidArgument("tool '" + tool.name +
                                 "': " + std::string(value.status().message()));
        }
        params = *value;
      }
      calls.push_back(
          g->Seq({g->Literal("{\"name\": " + Dump(Json(tool.name)) + ", \"parameters\": "), params,
                  g->Literal("}")}));
    }
    const int32_t call = calls.size() == 1 ? calls[0] : g->Alt(calls);
    // call (";" ws call){0, max_calls - 1}, right-recursive (a byte before each recursion).
    int32_t rest = g->Literal("");
    const int32_t bounded = std::min(max_calls, 64);
    if (max_calls > 1 && max_calls == bounded) {
      for (int k = 1; k < bounded; ++k) {
        rest = g->Alt({g->Literal(""), g->Seq({g->Literal(";"), ws, call, rest})});
      }
    } else if (max_calls > 1) {
      rest = g->Alt({g->Literal("")});
      // (The node is looked up after Seq() adds its own: a reference taken before would dangle
      // when the node table grows.)
      const int32_t more = g->Seq({g->Literal(";"), ws, call, rest});
      g->node(rest).children.push_back(more);
    }
    g->root =
        g->Seq({call, rest, ws});  // (no leading whitespace: the parser reads calls at the start)
    return Finish(std::move(g));
  } catch (const nlohmann::ordered_json::exception& e) {
    return InvalidArgument(std::string("JSON schema: ") + e.what());
  }
}

}  // namespace oasis::structured

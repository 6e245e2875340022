// The values a Jinja template computes with, modelled on the Python objects Jinja2 sees when
// transformers renders a chat template: none, bool, int, float, str, list, dict (insertion
// ordered, string keys), namespace, callable, and Jinja2's default Undefined.
//
// Value is a small immutable-ish variant: lists and dicts are shared, never mutated after
// construction (the ImmutableSandboxedEnvironment forbids mutation too), so copies are cheap.
// The one mutable object is Namespace (`{% set ns.x = ... %}`), shared by reference as in Python.
// Thread-safety: a Value may be read from several threads at once only if no Namespace inside it
// is being assigned; the renderer creates all namespaces per render, so parsed templates and
// their constant Values are safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "oasis/status.h"

namespace oasis::jinja {

class Value;
class Interpreter;

// Jinja2's Undefined: prints empty, is falsy, iterates empty; most other uses are errors whose
// text is `message` ("'x' is undefined").
struct Undefined {
  std::string message;
};
struct NoneValue {};

using List = std::vector<Value>;

class Dict;
struct Namespace;
class Callable;

class Value {
 public:
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NamespacePtr = std::shared_ptr<Namespace>;
  using CallablePtr = std::shared_ptr<const Callable>;

  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}       // NOLINT: implicit by design
  Value(NoneValue) : v_(NoneValue{}) {}          // NOLINT
  Value(bool b) : v_(b) {}                       // NOLINT
  Value(int64_t i) : v_(i) {}                    // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : v_(d) {}                     // NOLINT
  Value(std::string s) : v_(std::move(s)) {}     // NOLINT
  Value(const char* s) : v_(std::string(s)) {}   // NOLINT
  Value(NamespacePtr ns) : v_(std::move(ns)) {}  // NOLINT
  Value(CallablePtr c) : v_(std::move(c)) {}     // NOLINT
  // Containers record their nesting depth so that every recursive walk is bounded.
  static Value MakeList(List items);
  static Value MakeDict(Dict dict);
  // A Python tuple: a list that prints as `(a, b)` and never equals a list.
  static Value MakeTuple(List items);
  static Value None() { return Value(NoneValue{}); }
  static Value MakeUndefined(std::string message) { return Value(Undefined{std::move(message)}); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python's numbers.Number: bool, int, float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  // Python int (bool is a subclass of int).
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }  // lists and tuples
  bool is_tuple() const { return tuple_; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  const Undefined& undefined() const { return std::get<Undefined>(v_); }
  bool boolean() const { return std::get<bool>(v_); }
  int64_t integer() const { return is_bool() ? (boolean() ? 1 : 0) : std::get<int64_t>(v_); }
  double number() const {
    return is_float() ? std::get<double>(v_) : static_cast<double>(integer());
  }
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<ListPtr>(v_); }
  const Dict& dict() const { return *std::get<DictPtr>(v_); }
  const NamespacePtr& ns() const { return std::get<NamespacePtr>(v_); }
  const CallablePtr& callable() const { return std::get<CallablePtr>(v_); }
  int depth() const { return depth_; }

  // Python truthiness.
  bool Truthy() const;
  // Python type name for messages: "str", "int", "list", "dict", "NoneType", "Undefined", ...
  std::string TypeName() const;

 private:
  std::variant<Undefined, NoneValue, bool, int64_t, double, std::string, ListPtr, DictPtr,
               NamespacePtr, CallablePtr>
      v_;
  int depth_ = 0;
  bool tuple_ = false;
};

// An insertion-ordered dict with string keys (JSON objects, dict literals, kwargs).
// Not thread-safe to mutate; shared immutably once built.
class Dict {
 public:
  const Value* Find(std::string_view key) const;
  // Inserts or replaces, keeping the first insertion position as Python does.
  void Set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
};

// `namespace(...)`: the one mutable object. Owns its attributes; not thread-safe (per render).
struct Namespace {
  Dict attrs;
};

// Positional and keyword arguments of a call, filter or test.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Something a template can call: a global function, a bound method, a macro. Owns whatever it
// captured; Call is const and re-entrant (state lives in the Interpreter).
class Callable {
 public:
  virtual ~Callable() = default;
  virtual StatusOr<Value> Call(Interpreter& interp, CallArgs& args) const = 0;
  virtual std::string Name() const = 0;
};

// Nesting limit of lists/dicts (values deeper than this cannot be built or converted).
inline constexpr int kMaxValueDepth = 256;

// Python `str(v)` as Jinja2 prints it: Undefined -> "", None -> "None", 1.0 -> "1.0",
// lists and dicts as Python reprs.
std::string ToPythonStr(const Value& v);
// Python `repr(v)`.
std::string ToPythonRepr(const Value& v);
// Python float repr ("1.0", "1e+20", "0.1", "inf").
std::string FormatPythonFloat(double d);

// Python `==` (1 == 1.0 == True; Undefined equals only Undefined).
bool ValuesEqual(const Value& a, const Value& b);
// Python `<`: numbers, strings, lists; an error for other pairs.
StatusOr<bool> ValueLess(const Value& a, const Value& b);

// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...) byte for byte.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;  // the indent unit when has_indent
  bool has_separators = false;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
StatusOr<std::string> DumpJson(const Value& v, const JsonDumpOptions& options);

// Conversions from/to JSON (ordered: keys keep their order). Errors on too-deep input, and
// (to JSON) on undefined, namespaces and callables.
StatusOr<Value> FromJson(const nlohmann::ordered_json& j);
StatusOr<nlohmann::ordered_json> ToJson(const Value& v);

}  // namespace oasis::jinja

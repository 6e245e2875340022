// The built-in vocabulary of the Jinja subset: operators, attribute/item access with Jinja2's
// fallbacks, Python methods of str/dict/list, filters, tests and global functions
// (range, namespace, dict, raise_exception, strftime_now). All are stateless functions
// (state lives in the Interpreter passed in); thread-safe.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/value.h"

namespace oasis::jinja {

// `obj.name`: Python getattr (methods of str/dict/list) then obj[name]; Undefined if neither;
// an error on Undefined.
StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
// `obj[key]`: item, then (string keys) attribute; Undefined if neither; an error on Undefined.
StatusOr<Value> GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` on lists and strings (None = omitted).
StatusOr<Value> SliceValue(Interpreter& in, const Value& obj, const Value& start, const Value& stop,
                           const Value& step);
// + - * / // % ** ~ with Python semantics.
StatusOr<Value> BinaryOp(Interpreter& in, std::string_view op, const Value& a, const Value& b);
// `item in container`.
StatusOr<bool> Contains(const Value& container, const Value& item);
// Python str.strip/lstrip/rstrip (chars = nullptr: Unicode whitespace).
std::string StripString(const std::string& s, const std::string* chars, bool left, bool right);

using FilterFn = StatusOr<Value> (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = StatusOr<bool> (*)(Interpreter&, const Value&, CallArgs&);
FilterFn FindFilter(std::string_view name);  // nullptr when unknown
TestFn FindTest(std::string_view name);      // nullptr when unknown
// The global functions every render sees.
const Dict& Globals();

// Argument `pos` (positional) or `name` (keyword) of a call; nullptr when absent.
const Value* Arg(const CallArgs& args, size_t pos, std::string_view name);
// Error unless the call has at most `max_positional` positional args and only keywords in `names`.
Status CheckArgs(const CallArgs& args, std::string_view fn, size_t max_positional,
                 std::initializer_list<std::string_view> names);

}  // namespace oasis::jinja

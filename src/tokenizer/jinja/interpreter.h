// Tree-walking evaluator of a parsed Template against a context, with Jinja2's semantics as
// transformers uses them (ImmutableSandboxedEnvironment, default Undefined, loop scoping) and
// sandbox limits so that no template can hang, exhaust memory or overflow the stack: output
// size, value size, loop iterations and call depth are bounded; every failure is a Status
// "line:col: message", never a crash.
//
// An Interpreter is the state of one render (scopes, counters, output buffer): it is created per
// Render call, used by one thread, and discarded. The Template it walks is shared and immutable.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/value.h"

namespace oasis::jinja {

struct RenderOptions {
  size_t max_output_bytes = 64u << 20;  // also bounds every string/list built while rendering
  int64_t max_iterations = 1'000'000;   // loop iterations + macro calls + filter item visits
  int max_call_depth = 64;              // nested macro calls
  // strftime_now() uses this instead of the clock when set (tests, reproducible renders).
  std::optional<std::chrono::system_clock::time_point> now;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}

  // Renders `tmpl` with `context` (the template's variables). Call once per Interpreter.
  StatusOr<std::string> Render(const Template& tmpl, const Dict& context);

  // ---- services for filters, tests, methods and callables (builtins.h) ----
  const RenderOptions& options() const { return options_; }
  // Counts one unit of work against max_iterations.
  Status CountIteration(int64_t n = 1);
  // An error when a value of `size` bytes/items would exceed the output limit.
  Status CheckSize(size_t size) const;
  StatusOr<Value> CallValue(const Value& callee, CallArgs& args);
  StatusOr<Value> ApplyFilter(std::string_view name, const Value& value, CallArgs& args);
  StatusOr<bool> ApplyTest(std::string_view name, const Value& value, CallArgs& args);
  // Python iteration: list items, dict keys, string characters, Undefined -> empty.
  StatusOr<List> Iterate(const Value& v) const;
  // Runs a macro body with its parameters bound; used by the macro callable.
  StatusOr<Value> CallMacro(const Stmt& macro, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::vector<std::pair<std::string, Value>>;

  StatusOr<Flow> ExecBody(const Body& body);
  StatusOr<Flow> Exec(const Stmt& s);
  StatusOr<Flow> ExecFor(const Stmt& s);
  Status ExecSet(const Stmt& s);
  StatusOr<std::string> Capture(const Body& body);
  Status Emit(std::string_view text);

  StatusOr<Value> Eval(const Expr& e);
  StatusOr<Value> EvalBinary(const Expr& e);
  StatusOr<Value> EvalCompare(const Expr& e);
  Status EvalArgs(const Expr& e, size_t first, CallArgs& args);

  Value Lookup(const std::string& name) const;
  void Bind(std::string name, Value value);
  Status BindTargets(const std::vector<std::string>& targets, const Value& value, const Stmt& at);

  const RenderOptions& options_;
  const Dict* context_ = nullptr;
  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  Value block_value_;  // the input of a filter block / set-block filter chain
  int64_t iterations_ = 0;
  int call_depth_ = 0;
};

// "line:col: message" for errors raised at a node (no-op if the message is already located).
Status AtNode(int line, int column, const Status& status);

}  // namespace oasis::jinja

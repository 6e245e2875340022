#include "tokenizer/jinja/interpreter.h"

#include <cctype>

#include "common/check.h"

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

bool IsLocated(const std::string& m) {
  size_t i = 0;
  auto digits = [&] {
    size_t start = i;
    while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) ++i;
    return i > start;
  };
  if (!digits() || i >= m.size() || m[i++] != ':') return false;
  if (!digits() || i + 1 >= m.size() || m[i] != ':' || m[i + 1] != ' ') return false;
  return true;
}

// A `{% macro %}` bound as a value. Owns nothing: the Stmt belongs to the Template, which
// outlives every render that can see this callable.
class MacroCallable : public Callable {
 public:
  explicit MacroCallable(const Stmt* stmt) : stmt_(stmt) {}
  StatusOr<Value> Call(Interpreter& in, CallArgs& args) const override {
    return in.CallMacro(*stmt_, args);
  }
  std::string Name() const override { return stmt_->text; }

 private:
  const Stmt* stmt_;
};

// True when `v` holds a namespace or a callable (which may capture one): storing such a value in
// a namespace could make a reference cycle.
bool ContainsReference(const Value& v) {
  if (v.is_namespace() || v.is_callable()) return true;
  if (v.is_list()) {
    for (const Value& item : v.list()) {
      if (ContainsReference(item)) return true;
    }
  }
  if (v.is_dict()) {
    for (const auto& [k, item] : v.dict().entries()) {
      if (ContainsReference(item)) return true;
    }
  }
  return false;
}

}  // namespace

Status AtNode(int line, int column, const Status& status) {
  if (status.ok() || IsLocated(status.message())) return status;
  return Status(status.code(),
                std::to_string(line) + ":" + std::to_string(column) + ": " + status.message());
}

#define OASIS_AT(node, expr) AtNode((node).line, (node).column, (expr))

StatusOr<std::string> Interpreter::Render(const Template& tmpl, const Dict& context) {
  OASIS_CHECK(context_ == nullptr) << "an Interpreter renders exactly once";
  context_ = &context;
  frames_.assign(1, Frame());
  std::string out;
  out_ = &out;
  OASIS_ASSIGN_OR_RETURN(Flow flow, ExecBody(tmpl.body));
  (void)flow;
  out_ = nullptr;
  return out;
}

Status Interpreter::CountIteration(int64_t n) {
  iterations_ += n;
  if (iterations_ > options_.max_iterations) {
    return ResourceExhausted("template exceeded the iteration limit (" +
                             std::to_string(options_.max_iterations) + ")");
  }
  return Status::Ok();
}

Status Interpreter::CheckSize(size_t size) const {
  if (size > options_.max_output_bytes) {
    return ResourceExhausted("template value or output exceeds " +
                             std::to_string(options_.max_output_bytes) + " bytes");
  }
  return Status::Ok();
}

Status Interpreter::Emit(std::string_view text) {
  OASIS_RETURN_IF_ERROR(CheckSize(out_->size() + text.size()));
  out_->append(text);
  return Status::Ok();
}

Value Interpreter::Lookup(const std::string& name) const {
  for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
    for (auto it = f->rbegin(); it != f->rend(); ++it) {
      if (it->first == name) return it->second;
    }
  }
  if (const Value* v = context_->Find(name)) return *v;
  if (const Value* v = Globals().Find(name)) return *v;
  return Value::MakeUndefined("'" + name + "' is undefined");
}

void Interpreter::Bind(std::string name, Value value) {
  Frame& f = frames_.back();
  for (auto& [k, v] : f) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  f.emplace_back(std::move(name), std::move(value));
}

Status Interpreter::BindTargets(const std::vector<std::string>& targets, const Value& value,
                                const Stmt& at) {
  if (value.depth() > kMaxValueDepth)
    return OASIS_AT(at, InvalidArgument("value nested too deeply"));
  if (targets.size() == 1) {
    Bind(targets[0], value);
    return Status::Ok();
  }
  OASIS_ASSIGN_OR_RETURN(List items, Iterate(value));
  if (items.size() != targets.size()) {
    return OASIS_AT(at, InvalidArgument(items.size() < targets.size()
                                            ? "not enough values to unpack (expected " +
                                                  std::to_string(targets.size()) + ", got " +
                                                  std::to_string(items.size()) + ")"
                                            : "too many values to unpack (expected " +
                                                  std::to_string(targets.size()) + ")"));
  }
  for (size_t i = 0; i < targets.size(); ++i) Bind(targets[i], items[i]);
  return Status::Ok();
}

StatusOr<List> Interpreter::Iterate(const Value& v) const {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, item] : v.dict().entries()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      std::string one;
      for (char32_t c : utf8::Decode(v.str())) {
        one.clear();
        utf8::Append(one, c);
        chars.emplace_back(one);
      }
      return chars;
    }
    default:
      return InvalidArgument("'" + v.TypeName() + "' object is not iterable");
  }
}

StatusOr<Interpreter::Flow> Interpreter::ExecBody(const Body& body) {
  for (const StmtPtr& s : body) {
    OASIS_ASSIGN_OR_RETURN(Flow flow, Exec(*s));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

StatusOr<std::string> Interpreter::Capture(const Body& body) {
  std::string captured;
  std::string* saved = out_;
  out_ = &captured;
  auto flow = ExecBody(body);
  out_ = saved;
  if (!flow.ok()) return flow.status();
  return captured;
}

StatusOr<Interpreter::Flow> Interpreter::Exec(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::kText:
      OASIS_RETURN_IF_ERROR(Emit(s.text));
      return Flow::kNormal;
    case StmtKind::kOutput: {
      OASIS_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
      OASIS_RETURN_IF_ERROR(OASIS_AT(s, Emit(ToPythonStr(v))));
      return Flow::kNormal;
    }
    case StmtKind::kIf: {
      for (const auto& [cond, body] : s.branches) {
        OASIS_ASSIGN_OR_RETURN(Value c, Eval(*cond));
        if (c.Truthy()) return ExecBody(body);
      }
      return ExecBody(s.else_body);
    }
    case StmtKind::kFor:
      return ExecFor(s);
    case StmtKind::kSet:
      OASIS_RETURN_IF_ERROR(ExecSet(s));
      return Flow::kNormal;
    case StmtKind::kSetBlock: {
      OASIS_ASSIGN_OR_RETURN(std::string text, Capture(s.body));
      Value v(std::move(text));
      if (s.filter) {
        Value saved = std::move(block_value_);
        block_value_ = std::move(v);
        auto r = Eval(*s.filter);
        block_value_ = std::move(saved);
        if (!r.ok()) return r.status();
        v = std::move(r).value();
      }
      Bind(s.targets[0], std::move(v));
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      Bind(s.text, Value(Value::CallablePtr(std::make_shared<MacroCallable>(&s))));
      return Flow::kNormal;
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kFilterBlock: {
      OASIS_ASSIGN_OR_RETURN(std::string text, Capture(s.body));
      Value saved = std::move(block_value_);
      block_value_ = Value(std::move(text));
      auto r = Eval(*s.filter);
      block_value_ = std::move(saved);
      if (!r.ok()) return r.status();
      OASIS_RETURN_IF_ERROR(OASIS_AT(s, Emit(ToPythonStr(r.value()))));
      return Flow::kNormal;
    }
    case StmtKind::kBlock:
      return ExecBody(s.body);
  }
  return Flow::kNormal;
}

Status Interpreter::ExecSet(const Stmt& s) {
  OASIS_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
  if (s.ns_attr.empty()) return BindTargets(s.targets, v, s);
  Value ns = Lookup(s.targets[0]);
  if (!ns.is_namespace()) {
    return OASIS_AT(s, InvalidArgument("cannot assign attribute on non-namespace object"));
  }
  if (ContainsReference(v)) {
    return OASIS_AT(
        s, Unimplemented("storing a namespace or callable in a namespace is not supported"));
  }
  if (v.depth() > kMaxValueDepth) return OASIS_AT(s, InvalidArgument("value nested too deeply"));
  ns.ns()->attrs.Set(s.ns_attr, std::move(v));
  return Status::Ok();
}

StatusOr<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s) {
  OASIS_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
  auto items_or = Iterate(iterable);
  if (!items_or.ok()) return OASIS_AT(*s.expr, items_or.status());
  List items = std::move(items_or).value();
  if (s.filter) {
    List kept;
    for (Value& item : items) {
      OASIS_RETURN_IF_ERROR(OASIS_AT(s, CountIteration()));
      frames_.emplace_back();
      Status st = BindTargets(s.targets, item, s);
      StatusOr<Value> keep = st.ok() ? Eval(*s.filter) : StatusOr<Value>(st);
      frames_.pop_back();
      if (!keep.ok()) return keep.status();
      if (keep.value().Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    OASIS_RETURN_IF_ERROR(OASIS_AT(s, CountIteration()));
    Dict loop;
    loop.Set("index", Value(i + 1));
    loop.Set("index0", Value(i));
    loop.Set("revindex", Value(n - i));
    loop.Set("revindex0", Value(n - i - 1));
    loop.Set("first", Value(i == 0));
    loop.Set("last", Value(i == n - 1));
    loop.Set("length", Value(n));
    loop.Set("depth", Value(1));
    loop.Set("depth0", Value(0));
    if (i > 0) loop.Set("previtem", items[i - 1]);
    if (i + 1 < n) loop.Set("nextitem", items[i + 1]);
    frames_.emplace_back();
    Status st = BindTargets(s.targets, items[i], s);
    if (st.ok()) Bind("loop", Value::MakeDict(std::move(loop)));
    StatusOr<Flow> flow = st.ok() ? ExecBody(s.body) : StatusOr<Flow>(st);
    frames_.pop_back();
    if (!flow.ok()) return flow.status();
    if (flow.value() == Flow::kBreak) break;
  }
  if (n == 0) return ExecBody(s.else_body);
  return Flow::kNormal;
}

StatusOr<Value> Interpreter::CallMacro(const Stmt& macro, CallArgs& args) {
  if (call_depth_ >= options_.max_call_depth) {
    return ResourceExhausted("maximum macro call depth (" +
                             std::to_string(options_.max_call_depth) + ") exceeded");
  }
  OASIS_RETURN_IF_ERROR(CountIteration());
  if (args.positional.size() > macro.params.size()) {
    return InvalidArgument("macro '" + macro.text + "' takes not more than " +
                           std::to_string(macro.params.size()) + " argument(s)");
  }
  // Macros see the template's top-level variables, not the caller's locals.
  std::vector<Frame> saved;
  saved.swap(frames_);
  frames_.push_back(std::move(saved.front()));
  frames_.emplace_back();
  auto restore = [&] {
    OASIS_CHECK_EQ(frames_.size(), 2u) << "macro scope stack unbalanced";
    saved.front() = std::move(frames_.front());
    frames_.swap(saved);
  };
  Status st;
  for (size_t i = 0; i < macro.params.size() && st.ok(); ++i) {
    const MacroParam& p = macro.params[i];
    const Value* given = i < args.positional.size() ? &args.positional[i] : nullptr;
    for (const auto& [k, v] : args.keyword) {
      if (k == p.name) given = &v;
    }
    if (given != nullptr && given->depth() > kMaxValueDepth) {
      st = InvalidArgument("value nested too deeply");
    } else if (given != nullptr) {
      Bind(p.name, *given);
    } else if (p.default_value) {
      auto d = Eval(*p.default_value);
      if (!d.ok()) {
        st = d.status();
      } else {
        Bind(p.name, std::move(d).value());
      }
    } else {
      Bind(p.name, Value::MakeUndefined("parameter '" + p.name + "' was not provided"));
    }
  }
  for (const auto& [k, v] : args.keyword) {
    bool known = false;
    for (const MacroParam& p : macro.params) known = known || p.name == k;
    if (!known && st.ok())
      st = InvalidArgument("macro '" + macro.text + "' takes no keyword argument '" + k + "'");
  }
  if (!st.ok()) {
    restore();
    return st;
  }
  ++call_depth_;
  auto text = Capture(macro.body);
  --call_depth_;
  restore();
  if (!text.ok()) return text.status();
  return Value(std::move(text).value());
}

}  // namespace oasis::jinja

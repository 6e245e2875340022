#include "tokenizer/structured/gbnf.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/structured/charset.h"
#include "tokenizer/structured/json_schema.h"

namespace oasis::structured {
namespace {

constexpr int kMaxGbnfNesting = 200;

bool NameChar(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

class GbnfParser {
 public:
  GbnfParser(std::vector<uint32_t> cps, Grammar* g) : cps_(std::move(cps)), g_(g) {}

  Status Parse() {
    Skip();
    if (!More()) return Fail("the grammar is empty");
    while (More()) {
      const std::string name = Name();
      if (name.empty()) return Fail("a rule must start with its name");
      Skip();
      if (!(Eat(':') && Eat(':') && Eat('='))) return Fail("expected '::=' after '" + name + "'");
      Rule& r = rules_[name];
      if (r.defined) return Fail("rule '" + name + "' is defined twice");
      r.defined = true;
      r.line = line_;
      if (r.slot < 0) r.slot = g_->Alt({});
      const int32_t slot = r.slot;
      int32_t body = -1;
      if (Status st = ParseAlt(0, &body); !st.ok()) return st;
      g_->node(slot).children = {body};
      if (More() && !RuleStart()) return Fail("unexpected '" + Char(Peek()) + "'");
    }
    for (const auto& [name, r] : rules_) {
      if (!r.defined)
        return InvalidArgument("grammar: rule '" + name + "' is used but not defined");
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) return InvalidArgument("grammar: there is no 'root' rule");
    g_->root = root->second.slot;
    return Status::Ok();
  }

  // The rule whose node is `slot` (for messages).
  std::string RuleOf(int32_t slot) const {
    for (const auto& [name, r] : rules_) {
      if (r.slot == slot) return name;
    }
    return "?";
  }
  std::vector<int32_t> Slots() const {
    std::vector<int32_t> out;
    for (const auto& [name, r] : rules_) out.push_back(r.slot);
    return out;
  }

 private:
  struct Rule {
    int32_t slot = -1;
    bool defined = false;
    int line = 0;
  };

  static std::string Char(uint32_t c) {
    return c == 0xFFFFFFFFu ? "end of grammar" : EncodeUtf8(c);
  }
  Status Fail(const std::string& what) const {
    return InvalidArgument("grammar: line " + std::to_string(line_) + ": " + what);
  }
  bool More() const { return pos_ < cps_.size(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFFu;
  }
  uint32_t Take() {
    const uint32_t c = cps_[pos_++];
    if (c == '\n') ++line_;
    return c;
  }
  bool Eat(uint32_t c) {
    if (Peek() != c) return false;
    Take();
    return true;
  }
  // Whitespace and comments.
  void Skip() {
    while (More()) {
      const uint32_t c = Peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        Take();
      } else if (c == '#') {
        while (More() && Peek() != '\n') Take();
      } else {
        return;
      }
    }
  }
  std::string Name() {
    std::string out;
    while (More() && NameChar(Peek())) out += static_cast<char>(Take());
    return out;
  }
  // Whether "name ::=" starts here (a new rule: the current one ends).
  bool RuleStart() const {
    size_t p = pos_;
    while (p < cps_.size() && NameChar(cps_[p])) ++p;
    if (p == pos_) return false;
    while (p < cps_.size() && (cps_[p] == ' ' || cps_[p] == '\t')) ++p;
    return p + 2 < cps_.size() && cps_[p] == ':' && cps_[p + 1] == ':' && cps_[p + 2] == '=';
  }

  Status ParseAlt(int depth, int32_t* out) {
    if (depth > kMaxGbnfNesting) {
      return Fail("groups nest deeper than " + std::to_string(kMaxGbnfNesting));
    }
    std::vector<int32_t> alts;
    while (true) {
      int32_t seq = -1;
      if (Status st = ParseSeq(depth, &seq); !st.ok()) return st;
      alts.push_back(seq);
      Skip();
      if (!Eat('|')) break;
    }
    *out = alts.size() == 1 ? alts[0] : g_->Alt(std::move(alts));
    return Status::Ok();
  }

  Status ParseSeq(int depth, int32_t* out) {
    std::vector<int32_t> items;
    while (true) {
      Skip();
      if (!More() || Peek() == '|' || Peek() == ')' || (depth == 0 && RuleStart())) break;
      if (g_->size() > kMaxGrammarNodes) {
        return Fail("the grammar is too large (more than " + std::to_string(kMaxGrammarNodes) +
                    " nodes)");
      }
      int32_t item = -1;
      if (Status st = ParseItem(depth, &item); !st.ok()) return st;
      if (Status st = ParseQuantifier(&item); !st.ok()) return st;
      items.push_back(item);
    }
    *out = items.empty()       ? g_->Literal("")
           : items.size() == 1 ? items[0]
                               : g_->Seq(std::move(items));
    return Status::Ok();
  }

  Status ParseQuantifier(int32_t* item) {
    const uint32_t c = Peek();
    int64_t lo = 0, hi = -1;
    if (c == '*' || c == '+' || c == '?') {
      Take();
      lo = c == '+' ? 1 : 0;
      hi = c == '?' ? 1 : -1;
    } else if (c == '{') {
      Take();
      auto number = [&](int64_t* v) {
        Skip();
        bool any = false;
        *v = 0;
        while (Peek() >= '0' && Peek() <= '9') {
          *v = std::min<int64_t>(*v * 10 + (Take() - '0'), int64_t{1} << 40);
          any = true;
        }
        Skip();
        return any;
      };
      if (!number(&lo)) return Fail("'{' must be followed by a count");
      hi = lo;
      if (Eat(',')) {
        if (!number(&hi)) hi = -1;
      }
      if (!Eat('}')) return Fail("a '{m,n}' quantifier must end with '}'");
      if (lo > kMaxGbnfRepeat || hi > kMaxGbnfRepeat) {
        return Fail("repetition bounds above " + std::to_string(kMaxGbnfRepeat) +
                    " are not supported");
      }
      if (hi >= 0 && lo > hi) return Fail("repetition bounds are out of order");
    } else {
      return Status::Ok();
    }
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{') {
      return Fail("two quantifiers in a row (group the first)");
    }
    if (!(lo == 1 && hi == 1)) {
      *item = g_->Repeat(*item, static_cast<int32_t>(lo), static_cast<int32_t>(hi));
    }
    return Status::Ok();
  }

  Status ParseItem(int depth, int32_t* out) {
    const uint32_t c = Peek();
    if (c == '"') {
      Take();
      std::string text;
      while (true) {
        if (!More() || Peek() == '\n') return Fail("unterminated string");
        if (Eat('"')) break;
        uint32_t cp = 0;
        if (Status st = Character(&cp); !st.ok()) return st;
        text += EncodeUtf8(cp);
      }
      *out = g_->Literal(std::move(text));
      return Status::Ok();
    }
    if (c == '[') {
      Take();
      const bool negated = Eat('^');
      CodePoints set;
      while (true) {
        if (!More()) return Fail("unterminated character class");
        if (Eat(']')) break;
        uint32_t lo = 0;
        if (Status st = Character(&lo); !st.ok()) return st;
        uint32_t hi = lo;
        if (Peek() == '-' && Peek(1) != ']') {
          Take();
          if (Status st = Character(&hi); !st.ok()) return st;
          if (hi < lo) return Fail("the range in a character class is out of order");
        }
        set.emplace_back(lo, hi);
      }
      set = negated ? NegateCodePoints(set) : NormalizeCodePoints(set);
      if (set.empty()) return Fail("the character class matches no character");
      *out = CodePointsNode(g_, set, false);
      return Status::Ok();
    }
    if (c == '.') {
      Take();
      *out = CodePointsNode(g_, NegateCodePoints({}), false);
      return Status::Ok();
    }
    if (c == '(') {
      Take();
      if (Status st = ParseAlt(depth + 1, out); !st.ok()) return st;
      Skip();
      if (!Eat(')')) return Fail("missing ')'");
      return Status::Ok();
    }
    if (NameChar(c)) {
      const std::string name = Name();
      Rule& r = rules_[name];
      if (r.slot < 0) r.slot = g_->Alt({});
      *out = r.slot;
      return Status::Ok();
    }
    return Fail("unexpected '" + Char(c) + "'");
  }

  // One character of a literal or a class, escapes read.
  Status Character(uint32_t* cp) {
    if (!More()) return Fail("the grammar ends inside a literal or a character class");
    const uint32_t c = Take();
    if (c != '\\') {
      *cp = c;
      return Status::Ok();
    }
    if (!More()) return Fail("the grammar may not end with a backslash");
    const uint32_t e = Take();
    auto hex = [&](int digits) -> Status {
      *cp = 0;
      for (int i = 0; i < digits; ++i) {
        const int d = HexDigit(Peek());
        if (d < 0) return Fail("\\" + Char(e) + " takes " + std::to_string(digits) + " hex digits");
        Take();
        *cp = *cp * 16 + static_cast<uint32_t>(d);
      }
      if (!IsScalarValue(*cp)) return Fail("the escape is not a character");
      return Status::Ok();
    };
    switch (e) {
      case 'n':
        *cp = '\n';
        return Status::Ok();
      case 'r':
        *cp = '\r';
        return Status::Ok();
      case 't':
        *cp = '\t';
        return Status::Ok();
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '/':
      case '^':
        *cp = e;
        return Status::Ok();
      default:
        return Fail("unknown escape \\" + Char(e));
    }
  }

  std::vector<uint32_t> cps_;
  Grammar* g_;
  size_t pos_ = 0;
  int line_ = 1;
  std::map<std::string, Rule> rules_;
};

}  // namespace

StatusOr<std::shared_ptr<const Grammar>> GbnfGrammar(std::string_view text) {
  if (text.size() > kMaxGbnfBytes) {
    return InvalidArgument("grammar: grammars longer than " + std::to_string(kMaxGbnfBytes) +
                           " bytes are not supported");
  }
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(text, &cps)) return InvalidArgument("grammar: the text is not valid UTF-8");
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return InvalidArgument("grammar: the grammar is empty");
  }
  if (text.find("::=") == std::string_view::npos) {
    return InvalidArgument(
        "grammar: expected GBNF rules ('root ::= ...'); other grammar formats (Lark, regular "
        "expressions) are not supported here");
  }
  auto g = std::make_shared<Grammar>();
  GbnfParser parser(std::move(cps), g.get());
  if (Status st = parser.Parse(); !st.ok()) return st;
  if (g->LeftRecursive()) {
    return InvalidArgument(
        "grammar: left recursion (a rule reaches itself before matching any character) is not "
        "supported");
  }
  // Every rule reachable from root must be able to end: a rule that cannot would leave the
  // matcher in a state no text completes.
  const auto n = static_cast<size_t>(g->size());
  const std::vector<uint8_t> ends = g->EndingNodes();
  // The reachable rules that cannot end; named: one that needs itself (the cause), else any.
  auto reach = [&](int32_t from, std::vector<uint8_t>& seen) {
    std::vector<int32_t> todo = {from};
    while (!todo.empty()) {
      const int32_t id = todo.back();
      todo.pop_back();
      for (int32_t c : g->node(id).children) {
        if (!seen[static_cast<size_t>(c)]) {
          seen[static_cast<size_t>(c)] = 1;
          todo.push_back(c);
        }
      }
    }
  };
  std::vector<uint8_t> reachable(n, 0);
  reachable[static_cast<size_t>(g->root)] = 1;
  reach(g->root, reachable);
  int32_t stuck = -1;
  int tried = 0;  // (a bounded search for the cause: each try walks the grammar)
  for (int32_t slot : parser.Slots()) {
    if (!reachable[static_cast<size_t>(slot)] || ends[static_cast<size_t>(slot)]) continue;
    if (stuck >= 0 && ++tried > 64) break;
    std::vector<uint8_t> from(n, 0);
    reach(slot, from);
    if (stuck < 0 || from[static_cast<size_t>(slot)]) stuck = slot;
    if (from[static_cast<size_t>(slot)]) break;
  }
  if (stuck >= 0) {
    return InvalidArgument("grammar: rule '" + parser.RuleOf(stuck) +
                           "' can never end (each of its alternatives needs itself again)");
  }
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace oasis::structured

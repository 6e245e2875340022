#include "tokenizer/structured/grammar.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace oasis::structured {
namespace {

constexpr int32_t kClosed = 100;  // a string, object or array frame past its last byte

bool IsWs(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The JSON number automaton: states 0..9; -1 refuses. Accepting: 2, 3, 5, 8, 9.
int32_t NumberStep(int32_t s, uint8_t c, bool integer) {
  const bool digit = IsDigit(c), exp = (c == 'e' || c == 'E') && !integer;
  const bool dot = c == '.' && !integer;
  switch (s) {
    case 0:
      return c == '-' ? 1 : c == '0' ? 2 : digit ? 3 : -1;
    case 1:
      return c == '0' ? 2 : digit ? 3 : -1;
    case 2:
      return dot ? 4 : exp ? 6 : -1;
    case 3:
      return digit ? 3 : dot ? 4 : exp ? 6 : -1;
    case 4:
      return digit ? 5 : -1;
    case 5:
      return digit ? 5 : exp ? 6 : -1;
    case 6:
      return (c == '+' || c == '-') ? 7 : digit ? 8 : -1;
    case 7:
      return digit ? 8 : -1;
    case 8:
      return digit ? 9 : -1;  // (exponents of at most two digits: doubles' range)
    default:
      return -1;
  }
}
bool NumberAccepting(int32_t s) { return s == 2 || s == 3 || s == 5 || s == 8 || s == 9; }
// Bytes still needed from state s to an accepting state.
int32_t NumberNeed(int32_t s) { return NumberAccepting(s) ? 0 : 1; }

// UTF-8 inside strings: the phase after a lead byte (0 = refused), and the continuation
// phases: 10 one byte left; 11 two left; 12 E0 (A0..BF, then one); 13 ED (80..9F, then one);
// 14 F0 (90..BF, then two); 15 three left; 16 F4 (80..8F, then two).
int32_t LeadPhase(uint8_t c) {
  if (c >= 0xC2 && c <= 0xDF) return 10;
  if (c == 0xE0) return 12;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return 11;
  if (c == 0xED) return 13;
  if (c == 0xF0) return 14;
  if (c >= 0xF1 && c <= 0xF3) return 15;
  if (c == 0xF4) return 16;
  return 0;
}
struct Continuation {
  uint8_t lo, hi;  // the byte range allowed
  int32_t next;    // the phase after it
};
constexpr Continuation kContinuations[] = {  // phases 10..16
    {0x80, 0xBF, 1},  {0x80, 0xBF, 10}, {0xA0, 0xBF, 10}, {0x80, 0x9F, 10},
    {0x90, 0xBF, 11}, {0x80, 0xBF, 11}, {0x80, 0x8F, 11}};
int32_t ContinuationPhase(int32_t phase, uint8_t c) {
  if (phase < 10 || phase > 16) return -1;
  const Continuation& k = kContinuations[phase - 10];
  return c >= k.lo && c <= k.hi ? k.next : -1;
}

// A count kept only as far as the bounds need it: exact below max, else up to min (and 1).
int32_t CapCount(int32_t count, int32_t min_count, int32_t max_count) {
  if (max_count >= 0) return std::min(count, max_count);
  return std::min(count, std::max(min_count, 1));
}

bool FrameLess(const Frame& p, const Frame& q) {
  if (p.node != q.node) return p.node < q.node;
  if (p.a != q.a) return p.a < q.a;
  if (p.b != q.b) return p.b < q.b;
  return p.c < q.c;
}

// A state's canonical order of its stacks (any total order would do): shallower first, then
// from the top frame down — stacks of one state mostly share their bottom frames and differ near
// the top, so this decides in a frame or two where comparing from the bottom walked the shared
// part every time (half of an ambiguous grammar's matcher time went to sorting).
bool StackLess(const Stack& x, const Stack& y) {
  if (x.size() != y.size()) return x.size() < y.size();
  return std::lexicographical_compare(x.rbegin(), x.rend(), y.rbegin(), y.rend(), FrameLess);
}

// Which stacks a state keeps when it has more than kMaxStacks: the first ones in this order
// (from the bottom frame up), as the matcher always kept them.
bool StackKeptFirst(const Stack& x, const Stack& y) {
  return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end(), FrameLess);
}

}  // namespace

int32_t Grammar::Add(Node node) {
  nodes_.push_back(std::move(node));
  return static_cast<int32_t>(nodes_.size()) - 1;
}
int32_t Grammar::Literal(std::string text) {
  Node n;
  n.kind = NodeKind::kLiteral;
  n.text = std::move(text);
  return Add(std::move(n));
}
int32_t Grammar::Seq(std::vector<int32_t> children) {
  Node n;
  n.kind = NodeKind::kSeq;
  n.children = std::move(children);
  return Add(std::move(n));
}
int32_t Grammar::Alt(std::vector<int32_t> children) {
  Node n;
  n.kind = NodeKind::kAlt;
  n.children = std::move(children);
  return Add(std::move(n));
}
int32_t Grammar::Ws() {
  if (ws_ < 0) {
    Node n;
    n.kind = NodeKind::kWs;
    ws_ = Add(std::move(n));
  }
  return ws_;
}
int32_t Grammar::String(int32_t min_count, int32_t max_count) {
  Node n;
  n.kind = NodeKind::kString;
  n.min_count = min_count;
  n.max_count = max_count;
  return Add(std::move(n));
}
int32_t Grammar::Number(bool integer) {
  Node n;
  n.kind = NodeKind::kNumber;
  n.integer = integer;
  return Add(std::move(n));
}
int32_t Grammar::Array(int32_t item, int32_t min_count, int32_t max_count) {
  Ws();
  Node n;
  n.kind = NodeKind::kArray;
  n.item = item;
  n.min_count = min_count;
  n.max_count = max_count;
  return Add(std::move(n));
}
int32_t Grammar::Object() {
  Ws();
  Node n;
  n.kind = NodeKind::kObject;
  return Add(std::move(n));
}
int32_t Grammar::Member(const std::string& json_name, int32_t value) {
  const int32_t ws = Ws();
  return Seq({Literal(json_name), ws, Literal(":"), ws, value});
}
int32_t Grammar::AnyValue() {
  if (any_value_ >= 0) return any_value_;
  any_value_ = Alt({});
  const int32_t object = Object(), ws = Ws();
  node(object).additional = Seq({String(), ws, Literal(":"), ws, any_value_});
  const int32_t array = Array(any_value_);
  node(any_value_).children = {
      object, array, String(), Number(false), Literal("true"), Literal("false"), Literal("null")};
  return any_value_;
}

int32_t Grammar::Bytes(uint8_t lo, uint8_t hi) {
  Node n;
  n.kind = NodeKind::kBytes;
  for (int b = lo; b <= hi; ++b) n.bytes[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
  return Add(std::move(n));
}
int32_t Grammar::Repeat(int32_t child, int32_t min_count, int32_t max_count) {
  Node n;
  n.kind = NodeKind::kRepeat;
  n.children = {child};
  n.min_count = min_count;
  n.max_count = max_count;
  return Add(std::move(n));
}

std::vector<uint8_t> Grammar::Closure(bool (*leaf)(const Node&)) const {
  const auto n = static_cast<size_t>(size());
  std::vector<uint8_t> holds(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (holds[i]) continue;
      const Node& nd = nodes_[i];
      auto is = [&](int32_t c) { return holds[static_cast<size_t>(c)] != 0; };
      bool v = false;
      switch (nd.kind) {
        case NodeKind::kSeq:
          v = std::all_of(nd.children.begin(), nd.children.end(), is);
          break;
        case NodeKind::kAlt:
          v = std::any_of(nd.children.begin(), nd.children.end(), is);
          break;
        case NodeKind::kRepeat:
          v = nd.min_count == 0 || is(nd.children[0]);
          break;
        default:
          v = leaf(nd);
          break;
      }
      if (v) {
        holds[i] = 1;
        changed = true;
      }
    }
  }
  return holds;
}

std::vector<uint8_t> Grammar::NullableNodes() const {
  return Closure([](const Node& nd) {
    return nd.kind == NodeKind::kWs || (nd.kind == NodeKind::kLiteral && nd.text.empty());
  });
}

std::vector<uint8_t> Grammar::EndingNodes() const {
  return Closure([](const Node&) { return true; });
}

bool Grammar::LeftRecursive() const {
  const auto n = static_cast<size_t>(size());
  const std::vector<uint8_t> nullable = NullableNodes();
  // The nodes a node pushes before it matches a byte of its own.
  auto firsts = [&](size_t i) {
    std::vector<int32_t> out;
    const Node& nd = nodes_[i];
    if (nd.kind == NodeKind::kAlt || nd.kind == NodeKind::kRepeat) return nd.children;
    if (nd.kind == NodeKind::kSeq) {
      for (int32_t c : nd.children) {
        out.push_back(c);
        if (!nullable[static_cast<size_t>(c)]) break;
      }
    }
    return out;
  };
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start] != 0) continue;
    std::vector<std::pair<size_t, std::vector<int32_t>>> path;
    path.emplace_back(start, firsts(start));
    color[start] = 1;
    while (!path.empty()) {
      auto& [node, next] = path.back();
      if (next.empty()) {
        color[node] = 2;
        path.pop_back();
        continue;
      }
      const auto c = static_cast<size_t>(next.back());
      next.pop_back();
      if (color[c] == 1) return true;
      if (color[c] == 0) {
        color[c] = 1;
        path.emplace_back(c, firsts(c));
      }
    }
  }
  return false;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  const Grammar& g = *g_;
  nullable_ = g.NullableNodes();
  for (int32_t i = 0; i < g.size(); ++i)
    has_repeat_ = has_repeat_ || g.node(i).kind == NodeKind::kRepeat;
  Stack st;
  Push(st, g.root);
  start_ = Intern({st});
}

void GrammarMatcher::Push(Stack& st, int32_t node) const {
  Frame f;
  f.node = node;
  if (g_->node(node).kind == NodeKind::kAlt) f.a = -1;
  st.push_back(f);
}

// Pops the frames at the top that have nothing left to match.
void GrammarMatcher::Settle(Stack& st) const {
  while (!st.empty()) {
    const Frame& f = st.back();
    const Node& n = g_->node(f.node);
    bool done = false;
    switch (n.kind) {
      case NodeKind::kLiteral:
        done = f.a >= static_cast<int32_t>(n.text.size());
        break;
      case NodeKind::kSeq:
        done = f.a >= static_cast<int32_t>(n.children.size());
        break;
      case NodeKind::kAlt:
        done = f.a >= 0;
        break;
      case NodeKind::kString:
      case NodeKind::kObject:
      case NodeKind::kArray:
        done = f.a == kClosed;
        break;
      case NodeKind::kBytes:
        done = f.a == 1;
        break;
      case NodeKind::kRepeat:
        done = n.max_count >= 0 && f.a >= n.max_count;
        break;
      default:
        break;
    }
    if (!done) return;
    st.pop_back();
  }
}

void GrammarMatcher::FinishTop(Stack st, uint8_t c, std::vector<Stack>& out) const {
  st.pop_back();
  Settle(st);
  if (!st.empty()) Feed(std::move(st), c, out);
}

void GrammarMatcher::Feed(Stack st, uint8_t c, std::vector<Stack>& out) const {
  if (st.empty()) return;
  if (st.size() > static_cast<size_t>(kMaxDepth)) return;
  Frame& f = st.back();
  const Node& n = g_->node(f.node);
  // A byte was matched: every repetition on the stack is in an iteration that matched one.
  auto emit = [&](Stack s) {
    if (has_repeat_) {
      for (Frame& fr : s) {
        if (g_->node(fr.node).kind == NodeKind::kRepeat) fr.c = 0;
      }
    }
    Settle(s);
    out.push_back(std::move(s));
  };
  // Pushes `child` over the top frame (already updated) and feeds it the byte. Frames with
  // nothing left once the child is done (a sequence at its last item, an alternative chosen, a
  // repetition's last iteration) are popped first, as Settle would pop them after the child:
  // the same matches, and right recursion (`list ::= item ("," list)?`) does not deepen the
  // stacks.
  auto descend = [&](Stack s, int32_t child) {
    Settle(s);
    Push(s, child);
    Feed(std::move(s), c, out);
  };
  // The phases objects and arrays share: 0 their opening bracket (refused past the depth
  // bound), 1 and 3 the whitespace before a member / after a comma. Whether it was one of them.
  auto bracket_phase = [&](char open) {
    switch (f.a) {
      case 0:
        if (c == open && st.size() + 8 <= static_cast<size_t>(kMaxDepth)) {
          f.a = 1;
          emit(std::move(st));
        }
        return true;
      case 1:
      case 3:
        ++f.a;
        descend(std::move(st), g_->ws_node());
        return true;
      default:
        return false;
    }
  };
  switch (n.kind) {
    case NodeKind::kLiteral:
      if (f.a < static_cast<int32_t>(n.text.size()) && static_cast<uint8_t>(n.text[f.a]) == c) {
        ++f.a;
        emit(std::move(st));
      } else if (f.a >= static_cast<int32_t>(n.text.size())) {
        FinishTop(std::move(st), c, out);
      }
      return;
    case NodeKind::kSeq:
      if (f.a < static_cast<int32_t>(n.children.size())) {
        const int32_t child = n.children[static_cast<size_t>(f.a)];
        ++f.a;
        descend(std::move(st), child);
      } else {
        FinishTop(std::move(st), c, out);
      }
      return;
    case NodeKind::kAlt:
      if (f.a < 0) {
        for (size_t i = 0; i < n.children.size(); ++i) {
          Stack s = st;
          s.back().a = static_cast<int32_t>(i);
          descend(std::move(s), n.children[i]);
        }
      } else {
        FinishTop(std::move(st), c, out);
      }
      return;
    case NodeKind::kWs:
      if (IsWs(c) && !g_->compact && f.a < kMaxWhitespace && (c != '\n' || f.b < kMaxNewlines)) {
        Stack s = st;
        ++s.back().a;
        if (c == '\n') ++s.back().b;
        emit(std::move(s));
      }
      FinishTop(std::move(st), c, out);
      return;
    case NodeKind::kNumber: {
      const int32_t to = NumberStep(f.a, c, n.integer);
      if (to >= 0 && f.b + 1 + NumberNeed(to) <= kMaxNumberBytes) {
        Stack s = st;
        s.back().a = to;
        ++s.back().b;
        emit(std::move(s));
      }
      if (NumberAccepting(f.a)) FinishTop(std::move(st), c, out);
      return;
    }
    case NodeKind::kBytes:
      if (f.a == 0) {
        if ((n.bytes[c >> 6] >> (c & 63)) & 1) {
          f.a = 1;
          emit(std::move(st));
        }
      } else {
        FinishTop(std::move(st), c, out);
      }
      return;
    case NodeKind::kRepeat: {
      // Between iterations (a: the ones begun, capped as strings count; c: the last one began
      // with this very byte, so it matched nothing: no other begins, which would loop, and the
      // remaining ones may match nothing too).
      const bool empty_iteration = f.c != 0;
      if (!empty_iteration && (n.max_count < 0 || f.a < n.max_count)) {
        Stack s = st;
        s.back().a = CapCount(f.a + 1, n.min_count, n.max_count);
        s.back().c = 1;
        descend(std::move(s), n.children[0]);
      }
      if (f.a >= n.min_count || empty_iteration) FinishTop(std::move(st), c, out);
      return;
    }
    case NodeKind::kString: {
      const bool room = n.max_count < 0 || f.b < n.max_count;
      auto count = [&] { f.b = CapCount(f.b + 1, n.min_count, n.max_count); };
      if (f.a == 0) {
        if (c != '"') return;
        f.a = 1;
      } else if (f.a == 1) {
        if (c == '"') {
          if (f.b < n.min_count) return;
          f.a = kClosed;
        } else if (c == '\\') {
          if (!room) return;
          count();
          f.a = 2;
        } else if (c < 0x20) {
          return;
        } else if (c < 0x80) {
          if (!room) return;
          count();
        } else {
          const int32_t phase = LeadPhase(c);
          if (phase == 0 || !room) return;
          count();
          f.a = phase;
        }
      } else if (f.a == 2) {
        if (c == 'u') {
          f.a = 3;
        } else if (std::strchr("\"\\/bfnrt", c) != nullptr && c != 0) {
          f.a = 1;
        } else {
          return;
        }
      } else if (f.a >= 3 && f.a <= 6) {
        if (!IsHex(c)) return;
        // \uD800-\uDBFF must be followed by \uDC00-\uDFFF; a lone low surrogate is refused
        // (strict parsers reject both).
        f.a = f.a == 3 && (c == 'd' || c == 'D') ? 20 : f.a == 6 ? 1 : f.a + 1;
      } else if (f.a >= 20 && f.a <= 28) {
        const bool hex = IsHex(c);
        const bool high = c == '8' || c == '9' || c == 'a' || c == 'b' || c == 'A' || c == 'B';
        const bool low = (c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F');
        switch (f.a) {
          case 20:  // \uD?: 0-7 plain, 8-B a high surrogate, C-F refused
            if (!hex || low) return;
            f.a = high ? 21 : 5;
            break;
          case 21:
          case 22:
          case 27:
            if (!hex) return;
            ++f.a;
            break;
          case 23:
            if (c != '\\') return;
            f.a = 24;
            break;
          case 24:
            if (c != 'u') return;
            f.a = 25;
            break;
          case 25:
            if (c != 'd' && c != 'D') return;
            f.a = 26;
            break;
          case 26:
            if (!low) return;
            f.a = 27;
            break;
          default:  // 28: the pair's last digit
            if (!hex) return;
            f.a = 1;
            break;
        }
      } else {
        const int32_t to = ContinuationPhase(f.a, c);
        if (to < 0) return;
        f.a = to;
      }
      emit(std::move(st));
      return;
    }
    case NodeKind::kObject: {
      const int32_t members = static_cast<int32_t>(n.members.size());
      auto required_left = [&](int32_t from) {
        for (int32_t j = from; j < members; ++j) {
          if (n.members[static_cast<size_t>(j)].required) return true;
        }
        return false;
      };
      // A member starting with this byte: the listed ones from b up to the first required
      // one, then (with nothing required left) an additional one.
      auto member_start = [&](const Stack& base) {
        const Frame& bf = base.back();
        bool blocked = false;
        for (int32_t j = bf.b; j < members; ++j) {
          Stack s = base;
          s.back().a = 1;
          s.back().b = j + 1;
          s.back().c = 1;
          descend(std::move(s), n.members[static_cast<size_t>(j)].member);
          if (n.members[static_cast<size_t>(j)].required) {
            blocked = true;
            break;
          }
        }
        if (!blocked && n.additional >= 0) {
          Stack s = base;
          s.back().a = 1;
          s.back().b = members;
          s.back().c = 1;
          descend(std::move(s), n.additional);
        }
      };
      if (bracket_phase('{')) return;
      switch (f.a) {
        case 2:
          if (c == '}' && !required_left(f.b)) {
            Stack s = st;
            s.back().a = kClosed;
            emit(std::move(s));
          }
          if (f.c != 0) {
            if (c == ',' && (f.b < members || n.additional >= 0)) {
              f.a = 3;
              emit(std::move(st));
            }
          } else {
            member_start(st);
          }
          return;
        case 4:
          member_start(st);
          return;
        default:
          return;
      }
    }
    case NodeKind::kArray:
      if (bracket_phase('[')) return;
      switch (f.a) {
        case 2:
          if (c == ']' && f.b >= n.min_count) {
            Stack s = st;
            s.back().a = kClosed;
            emit(std::move(s));
          }
          if (f.b == 0) {
            if (n.max_count != 0) {
              f.a = 1;
              f.b = CapCount(1, n.min_count, n.max_count);
              descend(std::move(st), n.item);
            }
          } else if (c == ',' && (n.max_count < 0 || f.b < n.max_count)) {
            f.a = 3;
            emit(std::move(st));
          }
          return;
        case 4:
          f.a = 1;
          f.b = CapCount(f.b + 1, n.min_count, n.max_count);
          descend(std::move(st), n.item);
          return;
        default:
          return;
      }
  }
}

bool GrammarMatcher::RestNullable(const Frame& f) const {
  const Node& n = g_->node(f.node);
  switch (n.kind) {
    case NodeKind::kSeq:
      for (size_t i = static_cast<size_t>(std::max(f.a, 0)); i < n.children.size(); ++i) {
        if (!Nullable(n.children[i])) return false;
      }
      return true;
    case NodeKind::kAlt:
      return true;
    case NodeKind::kRepeat:
      return f.a >= n.min_count || Nullable(n.children[0]);
    default:
      return false;
  }
}

bool GrammarMatcher::CanFinish(const Stack& st) const {
  if (st.empty()) return true;
  const Frame& top = st.back();
  const Node& n = g_->node(top.node);
  bool ok = false;
  switch (n.kind) {
    case NodeKind::kLiteral:
      ok = top.a >= static_cast<int32_t>(n.text.size());
      break;
    case NodeKind::kSeq:
      ok = RestNullable(top);
      break;
    case NodeKind::kAlt:
      ok = top.a >= 0 || std::any_of(n.children.begin(), n.children.end(),
                                     [&](int32_t c) { return Nullable(c); });
      break;
    case NodeKind::kWs:
      ok = true;
      break;
    case NodeKind::kNumber:
      ok = NumberAccepting(top.a);
      break;
    case NodeKind::kBytes:
      ok = top.a == 1;
      break;
    case NodeKind::kRepeat:
      ok = RestNullable(top);
      break;
    default:
      ok = top.a == kClosed;
      break;
  }
  if (!ok) return false;
  for (size_t i = 0; i + 1 < st.size(); ++i) {
    if (!RestNullable(st[i])) return false;
  }
  return true;
}

int32_t GrammarMatcher::Intern(std::vector<Stack> stacks) {
  if (stacks.empty()) return kDead;
  std::sort(stacks.begin(), stacks.end(), StackLess);
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMaxStacks) {
    std::nth_element(stacks.begin(), stacks.begin() + kMaxStacks, stacks.end(), StackKeptFirst);
    stacks.resize(kMaxStacks);
    std::sort(stacks.begin(), stacks.end(), StackLess);
  }
  std::string key;
  size_t frames = 0;
  for (const Stack& s : stacks) {
    const uint32_t size = static_cast<uint32_t>(s.size());
    key.append(reinterpret_cast<const char*>(&size), sizeof(size));
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(Frame));
    frames += s.size();
  }
  if (states_.size() >= kMaxStates || stored_frames_ + frames > kMaxStoredFrames) {
    auto known = ids_.find(key);
    return known != ids_.end() ? known->second : kDead;
  }
  auto [it, fresh] = ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (!fresh) return it->second;
  bool accepting = false;
  for (const Stack& s : stacks) accepting = accepting || CanFinish(s);
  stored_frames_ += frames;
  states_.push_back(std::move(stacks));
  accepting_.push_back(accepting ? 1 : 0);
  next_.push_back(nullptr);
  return it->second;
}

int32_t GrammarMatcher::Next(int32_t state, uint8_t byte) {
  if (state < 0) return kDead;
  auto& table = next_[static_cast<size_t>(state)];
  if (!table) {
    table = std::make_unique<std::array<int32_t, 256>>();
    table->fill(-2);
  }
  int32_t& slot = (*table)[byte];
  if (slot != -2) return slot;
  std::vector<Stack> out;
  // Work: the frames copied in (each stack is fed a copy, whether or not it survives) and out.
  for (const Stack& s : states_[static_cast<size_t>(state)]) {
    work_ += s.size() + 1;
    Feed(s, byte, out);
  }
  for (const Stack& s : out) work_ += s.size() + 1;
  const int32_t to = Intern(std::move(out));
  // (Intern may have grown next_: look the slot up again.)
  (*next_[static_cast<size_t>(state)])[byte] = to;
  return to;
}

int32_t GrammarMatcher::Next(int32_t state, std::string_view bytes) {
  for (char ch : bytes) {
    state = Next(state, static_cast<uint8_t>(ch));
    if (state < 0) return kDead;
  }
  return state;
}

bool GrammarMatcher::CanContinue(int32_t state) {
  if (state < 0) return false;
  for (int b = 0; b < 256; ++b) {
    if (Next(state, static_cast<uint8_t>(b)) >= 0) return true;
  }
  return false;
}

}  // namespace oasis::structured

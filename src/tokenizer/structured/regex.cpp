#include "tokenizer/structured/regex.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/structured/charset.h"
#include "tokenizer/structured/json_schema.h"

namespace oasis::structured {
namespace {

constexpr int kMaxRegexNesting = 200;

using Ranges = CodePoints;

struct Ast {
  enum Kind { kSet, kSeq, kAlt, kRepeat } kind = kSeq;
  Ranges set;
  std::vector<Ast> kids;
  int32_t min = 0, max = -1;
};

class Parser {
 public:
  explicit Parser(std::vector<uint32_t> cps) : cps_(std::move(cps)), end_(cps_.size()) {}

  StatusOr<Ast> Parse() {
    // Anchors at the ends change nothing: the whole output matches.
    if (end_ > 0 && cps_[0] == '^') pos_ = 1;
    if (end_ > pos_ && cps_[end_ - 1] == '$') {
      size_t slashes = 0;
      while (end_ - 1 - slashes > pos_ && cps_[end_ - 2 - slashes] == '\\') ++slashes;
      if (slashes % 2 == 0) --end_;
    }
    Ast out;
    if (Status st = ParseAlt(0, &out); !st.ok()) return st;
    if (pos_ < end_) return Fail("unbalanced ')'");
    return out;
  }

 private:
  Status Fail(const std::string& what) const {
    return InvalidArgument("regex: " + what + " (at character " + std::to_string(pos_) + ")");
  }
  bool More() const { return pos_ < end_; }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < end_ ? cps_[pos_ + ahead] : 0xFFFFFFFFu;
  }
  bool Eat(uint32_t c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }

  Status ParseAlt(int depth, Ast* out) {
    if (depth > kMaxRegexNesting) {
      return Fail("groups nest deeper than " + std::to_string(kMaxRegexNesting));
    }
    Ast alt;
    alt.kind = Ast::kAlt;
    while (true) {
      Ast seq;
      if (Status st = ParseSeq(depth, &seq); !st.ok()) return st;
      alt.kids.push_back(std::move(seq));
      if (!Eat('|')) break;
    }
    *out = alt.kids.size() == 1 ? std::move(alt.kids[0]) : std::move(alt);
    return Status::Ok();
  }

  Status ParseSeq(int depth, Ast* out) {
    out->kind = Ast::kSeq;
    while (More() && Peek() != '|' && Peek() != ')') {
      Ast atom;
      if (Status st = ParseAtom(depth, &atom); !st.ok()) return st;
      if (Status st = ParseQuantifiers(&atom); !st.ok()) return st;
      out->kids.push_back(std::move(atom));
    }
    return Status::Ok();
  }

  // A quantifier at pos_ ({n}, {n,}, {,m}, {n,m}, * + ?): its bounds, and pos_ past it. A '{'
  // that starts none is a literal (as in Python).
  bool Quantifier(int32_t* lo, int32_t* hi, Status* error) {
    const uint32_t c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      *lo = c == '+' ? 1 : 0;
      *hi = c == '?' ? 1 : -1;
      return true;
    }
    if (c != '{') return false;
    size_t p = pos_ + 1;
    auto number = [&](int64_t* v) {
      const size_t from = p;
      *v = 0;
      while (p < end_ && cps_[p] >= '0' && cps_[p] <= '9') {
        *v = std::min<int64_t>(*v * 10 + (cps_[p] - '0'), int64_t{1} << 40);
        ++p;
      }
      return p > from;
    };
    int64_t a = 0, b = -1;
    const bool has_a = number(&a);
    bool has_b = false;
    if (p < end_ && cps_[p] == ',') {
      ++p;
      has_b = number(&b);
      if (!has_b) b = -1;
    } else {
      b = a;
      has_b = has_a;
    }
    if (p >= end_ || cps_[p] != '}' || (!has_a && !has_b)) return false;
    pos_ = p + 1;
    if (a > kMaxRegexRepeat || b > kMaxRegexRepeat) {
      *error =
          Fail("repetition bounds above " + std::to_string(kMaxRegexRepeat) + " are not supported");
    } else if (b >= 0 && a > b) {
      *error = Fail("repetition bounds {" + std::to_string(a) + "," + std::to_string(b) +
                    "} are out of order");
    }
    *lo = static_cast<int32_t>(a);
    *hi = static_cast<int32_t>(b);
    return true;
  }

  Status ParseQuantifiers(Ast* atom) {
    int32_t lo = 0, hi = 0;
    Status error = Status::Ok();
    if (!Quantifier(&lo, &hi, &error)) return Status::Ok();
    if (!error.ok()) return error;
    if (Eat('+')) return Fail("possessive quantifiers are not supported");
    Eat('?');  // lazy: the same texts match
    const size_t at = pos_;
    if (Quantifier(&lo, &hi, &error)) {
      pos_ = at;
      return Fail("multiple repeat");
    }
    if (lo == 1 && hi == 1) return Status::Ok();
    Ast rep;
    rep.kind = Ast::kRepeat;
    rep.min = lo;
    rep.max = hi;
    rep.kids.push_back(std::move(*atom));
    *atom = std::move(rep);
    return Status::Ok();
  }

  Status ParseAtom(int depth, Ast* out) {
    const uint32_t c = Peek();
    out->kind = Ast::kSet;
    if (c == '(') {
      ++pos_;
      if (Eat('?')) {
        if (Eat(':')) {
          // a group that captures nothing
        } else if ((Peek() == 'P' && Peek(1) == '<') ||
                   (Peek() == '<' && Peek(1) != '=' && Peek(1) != '!')) {
          pos_ += Peek() == 'P' ? 2 : 1;
          const size_t from = pos_;
          while (More() && Peek() != '>') {
            const uint32_t n = Peek();
            if (!(n == '_' || (n >= '0' && n <= '9') || (n >= 'a' && n <= 'z') ||
                  (n >= 'A' && n <= 'Z'))) {
              return Fail("bad group name");
            }
            ++pos_;
          }
          // (an identifier, as Python's group names)
          if (!Eat('>') || pos_ - 1 == from || (cps_[from] >= '0' && cps_[from] <= '9')) {
            return Fail("bad group name");
          }
        } else if (Peek() == '=' || Peek() == '!' || Peek() == '<') {
          return Fail("lookaround assertions are not supported");
        } else if (Peek() == 'P' && Peek(1) == '=') {
          return Fail("backreferences are not supported");
        } else {
          return Fail("inline flags and other (?...) groups are not supported");
        }
      }
      if (Status st = ParseAlt(depth + 1, out); !st.ok()) return st;
      if (!Eat(')')) return Fail("missing ')'");
      return Status::Ok();
    }
    if (c == '[') {
      ++pos_;
      return ParseClass(out);
    }
    if (c == '.') {
      ++pos_;
      out->set = NegateCodePoints(SingleCodePoint('\n'));
      return Status::Ok();
    }
    if (c == '^' || c == '$') return Fail("anchors are supported only at the pattern's ends");
    if (c == '*' || c == '+' || c == '?') return Fail("nothing to repeat");
    if (c == '{') {
      const size_t at = pos_;
      int32_t lo = 0, hi = 0;
      Status error = Status::Ok();
      if (Quantifier(&lo, &hi, &error)) {
        pos_ = at;
        return Fail("nothing to repeat");
      }
    }
    if (c == '\\') {
      ++pos_;
      return ParseEscape(false, &out->set);
    }
    ++pos_;
    out->set = SingleCodePoint(c);
    return Status::Ok();
  }

  // After a backslash; `set` gets what it matches.
  Status ParseEscape(bool in_class, Ranges* set) {
    if (!More()) return Fail("a pattern may not end with a backslash");
    const uint32_t c = Peek();
    ++pos_;
    auto hex = [&](size_t digits, uint32_t* v) {
      *v = 0;
      for (size_t i = 0; i < digits; ++i) {
        const int d = HexDigit(Peek());
        if (d < 0) return false;
        *v = *v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      return true;
    };
    static const Ranges digit = {{'0', '9'}};
    static const Ranges word =
        NormalizeCodePoints({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
    static const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    uint32_t v = 0;
    switch (c) {
      case 'd':
        *set = digit;
        return Status::Ok();
      case 'D':
        *set = NegateCodePoints(digit);
        return Status::Ok();
      case 'w':
        *set = word;
        return Status::Ok();
      case 'W':
        *set = NegateCodePoints(word);
        return Status::Ok();
      case 's':
        *set = space;
        return Status::Ok();
      case 'S':
        *set = NegateCodePoints(space);
        return Status::Ok();
      case 'n':
        v = '\n';
        break;
      case 't':
        v = '\t';
        break;
      case 'r':
        v = '\r';
        break;
      case 'f':
        v = '\f';
        break;
      case 'v':
        v = '\v';
        break;
      case 'a':
        v = 7;
        break;
      case 'b':
        if (!in_class) return Fail("word boundaries (\\b) are not supported");
        v = 8;
        break;
      case '0':  // \0 and up to two more octal digits
        for (int i = 0; i < 2 && Peek() >= '0' && Peek() <= '7'; ++i)
          v = v * 8 + (cps_[pos_++] - '0');
        break;
      case 'x':
        if (!hex(2, &v)) return Fail("\\x takes two hex digits");
        break;
      case 'u':
        if (Eat('{')) {
          size_t n = 0;
          v = 0;
          uint32_t d = 0;
          while (n < 6 && hex(1, &d)) {
            v = v * 16 + d;
            ++n;
          }
          if (n == 0 || !Eat('}')) return Fail("\\u{...} takes one to six hex digits");
        } else if (!hex(4, &v)) {
          return Fail("\\u takes four hex digits");
        }
        break;
      case 'U':
        if (!hex(8, &v)) return Fail("\\U takes eight hex digits");
        break;
      default:
        if (c >= '1' && c <= '9') return Fail("backreferences are not supported");
        if (c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G') {
          return Fail("the assertion \\" + std::string(1, static_cast<char>(c)) +
                      " is not supported");
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Fail("bad escape \\" + std::string(1, static_cast<char>(c)));
        }
        v = c;  // an escaped punctuation mark or non-ASCII character: itself
        break;
    }
    if (!IsScalarValue(v)) return Fail("the escape is not a character");
    *set = SingleCodePoint(v);
    return Status::Ok();
  }

  Status ParseClass(Ast* out) {
    const size_t start = pos_ - 1;
    const bool negated = Eat('^');
    Ranges items;
    bool first = true;
    while (true) {
      if (!More()) {
        pos_ = start;
        return Fail("unterminated character class");
      }
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      Ranges item;
      auto one = [&](Ranges* r) -> Status {
        if (Eat('\\')) return ParseEscape(true, r);
        *r = SingleCodePoint(Peek());
        ++pos_;
        return Status::Ok();
      };
      if (Status st = one(&item); !st.ok()) return st;
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < end_) {
        ++pos_;
        Ranges hi;
        if (Status st = one(&hi); !st.ok()) return st;
        if (item.size() != 1 || item[0].first != item[0].second || hi.size() != 1 ||
            hi[0].first != hi[0].second) {
          return Fail("bad character range");
        }
        if (item[0].first > hi[0].first) return Fail("bad character range (out of order)");
        item = {{item[0].first, hi[0].first}};
      }
      items.insert(items.end(), item.begin(), item.end());
    }
    out->kind = Ast::kSet;
    out->set = negated ? NegateCodePoints(items) : NormalizeCodePoints(items);
    if (out->set.empty()) {
      pos_ = start;
      return Fail("the character class matches no character");
    }
    return Status::Ok();
  }

  std::vector<uint32_t> cps_;
  size_t end_;
  size_t pos_ = 0;
};

class Emitter {
 public:
  Emitter(Grammar* g, bool json, CodePoints* matched) : g_(g), json_(json), matched_(matched) {}

  StatusOr<int32_t> Emit(const Ast& a) {
    if (g_->size() > kMaxGrammarNodes) {
      return InvalidArgument("regex: the pattern is too large (more than " +
                             std::to_string(kMaxGrammarNodes) + " grammar nodes)");
    }
    switch (a.kind) {
      case Ast::kSet:
        Note(a.set);
        return CodePointsNode(g_, a.set, json_);
      case Ast::kRepeat: {
        dead_ += a.max == 0;  // (x{0}: its characters never appear)
        auto child = Emit(a.kids[0]);
        dead_ -= a.max == 0;
        if (!child.ok()) return child;
        return g_->Repeat(*child, a.min, a.max);
      }
      case Ast::kAlt: {
        std::vector<int32_t> alts;
        for (const Ast& k : a.kids) {
          auto n = Emit(k);
          if (!n.ok()) return n;
          alts.push_back(*n);
        }
        return g_->Alt(std::move(alts));
      }
      case Ast::kSeq:
        break;
    }
    // Runs of single characters become one literal.
    std::vector<int32_t> parts;
    std::string text;
    for (const Ast& k : a.kids) {
      if (k.kind == Ast::kSet && k.set.size() == 1 && k.set[0].first == k.set[0].second) {
        Note(k.set);
        text += Text(k.set[0].first);
        continue;
      }
      if (!text.empty()) parts.push_back(g_->Literal(std::move(text)));
      text.clear();
      auto n = Emit(k);
      if (!n.ok()) return n;
      parts.push_back(*n);
    }
    if (!text.empty() || parts.empty()) parts.push_back(g_->Literal(std::move(text)));
    return parts.size() == 1 ? parts[0] : g_->Seq(std::move(parts));
  }

 private:
  std::string Text(uint32_t cp) const { return json_ ? JsonEscaped(cp) : EncodeUtf8(cp); }
  void Note(const CodePoints& set) {
    if (matched_ != nullptr && dead_ == 0)
      matched_->insert(matched_->end(), set.begin(), set.end());
  }

  Grammar* g_;
  bool json_;
  CodePoints* matched_;
  int dead_ = 0;  // inside repetitions of at most zero
};

}  // namespace

StatusOr<int32_t> CompileRegex(std::string_view pattern, Grammar* g, bool json_string,
                               CodePoints* matched) {
  if (pattern.size() > kMaxRegexBytes) {
    return InvalidArgument("regex: patterns longer than " + std::to_string(kMaxRegexBytes) +
                           " bytes are not supported");
  }
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(pattern, &cps)) return InvalidArgument("regex: the pattern is not valid UTF-8");
  Parser parser(std::move(cps));
  auto ast = parser.Parse();
  if (!ast.ok()) return ast.status();
  auto root = Emitter(g, json_string, matched).Emit(*ast);
  if (matched != nullptr) *matched = NormalizeCodePoints(*matched);
  return root;
}

StatusOr<std::shared_ptr<const Grammar>> RegexGrammar(std::string_view pattern) {
  auto g = std::make_shared<Grammar>();
  auto root = CompileRegex(pattern, g.get(), false);
  if (!root.ok()) return root.status();
  g->root = *root;
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace oasis::structured

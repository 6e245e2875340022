#include "tokenizer/structured/regex.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/structured/json_schema.h"

namespace oasis::structured {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRegexNesting = 200;

// A set of code points: sorted, disjoint, non-adjacent ranges, without surrogates.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(const Ranges& in) {
  Ranges r;
  for (auto [lo, hi] : in) {  // (surrogates have no UTF-8 form)
    if (lo > hi) continue;
    if (lo < 0xD800) r.emplace_back(lo, std::min<uint32_t>(hi, 0xD7FF));
    if (hi > 0xDFFF) r.emplace_back(std::max<uint32_t>(lo, 0xE000), hi);
  }
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges Negate(const Ranges& set) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : Normalize(set)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return Normalize(out);
}

Ranges Single(uint32_t cp) { return {{cp, cp}}; }

int Utf8Encode(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

std::string Utf8(uint32_t cp) {
  uint8_t b[4];
  const int n = Utf8Encode(cp, b);
  return std::string(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
}

// The UTF-8 forms of lo..hi (no surrogates inside) as sequences of byte ranges: every byte
// string of the sequence's length whose i-th byte lies in its i-th range encodes a code point
// of lo..hi, and each one is covered once.
using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;
void Utf8Split(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // one encoded length at a time
    if (lo <= edge && hi > edge) {
      Utf8Split(lo, edge, out);
      Utf8Split(edge + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int n = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int i = 1; i < n; ++i) {  // split until the bytes vary independently
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Split(lo, lo | m, out);
        Utf8Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Split(lo, (hi & ~m) - 1, out);
        Utf8Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Utf8Encode(lo, a);
  Utf8Encode(hi, b);
  ByteRanges seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

// How a code point is written between a JSON string's quotes.
std::string JsonEscaped(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      break;
  }
  if (cp < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
    return buf;
  }
  return Utf8(cp);
}

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
      out->set = Negate(Single('\n'));
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
    out->set = Single(c);
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
        const uint32_t h = Peek();
        int d = h >= '0' && h <= '9'   ? static_cast<int>(h - '0')
                : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10)
                                       : -1;
        if (d < 0) return false;
        *v = *v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      return true;
    };
    const Ranges digit = {{'0', '9'}};
    const Ranges word = Normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
    const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    uint32_t v = 0;
    switch (c) {
      case 'd':
        *set = digit;
        return Status::Ok();
      case 'D':
        *set = Negate(digit);
        return Status::Ok();
      case 'w':
        *set = word;
        return Status::Ok();
      case 'W':
        *set = Negate(word);
        return Status::Ok();
      case 's':
        *set = space;
        return Status::Ok();
      case 'S':
        *set = Negate(space);
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
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      return Fail("the escape is not a character");
    *set = Single(v);
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
        *r = Single(Peek());
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
    out->set = negated ? Negate(items) : Normalize(items);
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
  Emitter(Grammar* g, bool json) : g_(g), json_(json) {}

  StatusOr<int32_t> Emit(const Ast& a) {
    if (g_->size() > kMaxGrammarNodes) {
      return InvalidArgument("regex: the pattern is too large (more than " +
                             std::to_string(kMaxGrammarNodes) + " grammar nodes)");
    }
    switch (a.kind) {
      case Ast::kSet:
        return Set(a.set);
      case Ast::kRepeat: {
        auto child = Emit(a.kids[0]);
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
  std::string Text(uint32_t cp) const { return json_ ? JsonEscaped(cp) : Utf8(cp); }

  int32_t Set(const Ranges& set) {
    std::vector<int32_t> alts;
    Ranges raw;
    for (auto [lo, hi] : set) {
      if (json_) {  // '"', '\' and controls written as their escapes
        for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
          if (cp < 0x20 || cp == '"' || cp == '\\') alts.push_back(g_->Literal(JsonEscaped(cp)));
        }
        Ranges split = {{lo, hi}};
        for (uint32_t cut : {0x5Cu, 0x22u}) {
          Ranges next;
          for (auto [a, b] : split) {
            if (a <= cut && cut <= b) {
              if (a < cut) next.emplace_back(a, cut - 1);
              if (cut < b) next.emplace_back(cut + 1, b);
            } else {
              next.emplace_back(a, b);
            }
          }
          split = std::move(next);
        }
        for (auto [a, b] : split) {
          a = std::max<uint32_t>(a, 0x20);
          if (a <= b) raw.emplace_back(a, b);
        }
      } else {
        raw.emplace_back(lo, hi);
      }
    }
    std::vector<ByteRanges> seqs;
    for (auto [lo, hi] : raw) Utf8Split(lo, hi, seqs);
    int32_t ascii = -1;  // the one-byte forms share one node
    for (const ByteRanges& seq : seqs) {
      if (seq.size() == 1) {
        if (ascii < 0) {
          ascii = g_->Bytes(seq[0].first, seq[0].second);
          alts.push_back(ascii);
        } else {
          for (int b = seq[0].first; b <= seq[0].second; ++b) {
            g_->node(ascii).bytes[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
          }
        }
        continue;
      }
      std::vector<int32_t> bytes;
      for (auto [lo, hi] : seq) bytes.push_back(g_->Bytes(lo, hi));
      alts.push_back(g_->Seq(std::move(bytes)));
    }
    return alts.size() == 1 ? alts[0] : g_->Alt(std::move(alts));
  }

  Grammar* g_;
  bool json_;
};

// The pattern's code points; false for bytes that are not UTF-8.
bool DecodeUtf8(std::string_view s, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + static_cast<size_t>(n) > s.size()) return false;
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out->push_back(cp);
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

StatusOr<int32_t> CompileRegex(std::string_view pattern, Grammar* g, bool json_string) {
  if (pattern.size() > kMaxRegexBytes) {
    return InvalidArgument("regex: patterns longer than " + std::to_string(kMaxRegexBytes) +
                           " bytes are not supported");
  }
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(pattern, &cps)) return InvalidArgument("regex: the pattern is not valid UTF-8");
  Parser parser(std::move(cps));
  auto ast = parser.Parse();
  if (!ast.ok()) return ast.status();
  return Emitter(g, json_string).Emit(*ast);
}

StatusOr<std::shared_ptr<const Grammar>> RegexGrammar(std::string_view pattern) {
  auto g = std::make_shared<Grammar>();
  auto root = CompileRegex(pattern, g.get(), false);
  if (!root.ok()) return root.status();
  g->root = *root;
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace oasis::structured

#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "tokenizer/jinja/utf8.h"

namespace oasis::jinja {
namespace {

// Python `\s` (Unicode whitespace) at byte offset `pos`; returns its byte length or 0.
size_t SpaceAt(const std::string& s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return utf8::IsSpace(b) ? 1 : 0;
  size_t len = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  std::u32string cps = utf8::Decode(std::string_view(s).substr(pos, len));
  return (!cps.empty() && utf8::IsSpace(cps[0]) && utf8::Encode(cps.substr(0, 1)).size() == len)
             ? len
             : 0;
}

// Python str.rstrip() of Unicode whitespace.
std::string RStripSpace(const std::string& s) {
  std::u32string cps = utf8::Decode(s);
  size_t n = cps.size();
  while (n > 0 && utf8::IsSpace(cps[n - 1])) --n;
  return utf8::Encode(std::u32string_view(cps).substr(0, n));
}

bool AllSpace(const std::string& s, size_t from) {
  if (from >= s.size()) return false;  // `\s+` needs at least one character
  for (char32_t c : utf8::Decode(std::string_view(s).substr(from))) {
    if (!utf8::IsSpace(c)) return false;
  }
  return true;
}

// One per Tokenize call: owns the normalised source and the tokens being built. Not shared.
class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& o) : src_(std::move(source)), opt_(o) {}

  StatusOr<std::vector<Token>> Run();

 private:
  Status Error(size_t pos, const std::string& msg) const {
    auto [line, col] = LineCol(pos);
    return InvalidArgument(std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
  }
  std::pair<int, int> LineCol(size_t pos) const {
    // Incremental: positions are requested in increasing order almost always.
    if (pos < lc_pos_) {
      lc_pos_ = 0;
      lc_line_ = 1;
      lc_col_ = 1;
    }
    for (; lc_pos_ < pos && lc_pos_ < src_.size(); ++lc_pos_) {
      if (src_[lc_pos_] == '\n') {
        ++lc_line_;
        lc_col_ = 1;
      } else {
        ++lc_col_;
      }
    }
    return {lc_line_, lc_col_};
  }
  void Push(TokenKind kind, size_t pos, std::string text = {}) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    std::tie(t.line, t.column) = LineCol(pos);
    tokens_.push_back(std::move(t));
  }
  bool At(size_t pos, const char* s) const { return src_.compare(pos, std::strlen(s), s) == 0; }
  size_t SkipSpace(size_t pos) const {
    while (size_t n = SpaceAt(src_, pos)) pos += n;
    return pos;
  }
  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at pos; returns the end or npos.
  size_t MatchRawBegin(size_t pos) const;
  Status LexRaw(size_t& pos);
  Status LexComment(size_t& pos);
  Status LexTag(size_t& pos, bool is_block);
  Status LexString(size_t& pos);
  Status LexNumber(size_t& pos);

  std::string src_;
  LexerOptions opt_;
  std::vector<Token> tokens_;
  bool line_starting_ = true;
  mutable size_t lc_pos_ = 0;
  mutable int lc_line_ = 1, lc_col_ = 1;
};

size_t Lexer::MatchRawBegin(size_t pos) const {
  if (!At(pos, "{%")) return std::string::npos;
  size_t p = pos + 2;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
  p = SkipSpace(p);
  if (!At(p, "raw")) return std::string::npos;
  p = SkipSpace(p + 3);
  if (At(p, "-%}")) return SkipSpace(p + 3);
  if (At(p, "%}")) return p + 2;
  return std::string::npos;
}

StatusOr<std::vector<Token>> Lexer::Run() {
  // Normalise newlines and drop one trailing newline, as Jinja2's tokeniter does.
  std::string norm;
  norm.reserve(src_.size());
  for (size_t i = 0; i < src_.size(); ++i) {
    if (src_[i] == '\r') {
      norm.push_back('\n');
      if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
    } else {
      norm.push_back(src_[i]);
    }
  }
  if (!opt_.keep_trailing_newline && !norm.empty() && norm.back() == '\n') norm.pop_back();
  src_ = std::move(norm);

  size_t pos = 0;
  while (pos < src_.size()) {
    size_t open = pos;
    char kind = 0;
    while ((open = src_.find('{', open)) != std::string::npos) {
      if (open + 1 < src_.size() && std::strchr("{%#", src_[open + 1]) != nullptr) {
        kind = src_[open + 1];
        break;
      }
      ++open;
    }
    if (open == std::string::npos) {
      Push(TokenKind::kData, pos, src_.substr(pos));
      break;
    }
    std::string text = src_.substr(pos, open - pos);
    size_t raw_end = kind == '%' ? MatchRawBegin(open) : std::string::npos;
    char sign = open + 2 < src_.size() ? src_[open + 2] : 0;
    if (sign == '-') {
      text = RStripSpace(text);
    } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && AllSpace(text, l_pos)) text.resize(l_pos);
    }
    if (!text.empty()) Push(TokenKind::kData, pos, std::move(text));
    size_t body = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    if (raw_end != std::string::npos) {
      pos = raw_end;
      OASIS_RETURN_IF_ERROR(LexRaw(pos));
    } else if (kind == '#') {
      pos = body;
      OASIS_RETURN_IF_ERROR(LexComment(pos));
    } else {
      Push(kind == '%' ? TokenKind::kBlockBegin : TokenKind::kVarBegin, open);
      pos = body;
      OASIS_RETURN_IF_ERROR(LexTag(pos, kind == '%'));
    }
  }
  Push(TokenKind::kEnd, src_.size());
  return std::move(tokens_);
}

Status Lexer::LexRaw(size_t& pos) {
  // (.*?)({%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)) with lstrip on the text before it.
  size_t search = pos;
  while (true) {
    size_t open = src_.find("{%", search);
    if (open == std::string::npos) return Error(pos, "Missing end of raw directive");
    size_t p = open + 2;
    char sign = p < src_.size() ? src_[p] : 0;
    if (sign == '-' || sign == '+') ++p;
    p = SkipSpace(p);
    if (!At(p, "endraw")) {
      search = open + 1;
      continue;
    }
    p = SkipSpace(p + 6);
    size_t end;
    if (At(p, "+%}")) {
      end = p + 3;
    } else if (At(p, "-%}")) {
      end = SkipSpace(p + 3);
    } else if (At(p, "%}")) {
      end = p + 2;
      if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
    } else {
      search = open + 1;
      continue;
    }
    std::string text = src_.substr(pos, open - pos);
    if (sign == '-') {
      text = RStripSpace(text);
    } else if (sign != '+' && opt_.lstrip_blocks) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && AllSpace(text, l_pos)) text.resize(l_pos);
    }
    if (!text.empty()) Push(TokenKind::kData, pos, std::move(text));
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    pos = end;
    return Status::Ok();
  }
}

Status Lexer::LexComment(size_t& pos) {
  size_t close = src_.find("#}", pos);
  if (close == std::string::npos) return Error(pos, "Missing end of comment tag");
  size_t end = close + 2;
  if (close > pos && src_[close - 1] == '-') {
    end = SkipSpace(end);
  } else if (close > pos && src_[close - 1] == '+') {
    // keep everything
  } else if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') {
    ++end;
  }
  line_starting_ = src_[end - 1] == '\n';
  pos = end;
  return Status::Ok();
}

Status Lexer::LexTag(size_t& pos, bool is_block) {
  std::string brackets;  // expected closers
  while (true) {
    pos = SkipSpace(pos);
    if (pos >= src_.size())
      return Error(pos, is_block ? "unexpected end of template, expected '%}'"
                                 : "unexpected end of template, expected '}}'");
    if (brackets.empty()) {
      size_t end = std::string::npos;
      if (is_block) {
        if (At(pos, "+%}")) {
          end = pos + 3;
        } else if (At(pos, "-%}")) {
          end = SkipSpace(pos + 3);
        } else if (At(pos, "%}")) {
          end = pos + 2;
          if (opt_.trim_blocks && end < src_.size() && src_[end] == '\n') ++end;
        }
      } else if (At(pos, "-}}")) {
        end = SkipSpace(pos + 3);
      } else if (At(pos, "}}")) {
        end = pos + 2;
      }
      if (end != std::string::npos) {
        Push(is_block ? TokenKind::kBlockEnd : TokenKind::kVarEnd, pos);
        line_starting_ = src_[end - 1] == '\n';
        pos = end;
        return Status::Ok();
      }
    }
    char c = src_[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      OASIS_RETURN_IF_ERROR(LexNumber(pos));
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos;
      while (pos < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[pos])) || src_[pos] == '_')) {
        ++pos;
      }
      Push(TokenKind::kName, start, src_.substr(start, pos - start));
    } else if (c == '\'' || c == '"') {
      OASIS_RETURN_IF_ERROR(LexString(pos));
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                   "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                   ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      const char* op = nullptr;
      for (const char* candidate : kOps) {
        if (At(pos, candidate)) {
          op = candidate;
          break;
        }
      }
      if (op == nullptr) {
        return Error(pos, std::string("unexpected char '") + c + "'");
      }
      char o = op[0];
      if (op[1] == 0 && (o == '(' || o == '[' || o == '{')) {
        brackets.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      } else if (op[1] == 0 && (o == ')' || o == ']' || o == '}')) {
        if (brackets.empty()) return Error(pos, std::string("unexpected '") + o + "'");
        if (brackets.back() != o) {
          return Error(pos,
                       std::string("unexpected '") + o + "', expected '" + brackets.back() + "'");
        }
        brackets.pop_back();
      }
      Push(TokenKind::kOperator, pos, op);
      pos += std::strlen(op);
    }
  }
}

Status Lexer::LexString(size_t& pos) {
  char quote = src_[pos];
  size_t start = pos++;
  std::string raw;
  while (true) {
    if (pos >= src_.size()) return Error(start, "unexpected end of string literal");
    char c = src_[pos];
    if (c == quote) break;
    if (c == '\\' && pos + 1 < src_.size()) {
      raw.push_back(c);
      raw.push_back(src_[pos + 1]);
      pos += 2;
      continue;
    }
    raw.push_back(c);
    ++pos;
  }
  ++pos;
  // Python "unicode-escape" decoding.
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out.push_back(raw[i]);
      continue;
    }
    char e = raw[++i];
    auto hex = [&](int digits, const char* what) -> StatusOr<char32_t> {
      char32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        if (i + 1 >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[i + 1]))) {
          return Error(start, std::string("truncated ") + what + " escape");
        }
        char h = raw[++i];
        v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h))
                                               ? h - '0'
                                               : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        OASIS_ASSIGN_OR_RETURN(char32_t cp, hex(digits, e == 'x'   ? "\\xXX"
                                                        : e == 'u' ? "\\uXXXX"
                                                                   : "\\UXXXXXXXX"));
        if (cp > 0x10FFFF) return Error(start, "illegal Unicode character");
        utf8::Append(out, cp);
        break;
      }
      case 'N':
        return Error(start, "malformed \\N character escape");
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7';
               ++k) {
            v = v * 8 + static_cast<char32_t>(raw[++i] - '0');
          }
          utf8::Append(out, v);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  Push(TokenKind::kString, start, std::move(out));
  return Status::Ok();
}

Status Lexer::LexNumber(size_t& pos) {
  size_t start = pos;
  auto digits = [&](auto pred) {
    while (pos < src_.size() && (pred(src_[pos]) || (src_[pos] == '_' && pos + 1 < src_.size() &&
                                                     pred(src_[pos + 1])))) {
      ++pos;
    }
  };
  auto dec = [](char c) { return c >= '0' && c <= '9'; };
  bool after_dot = start > 0 && src_[start - 1] == '.';
  int base = 10;
  if (src_[pos] == '0' && pos + 1 < src_.size() && std::strchr("xXoObB", src_[pos + 1]) &&
      src_[pos + 1]) {
    char b = static_cast<char>(std::tolower(src_[pos + 1]));
    base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
    pos += 2;
    digits([base](char c) {
      return base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                        : (c >= '0' && c < static_cast<char>('0' + base));
    });
  } else {
    digits(dec);
  }
  bool is_float = false;
  if (base == 10 && !after_dot) {
    if (pos + 1 < src_.size() && src_[pos] == '.' && dec(src_[pos + 1])) {
      is_float = true;
      ++pos;
      digits(dec);
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t p = pos + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && dec(src_[p])) {
        is_float = true;
        pos = p;
        digits(dec);
      }
    }
  }
  std::string text;
  for (size_t i = start; i < pos; ++i) {
    if (src_[i] != '_') text.push_back(src_[i]);
  }
  Token t;
  std::tie(t.line, t.column) = LineCol(start);
  t.text = text;
  if (is_float) {
    t.kind = TokenKind::kFloat;
    t.number = std::strtod(text.c_str(), nullptr);
  } else {
    t.kind = TokenKind::kInteger;
    errno = 0;
    unsigned long long v =
        std::strtoull(base == 10 ? text.c_str() : text.c_str() + 2, nullptr, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      return Error(start, "integer literal too large");
    }
    t.integer = static_cast<int64_t>(v);
  }
  tokens_.push_back(std::move(t));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<Token>> Tokenize(const std::string& source, const LexerOptions& options) {
  Lexer lexer(source, options);
  return lexer.Run();
}

}  // namespace oasis::jinja

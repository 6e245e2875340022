#include "server/json_scanner.h"

#include <nlohmann/json.hpp>

namespace oasis::server {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool IsJsonNumber(std::string_view t) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < t.size() && IsDigit(t[i])) ++i;
    return i > start;
  };
  if (i < t.size() && t[i] == '-') ++i;
  if (i < t.size() && t[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < t.size() && t[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == t.size();
}

const JsonObjectScanner::Member* JsonObjectScanner::Find(std::string_view key) const {
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) {
    if (it->key == key) return &*it;
  }
  return nullptr;
}

size_t JsonObjectScanner::Feed(std::string_view text) {
  size_t used = 0;
  while (used < text.size() && state_ == State::kIncomplete) {
    if (!Push(text[used])) {
      state_ = State::kError;
      break;
    }
    ++used;
    ++offset_;
  }
  return used;
}

void JsonObjectScanner::EndValue(size_t end) {
  if (stack_.size() == 1 && stack_[0] == '{' && !members_.empty()) members_.back().end = end;
  expect_ = Expect::kCommaOrClose;
}

bool JsonObjectScanner::StartValue(char c) {
  if (stack_.empty() && c != '{') return false;  // the top level is an object
  if (stack_.size() == 1 && stack_[0] == '{' && !members_.empty()) members_.back().begin = offset_;
  switch (c) {
    case '{':
    case '[':
      stack_.push_back(c);
      expect_ = c == '{' ? Expect::kKeyOrClose : Expect::kValueOrClose;
      return true;
    case '"':
      token_ = Token::kString;
      key_ = false;
      return true;
    case 't':
    case 'f':
    case 'n':
      token_ = Token::kLiteral;
      literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      literal_pos_ = 1;
      return true;
    default:
      if (c != '-' && !IsDigit(c)) return false;
      token_ = Token::kNumber;
      buffer_.assign(1, c);
      return true;
  }
}

bool JsonObjectScanner::Structural(char c) {
  if (IsSpace(c)) return true;
  const bool closes = c == '}' || c == ']';
  if (closes) {
    const bool may_close = expect_ == Expect::kCommaOrClose ||
                           (c == '}' && expect_ == Expect::kKeyOrClose) ||
                           (c == ']' && expect_ == Expect::kValueOrClose);
    if (!may_close || stack_.empty() || stack_.back() != (c == '}' ? '{' : '[')) return false;
    stack_.pop_back();
    if (stack_.empty()) {
      state_ = State::kComplete;
      return true;
    }
    EndValue(offset_ + 1);
    return true;
  }
  switch (expect_) {
    case Expect::kValue:
    case Expect::kValueOrClose:
      return StartValue(c);
    case Expect::kKeyOrClose:
    case Expect::kKey:
      if (c != '"') return false;
      token_ = Token::kString;
      key_ = true;
      buffer_ = "\"";
      return true;
    case Expect::kColon:
      if (c != ':') return false;
      expect_ = Expect::kValue;
      return true;
    case Expect::kCommaOrClose:
      if (c != ',') return false;
      expect_ = stack_.back() == '{' ? Expect::kKey : Expect::kValue;
      return true;
  }
  return false;
}

bool JsonObjectScanner::Push(char c) {
  switch (token_) {
    case Token::kString: {
      const bool top_key = key_ && stack_.size() == 1;
      if (top_key) buffer_ += c;
      if (unicode_left_ > 0) {
        --unicode_left_;
        return IsHex(c);
      }
      if (escape_) {
        escape_ = false;
        if (c == 'u') {
          unicode_left_ = 4;
          return true;
        }
        return std::string_view("\"\\/bfnrt").find(c) != std::string_view::npos;
      }
      if (c == '\\') {
        escape_ = true;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '"') return true;
      token_ = Token::kNone;
      if (!key_) {
        EndValue(offset_ + 1);
        return true;
      }
      if (top_key) {
        const nlohmann::json key = nlohmann::json::parse(buffer_, nullptr, false);
        if (!key.is_string()) return false;  // e.g. a lone surrogate escape
        members_.push_back(Member{key.get<std::string>()});
      }
      expect_ = Expect::kColon;
      return true;
    }
    case Token::kLiteral:
      if (c != literal_[literal_pos_]) return false;
      if (++literal_pos_ == literal_.size()) {
        token_ = Token::kNone;
        EndValue(offset_ + 1);
      }
      return true;
    case Token::kNumber:
      if (IsDigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
        buffer_ += c;
        return true;
      }
      if (!IsJsonNumber(buffer_)) return false;
      token_ = Token::kNone;
      EndValue(offset_);
      return Structural(c);
    case Token::kNone:
      return Structural(c);
  }
  return false;
}

}  // namespace oasis::server

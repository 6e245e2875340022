// JsonObjectScanner: validates one JSON object incrementally, byte by byte, and records where
// each of its top-level members' values lies in the text — so that a tool call's JSON can be
// streamed while it is generated (its name once complete, its arguments as they grow) and
// refused as soon as it stops being JSON.
//
// Strict JSON (RFC 8259): no comments, no trailing commas, no single quotes; the top-level value
// must be an object. Bytes after the object's closing brace are not consumed. A plain value
// type; thread-compatible.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace oasis::server {

class JsonObjectScanner {
 public:
  static constexpr size_t kOpen = static_cast<size_t>(-1);
  enum class State { kIncomplete, kComplete, kError };
  // A member of the top-level object: its decoded key and its value's byte range [begin, end)
  // in the text fed (offsets from the first byte fed); end is kOpen while the value is still
  // being scanned (begin is kOpen until it starts).
  struct Member {
    std::string key;
    size_t begin = kOpen;
    size_t end = kOpen;
  };

  // Scans `text`, the continuation of what was fed before, up to the end of the object or the
  // first error; returns the bytes consumed.
  size_t Feed(std::string_view text);
  State state() const { return state_; }
  size_t offset() const { return offset_; }  // bytes consumed so far
  const std::vector<Member>& members() const { return members_; }
  // The member with this key (the last one if repeated), or null.
  const Member* Find(std::string_view key) const;

 private:
  enum class Expect { kValue, kValueOrClose, kKeyOrClose, kKey, kColon, kCommaOrClose };
  enum class Token { kNone, kString, kNumber, kLiteral };

  bool Push(char c);  // false: not JSON
  bool Structural(char c);
  bool StartValue(char c);
  void EndValue(size_t end);  // a value ended at `end` (exclusive)

  State state_ = State::kIncomplete;
  size_t offset_ = 0;
  std::string stack_;  // '{' / '[' per open container
  Expect expect_ = Expect::kValue;
  Token token_ = Token::kNone;
  bool key_ = false;  // the string being scanned is a key
  bool escape_ = false;
  int unicode_left_ = 0;
  std::string buffer_;   // a number's text, or a top-level key's raw text
  std::string literal_;  // true / false / null being matched
  size_t literal_pos_ = 0;
  std::vector<Member> members_;
};

// Whether `text` is a JSON number (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?).
bool IsJsonNumber(std::string_view text);

}  // namespace oasis::server

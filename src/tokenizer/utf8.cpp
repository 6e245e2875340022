#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace oasis::tokenizer {
namespace {

// The outcome of reading one sequence at the front of a byte string.
enum class SeqKind { kValid, kInvalid, kTruncated };

struct Seq {
  SeqKind kind;
  size_t length;  // bytes consumed: the whole valid char, or the maximal invalid subpart
};

// Reads the sequence at bytes[0..]; `bytes` is not empty.
Seq ReadSequence(std::string_view bytes) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  if (b0 < 0x80) return {SeqKind::kValid, 1};
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the valid range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {SeqKind::kInvalid, 1};
  }
  for (int k = 1; k <= need; ++k) {
    if (static_cast<size_t>(k) >= bytes.size())
      return {SeqKind::kTruncated, static_cast<size_t>(k)};
    const auto b = static_cast<unsigned char>(bytes[k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {SeqKind::kInvalid, static_cast<size_t>(k)};
  }
  return {SeqKind::kValid, static_cast<size_t>(need + 1)};
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= bytes.size()) {
      uint64_t w;
      __builtin_memcpy(&w, bytes.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= bytes.size()) break;
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    Seq s = ReadSequence(bytes.substr(i));
    if (s.kind != SeqKind::kValid) return false;
    i += s.length;
  }
  return true;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  size_t i = 0, run = 0;  // [run, i) is a pending run of valid bytes
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    Seq s = ReadSequence(bytes.substr(i));
    if (s.kind == SeqKind::kValid) {
      i += s.length;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    out->append(kReplacementChar);
    i += s.length;
    run = i;
  }
  out->append(bytes.data() + run, bytes.size() - run);
}

size_t StableUtf8PrefixLength(std::string_view bytes) {
  // Only the last (up to) 3 bytes can belong to a truncated sequence; find its lead, if any.
  const size_t n = bytes.size();
  const size_t first = n >= 3 ? n - 3 : 0;
  for (size_t start = n; start-- > first;) {
    const auto b = static_cast<unsigned char>(bytes[start]);
    if (b < 0x80) return n;  // ASCII: nothing after it can be a lead's tail
    if (b >= 0xC0) {         // a lead byte (or an invalid one)
      Seq s = ReadSequence(bytes.substr(start));
      return s.kind == SeqKind::kTruncated ? start : n;
    }
    // A continuation byte: keep looking left for its lead.
  }
  return n;
}

int DecodeUtf8(const char* p, const char* end, char32_t* code_point) {
  const auto b0 = static_cast<unsigned char>(p[0]);
  const int len = Utf8SequenceLength(b0);
  if (len == 1 || end - p < len) {
    *code_point = b0;
    return 1;
  }
  char32_t c = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(p[k]) & 0x3F);
  *code_point = c;
  return len;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsUnicodeWhitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsUnicodeWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  if (c >= 0x24B6 && c <= 0x24E9) return true;  // circled letters (Other_Alphabetic)
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace oasis::tokenizer

#include "tokenizer/structured/charset.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace oasis::structured {
namespace {

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

// The UTF-8 forms of lo..hi (no surrogates inside) as sequences of byte ranges: every byte
// string of the sequence's length whose i-th byte lies in its i-th range encodes a code point
// of lo..hi, and each one is covered once.
using ByteCodePoints = std::vector<std::pair<uint8_t, uint8_t>>;
void Utf8Split(uint32_t lo, uint32_t hi, std::vector<ByteCodePoints>& out) {
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
  ByteCodePoints seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

}  // namespace

CodePoints NormalizeCodePoints(const CodePoints& in) {
  CodePoints r;
  for (auto [lo, hi] : in) {  // (surrogates have no UTF-8 form)
    if (lo > hi) continue;
    if (lo < 0xD800) r.emplace_back(lo, std::min<uint32_t>(hi, 0xD7FF));
    if (hi > 0xDFFF) r.emplace_back(std::max<uint32_t>(lo, 0xE000), hi);
  }
  std::sort(r.begin(), r.end());
  CodePoints out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

CodePoints NegateCodePoints(const CodePoints& set) {
  CodePoints out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : NormalizeCodePoints(set)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return NormalizeCodePoints(out);
}

std::string EncodeUtf8(uint32_t cp) {
  uint8_t b[4];
  const int n = Utf8Encode(cp, b);
  return std::string(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
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
  return EncodeUtf8(cp);
}
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
    if (cp < kMin[n] || !IsScalarValue(cp)) return false;
    out->push_back(cp);
    i += static_cast<size_t>(n);
  }
  return true;
}

int32_t CodePointsNode(Grammar* g, const CodePoints& set, bool json_string) {
  std::vector<int32_t> alts;
  CodePoints raw;
  for (auto [lo, hi] : set) {
    if (json_string) {  // '"', '\' and controls written as their escapes
      for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
        if (cp < 0x20 || cp == '"' || cp == '\\') alts.push_back(g->Literal(JsonEscaped(cp)));
      }
      CodePoints split = {{lo, hi}};
      for (uint32_t cut : {0x5Cu, 0x22u}) {
        CodePoints next;
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
  std::vector<ByteCodePoints> seqs;
  for (auto [lo, hi] : raw) Utf8Split(lo, hi, seqs);
  int32_t ascii = -1;  // the one-byte forms share one node
  for (const ByteCodePoints& seq : seqs) {
    if (seq.size() == 1) {
      if (ascii < 0) {
        ascii = g->Bytes(seq[0].first, seq[0].second);
        alts.push_back(ascii);
      } else {
        for (int b = seq[0].first; b <= seq[0].second; ++b) {
          g->node(ascii).bytes[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
        }
      }
      continue;
    }
    std::vector<int32_t> bytes;
    for (auto [lo, hi] : seq) bytes.push_back(g->Bytes(lo, hi));
    alts.push_back(g->Seq(std::move(bytes)));
  }
  return alts.size() == 1 ? alts[0] : g->Alt(std::move(alts));
}

}  // namespace oasis::structured

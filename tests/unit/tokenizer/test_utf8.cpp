#include <catch2/catch.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

std::string Lossy(std::string_view bytes) {
  std::string out;
  AppendUtf8Lossy(bytes, &out);
  return out;
}

const std::string R(kReplacementChar);

TEST_CASE("IsValidUtf8 follows Unicode Table 3-7", "[tokenizer][utf8]") {
  CHECK(IsValidUtf8(""));
  CHECK(IsValidUtf8("plain ascii text that is longer than eight bytes"));
  CHECK(IsValidUtf8("\xC3\xA4\xE4\xB8\xAD\xF0\x9F\x98\x80"));  // ä 中 😀
  CHECK(IsValidUtf8("\xF4\x8F\xBF\xBF"));                      // U+10FFFF
  CHECK_FALSE(IsValidUtf8("\xC0\x80"));                        // overlong NUL
  CHECK_FALSE(IsValidUtf8("\xE0\x80\x80"));                    // overlong
  CHECK_FALSE(IsValidUtf8("\xED\xA0\x80"));                    // surrogate U+D800
  CHECK_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));                // above U+10FFFF
  CHECK_FALSE(IsValidUtf8("\xF0\x9F\x98"));                    // truncated
  CHECK_FALSE(IsValidUtf8("abcdefgh\x80"));                    // lone continuation
  CHECK_FALSE(IsValidUtf8("\xFF"));
}

TEST_CASE("lossy decoding replaces each maximal invalid subpart once", "[tokenizer][utf8]") {
  // The example of Unicode chapter 3 ("U+FFFD substitution of maximal subparts").
  CHECK(Lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        "a" + R + R + R + "b" + R + "c" + R + R + "d");
  CHECK(Lossy("\xED\xA0\x80") == R + R + R);  // a surrogate is three subparts
  CHECK(Lossy("\xC0\xAF") == R + R);
  CHECK(Lossy("\xF0\x9F\x98") == R);           // one truncated sequence
  CHECK(Lossy("\xF0\x9F\x98!") == R + "!");
  CHECK(Lossy("ok \xE4\xB8\xAD") == "ok \xE4\xB8\xAD");
}

TEST_CASE("StableUtf8PrefixLength holds back only a possibly valid unfinished char", "[tokenizer][utf8]") {
  CHECK(StableUtf8PrefixLength("") == 0);
  CHECK(StableUtf8PrefixLength("abc") == 3);
  CHECK(StableUtf8PrefixLength("ab\xF0\x9F") == 2);
  CHECK(StableUtf8PrefixLength("ab\xF0\x9F\x98") == 2);
  CHECK(StableUtf8PrefixLength("ab\xF0\x9F\x98\x80") == 6);
  CHECK(StableUtf8PrefixLength("ab\xE4") == 2);
  CHECK(StableUtf8PrefixLength("ab\xE0\x80") == 4);  // already invalid: final
  CHECK(StableUtf8PrefixLength("ab\x80\x80\x80") == 5);
  CHECK(StableUtf8PrefixLength("\xFF") == 1);
}

TEST_CASE("byte-level alphabet round-trips all bytes", "[tokenizer][utf8]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = BytesToByteLevel(all);
  CHECK(IsValidUtf8(mapped));
  CHECK(ByteLevelAlphabet()[' '] == "\xC4\xA0");  // Ġ
  CHECK(ByteLevelAlphabet()['\n'] == "\xC4\x8A");  // Ċ
  CHECK(ByteLevelAlphabet()['a'] == "a");
  auto back = ByteLevelToBytes(mapped);
  REQUIRE(back);
  CHECK(*back == all);
  CHECK_FALSE(ByteLevelToBytes("\xE4\xB8\xAD"));  // 中 is not in the alphabet
}

TEST_CASE("NFC normalization matches known compositions", "[tokenizer][utf8]") {
  std::string out;
  NormalizeUnicode("e\xCC\x81", UnicodeForm::kNfc, &out);  // e + U+0301
  CHECK(out == "\xC3\xA9");
  NormalizeUnicode("cafe\xCC\x81 ok", UnicodeForm::kNfc, &out);
  CHECK(out == "caf\xC3\xA9 ok");
  NormalizeUnicode("\xE1\x84\x80\xE1\x85\xA1", UnicodeForm::kNfc, &out);  // Hangul L+V -> 가
  CHECK(out == "\xEA\xB0\x80");
  NormalizeUnicode("\xE2\x84\xAB", UnicodeForm::kNfc, &out);  // Angstrom sign -> Å
  CHECK(out == "\xC3\x85");
  NormalizeUnicode("\xC3\xA9", UnicodeForm::kNfd, &out);
  CHECK(out == "e\xCC\x81");
  NormalizeUnicode("\xEF\xAC\x81", UnicodeForm::kNfkc, &out);  // ligature fi
  CHECK(out == "fi");
  NormalizeUnicode("plain \xC3\xA9 text", UnicodeForm::kNfc, &out);
  CHECK(out == "plain \xC3\xA9 text");
}

TEST_CASE("Oniguruma patterns are rewritten for PCRE2", "[tokenizer][regex]") {
  CHECK(Regex::TranslateOnigurumaPattern(R"(\s+(?!\S))") ==
        R"([\t-\r\x{85}\p{Zs}\x{2028}\x{2029}]+(?![^\t-\r\x{85}\p{Zs}\x{2028}\x{2029}]))");
  CHECK(Regex::TranslateOnigurumaPattern(R"([^\s\p{L}])") ==
        R"([^\t-\r\x{85}\p{Zs}\x{2028}\x{2029}\p{L}])");
  CHECK(Regex::TranslateOnigurumaPattern(R"(\\s)") == R"(\\s)");
  CHECK(Regex::TranslateOnigurumaPattern(R"([]s])") == R"([]s])");

  auto re = Regex::Compile(R"(\s+)");
  REQUIRE(re.ok());
  std::vector<ByteRange> m;
  (*re)->FindAll("a \xC2\x85 b\xE1\xA0\x8E" "c", &m);  // NEL is a space, U+180E is not
  REQUIRE(m.size() == 1);
  CHECK(m[0].begin == 1);
  CHECK(m[0].end == 5);
}

TEST_CASE("empty regex matches follow Oniguruma's find_iter", "[tokenizer][regex]") {
  auto re = Regex::Compile("a*");
  REQUIRE(re.ok());
  std::vector<ByteRange> m;
  (*re)->FindAll("baab", &m);
  // "" at 0, "aa" at 1..3, no empty match at 3 (right after "aa"), "" at 4.
  REQUIRE(m.size() == 3);
  CHECK((m[0].begin == 0 && m[0].end == 0));
  CHECK((m[1].begin == 1 && m[1].end == 3));
  CHECK((m[2].begin == 4 && m[2].end == 4));
}

}  // namespace
}  // namespace oasis::tokenizer

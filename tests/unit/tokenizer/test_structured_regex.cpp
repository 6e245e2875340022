// Structured output's regular expressions (guided_regex, JSON Schema's "pattern"): the
// grammar's full matches against std::regex (ECMAScript, the same language on the common
// subset) on random patterns and texts, random walks that never dead-end and end in matches,
// UTF-8 classes over every kind of code point, the JSON-string form, and the refusals.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "structured_walk.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/regex.h"

using namespace oasis;
using namespace oasis::structured;
using namespace oasis::structured::testing;

namespace {

std::shared_ptr<const Grammar> Re(const std::string& pattern) {
  auto g = RegexGrammar(pattern);
  INFO(pattern << ": " << g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A random pattern over the subset std::regex (ECMAScript) and Python agree on.
std::string RandomPattern(std::mt19937_64& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  std::string out;
  const int items = 1 + pick(4);
  for (int i = 0; i < items; ++i) {
    std::string atom;
    switch (pick(depth < 3 ? 9 : 7)) {
      case 0:
        atom = "a";
        break;
      case 1:
        atom = "b";
        break;
      case 2:
        atom = ".";
        break;
      case 3:
        atom = std::vector<std::string>{"[ab]", "[^a]", "[a-c]", "[^b-c\\n]",
                                        "\\d",  "\\w",  "\\s",   "\\S"}[pick(8)];
        break;
      case 4:
        atom = "\\.";
        break;
      case 5:
        atom = "c";
        break;
      case 6:
        atom = "1";
        break;
      default:
        atom = (pick(2) ? "(" : "(?:") + RandomPattern(rng, depth + 1) +
               (pick(3) == 0 ? "|" + RandomPattern(rng, depth + 1) : "") + ")";
        break;
    }
    switch (pick(8)) {
      case 0:
        atom += "*";
        break;
      case 1:
        atom += "+";
        break;
      case 2:
        atom += "?";
        break;
      case 3:
        atom += "{" + std::to_string(pick(3)) + "," + std::to_string(2 + pick(3)) + "}";
        break;
      case 4:
        atom += "{" + std::to_string(pick(3)) + "}";
        break;
      case 5:
        atom += "{1,}";
        break;
      default:
        break;
    }
    if (pick(6) == 0 && atom.back() != '}' &&
        (atom.back() == '*' || atom.back() == '+' || atom.back() == '?'))
      atom += "?";
    out += atom;
  }
  if (pick(5) == 0) out += "|" + RandomPattern(rng, depth + 1);
  return out;
}

}  // namespace

TEST_CASE("structured regex: full matches of known patterns", "[structured][regex]") {
  struct Case {
    const char* pattern;
    std::vector<std::string> in, out;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"^abc$", {"abc"}, {"ab", "abc$", "^abc"}},
      {"\\^a\\$", {"^a$"}, {"a"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"(ab)+", {"ab", "abab"}, {"", "aba"}},
      {"(?:a|b)*c", {"c", "abbac"}, {"ab", "cc"}},
      {"(?P<year>\\d{4})-(?<month>\\d{2})", {"2026-12"}, {"26-12", "2026-1"}},
      {"x{2,3}", {"xx", "xxx"}, {"x", "xxxx"}},
      {"x{,2}y", {"y", "xy", "xxy"}, {"xxxy"}},
      {"x{2,}", {"xx", "xxxxxxxx"}, {"x"}},
      {"x{0}y", {"y"}, {"xy"}},
      {"a{,}", {"a{,}"}, {"a"}},  // (not a quantifier: literal, as Python reads it)
      {"a{x}", {"a{x}"}, {"a"}},
      {"[a-c]+", {"abcabc"}, {"d", "abcd"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"[-a]", {"-", "a"}, {"b"}},
      {"[a-]", {"-", "a"}, {"b"}},
      {"[^a-c]", {"d", "\n", "é", "😀"}, {"a", "b", "c", "dd"}},
      {".", {"a", "é", "中", "😀", "\r"}, {"\n", "", "ab"}},
      {"\\d\\D\\w\\W\\s\\S", {"1a_ \tx", "9x0!\nb"}, {"aa_ \tx"}},
      {"\\x41\\u00e9\\U0001F600\\u{4e2d}", {"Aé😀中"}, {"A"}},
      {"[\\x00-\\x1f]", {"\x01", "\x1f"}, {" "}},
      {"\\n\\t\\0", {std::string("\n\t") + '\0'}, {"\n\t0"}},
      {"é+", {"é", "éé"}, {"e", ""}},
      {"[éa-c]{2}", {"éa", "cé"}, {"é", "ée"}},
      {"\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\/", {".*+?()[]{}|\\/"}, {}},
      {"a*?b+?c??", {"b", "aabbc"}, {"c"}},
      {"((a|b)*)*c", {"c", "abababc"}, {"ab"}},
      {"(a?)*b", {"b", "aab"}, {"a"}},
      {"(a*|b)+c", {"c", "ac", "abbaac"}, {"a"}},
      {"(?:(?:a{0,2}){2})c", {"c", "aaaac"}, {"aaaaac"}},
  };
  for (const Case& c : cases) {
    GrammarMatcher m(Re(c.pattern));
    for (const std::string& t : c.in) {
      INFO(c.pattern << " should match '" << t << "'");
      CHECK(Matches(m, t));
    }
    for (const std::string& t : c.out) {
      INFO(c.pattern << " should not match '" << t << "'");
      CHECK_FALSE(Matches(m, t));
    }
  }
}

TEST_CASE("structured regex: patterns it cannot honour are refused, saying why",
          "[structured][regex]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"(a)\\1", "backreferences"},
      {"(?P<x>a)(?P=x)", "backreferences"},
      {"a(?=b)", "lookaround"},
      {"a(?!b)", "lookaround"},
      {"(?<=a)b", "lookaround"},
      {"(?<!a)b", "lookaround"},
      {"\\bword\\b", "word boundaries"},
      {"a\\B", "\\B"},
      {"(?i)abc", "inline flags"},
      {"a^b", "anchors"},
      {"a$b", "anchors"},
      {"a**", "multiple repeat"},
      {"a{2}{3}", "multiple repeat"},
      {"a*+", "possessive"},
      {"*a", "nothing to repeat"},
      {"a|?", "nothing to repeat"},
      {"{2}", "nothing to repeat"},
      {"a{1001}", "above 1000"},
      {"a{3,2}", "out of order"},
      {"(ab", "missing ')'"},
      {"ab)", "unbalanced"},
      {"[ab", "unterminated"},
      {"[z-a]", "out of order"},
      {"[\\d-z]", "bad character range"},
      {"[^\\x00-\\U0010FFFF]", "matches no character"},
      {"\\p{L}", "bad escape"},
      {"\\q", "bad escape"},
      {"a\\", "backslash"},
      {"\\x4", "two hex digits"},
      {"\\ud800", "not a character"},
      {"(?P<1x>a)", "bad group name"},
      {std::string("\xff"), "UTF-8"},
      {std::string(kMaxRegexBytes + 1, 'a'), "longer than"},
      {std::string(300, '(') + std::string(300, ')'), "nest deeper"},
  };
  for (const auto& [pattern, why] : refused) {
    auto g = RegexGrammar(pattern);
    INFO(pattern.substr(0, 60) << " -> " << g.status().ToString());
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().message().find(why) != std::string::npos);
  }
}

TEST_CASE("structured regex: random patterns and texts agree with std::regex",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 11);
  const std::string alphabet = "abc1.\n _";
  int matched = 0, compared = 0;
  for (int p = 0; p < 300; ++p) {
    const std::string pattern = RandomPattern(rng, 0);
    INFO("pattern " << pattern);
    GrammarMatcher m(Re(pattern));
    // (__polynomial: libstdc++'s automaton executor, not its exponential backtracking.)
    const std::regex reference(pattern,
                               std::regex::ECMAScript | std::regex_constants::__polynomial);
    // Random texts, and texts the grammar itself produced.
    for (int t = 0; t < 60; ++t) {
      std::string text;
      if (t % 3 == 0) {
        auto w = Walk(m, rng, 40, 0.3);
        if (!w) continue;
        text = *w;
      } else {
        for (size_t n = rng() % 8; n > 0; --n) text += alphabet[rng() % alphabet.size()];
      }
      INFO("text '" << text << "'");
      // (std::regex reads bytes, and its '.' refuses '\r': walks past ASCII or through '\r'
      // are checked to match, not compared.)
      const bool plain =
          std::all_of(text.begin(), text.end(), [](char ch) { return ch > 0 && ch != '\r'; }) ||
          text.empty();
      if (!plain) {
        CHECK(Matches(m, text));
        continue;
      }
      const bool want = std::regex_match(text, reference);
      CHECK(Matches(m, text) == want);
      matched += want;
      ++compared;
    }
  }
  CHECK(matched > compared / 5);
}

TEST_CASE("structured regex: classes over UTF-8 take exactly their code points",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 12);
  std::vector<uint32_t> probes = {0,       0x7F,     0x80,     0x7FF,  0x800,   0xFFF,   0x1000,
                                  0xD7FF,  0xE000,   0xFFFD,   0xFFFF, 0x10000, 0x3FFFF, 0x40000,
                                  0xFFFFF, 0x100000, 0x10FFFF, 'a',    0xE9,    0x4E2D,  0x1F600};
  for (int i = 0; i < 200; ++i) {
    uint32_t cp = static_cast<uint32_t>(rng() % 0x110000);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xE000;
    probes.push_back(cp);
  }
  for (int k = 0; k < 40; ++k) {
    // A class of random ranges, plain and negated.
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    std::string cls;
    for (size_t r = 1 + rng() % 3; r > 0; --r) {
      uint32_t lo = probes[rng() % probes.size()], hi = probes[rng() % probes.size()];
      if (lo > hi) std::swap(lo, hi);
      if (lo == 0) lo = 1;  // (\x00 written as \u0000 below works too; keep the pattern short)
      ranges.emplace_back(lo, hi);
      char buf[64];
      std::snprintf(buf, sizeof buf, "\\U%08x-\\U%08x", lo, hi);
      cls += buf;
    }
    for (bool negated : {false, true}) {
      const std::string pattern = std::string("[") + (negated ? "^" : "") + cls + "]";
      GrammarMatcher m(Re(pattern));
      for (uint32_t cp : probes) {
        bool in = false;
        for (auto [lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
        INFO(pattern << " code point " << cp);
        CHECK(Matches(m, Utf8(cp)) == (in != negated));
      }
      // Bytes that are not UTF-8 never match: surrogates, overlong forms, stray continuations.
      for (const char* bad :
           {"\xED\xA0\x80", "\xC0\x80", "\xE0\x80\x80", "\x80", "\xF4\x90\x80\x80", "\xFF"}) {
        CHECK_FALSE(Matches(m, bad));
      }
    }
  }
}

TEST_CASE("structured regex: random walks never dead-end and end in matches",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 13);
  for (const char* pattern :
       {"[^\"]{3,8}", "(\\d{3}-)?\\d{4}", "[a-zé😀]+@[a-z]+\\.(com|org)", ".{0,12}",
        "(foo|bar|baz)(, (foo|bar|baz)){0,3}", "[\\u0400-\\u04ff\\s]{1,20}"}) {
    GrammarMatcher m(Re(pattern));
    int finished = 0;
    for (int i = 0; i < 100; ++i) {
      auto text = Walk(m, rng, 200, 0.2);
      if (!text) continue;
      ++finished;
      INFO(pattern << ": '" << *text << "'");
      CHECK(Matches(m, *text));
      CHECK_NOTHROW(nlohmann::json(*text).dump());  // valid UTF-8 (dump throws on anything else)
    }
    CHECK(finished > 50);
  }
}

TEST_CASE("structured regex: JSON Schema's pattern, written inside a JSON string",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 14);
  for (const char* pattern :
       {"[^x]{0,6}", "a\"b\\\\c", "[\\x00-\\x1f\"\\\\]{1,4}", "\\d+(\\.\\d+)?", "(é|\\n|/)*z"}) {
    const nlohmann::ordered_json schema = {
        {"type", "object"},
        {"properties", {{"s", {{"type", "string"}, {"pattern", pattern}}}}},
        {"required", {"s"}}};
    auto g = JsonSchemaGrammar(schema);
    INFO(pattern << ": " << g.status().ToString());
    REQUIRE(g.ok());
    GrammarMatcher m(*g);
    // (__polynomial: libstdc++'s automaton executor, not its exponential backtracking.)
    const std::regex reference(pattern,
                               std::regex::ECMAScript | std::regex_constants::__polynomial);
    int finished = 0;
    for (int i = 0; i < 100; ++i) {
      auto text = Walk(m, rng, 300, 0.3);
      if (!text) continue;
      ++finished;
      INFO(*text);
      const auto v = nlohmann::json::parse(*text, nullptr, false);
      REQUIRE(v.is_object());
      const std::string s = v["s"].get<std::string>();
      // (std::regex reads bytes: strings past ASCII are checked by the walk's grammar only.)
      if (std::all_of(s.begin(), s.end(), [](char ch) { return ch >= 0; }))
        CHECK(std::regex_match(s, reference));
    }
    CHECK(finished > 50);
  }
  // Its bounds with minLength / maxLength are not honoured together: refused.
  auto both = JsonSchemaGrammar(
      nlohmann::ordered_json::parse(R"({"type":"string","pattern":"a+","maxLength":3})"));
  REQUIRE_FALSE(both.ok());
  CHECK(both.status().message().find("pattern") != std::string::npos);
  auto bad =
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type":"string","pattern":"(a"})"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("/pattern") != std::string::npos);
}

// Integer bounds (minimum / maximum / exclusive*, compiled to digit patterns): every integer in
// a window around the bounds and at random magnitudes matches exactly when it is inside them,
// and walks end inside them.
TEST_CASE("structured: integer bounds take exactly the integers inside them",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 15);
  auto random_bound = [&]() -> int64_t {
    const int digits = 1 + static_cast<int>(rng() % 18);
    int64_t v = static_cast<int64_t>(rng() % 10);
    for (int i = 1; i < digits; ++i) v = v * 10 + static_cast<int64_t>(rng() % 10);
    return rng() % 3 == 0 ? -v : v;
  };
  std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> cases = {
      {0, std::nullopt},
      {std::nullopt, 0},
      {1, 1},
      {-5, 5},
      {-1000, -999},
      {7, 100},
      {99, 1000},
      {-123456, -1},
      {10, 10000},
      {0, 9},
      {1000000000000000000, std::nullopt},
      {std::nullopt, -1000000000000000000},
      {-1000000000000000000, 1000000000000000000}};
  for (int i = 0; i < 60; ++i) {
    std::optional<int64_t> lo, hi;
    if (rng() % 4 != 0) lo = random_bound();
    if (rng() % 4 != 0) hi = random_bound();
    if (lo && hi && *lo > *hi) std::swap(lo, hi);
    cases.emplace_back(lo, hi);
  }
  for (const auto& [lo, hi] : cases) {
    nlohmann::ordered_json schema = {{"type", "integer"}};
    // Written as the four keywords in turn (exclusive ones one step out; floats rounded in).
    const int form = static_cast<int>(rng() % 3);
    if (lo) {
      if (form == 0) schema["minimum"] = *lo;
      if (form == 1) schema["exclusiveMinimum"] = *lo - 1;
      if (form == 2) schema["minimum"] = static_cast<double>(*lo) - 0.5;  // (ceil: lo)
    }
    if (hi) {
      if (form == 0) schema["maximum"] = *hi;
      if (form == 1) schema["exclusiveMaximum"] = *hi + 1;
      if (form == 2) schema["maximum"] = static_cast<double>(*hi) + 0.5;
    }
    if (form == 2 && ((lo && std::llabs(*lo) > (int64_t{1} << 52)) ||
                      (hi && std::llabs(*hi) > (int64_t{1} << 52)))) {
      continue;  // (a double does not hold the half past these)
    }
    auto g = JsonSchemaGrammar(schema);
    INFO(schema.dump() << " -> " << g.status().ToString());
    REQUIRE(g.ok());
    GrammarMatcher m(*g);
    std::vector<int64_t> probes = {0,  1,   -1,    9,      10,        -10,
                                   99, 100, 12345, -12345, INT64_MAX, INT64_MIN + 1};
    for (auto b : {lo, hi}) {
      if (!b) continue;
      for (int64_t d = -12; d <= 12; ++d) {
        if ((d < 0 && *b >= INT64_MIN - d) || (d >= 0 && *b <= INT64_MAX - d))
          probes.push_back(*b + d);
      }
      probes.push_back(*b * 10);
      probes.push_back(*b / 10);
    }
    for (int i = 0; i < 40; ++i) probes.push_back(random_bound());
    for (int64_t x : probes) {
      const bool in = (!lo || x >= *lo) && (!hi || x <= *hi);
      INFO("x = " << x);
      CHECK(Matches(m, std::to_string(x)) == in);
    }
    CHECK_FALSE(Matches(m, "01"));
    if (lo || hi) CHECK_FALSE(Matches(m, "-0"));  // (a plain integer is JSON's: -0 too)
    for (int i = 0; i < 20; ++i) {
      auto text = Walk(m, rng, 40, 0.2);
      if (!text) continue;
      INFO(*text);
      // (Past int64 without an upper bound: compared as long doubles, far from the bounds.)
      const long double x = std::stold(*text);
      CHECK(((!lo || x >= static_cast<long double>(*lo)) &&
             (!hi || x <= static_cast<long double>(*hi))));
    }
  }
  for (const auto& [schema, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type":"number","minimum":0})", "integers only"},
           {R"({"type":"integer","minimum":"3"})", "must be a number"},
           {R"({"type":"integer","exclusiveMinimum":true})", "must be a number"},
           {R"({"type":"integer","minimum":5,"maximum":4})", "no integer"},
           {R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})", "no integer"},
           {R"({"type":"integer","maximum":1e19})", "10^18"},
           {R"({"minimum":1})", "without a 'type'"}}) {
    auto g = JsonSchemaGrammar(nlohmann::ordered_json::parse(schema));
    INFO(schema << " -> " << g.status().ToString());
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().message().find(why) != std::string::npos);
  }
}

// Tuples (prefixItems, pydantic's Tuple[...]; 2019's list of items with additionalItems): walks
// end in arrays whose items have their position's type and whose length keeps the bounds;
// instances in and out.
TEST_CASE("structured: tuples take their items in order, within the bounds", "[structured]") {
  std::mt19937_64 rng(Catch::rngSeed() + 16);
  struct Case {
    const char* schema;
    std::vector<std::string> types;  // by position; past them: `rest` ("" none, "any")
    std::string rest;
    size_t lo, hi;  // hi: SIZE_MAX none
    std::vector<std::string> in, out;
  };
  const std::vector<Case> cases = {
      {R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"minItems":2,"maxItems":2})",
       {"integer", "string"},
       "any",
       2,
       2,
       {"[1, \"a\"]", "[-3,\"\"]"},
       {"[1]", "[1, \"a\", 2]", "[\"a\", 1]", "[]"}},
      {R"({"type":"array","prefixItems":[{"type":"boolean"},{"type":"integer"}],"items":false})",
       {"boolean", "integer"},
       "",
       0,
       2,
       {"[]", "[true]", "[false, 7]"},
       {"[true, 7, 8]", "[7]"}},
      {R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"integer"},"minItems":3,"maxItems":5})",
       {"string"},
       "integer",
       3,
       5,
       {"[\"a\", 1, 2]", "[\"a\",1,2,3,4]"},
       {"[\"a\", 1]", "[\"a\",1,2,3,4,5]", "[\"a\", \"b\", 1]"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"integer"},{"type":"integer"}],"maxItems":2})",
       {"integer", "integer", "integer"},
       "any",
       0,
       2,
       {"[]", "[1]", "[1, 2]"},
       {"[1, 2, 3]"}},
      {R"({"type":"array","items":[{"type":"string"},{"type":"boolean"}],"additionalItems":{"type":"null"}})",
       {"string", "boolean"},
       "null",
       0,
       SIZE_MAX,
       {"[\"x\", true, null, null]", "[\"x\"]"},
       {"[\"x\", true, 1]"}},
      {R"({"type":"array","prefixItems":[{"type":"integer"}],"minItems":1})",
       {"integer"},
       "any",
       1,
       SIZE_MAX,
       {"[1, \"any\", {\"a\": [null]}]"},
       {"[]", "[\"a\"]"}},
  };
  auto has_type = [](const nlohmann::json& v, const std::string& t) {
    return t == "any" ||
           (t == "integer" &&
            (v.is_number_integer() ||  // (past 64 bits nlohmann holds a double)
             (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))) ||
           (t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) ||
           (t == "null" && v.is_null());
  };
  for (const Case& c : cases) {
    auto g = JsonSchemaGrammar(nlohmann::ordered_json::parse(c.schema));
    INFO(c.schema << " -> " << g.status().ToString());
    REQUIRE(g.ok());
    GrammarMatcher m(*g);
    for (const std::string& t : c.in) {
      INFO("should match " << t);
      CHECK(Matches(m, t));
    }
    for (const std::string& t : c.out) {
      INFO("should not match " << t);
      CHECK_FALSE(Matches(m, t));
    }
    int finished = 0;
    for (int i = 0; i < 150; ++i) {
      auto text = Walk(m, rng, 300, 0.3, "]\"0123456789");
      if (!text) continue;
      ++finished;
      INFO(*text);
      const auto v = nlohmann::json::parse(*text, nullptr, false);
      REQUIRE(v.is_array());
      CHECK(v.size() >= c.lo);
      CHECK(v.size() <= c.hi);
      for (size_t k = 0; k < v.size(); ++k) {
        if (k < c.types.size()) {
          CHECK(has_type(v[k], c.types[k]));
        } else {
          REQUIRE_FALSE(c.rest.empty());
          CHECK(has_type(v[k], c.rest));
        }
      }
    }
    CHECK(finished > 50);
  }
}

// The string formats enforced (date, time, date-time, uuid, ipv4, hostname, email): values in
// and out, and walks that end in values of the format; other formats stay annotations.
TEST_CASE("structured: string formats are enforced where known", "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 17);
  struct Case {
    const char* format;
    std::vector<std::string> in, out;
    const char* check;  // ECMAScript, over the value
  };
  const std::vector<Case> cases = {
      {"date",
       {"2026-12-05", "1999-02-31"},
       {"2026-13-01", "26-12-05", "2026-12-5", "2026-12-00"},
       R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)"},
      {"time",
       {"23:59:60Z", "08:30:00.123+02:00"},
       {"24:00:00Z", "08:30:00", "8:30:00Z"},
       R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
      {"date-time",
       {"2026-12-05T10:12:15Z"},
       {"2026-12-05 10:12:15Z", "2026-12-05T10:12:15"},
       R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$)"},
      {"uuid",
       {"123e4567-e89b-12d3-a456-426614174000"},
       {"123e4567e89b12d3a456426614174000", "g23e4567-e89b-12d3-a456-426614174000"},
       R"(^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$)"},
      {"ipv4",
       {"0.0.0.0", "255.255.255.255", "10.1.20.199"},
       {"256.1.1.1", "1.2.3", "01.2.3.4"},
       R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)"},
      {"hostname",
       {"example.com", "a", "x-1.y"},
       {"-a.com", "a..b", "a_b"},
       R"(^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$)"},
      {"email",
       {"a.b+c@example.com", "x@y.z"},
       {"a@b", "@b.com", "a@@b.com", "a b@c.com"},
       R"(^[^@ ]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$)"},
  };
  for (const Case& c : cases) {
    const nlohmann::ordered_json schema = {{"type", "string"}, {"format", c.format}};
    auto g = JsonSchemaGrammar(schema);
    INFO(schema.dump() << " -> " << g.status().ToString());
    REQUIRE(g.ok());
    GrammarMatcher m(*g);
    for (const std::string& v : c.in) {
      INFO("should match " << v);
      CHECK(Matches(m, nlohmann::json(v).dump()));
    }
    for (const std::string& v : c.out) {
      INFO("should not match " << v);
      CHECK_FALSE(Matches(m, nlohmann::json(v).dump()));
    }
    const std::regex check(c.check, std::regex::ECMAScript | std::regex_constants::__polynomial);
    int finished = 0;
    for (int i = 0; i < 100; ++i) {
      auto text = Walk(m, rng, 200, 0.3);
      if (!text) continue;
      ++finished;
      INFO(*text);
      const auto v = nlohmann::json::parse(*text, nullptr, false);
      REQUIRE(v.is_string());
      CHECK(std::regex_match(v.get<std::string>(), check));
    }
    CHECK(finished > 50);
  }
  // Another format is an annotation (any string); a known one with a pattern or bounds is refused.
  CHECK(
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type":"string","format":"uri"})")).ok());
  CHECK_FALSE(JsonSchemaGrammar(nlohmann::ordered_json::parse(
                                    R"({"type":"string","format":"date","pattern":"a"})"))
                  .ok());
  CHECK_FALSE(JsonSchemaGrammar(nlohmann::ordered_json::parse(
                                    R"({"type":"string","format":"uuid","maxLength":5})"))
                  .ok());
}

// A whitespace pattern (vLLM's whitespace_pattern) replaces the bounded default between JSON
// tokens; one that could match anything but JSON's whitespace is refused.
TEST_CASE("structured: a whitespace pattern sets the whitespace between JSON tokens",
          "[structured][regex]") {
  std::mt19937_64 rng(Catch::rngSeed() + 18);
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})");
  auto g = JsonSchemaGrammar(schema, false, "\\n?");  // at most one newline, nothing else
  REQUIRE(g.ok());
  GrammarMatcher m(*g);
  CHECK(Matches(m, "{\"a\":[1,2]}"));
  CHECK(Matches(m, "{\n\"a\"\n:\n[\n1\n,2]}"));
  CHECK_FALSE(Matches(m, "{ \"a\":[1]}"));
  CHECK_FALSE(Matches(m, "{\n\n\"a\":[1]}"));
  auto spaced = JsonObjectGrammar(false, " {1,4}");  // one to four spaces, always
  REQUIRE(spaced.ok());
  GrammarMatcher s(*spaced);
  CHECK(Matches(s, " { \"k\" : 1 } "));
  CHECK_FALSE(Matches(s, "{\"k\":1}"));
  for (int i = 0; i < 50; ++i) {
    auto text = Walk(s, rng, 300, 0.3, "}]\"0123456789");
    if (!text) continue;
    INFO(*text);
    CHECK_FALSE(nlohmann::json::parse(*text, nullptr, false).is_discarded());
  }
  for (const auto& [pattern, why] : std::vector<std::pair<std::string, std::string>>{
           {"[ a]*", "more than JSON's whitespace"},
           {".?", "more than JSON's whitespace"},
           {"\\s*", "more than JSON's whitespace"},  // (\s takes \v and \f too)
           {"(a", "missing ')'"}}) {
    auto bad = JsonSchemaGrammar(schema, false, pattern);
    INFO(pattern << " -> " << bad.status().ToString());
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().find(why) != std::string::npos);
  }
}

// Structured output's GBNF grammars (guided_grammar): known grammars in and out, random walks
// that never dead-end and end in texts a plain recursive recogniser accepts, the refusals; and
// the constraint's last resort (no token can go on: EOS).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "structured_walk.h"
#include "tokenizer/structured/gbnf.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/token_constraint.h"

using namespace oasis;
using namespace oasis::structured;
using namespace oasis::structured::testing;

namespace {

std::shared_ptr<const Grammar> Gbnf(const std::string& text) {
  auto g = GbnfGrammar(text);
  INFO(text << "\n-> " << g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}

// Arithmetic, written plainly: expr ::= term (("+"|"-") term)*, term ::= factor ("*" factor)*,
// factor ::= [0-9]+ | "(" expr ")" | "-" factor. Whether all of `t` is one expr.
struct Arith {
  const std::string& t;
  size_t p = 0;
  bool Expr() {
    if (!Term()) return false;
    while (p < t.size() && (t[p] == '+' || t[p] == '-')) {
      ++p;
      if (!Term()) return false;
    }
    return true;
  }
  bool Term() {
    if (!Factor()) return false;
    while (p < t.size() && t[p] == '*') {
      ++p;
      if (!Factor()) return false;
    }
    return true;
  }
  bool Factor() {
    if (p < t.size() && t[p] == '(') {
      ++p;
      if (!Expr() || p >= t.size() || t[p] != ')') return false;
      ++p;
      return true;
    }
    if (p < t.size() && t[p] == '-') {
      ++p;
      return Factor();
    }
    const size_t from = p;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
    return p > from;
  }
};
bool IsArith(const std::string& t) {
  Arith a{t};
  return a.Expr() && a.p == t.size();
}

constexpr const char* kArith = R"G(# arithmetic
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
)G";

}  // namespace

TEST_CASE("structured gbnf: known grammars in and out", "[structured][gbnf]") {
  struct Case {
    std::string grammar;
    std::vector<std::string> in, out;
  };
  const std::vector<Case> cases = {
      {kArith, {"1", "12+3*4", "(1+2)*-3", "--7", "((0))"}, {"", "1+", "(1", "1**2", "a"}},
      {R"(root ::= "yes" | "no")", {"yes", "no"}, {"y", "yesno", ""}},
      {"root ::= item (\",\" ws item)*\nitem ::= [a-z]{1,3}\nws ::= [ \\t]?",
       {"a", "ab, c", "abc,d"},
       {"abcd", "a,,b", "a ,b"}},
      {"root ::= \"x\"\n  \"y\"  # a rule may go on over lines\n  \"z\"", {"xyz"}, {"x"}},
      {R"(root ::= [^"\\]* "!")", {"!", "abc é!", "\n!"}, {"\"!", "\\!", "abc"}},
      {R"(root ::= . . "\x41\u00e9\U0001F600\n\t\"\\\[\]")",
       {"ab"
        "Aé😀\n\t\"\\[]",
        "é😀"
        "Aé😀\n\t\"\\[]"},
       {"a"
        "Aé😀\n\t\"\\[]"}},
      {R"(root ::= "a"{2,3} "b"{2} "c"{1,} "d"?)",
       {"aabbc", "aaabbccd"},
       {"abbc", "aabbd", "aabbbc"}},
      {R"(root ::= ("a"?)* "b" | )", {"b", "aab", ""}, {"a"}},
      {R"(root ::= [a-c-]+ [\-\]]?)", {"a-c", "b]", "--"}, {"d"}},
      {R"(root ::= list
list ::= "[" (value ("," value)*)? "]"
value ::= list | [0-9])",
       {"[]", "[1,[2,[]],3]"},
       {"[", "[1,]", "[[]"}},
      {R"(root ::= a-rule
a-rule ::= "ok")",
       {"ok"},
       {"a-rule"}},
  };
  for (const Case& c : cases) {
    GrammarMatcher m(Gbnf(c.grammar));
    for (const std::string& t : c.in) {
      INFO(c.grammar << "\nshould match '" << t << "'");
      CHECK(Matches(m, t));
    }
    for (const std::string& t : c.out) {
      INFO(c.grammar << "\nshould not match '" << t << "'");
      CHECK_FALSE(Matches(m, t));
    }
  }
}

TEST_CASE("structured gbnf: random walks never dead-end and end in the language",
          "[structured][gbnf]") {
  std::mt19937_64 rng(Catch::rngSeed() + 21);
  GrammarMatcher m(Gbnf(kArith));
  int finished = 0;
  for (int i = 0; i < 300; ++i) {
    auto text = Walk(m, rng, 120, 0.3);
    if (!text) continue;
    ++finished;
    INFO(*text);
    CHECK(IsArith(*text));
  }
  CHECK(finished > 100);
  // Random texts over the alphabet: the grammar and the recogniser agree.
  const std::string alphabet = "0123()+-*";
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    for (size_t n = 1 + rng() % 10; n > 0; --n) t += alphabet[rng() % alphabet.size()];
    INFO(t);
    CHECK(Matches(m, t) == IsArith(t));
  }
  // A JSON grammar in GBNF: what it generates parses.
  GrammarMatcher j(Gbnf(R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ( string ":" value ( "," string ":" value )* )? "}"
array  ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]{1,5}) ("." [0-9]{1,6})?
)"));
  int parsed = 0;
  for (int i = 0; i < 200; ++i) {
    auto text = Walk(j, rng, 300, 0.4);
    if (!text) continue;
    INFO(*text);
    CHECK_FALSE(nlohmann::json::parse(*text, nullptr, false).is_discarded());
    ++parsed;
  }
  CHECK(parsed > 50);
}

TEST_CASE("structured gbnf: grammars it cannot honour are refused, saying why and where",
          "[structured][gbnf]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"", "empty"},
      {"?start: \"a\"", "GBNF"},
      {"root ::= a", "rule 'a' is used but not defined"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= root \"a\" | \"b\"", "left recursion"},
      {"root ::= (\"x\"? root) \"a\" | \"b\"", "left recursion"},
      {"root ::= \"a\" loop\nloop ::= \"b\" loop", "rule 'loop' can never end"},
      {"root ::= \"a", "line 1: unterminated string"},
      {"root ::= \"a\"\nb ::= [a", "line 2: unterminated character class"},
      {"root ::= [a-", "line 1: the grammar ends inside a literal or a character class"},
      {"root ::= [\\", "may not end with a backslash"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= [^\\x00-\\U0010FFFF]", "matches no character"},
      {"root ::= \"a\"{1001}", "above 1000"},
      {"root ::= \"a\"{3,2}", "out of order"},
      {"root ::= \"a\"**", "two quantifiers"},
      {"root ::= (\"a\"", "missing ')'"},
      {"root ::= \"a\" )", "unexpected ')'"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"\\ud800\"", "not a character"},
      {"root ::= \"a\" @", "unexpected '@'"},
      {"root \"a\"\nx ::= \"b\"", "expected '::='"},
      {std::string("root ::= \"\xff\""), "UTF-8"},
      {"root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'), "nest deeper"},
      {"root ::= \"" + std::string(kMaxGbnfBytes, 'a') + "\"", "longer than"},
  };
  for (const auto& [text, why] : refused) {
    auto g = GbnfGrammar(text);
    INFO(text.substr(0, 80) << " -> " << g.status().ToString());
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().message().find(why) != std::string::npos);
  }
}

// Where the matcher's bounds end a text that the grammar would go on with (here: 50,000 states
// of a long string, in a vocabulary whose only way on is another character), no token can
// follow: EOS may, so the request ends instead of being left without a token.
TEST_CASE("structured: where no token can go on, EOS may", "[structured]") {
  auto g =
      JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({"type":"string","maxLength":200000})"));
  REQUIRE(g.ok());
  auto vocab = TokenVocabulary::FromBytes({"\"a", "a", ""}, 3);
  GrammarConstraint c(*g, vocab, {2});
  std::vector<int32_t> out = {0};
  bool cut = false;
  for (int i = 0; i < 60000; ++i) {
    const std::vector<int32_t> allowed = c.Allowed(out);
    REQUIRE_FALSE(allowed.empty());
    if (allowed == std::vector<int32_t>{1}) {
      out.push_back(1);
      continue;
    }
    CHECK(allowed == std::vector<int32_t>{2});
    cut = true;
    break;
  }
  CHECK(cut);
  CHECK(out.size() > 40000);
}

// Right recursion in tail position (a list as `list ::= item ("," list)?`, a rule ending in a
// reference) does not deepen the matcher's stacks: lists far longer than the 160-frame bound
// match, while nesting (`"(" e ")"`) still counts against it.
TEST_CASE("structured gbnf: tail recursion is not bounded by the stack depth", "[structured][gbnf]") {
  GrammarMatcher m(Gbnf("root ::= \"[\" list \"]\"\nlist ::= [0-9]+ (\",\" list)?\n"));
  std::string text = "[";
  for (int i = 0; i < 2000; ++i) text += std::to_string(i) + (i + 1 < 2000 ? "," : "]");
  const int32_t s = m.Next(m.start(), text);
  REQUIRE(s >= 0);
  CHECK(m.Accepting(s));
  CHECK(m.num_states() < 200);  // the same few states over and over
  GrammarMatcher nest(Gbnf("root ::= e\ne ::= \"(\" e \")\" | \"x\"\n"));
  CHECK(nest.Next(nest.start(), std::string(100, '(') + "x" + std::string(100, ')')) >= 0);
  CHECK(nest.Next(nest.start(), std::string(400, '(')) == GrammarMatcher::kDead);
}

// An ambiguous, centre-embedding grammar makes every state hold hundreds of deep stacks: a
// vocabulary walk would do millions of frames of work (seconds of the engine thread, for every
// request's step). The walk stops at kMaxWalkWork: the masks stay valid (every allowed token
// goes on in the grammar), never empty, the matcher's frames stay under its bound, and usual
// grammars are never cut.
TEST_CASE("structured: a grammar too costly to walk has its walks cut, and stays valid",
          "[structured][gbnf]") {
  std::vector<std::string> bytes;
  for (char a = 'a'; a <= 'z'; ++a) {
    bytes.emplace_back(1, a);
    for (char b = 'a'; b <= 'z'; ++b) {
      bytes.push_back(std::string{a, b});
      for (char c = 'a'; c <= 'z'; c += 2) bytes.push_back(std::string{a, b, c});
    }
  }
  bytes.emplace_back();  // EOS
  const int32_t eos = static_cast<int32_t>(bytes.size()) - 1;
  auto vocab = TokenVocabulary::FromBytes(bytes, static_cast<int64_t>(bytes.size()));
  auto hostile = Gbnf("root ::= w\nw ::= [a-z] w ([a-z] | [a-m] | \"\") | [a-z] w [a-z] [a-z]? | [a-z]\n");
  // (A quarter of the default budget: this vocabulary is an eighth of a real one.)
  constexpr uint64_t kBudget = GrammarConstraint::kMaxWalkWork / 4;
  GrammarConstraint c(hostile, vocab, {eos}, {}, kBudget);
  std::vector<int32_t> out;
  std::mt19937 rng(7);
  for (int step = 0; step < 40; ++step) {
    const uint64_t work0 = c.work();
    const size_t cuts0 = c.num_cut_walks();
    const std::vector<int32_t> allowed = c.Allowed(out);
    // The budget, plus what the last token of the walk and the committed token fed (each byte
    // at most a few times 256 stacks of 160 frames, in and out): without the cut a walk here
    // does tens of millions. After four cuts, a 32nd of the budget.
    const uint64_t budget = cuts0 >= 4 ? kBudget / 32 : kBudget;
    const uint64_t work = c.work() - work0;
    INFO("step " << step << ": work " << work << ", budget " << budget);
    CHECK(work <= budget + 2 * 3 * 256 * 161 * 4);
    REQUIRE_FALSE(allowed.empty());
    if (allowed.back() == eos && allowed.size() == 1) break;
    // Every allowed token goes on from here, by a matcher of its own.
    GrammarMatcher check(hostile);
    int32_t s = check.start();
    for (int32_t t : out) s = check.Next(s, vocab->bytes(t));
    REQUIRE(s >= 0);
    for (size_t i = 0; i < allowed.size(); i += 17) {
      if (allowed[i] != eos) CHECK(check.Next(s, vocab->bytes(allowed[i])) >= 0);
    }
    int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (pick == eos) pick = allowed.front();
    if (pick == eos) break;
    out.push_back(pick);
  }
  CHECK(c.num_cut_walks() > 0);
  // The built-in arithmetic grammar over the same vocabulary: never cut.
  GrammarConstraint plain(Gbnf(kArith), vocab, {eos});
  for (int i = 0; i < 5; ++i) (void)plain.Allowed({});
  CHECK(plain.num_cut_walks() == 0);
}

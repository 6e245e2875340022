// Structured output's grammars: the first line is a JSON schema (or "object" for any JSON
// object, "choice:a|b|c" for choices, "regex:PATTERN" for a regular expression, "gbnf:RULES" for a
// GBNF grammar, "tools:SCHEMA" for forced tool calls with those parameters, one call or many); the
// rest is fed to the matcher byte by byte, and as token ids (two bytes each) to a constraint over a
// small vocabulary. Nothing may crash; what the matcher accepts must be JSON nlohmann parses (for
// the JSON grammars) and UTF-8 (for all but choices).
#include <nlohmann/json.hpp>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_depth.h"
#include "tokenizer/structured/gbnf.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/regex.h"
#include "tokenizer/structured/token_constraint.h"

using namespace oasis::structured;

namespace {

std::shared_ptr<const TokenVocabulary> Vocabulary() {
  static const std::shared_ptr<const TokenVocabulary> v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\":", "\",\"", "\"}", "true", "false", "null", "12", "0.", "e-",
                          "[{", "}]", "  ", "\n ", "\\u00", "\xc3\xa9", "ab", "\":\""}) {
      bytes.emplace_back(t);
    }
    bytes.emplace_back();  // EOS
    return TokenVocabulary::FromBytes(std::move(bytes), static_cast<int64_t>(bytes.size()) + 3);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view head = in.substr(0, nl);
  const std::string_view rest =
      nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  std::shared_ptr<const Grammar> g;
  bool json = true;
  bool utf8 = true;  // (choices are the request's own bytes)
  if (head == "object") {
    g = *JsonObjectGrammar(rest.size() % 2 == 1);
  } else if (head.substr(0, 7) == "choice:") {
    std::vector<std::string> choices;
    std::string_view list = head.substr(7);
    while (!list.empty()) {
      const size_t bar = list.find('|');
      choices.emplace_back(list.substr(0, bar));
      list = bar == std::string_view::npos ? std::string_view() : list.substr(bar + 1);
    }
    auto c = ChoiceGrammar(choices);
    if (!c.ok()) return 0;
    g = *c;
    json = false;
    utf8 = false;
  } else if (head.substr(0, 6) == "regex:") {
    auto c = RegexGrammar(head.substr(6));
    if (!c.ok()) return 0;
    g = *c;
    json = false;
  } else if (head.substr(0, 5) == "gbnf:") {
    auto c = GbnfGrammar(head.substr(5));
    if (!c.ok()) return 0;
    g = *c;
    json = false;
  } else if (head.substr(0, 6) == "tools:") {
    if (oasis::JsonNestedDeeperThan(head.substr(6))) return 0;
    const auto schema = nlohmann::ordered_json::parse(head.substr(6), nullptr, false);
    if (schema.is_discarded()) return 0;
    const std::vector<ToolSchema> tools = {{"f", &schema}, {"g", nullptr}};
    auto c = ToolCallsGrammar(
        tools, rest.size() % 2 == 0 ? INT_MAX : 1 + static_cast<int>(rest.size() % 80),
        rest.size() % 3 == 0);
    if (!c.ok()) return 0;
    g = *c;
    json = false;
  } else {
    if (oasis::JsonNestedDeeperThan(head)) return 0;
    const auto schema = nlohmann::ordered_json::parse(head, nullptr, false);
    if (schema.is_discarded()) return 0;
    auto c = JsonSchemaGrammar(schema, rest.size() % 3 == 0);
    if (!c.ok()) return 0;
    g = *c;
  }
  // Ambiguous grammars make every byte cost up to 256 deep stacks: past this much matcher work
  // (~0.5 s under the sanitizers) the input has shown what it can, and the unit stays far from
  // the timeout.
  constexpr uint64_t kWorkBound = uint64_t{1} << 19;
  GrammarMatcher m(g);
  int32_t s = m.start();
  size_t fed = 0;
  for (char ch : rest) {
    if (m.work() > kWorkBound) break;
    const int32_t next = m.Next(s, static_cast<uint8_t>(ch));
    if (next < 0) break;
    s = next;
    ++fed;
  }
  if (json && m.Accepting(s)) {
    const std::string text(rest.substr(0, fed));
    if (nlohmann::json::parse(text, nullptr, false).is_discarded()) {
      // Numbers past double's range are JSON that nlohmann refuses; the rest is a bug.
      if (text.find_first_of("eE") == std::string::npos) std::abort();
    }
  }
  if (utf8 && m.Accepting(s)) {
    try {
      (void)nlohmann::json(std::string(rest.substr(0, fed))).dump();  // (throws on bytes not UTF-8)
    } catch (const nlohmann::json::exception&) {
      std::abort();
    }
  }
  if (m.work() > kWorkBound) return 0;  // (the constraint below would feed the same bytes)
  auto vocab = Vocabulary();
  const int32_t eos = static_cast<int32_t>(vocab->vocab_size()) - 4;
  // A small walk budget (a production walk may do 1M frames of work: seconds under ASan, 10
  // times an input): the cut walks are exercised often, and no unit nears the timeout.
  GrammarConstraint c(g, vocab, {eos}, {}, uint64_t{1} << 15);
  std::vector<int32_t> tokens;
  for (size_t i = 0; i + 1 < rest.size() && tokens.size() < 64; i += 2) {
    tokens.push_back((static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8)) %
                     static_cast<int32_t>(vocab->vocab_size()));
  }
  std::vector<int32_t> masked;
  for (size_t k = 0; k <= tokens.size(); k += 7) {
    masked.clear();
    c.Masked(std::span<const int32_t>(tokens).first(k), {}, &masked);
    for (size_t i = 1; i < masked.size(); ++i) {
      if (masked[i - 1] >= masked[i]) std::abort();  // sorted, unique
    }
  }
  return 0;
}

// Structured output: the byte grammars (JSON schema subset, any object, choices), their
// matcher, and the token masks over a vocabulary (a small one, checked against brute force,
// and the real Qwen3 tokenizer, sampled until the end).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "real_tokenizers.h"
#include "structured_walk.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/token_constraint.h"

using namespace oasis;
using namespace oasis::structured;
using namespace oasis::structured::testing;
using OJson = nlohmann::ordered_json;

namespace {

// Bytes the walks prefer half the time: closing brackets, quotes and digits, so that they end.
constexpr std::string_view kClosing = "}]\"0123456789";

std::shared_ptr<const Grammar> Schema(const std::string& text) {
  auto g = JsonSchemaGrammar(OJson::parse(text));
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}


// The subset's semantics, written plainly: whether `v` is an instance of `s` (properties in
// order, as the grammar generates them).
bool Valid(const OJson& v, const OJson& s, const OJson& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    if (ref == "#") return Valid(v, root, root);
    return Valid(v, root.at(OJson::json_pointer(ref.substr(1))), root);
  }
  if (s.value("nullable", false) && v.is_null()) return true;
  for (const char* k : {"anyOf", "oneOf"}) {
    if (s.contains(k)) {
      for (const OJson& a : s[k]) {
        if (Valid(v, a, root)) return true;
      }
      return false;
    }
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) {
    for (const OJson& e : s["enum"]) {
      if (v == e) return true;
    }
    return false;
  }
  if (!s.contains("type")) return true;
  std::vector<std::string> types;
  if (s["type"].is_string()) types.push_back(s["type"]);
  else for (const OJson& t : s["type"]) types.push_back(t);
  for (const std::string& t : types) {
    if (t == "null" && v.is_null()) return true;
    if (t == "boolean" && v.is_boolean()) return true;
    // (integers past 64 bits parse as doubles)
    if (t == "integer" && (v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))))
      return true;
    if (t == "number" && v.is_number()) return true;
    if (t == "string" && v.is_string()) {
      // (code points)
      const std::string str = v;
      int64_t n = 0;
      for (unsigned char c : str) n += (c & 0xC0) != 0x80;
      if (n >= s.value("minLength", 0) && (!s.contains("maxLength") || n <= s["maxLength"].get<int64_t>()))
        return true;
    }
    if (t == "array" && v.is_array()) {
      const int64_t n = static_cast<int64_t>(v.size());
      if (n < s.value("minItems", 0) || (s.contains("maxItems") && n > s["maxItems"].get<int64_t>())) continue;
      bool ok = true;
      for (const OJson& x : v) ok = ok && (!s.contains("items") || Valid(x, s["items"], root));
      if (ok) return true;
    }
    if (t == "object" && v.is_object()) {
      const OJson props = s.value("properties", OJson::object());
      const bool extra = s.contains("additionalProperties") ? !s["additionalProperties"].is_boolean() ||
                                                                  s["additionalProperties"].get<bool>()
                                                            : !s.contains("properties");
      bool ok = true;
      for (const OJson& r : s.value("required", OJson::array())) ok = ok && v.contains(r.get<std::string>());
      for (const auto& [k, x] : v.items()) {
        if (props.contains(k)) {
          ok = ok && Valid(x, props[k], root);
        } else if (!extra) {
          ok = false;
        } else if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
          ok = ok && Valid(x, s["additionalProperties"], root);
        }
      }
      if (ok) return true;
    }
  }
  return false;
}


}  // namespace

TEST_CASE("structured: any JSON object, against nlohmann's parser", "[structured]") {
  GrammarMatcher m(*JsonObjectGrammar());
  for (const char* good : {"{}", "{ }", "{\"a\":1}", "{\"a\": [1, 2.5e-3, -0, true, null, \"x\"]}",
                           "\n{\"k\": {\"n\": {\"m\": []}}}\n", "{\"\\u00e9\\n\": \"caf\xc3\xa9\"}",
                           "{\"a\":{},\"b\":[{}],\"c\":-12.5E+7}", "{\"s\":\"\\ud83d\\ude00 \\uD7FF \\u00e9\"}"}) {
    INFO(good);
    CHECK(Matches(m, good));
    CHECK(OJson::accept(good));
  }
  for (const char* bad : {"[]", "1", "\"x\"", "{\"a\"}", "{\"a\":}", "{,}", "{\"a\":1,}", "{\"a\":01}",
                          "{\"a\":1.}", "{\"a\":\"\\x\"}", "{\"a\":tru}", "{'a':1}", "{\"a\":1}}",
                          "{\"a\":\"\x01\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
                          "{\"a\":\"\\ud888A\"}", "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud83d\\u0041\"}"}) {
    INFO(bad);
    CHECK_FALSE(Matches(m, bad));
  }
  // Every prefix of a match is alive; a match is no longer alive after a stray byte.
  const std::string doc = "{\"name\": \"x\", \"list\": [1, {\"y\": false}], \"z\": null}";
  for (size_t i = 0; i <= doc.size(); ++i) CHECK(Alive(m, doc.substr(0, i)));
  CHECK_FALSE(Alive(m, doc + "x"));
  // Bounds: whitespace runs, number lengths.
  CHECK(Matches(m, "{" + std::string(kMaxWhitespace, ' ') + "}"));
  CHECK_FALSE(Alive(m, "{" + std::string(kMaxWhitespace + 1, ' ')));
  CHECK(Matches(m, "{\n  \"a\": 1\n}"));
  CHECK(Matches(m, "{\n\n  \"a\": 1}"));
  CHECK_FALSE(Alive(m, "{\n\n\n"));
  // Compact: no whitespace at all.
  GrammarMatcher compact(*JsonObjectGrammar(true));
  CHECK(Matches(compact, "{\"a\":[1,{\"b\":\" x \"}]}"));
  CHECK_FALSE(Alive(compact, "{ "));
  CHECK_FALSE(Alive(compact, "{\"a\": "));
  CHECK_FALSE(Alive(compact, " {"));
  CHECK(Matches(m, "{\"a\":" + std::string(kMaxNumberBytes, '1') + "}"));
  CHECK_FALSE(Alive(m, "{\"a\":" + std::string(kMaxNumberBytes + 1, '1')));
  // Nesting deeper than the matcher keeps is refused at its bracket, not crashed on.
  std::string deep = "{\"a\":";
  for (int i = 0; i < 200; ++i) deep += "[";
  CHECK_FALSE(Alive(m, deep));
  std::string ok = "{\"a\":";
  for (int i = 0; i < 20; ++i) ok += "[";
  ok += "1";
  for (int i = 0; i < 20; ++i) ok += "]";
  CHECK(Matches(m, ok + "}"));
}

TEST_CASE("structured: random walks of any JSON object never dead-end and end in valid JSON",
          "[structured]") {
  std::mt19937_64 rng(Catch::rngSeed() + 1);
  GrammarMatcher m(*JsonObjectGrammar());
  int finished = 0;
  for (int i = 0; i < 300; ++i) {
    auto text = Walk(m, rng, 400, 0.5, kClosing);
    if (!text) continue;
    ++finished;
    INFO(*text);
    const OJson v = OJson::parse(*text, nullptr, false);
    CHECK(!v.is_discarded());
    CHECK(v.is_object());
  }
  CHECK(finished > 30);
}

TEST_CASE("structured: JSON schemas, instances in and out", "[structured]") {
  const std::string person = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 2},
      "ok": {"type": "boolean"},
      "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]}
    },
    "required": ["name", "age"]
  })";
  GrammarMatcher m(Schema(person));
  for (const char* good : {R"({"name":"Al","age":3})", R"({"name": "Al", "age": -3, "ok": true})",
                           R"({"name":"x","age":0,"tags":["a",3],"nick":null})",
                           R"({"name":"é€😀ab","age":1,"nick":"z"})", R"({"name":"x","age":1,"tags":[]})"}) {
    INFO(good);
    CHECK(Matches(m, good));
  }
  for (const char* bad : {R"({"age":3,"name":"Al"})",            // order of the schema
                          R"({"name":"Al"})",                    // required age
                          R"({"name":"","age":1})",              // minLength
                          R"({"name":"abcdef","age":1})",        // maxLength
                          R"({"name":"x","age":1.5})",           // integer
                          R"({"name":"x","age":1,"tags":["c"]})",   // enum
                          R"({"name":"x","age":1,"tags":["a","b","a"]})",  // maxItems
                          R"({"name":"x","age":1,"other":1})",   // no additional properties
                          R"({"name":"x","age":1,"nick":3})"}) {
    INFO(bad);
    CHECK_FALSE(Matches(m, bad));
  }
  // const, nested $defs with recursion, additionalProperties as a schema, nullable, type lists.
  const std::string tree = R"({
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": ["integer", "string"]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}},
    "type": "object",
    "properties": {"kind": {"const": "tree"}, "root": {"$ref": "#/$defs/node"},
                   "meta": {"type": "object", "additionalProperties": {"type": "number"}},
                   "note": {"type": "string", "nullable": true}},
    "required": ["kind", "root"]
  })";
  GrammarMatcher t(Schema(tree));
  CHECK(Matches(t, R"({"kind":"tree","root":{"v":1,"kids":[{"v":"x"},{"v":2,"kids":[]}]}})"));
  CHECK(Matches(t, R"({"kind":"tree","root":{"v":1},"meta":{"a":1,"b":2.5},"note":null})"));
  CHECK_FALSE(Matches(t, R"({"kind":"bush","root":{"v":1}})"));
  CHECK_FALSE(Matches(t, R"({"kind":"tree","root":{"kids":[]}})"));
  CHECK_FALSE(Matches(t, R"({"kind":"tree","root":{"v":1},"meta":{"a":"x"}})"));
}

TEST_CASE("structured: random walks of schemas end in instances of them", "[structured]") {
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":3},
          "c":{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3}},"required":["a","c"]})",
      R"({"type":"object","properties":{"x":{"enum":["p","q",null,1.5]},"y":{"anyOf":[{"type":"number"},
          {"type":"object","properties":{"z":{"type":"null"}}}]}}})",
      R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"],
          "additionalProperties":{"type":"boolean"}},"maxItems":4})",
      R"({"$defs":{"n":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}}}},
          "$ref":"#/$defs/n"})",
      R"({"type":"string","minLength":2,"maxLength":4})",
      R"({"type":["integer","null"]})"};
  std::mt19937_64 rng(Catch::rngSeed() + 2);
  for (const std::string& text : schemas) {
    const OJson schema = OJson::parse(text);
    GrammarMatcher m(Schema(text));
    int finished = 0;
    for (int i = 0; i < 150; ++i) {
      auto out = Walk(m, rng, 300, 0.6, kClosing);
      if (!out) continue;
      ++finished;
      INFO(text << "\n" << *out);
      const OJson v = OJson::parse(*out, nullptr, false);
      REQUIRE(!v.is_discarded());
      CHECK(Valid(v, schema, schema));
    }
    INFO(text);
    CHECK(finished > 10);
  }
}

TEST_CASE("structured: schemas it cannot honour are refused, naming the keyword", "[structured]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"string","pattern":"(?=a)a"})", "#/pattern: regex: lookaround"},
      {R"({"type":"string","pattern":"a+","minLength":2})", "'pattern' together with 'minLength'"},
      {R"({"type":"string","pattern":5})", "'pattern' must be a string"},
      {R"({"type":"integer","multipleOf":3})", "'multipleOf'"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"object","properties":{"a":{"type":"string","x-custom":1}}})", "'x-custom'"},
      {R"({"type":"object","properties":{"a":{"not":{}}}})", "#/properties/a"},
      {R"({"type":"widget"})", "unknown type 'widget'"},
      {R"({"type":"object","required":["a"]})", "required property 'a'"},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"({"$ref":"https://example.com/s.json"})", "only references inside the schema"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "refers to itself"},
      {R"({"anyOf":[]})", "non-empty list"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "'allOf' of more than one"},
      {R"({"type":"string","maxLength":-1})", "'maxLength'"},
      {R"({"type":"string","minLength":5,"maxLength":2})", "below 'minLength'"},
      {R"({"type":"array","prefixItems":[{"type":"string"}],"additionalItems":false})", "'additionalItems' with"},
      {R"({"type":"array","additionalItems":false})", "list of 'items' only"},
      {R"({"type":"array","prefixItems":[{"type":"string"}],"items":false,"minItems":2})", "matches nothing"},
      {R"(false)", "matches nothing"},
      {R"("object")", "must be an object or a boolean"},
      {R"({"type":"object","properties":{"a":{"type":"string"}},"$ref":"#"})", "'$ref' together with"},
  };
  for (const auto& [schema, words] : cases) {
    auto g = JsonSchemaGrammar(OJson::parse(schema));
    INFO(schema);
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.status().message(), Catch::Contains(words));
  }
  // Annotations are not constraints: accepted.
  CHECK(JsonSchemaGrammar(OJson::parse(
                              R"({"title":"T","description":"d","type":"string","format":"date-time","default":"x","examples":["y"]})"))
            .ok());
  CHECK_FALSE(ChoiceGrammar({}).ok());
  CHECK_FALSE(ChoiceGrammar({"a", ""}).ok());
}

TEST_CASE("structured: token masks over a small vocabulary equal brute force", "[structured]") {
  // Ids 0..255 single bytes, then multi-byte tokens, an added token without bytes, and EOS;
  // the logits are wider than the vocabulary.
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\"}", "true", "false", "  ", "\n  ", "12", "\"a\"", "},{", "ab", "\xc3\xa9",
                        "\xc3", "\xa9\"", "null", "\": \""}) {
    bytes.emplace_back(t);
  }
  const auto added = static_cast<int32_t>(bytes.size());
  bytes.emplace_back();  // <|special|>
  const auto eos = static_cast<int32_t>(bytes.size());
  bytes.emplace_back();
  const int64_t vocab = static_cast<int64_t>(bytes.size()) + 5;
  auto v = TokenVocabulary::FromBytes(bytes, vocab);
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"string","maxLength":4},"b":{"type":"array","items":{"type":"boolean"}},
          "c":{"enum":[12,null]}},"required":["a"]})";
  auto g = Schema(schema);
  GrammarConstraint c(g, v, {eos});
  GrammarMatcher ref(g);
  std::mt19937_64 rng(Catch::rngSeed() + 3);
  int ended = 0;
  for (int run = 0; run < 60; ++run) {
    std::vector<int32_t> out;
    std::string text;
    for (int step = 0; step < 80; ++step) {
      const std::vector<int32_t> allowed = c.Allowed(out);
      const int32_t s = ref.Next(ref.start(), text);
      REQUIRE(s >= 0);
      std::vector<int32_t> want;
      for (int32_t id = 0; id < vocab; ++id) {
        const std::string_view b = v->bytes(id);
        if (id == eos ? ref.Accepting(s) : (!b.empty() && ref.Next(s, b) >= 0)) want.push_back(id);
      }
      INFO(text);
      REQUIRE(allowed == want);
      CHECK(std::find(allowed.begin(), allowed.end(), added) == allowed.end());
      // The same set with the last token given as a draft (a speculative row).
      if (!out.empty()) {
        std::vector<int32_t> masked;
        c.Masked(std::span<const int32_t>(out).first(out.size() - 1), std::span<const int32_t>(out).last(1), &masked);
        CHECK(masked.size() + allowed.size() == static_cast<size_t>(vocab));
      }
      REQUIRE(!allowed.empty());
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      out.push_back(t);
      if (t == eos) break;
      text += v->bytes(t);
    }
    if (out.back() == eos) {
      ++ended;
      CHECK(c.Complete(out));
      const OJson schema_json = OJson::parse(schema);
      const OJson value = OJson::parse(text, nullptr, false);
      INFO(text);
      REQUIRE(!value.is_discarded());
      CHECK(Valid(value, schema_json, schema_json));
    }
  }
  CHECK(ended > 0);
  // A refused draft masks nothing; committed tokens outside the grammar leave only EOS.
  std::vector<int32_t> masked;
  c.Masked({}, std::vector<int32_t>{'x'}, &masked);
  CHECK(masked.empty());
  c.Masked(std::vector<int32_t>{'x'}, {}, &masked);
  CHECK(masked.size() == static_cast<size_t>(vocab - 1));
  CHECK(!std::binary_search(masked.begin(), masked.end(), eos));
}

TEST_CASE("structured: siblings share the matcher and mask exactly as separate constraints", "[structured]") {
  // A request's sequences (n > 1) run interleaved, each through its own sibling; every mask must
  // equal an independent constraint's over the same tokens, while states and allowed sets are
  // computed once: the siblings' walks together are fewer than the independent ones'.
  std::vector<std::string> bytes;
  for (int b = 32; b < 127; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"", "\":", "\"}", "true", "false", "12", "\"a\"", "ab", ", \""}) bytes.emplace_back(t);
  const auto eos = static_cast<int32_t>(bytes.size());
  bytes.emplace_back();
  auto v = TokenVocabulary::FromBytes(bytes, static_cast<int64_t>(bytes.size()));
  auto g = Schema(R"({"type":"object","properties":{"a":{"type":"string","maxLength":6},"b":{"type":"boolean"}},"required":["a","b"]})");
  auto first = std::make_shared<GrammarConstraint>(g, v, std::vector<int32_t>{eos});
  std::vector<std::shared_ptr<GrammarConstraint>> siblings = {first, first->Sibling(), first->Sibling(), first->Sibling()};
  std::vector<std::unique_ptr<GrammarConstraint>> alone;
  for (size_t i = 0; i < siblings.size(); ++i) alone.push_back(std::make_unique<GrammarConstraint>(g, v, std::vector<int32_t>{eos}));
  std::vector<std::vector<int32_t>> outs(siblings.size());
  std::vector<bool> done(siblings.size(), false);
  std::mt19937_64 rng(Catch::rngSeed() + 11);
  for (int step = 0; step < 60; ++step) {
    for (size_t i = 0; i < siblings.size(); ++i) {  // interleaved, as the engine's rows
      if (done[i]) continue;
      const std::vector<int32_t> got = siblings[i]->Allowed(outs[i]);
      REQUIRE(got == alone[i]->Allowed(outs[i]));
      REQUIRE(!got.empty());
      const int32_t t = got[std::uniform_int_distribution<size_t>(0, got.size() - 1)(rng)];
      outs[i].push_back(t);
      done[i] = t == eos;
    }
  }
  size_t alone_walks = 0;
  for (const auto& c : alone) alone_walks += c->num_walks();
  CHECK(first->num_walks() == siblings[3]->num_walks());  // one count: the shared walks
  CHECK(first->num_walks() < alone_walks);
  CHECK(first->num_states() == siblings[2]->num_states());
  for (size_t i = 0; i < siblings.size(); ++i) {
    if (done[i]) CHECK(siblings[i]->Complete(outs[i]));
  }
}

TEST_CASE("structured: the reasoning gate frees the thinking block", "[structured]") {
  std::vector<std::string> bytes;
  for (int b = 0; b < 128; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const int32_t think = 128, end_think = 129, eos = 130;
  bytes.resize(131);
  auto v = TokenVocabulary::FromBytes(bytes, 131);
  auto g = *ChoiceGrammar({"yes", "no"});
  GrammarConstraint gated(g, v, {eos}, ReasoningGate{true, false, think, end_think});
  // First token: the grammar's first bytes or <think>.
  CHECK(gated.Allowed({}) == std::vector<int32_t>{'n', 'y', think});
  // Inside the thinking block anything goes.
  CHECK(gated.Allowed(std::vector<int32_t>{think, 'q'}).size() == 131);
  // After it, the grammar.
  CHECK(gated.Allowed(std::vector<int32_t>{think, 'q', end_think}) == std::vector<int32_t>{'n', 'y'});
  CHECK(gated.Allowed(std::vector<int32_t>{think, end_think, 'n', 'o'}) == std::vector<int32_t>{eos});
  CHECK(gated.Complete(std::vector<int32_t>{think, end_think, 'y', 'e', 's', eos}));
  // A prompt that opens the block: free until </think>.
  GrammarConstraint open(g, v, {eos}, ReasoningGate{true, true, think, end_think});
  CHECK(open.Allowed({}).size() == 131);
  CHECK(open.Allowed(std::vector<int32_t>{'a', end_think}) == std::vector<int32_t>{'n', 'y'});
  // Without the gate: the grammar from the first token, <think> masked.
  GrammarConstraint plain(g, v, {eos});
  CHECK(plain.Allowed({}) == std::vector<int32_t>{'n', 'y'});
}

TEST_CASE("structured: sampling under the mask with the real Qwen3 tokenizer ends in valid JSON",
          "[structured][real]") {
  const tokenizer::Tokenizer* tok = tokenizer::testing::RealTokenizer("qwen3");
  if (tok == nullptr) return;
  const int64_t vocab = 151936;  // Qwen3-8B's logits (past the tokenizer's 151,669)
  auto v = TokenVocabulary::Build(*tok, vocab);
  const int32_t eos = *tok->TokenToId("<|im_end|>");
  const std::string schema = R"({"type":"object","properties":{
      "city":{"type":"string","maxLength":12},"temp":{"type":"number"},
      "unit":{"enum":["C","F"]},"days":{"type":"array","items":{"type":"integer"},"maxItems":3}},
      "required":["city","unit"]})";
  const OJson schema_json = OJson::parse(schema);
  std::mt19937_64 rng(Catch::rngSeed() + 4);
  int ended = 0;
  for (int run = 0; run < 6; ++run) {
    GrammarConstraint c(Schema(schema), v, {eos});
    std::vector<int32_t> out;
    for (int step = 0; step < 200; ++step) {
      std::vector<int32_t> masked;
      c.Masked(out, {}, &masked);
      REQUIRE(masked.size() < static_cast<size_t>(vocab));
      REQUIRE(std::is_sorted(masked.begin(), masked.end()));
      // A random allowed token, short ones preferred (as a model's would be: ends sooner).
      std::vector<int32_t> allowed;
      size_t m = 0;
      for (int32_t id = 0; id < vocab; ++id) {
        if (m < masked.size() && masked[m] == id) {
          ++m;
          continue;
        }
        allowed.push_back(id);
      }
      int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      for (int k = 0; k < 3 && t != eos && tok->DecodedBytes(t).size() > 2; ++k) {
        t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      }
      if (std::binary_search(allowed.begin(), allowed.end(), eos) && step > 20) t = eos;
      out.push_back(t);
      if (t == eos) break;
      CHECK_FALSE(tok->IsAdded(t));
    }
    const std::string text = tok->Decode(out, tokenizer::SkipSpecialTokens::kYes);
    INFO(text);
    if (out.back() != eos) continue;
    ++ended;
    const OJson value = OJson::parse(text, nullptr, false);
    REQUIRE(!value.is_discarded());
    CHECK(Valid(value, schema_json, schema_json));
  }
  CHECK(ended > 0);
}

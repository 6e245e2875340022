// vLLM's text datasets: ShareGPT parsing (malformed JSON, missing fields, empty conversations,
// unicode), sampling (vLLM's length filter, seeded shuffle, oversampling), sonnet prompts
// (prefix lines, line counts with Python's rounding, re-draws, chat rendering), custom JSONL;
// the committed offline datasets load. Token counts come from a fake tokenizer: one token a
// space-separated word, a chat template of 10 tokens.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include "test_support.h"
#include "tools/loadgen/text_datasets.h"

using namespace oasis;
using namespace oasis::loadgen;

namespace {

class WordTokenizer : public PromptTokenizer {
 public:
  static int64_t Words(const std::string& text) {
    std::istringstream in(text);
    std::string w;
    int64_t n = 0;
    while (in >> w) ++n;
    return n;
  }
  StatusOr<int64_t> Count(const std::string& text) override {
    ++calls;
    if (fail) return Unavailable("tokenizer down");
    return Words(text);
  }
  StatusOr<int64_t> CountChat(const std::string& m) override {
    ++calls;
    return Words(m) + 10;
  }
  StatusOr<std::string> RenderChat(const std::string& m) override {
    return "<user>" + m + "<assistant>";
  }
  std::string Name() const override { return "words"; }
  bool exact() const override { return true; }
  int calls = 0;
  bool fail = false;
};

std::string Words(int n, const std::string& word = "w") {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " " : "") + word;
  return s;
}

std::string Conversation(const std::string& id, const std::string& prompt,
                         const std::string& answer) {
  nlohmann::json c = {
      {"id", id},
      {"conversations",
       {{{"from", "human"}, {"value", prompt}}, {{"from", "gpt"}, {"value", answer}}}}};
  return c.dump();
}

std::string ErrorOf(const StatusOr<ShareGptFile>& file) {
  REQUIRE_FALSE(file.ok());
  return file.status().message();
}

std::filesystem::path WriteFile(const std::string& tag, const std::string& text) {
  const auto path = oasis::testing::MakeTempDir(tag) / "data";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

TEST_CASE("sharegpt: turn 0 is the prompt, turn 1 the completion; short entries skipped") {
  const std::string text =
      "[" + Conversation("a", "first prompt", "first answer") + "," +
      R"({"id": "one-turn", "conversations": [{"from": "human", "value": "alone"}]},)" +
      R"({"id": "empty", "conversations": []},)" + R"({"id": "no-conversations"},)" +
      R"({"conversations": [{"from": "gpt", "value": "g"}, {"from": "human", "value": "h"},)" +
      R"( {"from": "gpt", "value": "third"}]}])";
  auto file = ParseShareGpt(text, "f.json");
  REQUIRE(file.ok());
  CHECK(file->entries == 5);
  CHECK(file->skipped == 3);
  REQUIRE(file->pairs.size() == 2);
  CHECK(file->pairs[0].id == "a");
  CHECK(file->pairs[0].prompt == "first prompt");
  CHECK(file->pairs[0].completion == "first answer");
  // vLLM takes turns 0 and 1 whoever speaks them; no "id" is fine.
  CHECK(file->pairs[1].id.empty());
  CHECK(file->pairs[1].prompt == "g");
  CHECK(file->pairs[1].completion == "h");
  auto empty = ParseShareGpt("[]", "e.json");
  REQUIRE(empty.ok());
  CHECK(empty->pairs.empty());
}

TEST_CASE("sharegpt: malformed files are errors naming the file, entry and field") {
  CHECK(ErrorOf(ParseShareGpt(R"([{"id": "a", "conversations": [}])", "bad.json"))
            .rfind("bad.json: not valid JSON (byte ", 0) == 0);
  CHECK(ErrorOf(ParseShareGpt("", "empty.json")).find("not valid JSON") != std::string::npos);
  CHECK(ErrorOf(ParseShareGpt(R"({"conversations": []})", "obj.json")) ==
        "obj.json: a ShareGPT file is a JSON list of conversations");
  CHECK(ErrorOf(ParseShareGpt(R"([{"conversations": []}, 7])", "f")) ==
        "f: entry 1 is not a JSON object");
  CHECK(ErrorOf(ParseShareGpt(R"([{"id": "x", "conversations": "hello"}])", "f")) ==
        "f: entry 0 (id x): \"conversations\" is not a list");
  CHECK(ErrorOf(ParseShareGpt(
            R"([{"id": 12, "conversations": [{"from": "human", "value": "p"}, {"from": "gpt"}]}])",
            "f")) == "f: entry 0 (id 12): turn 1 has no string \"value\"");
  CHECK(ErrorOf(ParseShareGpt(R"([{"conversations": [{"value": 5}, {"value": "a"}]}])", "f")) ==
        "f: entry 0: turn 0 has no string \"value\"");
  CHECK(ErrorOf(ParseShareGpt(R"([{"conversations": ["text", {"value": "a"}]}])", "f")) ==
        "f: entry 0: turn 0 has no string \"value\"");
}

TEST_CASE("sharegpt: unicode values come through byte for byte") {
  // Raw UTF-8 and \u escapes (a surrogate pair included) both decode to UTF-8.
  const std::string text =
      R"([{"conversations": [{"from": "human", "value": "naïve café — “quotes” 日本語 😀"},)"
      R"( {"from": "gpt", "value": "\u00e9t\u00e9 \ud83d\ude00"}]}])";
  auto file = ParseShareGpt(text, "u.json");
  REQUIRE(file.ok());
  REQUIRE(file->pairs.size() == 1);
  CHECK(file->pairs[0].prompt == "naïve café — “quotes” 日本語 😀");
  CHECK(file->pairs[0].completion == "\xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80");
  // An invalid UTF-8 byte is malformed JSON.
  CHECK(ErrorOf(ParseShareGpt("[{\"conversations\": [{\"value\": \"\xFF\"}]}]", "x"))
            .find("not valid JSON") != std::string::npos);
}

TEST_CASE("sharegpt: vLLM's length filter") {
  CHECK(IsValidShareGptPair(4, 4, false));
  CHECK_FALSE(IsValidShareGptPair(3, 100, false));  // prompt under 4 tokens
  CHECK_FALSE(IsValidShareGptPair(100, 3, false));  // output under 4 tokens ...
  CHECK(IsValidShareGptPair(100, 3, true));         // ... unless the output length is fixed
  CHECK(IsValidShareGptPair(1024, 1024, false));
  CHECK_FALSE(IsValidShareGptPair(1025, 10, false));    // prompt over 1024
  CHECK_FALSE(IsValidShareGptPair(1000, 1049, false));  // together over 2048
  CHECK_FALSE(IsValidShareGptPair(3, 100, true));       // the prompt check stays
}

TEST_CASE("sharegpt: sampling prunes, shuffles with the seed, oversamples") {
  std::string text = "[";
  for (int i = 0; i < 10; ++i) {
    text += Conversation("c" + std::to_string(i), Words(4 + i, "p" + std::to_string(i)),
                         Words(10 + i)) +
            ",";
  }
  text += Conversation("short-prompt", "too short", Words(20)) + ",";
  text += Conversation("short-answer", Words(8), "one two three") + ",";
  text += Conversation("long-prompt", Words(1025), Words(8)) + "]";
  auto file = ParseShareGpt(text, "s.json");
  REQUIRE(file.ok());
  REQUIRE(file->pairs.size() == 13);
  WordTokenizer tok;

  ShareGptOptions o;
  o.num_prompts = 0;  // every usable pair once
  o.shuffle = false;
  ShareGptStats stats;
  auto all = SampleShareGpt(*file, o, &tok, &stats);
  REQUIRE(all.ok());
  CHECK(stats.pruned == 3);
  CHECK(stats.usable == 10);
  REQUIRE(all->size() == 10);
  for (int i = 0; i < 10; ++i) {
    const Prompt& p = (*all)[i];
    CHECK(p.text == Words(4 + i, "p" + std::to_string(i)));  // file order, text prompts
    CHECK(p.token_ids.empty());
    CHECK(p.prompt_len == 4 + i);
    CHECK(p.output_len == 10 + i);  // the completion's token length
  }

  o.shuffle = true;
  o.seed = 1;
  auto a = SampleShareGpt(*file, o, &tok, nullptr);
  auto b = SampleShareGpt(*file, o, &tok, nullptr);
  o.seed = 2;
  auto c = SampleShareGpt(*file, o, &tok, nullptr);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  std::vector<std::string> ta, tb, tc;
  for (const Prompt& p : *a) ta.push_back(p.text);
  for (const Prompt& p : *b) tb.push_back(p.text);
  for (const Prompt& p : *c) tc.push_back(p.text);
  CHECK(ta == tb);
  CHECK(ta != tc);
  CHECK(std::set<std::string>(ta.begin(), ta.end()).size() == 10);  // a permutation

  // Fewer wanted: sampling stops early (no tokenizer calls for the rest).
  o.num_prompts = 3;
  tok.calls = 0;
  auto three = SampleShareGpt(*file, o, &tok, &stats);
  REQUIRE(three.ok());
  CHECK(three->size() == 3);
  CHECK(tok.calls <= 2 * 6);  // at most the 3 pruned pairs on the way

  // More wanted than usable: topped up by choices among the usable ones, or not.
  o.num_prompts = 25;
  o.output_len = 7;  // fixed: every output 7, the short answer is no longer pruned
  auto many = SampleShareGpt(*file, o, &tok, &stats);
  REQUIRE(many.ok());
  CHECK(many->size() == 25);
  CHECK(stats.usable == 11);
  CHECK(stats.pruned == 2);
  for (const Prompt& p : *many) CHECK(p.output_len == 7);
  o.oversample = false;
  auto few = SampleShareGpt(*file, o, &tok, nullptr);
  REQUIRE(few.ok());
  CHECK(few->size() == 11);
}

TEST_CASE("sharegpt: nothing usable, bad options and tokenizer errors are errors") {
  auto file = ParseShareGpt(
      "[" + Conversation("x", "hi", "ok") + "," + R"({"conversations": [{"value": "alone"}]}])",
      "n.json");
  REQUIRE(file.ok());
  WordTokenizer tok;
  ShareGptOptions o;
  auto none = SampleShareGpt(*file, o, &tok, nullptr);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "no usable ShareGPT conversation: 2 entries, 1 with fewer than two turns, 1 pruned for "
        "their lengths (prompt >= 4 and <= 1024 tokens, output >= 4, both <= 2048)");
  o.output_len = 0;
  CHECK_FALSE(SampleShareGpt(*file, o, &tok, nullptr).ok());
  o.output_len.reset();
  tok.fail = true;
  auto down = SampleShareGpt(*file, o, &tok, nullptr);
  REQUIRE_FALSE(down.ok());
  CHECK(down.status().message().find("tokenizer down") != std::string::npos);
  auto missing = ReadShareGptWorkload("/nonexistent/sharegpt.json", o, &tok, nullptr);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
}

TEST_CASE("sonnet: poem lines keep their newline") {
  auto lines = ReadPoemLines(WriteFile("sonnet_lines", "one\r\ntwo\n\nthree"));
  REQUIRE(lines.ok());
  CHECK(*lines == std::vector<std::string>{"one\r\n", "two\n", "\n", "three\n"});
  auto empty = ReadPoemLines(WriteFile("sonnet_empty", ""));
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("no poem lines") != std::string::npos);
  CHECK_FALSE(ReadPoemLines("/nonexistent/sonnet.txt").ok());
}

TEST_CASE("sonnet: instruction, shared prefix lines, random lines up to input_len") {
  std::vector<std::string> lines;
  for (int i = 0; i < 20; ++i) lines.push_back("l" + std::to_string(i) + " b c\n");  // 3 tokens
  WordTokenizer tok;
  SonnetOptions o;
  o.num_prompts = 30;
  // The instruction is 11 words + 10 for the template = 21 tokens (the base offset).
  o.input_len = 51;   // (51 - 21) / 3 = 10 lines in all
  o.prefix_len = 27;  // (27 - 21) / 3 = 2 of them the file's first lines
  o.output_len = 9;
  o.seed = 5;
  SonnetStats stats;
  auto prompts = MakeSonnetWorkload(lines, o, &tok, &stats);
  REQUIRE(prompts.ok());
  CHECK(stats.base_offset == 21);
  CHECK(stats.avg_line_tokens == Approx(3.0));
  CHECK(stats.num_input_lines == 10);
  CHECK(stats.num_prefix_lines == 2);
  CHECK(stats.redrawn == 0);
  CHECK_FALSE(stats.rendered);
  REQUIRE(prompts->size() == 30);
  const std::string prefix = std::string(kSonnetInstruction) + lines[0] + lines[1];
  std::set<std::string> distinct;
  for (const Prompt& p : *prompts) {
    CHECK(p.text.rfind(prefix, 0) == 0);
    CHECK(p.prompt_len == 51);  // 11 + 10 lines * 3 + 10
    CHECK(p.output_len == 9);
    CHECK(WordTokenizer::Words(p.text) == 41);
    distinct.insert(p.text);
  }
  CHECK(distinct.size() > 25);
  // The same seed, the same prompts.
  auto again = MakeSonnetWorkload(lines, o, &tok, nullptr);
  REQUIRE(again.ok());
  CHECK((*again)[7].text == (*prompts)[7].text);

  o.render_chat = true;  // completions endpoint: sent rendered by the chat template
  auto rendered = MakeSonnetWorkload(lines, o, &tok, &stats);
  REQUIRE(rendered.ok());
  CHECK(stats.rendered);
  CHECK((*rendered)[0].text == "<user>" + (*prompts)[0].text + "<assistant>");
  CHECK((*rendered)[0].prompt_len == 51);
}

TEST_CASE("sonnet: Python's rounding, over-long prompts drawn again, impossible lengths") {
  // Lines of 2 tokens: (26 - 21) / 2 = 2.5 rounds to 2 lines (ties to even, as Python).
  std::vector<std::string> two(8, "a b\n");
  WordTokenizer tok;
  SonnetOptions o;
  o.num_prompts = 5;
  o.input_len = 26;
  o.prefix_len = 0;
  SonnetStats stats;
  auto p = MakeSonnetWorkload(two, o, &tok, &stats);
  REQUIRE(p.ok());
  CHECK(stats.num_input_lines == 2);
  CHECK(stats.num_prefix_lines == 0);  // max(round(-10.5), 0)
  CHECK((*p)[0].prompt_len == 25);     // 11 + 2 * 2 + 10

  // Lines of 1 and 9 tokens (average 5): 4 lines a prompt, some over input_len, drawn again.
  std::vector<std::string> mixed = {"x\n", Words(9) + "\n"};
  o.input_len = 41;  // (41 - 21) / 5 = 4 lines, at most two of 9 tokens fit
  o.num_prompts = 40;
  auto q = MakeSonnetWorkload(mixed, o, &tok, &stats);
  REQUIRE(q.ok());
  CHECK(stats.redrawn > 0);
  for (const Prompt& x : *q) CHECK(x.prompt_len <= 41);

  // input_len must exceed the instruction's own length.
  o.input_len = 21;
  auto low = MakeSonnetWorkload(two, o, &tok, nullptr);
  REQUIRE_FALSE(low.ok());
  CHECK(low.status().message() ==
        "--sonnet-input-len 21 must be higher than the base prompt length (21 tokens)");
  // More prefix lines than input lines (vLLM: no random lines), and than the file has.
  std::vector<std::string> nine = {Words(9) + "\n"};
  o.input_len = 52;    // round(31 / 9) = 3 lines
  o.prefix_len = 100;  // round(79 / 9) = 9 prefix lines, cut to the file's one
  auto prefix_only = MakeSonnetWorkload(nine, o, &tok, &stats);
  REQUIRE(prefix_only.ok());
  CHECK(stats.num_prefix_lines == 1);
  CHECK((*prefix_only)[0].prompt_len == 30);  // 11 + 9 + 10
  // Every draw too long: an error, not an endless loop.
  o.prefix_len = 0;
  o.input_len = 36;  // round(15 / 9) = 2 lines: 11 + 18 + 10 = 39 > 36, never fits
  auto impossible = MakeSonnetWorkload(nine, o, &tok, nullptr);
  REQUIRE_FALSE(impossible.ok());
  CHECK(impossible.status().message().find("were longer than --sonnet-input-len 36") !=
        std::string::npos);
}

TEST_CASE("custom: JSONL prompts shuffled, rendered for completions, counted") {
  std::vector<Prompt> lines(3);
  lines[0].text = "alpha beta";
  lines[0].output_len = 5;
  lines[1].text = "gamma";
  lines[1].output_len = 6;
  lines[2].token_ids = {1, 2, 3};
  lines[2].prompt_len = 3;
  lines[2].output_len = 7;
  WordTokenizer tok;
  CustomOptions o;
  o.num_prompts = 0;
  o.shuffle = false;
  o.render_chat = true;
  auto p = MakeCustomWorkload(lines, o, &tok);
  REQUIRE(p.ok());
  REQUIRE(p->size() == 3);
  CHECK((*p)[0].text == "<user>alpha beta<assistant>");
  CHECK((*p)[0].prompt_len == 2);
  CHECK((*p)[0].output_len == 5);
  CHECK((*p)[2].token_ids == std::vector<int64_t>{1, 2, 3});  // ids are sent as they are
  o.num_prompts = 7;
  o.render_chat = false;
  o.shuffle = true;
  auto more = MakeCustomWorkload(lines, o, &tok);
  REQUIRE(more.ok());
  CHECK(more->size() == 7);
  o.oversample = false;
  CHECK(MakeCustomWorkload(lines, o, &tok)->size() == 3);
  ApproxTokenizer approx;  // cannot render: the error says what to do
  o.render_chat = true;
  auto no = MakeCustomWorkload(lines, o, &approx);
  REQUIRE_FALSE(no.ok());
  CHECK(no.status().message().find("--skip-chat-template") != std::string::npos);
  CHECK_FALSE(MakeCustomWorkload({}, o, &tok).ok());
}

TEST_CASE("approximate token counts: 4 bytes a token, no chat template") {
  ApproxTokenizer t;
  CHECK(*t.Count("") == 0);
  CHECK(*t.Count("abcd") == 1);
  CHECK(*t.Count("abcde") == 2);
  CHECK(*t.CountChat("abcdefgh") == 2);
  CHECK_FALSE(t.RenderChat("x").ok());
  CHECK_FALSE(t.exact());
  CHECK(ParseTokenCounting("server").ok());
  CHECK_FALSE(ParseTokenCounting("hf").ok());
}

TEST_CASE("the committed offline datasets load as vLLM would use them") {
  WordTokenizer tok;
  ShareGptOptions o;
  o.num_prompts = 0;
  ShareGptStats stats;
  auto sharegpt =
      ReadShareGptWorkload(oasis::testing::FixturePath("bench/sharegpt.json"), o, &tok, &stats);
  REQUIRE(sharegpt.ok());
  CHECK(sharegpt->size() == 80);  // 83 entries: 2 too short to use, "Hi" pruned
  CHECK(stats.pruned == 1);
  auto lines = ReadPoemLines(oasis::testing::FixturePath("bench/sonnet.txt"));
  REQUIRE(lines.ok());
  CHECK(lines->size() == 415);
  SonnetOptions s;
  s.num_prompts = 10;
  auto sonnet = MakeSonnetWorkload(*lines, s, &tok, nullptr);
  REQUIRE(sonnet.ok());
  CHECK(sonnet->size() == 10);
}

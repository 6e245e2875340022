// StopChecker: stop ids, EOS, min/max tokens and the context limit on ids alone; stop
// strings across token boundaries, held-back text and UTF-8 with the real Qwen3 tokenizer
// (from tools/fetch_test_data.sh; those cases WARN and pass when it is absent).
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "engine/stop_checker.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;

namespace {

StopConditions Conditions(int64_t max_tokens = 100) {
  StopConditions c;
  c.eos_token_ids = {2};
  c.stop_token_ids = {9, 10};
  c.max_tokens = max_tokens;
  c.max_total_tokens = 1000;
  return c;
}

const tokenizer::Tokenizer* Qwen3() {
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    const auto path = testing::CacheDir() / "qwen3" / "tokenizer.json";
    if (!std::filesystem::exists(path)) return std::unique_ptr<tokenizer::Tokenizer>();
    auto t = tokenizer::Tokenizer::FromFile(path);
    REQUIRE(t.ok());
    return std::move(*t);
  }();
  if (!tok)
    WARN("skipped: " << (testing::CacheDir() / "qwen3" / "tokenizer.json")
                     << " is absent (tools/fetch_test_data.sh)");
  return tok.get();
}

struct Run {
  std::string text;                 // everything emitted
  std::vector<std::string> deltas;  // per token
  StopDecision last;
  size_t tokens_used = 0;
};

// Feeds `ids` until the checker finishes (or the ids run out).
Run Feed(StopChecker& checker, const std::vector<int32_t>& ids, int64_t prompt_len = 5) {
  Run r;
  for (size_t i = 0; i < ids.size(); ++i) {
    StopDecision d = checker.Append(ids[i], static_cast<int64_t>(i) + 1,
                                    prompt_len + static_cast<int64_t>(i) + 1);
    r.text += d.text;
    r.deltas.push_back(d.text);
    r.tokens_used = i + 1;
    r.last = d;
    if (d.finished()) break;
  }
  return r;
}

}  // namespace

TEST_CASE("EOS and stop token ids finish with kStop", "[stop_checker]") {
  StopChecker eos(Conditions(), nullptr);
  Run r = Feed(eos, {5, 6, 2, 7});
  CHECK(r.tokens_used == 3);
  CHECK(r.last.reason == FinishReasonKind::kStop);
  CHECK(r.last.stop_reason.empty());
  CHECK(r.text.empty());

  StopChecker stop_id(Conditions(), nullptr);
  r = Feed(stop_id, {5, 10, 7});
  CHECK(r.tokens_used == 2);
  CHECK(r.last.reason == FinishReasonKind::kStop);
  CHECK(r.last.stop_reason == "10");

  StopConditions ignore = Conditions();
  ignore.eos_token_ids.clear();  // ignore_eos
  StopChecker no_eos(ignore, nullptr);
  r = Feed(no_eos, {5, 2, 2, 9});
  CHECK(r.tokens_used == 4);
  CHECK(r.last.stop_reason == "9");
}

TEST_CASE("min_tokens delays stops; max_tokens and the context end with kLength",
          "[stop_checker]") {
  StopConditions c = Conditions();
  c.min_tokens = 3;
  StopChecker min(c, nullptr);
  Run r = Feed(min, {2, 9, 2, 5});
  CHECK(r.tokens_used == 3);  // the 3rd token is the first that may stop
  CHECK(r.last.reason == FinishReasonKind::kStop);

  StopChecker max(Conditions(4), nullptr);
  r = Feed(max, {5, 6, 7, 8, 11});
  CHECK(r.tokens_used == 4);
  CHECK(r.last.reason == FinishReasonKind::kLength);

  StopConditions ctx = Conditions();
  ctx.max_total_tokens = 8;  // prompt of 5: three tokens fill the context
  StopChecker context(ctx, nullptr);
  r = Feed(context, {5, 6, 7, 8});
  CHECK(r.tokens_used == 3);
  CHECK(r.last.reason == FinishReasonKind::kLength);

  StopChecker both(Conditions(2), nullptr);  // a stop token on the last allowed token is a stop
  r = Feed(both, {5, 9});
  CHECK(r.last.reason == FinishReasonKind::kStop);
}

TEST_CASE("stop strings across token boundaries with the Qwen3 tokenizer", "[stop_checker]") {
  const tokenizer::Tokenizer* tok = Qwen3();
  if (tok == nullptr) return;
  const std::string text = "The quick brown fox jumps over the lazy dog. Then it sleeps.";
  const std::vector<int32_t> ids = tok->Encode(text, tokenizer::AddSpecialTokens::kNo);
  REQUIRE(ids.size() > 8);

  SECTION("cut before the stop string; text that may start it is held back") {
    StopConditions c = Conditions();
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"fox jumps over"};
    StopChecker checker(c, tok);
    Run r = Feed(checker, ids);
    CHECK(r.last.reason == FinishReasonKind::kStop);
    CHECK(r.last.stop_reason == "fox jumps over");
    CHECK(r.text == "The quick brown ");
    CHECK(r.tokens_used < ids.size());
    // "fox" was never emitted before the match was known.
    for (const std::string& d : r.deltas) CHECK(d.find("fox") == std::string::npos);
  }
  SECTION("include_stop_str_in_output keeps it; the earliest of several matches wins") {
    StopConditions c = Conditions();
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"lazy", "jumps over", "zzz"};
    c.include_stop_str_in_output = true;
    StopChecker checker(c, tok);
    Run r = Feed(checker, ids);
    CHECK(r.last.stop_reason == "jumps over");
    CHECK(r.text == "The quick brown fox jumps over");
  }
  SECTION("a stop string inside one token's text, text after it dropped") {
    StopConditions c = Conditions();
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"ui"};  // inside " quick"
    StopChecker checker(c, tok);
    Run r = Feed(checker, ids);
    CHECK(r.last.stop_reason == "ui");
    CHECK(r.text == "The q");
  }
  SECTION("held-back text is released once ruled out and at the end") {
    StopConditions c = Conditions(static_cast<int64_t>(ids.size()));
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"fox sleeps", "."};
    StopChecker checker(c, tok);
    Run r = Feed(checker, ids);
    CHECK(r.last.stop_reason == ".");
    CHECK(r.text == "The quick brown fox jumps over the lazy dog");
    StopConditions none = c;
    none.stop_strings = {"dog!", "sleeps now"};
    StopChecker all(none, tok);
    r = Feed(all, ids);
    CHECK(r.last.reason == FinishReasonKind::kLength);
    CHECK(r.text == text);  // "dog" and "sleeps" were held, then released
    CHECK(r.text == tok->Decode(ids, tokenizer::SkipSpecialTokens::kYes));
  }
  SECTION("min_tokens: stop strings completed before it are ordinary text") {
    StopConditions c = Conditions();
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"quick", "over"};
    c.min_tokens = 3;  // "quick" completes with token 2
    StopChecker checker(c, tok);
    Run r = Feed(checker, ids);
    CHECK(r.last.reason == FinishReasonKind::kStop);
    CHECK(r.last.stop_reason == "over");
    CHECK(r.text == "The quick brown fox jumps ");
  }
  SECTION("multi-byte characters split over tokens and a CJK stop string") {
    const std::string cjk = "你好世界🙂，今天天气很好，我们去公园散步吧。";
    const std::vector<int32_t> cjk_ids = tok->Encode(cjk, tokenizer::AddSpecialTokens::kNo);
    StopConditions c = Conditions();
    c.eos_token_ids.clear();
    c.stop_token_ids.clear();
    c.stop_strings = {"天气很"};
    StopChecker checker(c, tok);
    Run r = Feed(checker, cjk_ids);
    CHECK(r.last.stop_reason == "天气很");
    CHECK(r.text == "你好世界🙂，今天");
  }
  SECTION("EOS text is not emitted; flush releases held text on abort") {
    StopConditions c = Conditions();
    const auto im_end = tok->TokenToId("<|im_end|>");
    REQUIRE(im_end.has_value());
    c.eos_token_ids = {*im_end};
    c.stop_token_ids.clear();
    c.stop_strings = {"lazy cat"};
    StopChecker checker(c, tok);
    std::vector<int32_t> with_eos(ids.begin(), ids.begin() + 4);
    with_eos.push_back(*im_end);
    Run r = Feed(checker, with_eos);
    CHECK(r.last.reason == FinishReasonKind::kStop);
    CHECK(r.text == tok->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + 4),
                                tokenizer::SkipSpecialTokens::kYes));

    StopChecker aborted(c, tok);
    const std::vector<int32_t> lazy = tok->Encode("the lazy", tokenizer::AddSpecialTokens::kNo);
    Run partial = Feed(aborted, lazy);
    CHECK_FALSE(partial.last.finished());
    CHECK(partial.text + aborted.Flush() == "the lazy");
    CHECK(partial.text.find("lazy") == std::string::npos);
  }
}

TEST_CASE("skip_special_tokens: special tokens' text left out, or kept", "[stop_checker]") {
  auto tok = tokenizer::Tokenizer::FromFile(testing::SourceDir() /
                                            "tests/fixtures/tiny-default/tokenizer.json");
  REQUIRE(tok.ok());
  const int32_t im_start = 510;  // <|im_start|>, special in the tiny tokenizer
  REQUIRE((*tok)->IdToToken(im_start) == std::optional<std::string>("<|im_start|>"));
  std::vector<int32_t> ids = (*tok)->Encode("Hi", tokenizer::AddSpecialTokens::kNo);
  ids.push_back(im_start);
  for (int32_t id : (*tok)->Encode(" there", tokenizer::AddSpecialTokens::kNo)) ids.push_back(id);
  StopConditions c = Conditions();
  c.eos_token_ids.clear();
  c.stop_token_ids.clear();
  StopChecker skipping(c, tok->get());
  Run r = Feed(skipping, ids);
  r.text += skipping.Flush();
  CHECK(r.text == "Hi there");
  c.skip_special_tokens = false;
  StopChecker keeping(c, tok->get());
  r = Feed(keeping, ids);
  r.text += keeping.Flush();
  CHECK(r.text == "Hi<|im_start|> there");
}

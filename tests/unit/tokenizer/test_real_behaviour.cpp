// Properties of the real Qwen3 and Llama-3.1 tokenizers (skipped when the cache is absent).
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "random_text.h"
#include "real_tokenizers.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

using testing::RealTokenizer;

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST_CASE("Qwen3: vocabulary and special tokens", "[tokenizer][real]") {
  const Tokenizer* t = RealTokenizer("qwen3");
  if (t == nullptr) return;
  CHECK(t->vocab_size() == 151669);
  CHECK(t->TokenToId("<|im_start|>") == 151644);
  CHECK(t->TokenToId("<|im_end|>") == 151645);
  CHECK(t->TokenToId("<think>") == 151667);
  CHECK(t->IsSpecial(151644));
  CHECK_FALSE(t->IsSpecial(151667));  // <think> is an added token but not special
  CHECK(t->IdToToken(151643) == "<|endoftext|>");
  CHECK(t->IdToToken(198) == "\xC4\x8A");  // "Ċ", the newline byte
  CHECK_FALSE(t->IdToToken(151669));
  CHECK_FALSE(t->IdToToken(-1));

  const auto body = t->Encode("user\nhi", AddSpecialTokens::kNo);
  const auto ids = t->Encode("<|im_start|>user\nhi<|im_end|>", AddSpecialTokens::kNo);
  CHECK(ids == Concat({{151644}, body, {151645}}));
  CHECK(body == std::vector<int32_t>{*t->TokenToId("user"), 198, *t->TokenToId("hi")});
  CHECK(t->Decode(ids, SkipSpecialTokens::kNo) == "<|im_start|>user\nhi<|im_end|>");
  CHECK(t->Decode(ids, SkipSpecialTokens::kYes) == "user\nhi");
  // <think> is matched inside words, and it survives skip_special_tokens.
  const auto think = t->Encode("a<think>b</think>", AddSpecialTokens::kNo);
  CHECK(think == Concat({t->Encode("a", AddSpecialTokens::kNo), {151667},
                         t->Encode("b", AddSpecialTokens::kNo), {151668}}));
  CHECK(t->Decode(think, SkipSpecialTokens::kYes) == "a<think>b</think>");
  // Qwen3's post-processor adds nothing.
  CHECK(t->Encode("Hello", AddSpecialTokens::kYes) == t->Encode("Hello", AddSpecialTokens::kNo));
  // Ids past the vocabulary (Qwen3's embedding has 151,936 rows) decode to nothing.
  CHECK(t->Decode(std::vector<int32_t>{151900, -3}, SkipSpecialTokens::kNo).empty());
}

TEST_CASE("Llama-3.1: BOS on request and special tokens", "[tokenizer][real]") {
  const Tokenizer* t = RealTokenizer("llama3_1");
  if (t == nullptr) return;
  CHECK(t->vocab_size() == 128256);
  CHECK(t->Encode("Hello world", AddSpecialTokens::kNo) == std::vector<int32_t>{9906, 1917});
  CHECK(t->Encode("Hello world", AddSpecialTokens::kYes) == std::vector<int32_t>{128000, 9906, 1917});
  CHECK(t->Encode("", AddSpecialTokens::kYes) == std::vector<int32_t>{128000});
  const auto ids = t->Encode("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
                             AddSpecialTokens::kNo);
  REQUIRE(ids.size() >= 6);
  CHECK(ids[0] == 128000);
  CHECK(ids[1] == *t->TokenToId("<|start_header_id|>"));
  CHECK(ids.back() == *t->TokenToId("<|eot_id|>"));
  CHECK(t->Decode(ids, SkipSpecialTokens::kYes) == "user\n\nhi");
}

TEST_CASE("invalid UTF-8 input is encoded as if each bad subpart were U+FFFD", "[tokenizer][real]") {
  for (const char* name : {"qwen3", "llama3_1"}) {
    const Tokenizer* t = RealTokenizer(name);
    if (t == nullptr) return;
    const std::string r(kReplacementChar);
    CHECK(t->Encode("ab\xFF" "cd\xF0\x9F", AddSpecialTokens::kNo) ==
          t->Encode("ab" + r + "cd" + r, AddSpecialTokens::kNo));
    CHECK(t->Encode("\xED\xA0\x80", AddSpecialTokens::kNo) == t->Encode(r + r + r, AddSpecialTokens::kNo));
    CHECK(t->Decode(t->Encode("x\xC0y", AddSpecialTokens::kNo), SkipSpecialTokens::kNo) == "x" + r + "y");
  }
}

TEST_CASE("decode(encode(x)) == x (NFC(x) for Qwen3) on random text", "[tokenizer][real]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const char* name : {"qwen3", "llama3_1"}) {
    const Tokenizer* t = RealTokenizer(name);
    if (t == nullptr) return;
    const bool nfc = std::string(name) == "qwen3";
    for (int i = 0; i < 1500; ++i) {
      const std::string text = testing::RandomText(rng, i % 50 == 0 ? 2000 : 60);
      std::string expected = text;
      if (nfc) NormalizeUnicode(text, UnicodeForm::kNfc, &expected);
      const auto ids = t->Encode(text, AddSpecialTokens::kNo);
      const std::string back = t->Decode(ids, SkipSpecialTokens::kNo);
      if (back != expected) {
        INFO(name << " text " << nlohmann::json(text).dump());
        REQUIRE(back == expected);
      }
    }
  }
}

TEST_CASE("long and repetitive inputs stay fast and lossless", "[tokenizer][real]") {
  const Tokenizer* t = RealTokenizer("qwen3");
  if (t == nullptr) return;
  std::string cjk;
  for (int i = 0; i < 20000; ++i) cjk += "\xE4\xB8\xAD";  // 中
  const std::vector<std::string> inputs = {
      std::string(200000, ' '), std::string(100000, 'a'), std::string(50000, '7'),
      std::string(30000, '\n'), cjk, std::string(40000, '!'),
      "x" + std::string(100000, ' ') + "y", std::string(60000, '\t') + "\n"};
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& s : inputs) {
    const auto ids = t->Encode(s, AddSpecialTokens::kNo);
    CHECK_FALSE(ids.empty());
    CHECK(t->Decode(ids, SkipSpecialTokens::kNo) == s);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 20.0);
}

TEST_CASE("concurrent Encode/Decode give the single-threaded results", "[tokenizer][real]") {
  const Tokenizer* t = RealTokenizer("llama3_1");
  if (t == nullptr) return;
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) texts.push_back(testing::RandomText(rng, 80));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : texts) expected.push_back(t->Encode(s, AddSpecialTokens::kYes));
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = k; i < texts.size() + k; ++i) {
          const size_t j = i % texts.size();
          const auto ids = t->Encode(texts[j], AddSpecialTokens::kYes);
          if (ids != expected[j]) ++failures[k];
          if (t->Decode(ids, SkipSpecialTokens::kYes) != t->Decode(expected[j], SkipSpecialTokens::kYes)) {
            ++failures[k];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == std::vector<int>(4, 0));
}

}  // namespace
}  // namespace oasis::tokenizer

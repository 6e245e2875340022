// Logits processing on the CPU (runner/logits_processing.h): each parameter's exact effect on
// small vocabularies, vLLM's order when they combine, speculative rows (draft tokens counted
// as generated), and what the sampler draws from the processed logits — greedy and seeded —
// while it reports the raw log-probabilities.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "oasis/token_constraint.h"
#include "runner/logits_processing.h"
#include "runner/sampler.h"

using namespace oasis;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> Process(const std::vector<float>& logits, const SamplingParams& params,
                           const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                           const std::vector<int32_t>& draft = {}, int64_t min_tokens = 0,
                           std::vector<int32_t> stop_ids = {}) {
  auto p = LogitsProcessing::For(params, min_tokens, std::move(stop_ids));
  REQUIRE(p != nullptr);
  std::vector<float> out(logits.size());
  ApplyLogitsProcessing(logits.data(), static_cast<int64_t>(logits.size()), *p, prompt, output,
                        draft, out.data());
  return out;
}

SampleRow Row(const SamplingParams& params, const std::vector<int32_t>& prompt,
              const std::vector<int32_t>& output, int64_t min_tokens = 0,
              std::vector<int32_t> stop_ids = {}) {
  SampleRow row;
  row.params = params;
  row.seed = 7;
  row.processing = LogitsProcessing::For(params, min_tokens, std::move(stop_ids));
  row.prompt_tokens = prompt;
  row.output_tokens = output;
  return row;
}

double LogSoftmaxOf(const std::vector<float>& l, size_t i) {
  double mx = -1e30, z = 0;
  for (float x : l) mx = std::max(mx, static_cast<double>(x));
  for (float x : l) z += std::exp(x - mx);
  return l[i] - mx - std::log(z);
}

}  // namespace

TEST_CASE("no processing asked: no LogitsProcessing at all", "[sampler][logits]") {
  SamplingParams p;
  CHECK(LogitsProcessing::For(p, 0, {}) == nullptr);
  CHECK(LogitsProcessing::For(p, 5, {}) == nullptr);  // min_tokens without stop ids: nothing
  CHECK(LogitsProcessing::For(p, 0, {2}) == nullptr);
  CHECK(LogitsProcessing::For(p, 3, {2}) != nullptr);
  p.presence_penalty = 0.1f;
  CHECK(LogitsProcessing::For(p, 0, {}) != nullptr);
}

TEST_CASE("presence and frequency penalties: OpenAI's, over the generated tokens", "[sampler][logits]") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  // Token 1 twice, token 3 once; the prompt's token 4 does not count.
  const auto out = Process(logits, p, {4, 4}, {1, 3, 1});
  CHECK(out == std::vector<float>{1.0f, 2.0f - 0.5f - 0.5f, 3.0f, 4.0f - 0.25f - 0.5f, 5.0f});
  // Negative values reward repeats.
  p.presence_penalty = -1.0f;
  p.frequency_penalty = -2.0f;
  CHECK(Process(logits, p, {}, {0, 0, 0}) == std::vector<float>{1.0f + 6.0f + 1.0f, 2, 3, 4, 5});
}

TEST_CASE("repetition penalty: vLLM's, over prompt and output, by the logit's sign", "[sampler][logits]") {
  const std::vector<float> logits = {2.0f, -1.0f, 3.0f, 0.5f, -2.0f, 0.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  // Prompt: 0 and 5; output: 4. 0 (> 0) halves, 4 (< 0) doubles, 5 (= 0) stays 0.
  CHECK(Process(logits, p, {0, 5}, {4}) == std::vector<float>{1.0f, -1.0f, 3.0f, 0.5f, -4.0f, 0.0f});
  p.repetition_penalty = 0.5f;  // < 1 encourages repeats
  CHECK(Process(logits, p, {2}, {1}) == std::vector<float>{2.0f, -0.5f, 6.0f, 0.5f, -2.0f, 0.0f});
}

TEST_CASE("logit_bias adds; allowed_token_ids masks the rest", "[sampler][logits]") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  SamplingParams p;
  p.logit_bias = {{2, 1.5f}, {0, -100.0f}, {2, 10.0f}};  // a repeated id: the last one wins
  CHECK(Process(logits, p, {}, {}) == std::vector<float>{-99.0f, 2.0f, 13.0f, 4.0f});
  SamplingParams a;
  a.allowed_token_ids = {2, 0, 2};
  CHECK(Process(logits, a, {}, {}) == std::vector<float>{1.0f, -kInf, 3.0f, -kInf});
  // A bias on a token outside the allowed set leaves it masked.
  a.logit_bias = {{1, 100.0f}, {0, 0.5f}};
  CHECK(Process(logits, a, {}, {}) == std::vector<float>{1.5f, -kInf, 3.0f, -kInf});
}

TEST_CASE("bad words: single tokens always, longer words after their prefix", "[sampler][logits]") {
  const std::vector<float> logits = {0, 1, 2, 3, 4, 5};
  SamplingParams p;
  p.bad_words_token_ids = {{5}, {1, 2, 3}, {4, 0}};
  // Nothing generated: only the single-token word.
  CHECK(Process(logits, p, {1, 2}, {}) == std::vector<float>{0, 1, 2, 3, 4, -kInf});
  // ... ending with 1 2: 3 is masked; ending with 4: 0 is masked.
  CHECK(Process(logits, p, {}, {0, 1, 2}) == std::vector<float>{0, 1, 2, -kInf, 4, -kInf});
  CHECK(Process(logits, p, {}, {2, 4}) == std::vector<float>{-kInf, 1, 2, 3, 4, -kInf});
  // The prompt is not part of the prefix (vLLM matches the generated tokens).
  CHECK(Process(logits, p, {1, 2}, {}) == Process(logits, p, {}, {}));
  // A speculative row: the draft tokens continue the output.
  CHECK(Process(logits, p, {}, {1}, {2}) == std::vector<float>{0, 1, 2, -kInf, 4, -kInf});
  CHECK(Process(logits, p, {}, {}, {1, 2}) == std::vector<float>{0, 1, 2, -kInf, 4, -kInf});
}

TEST_CASE("min_tokens masks the stop tokens until enough are generated", "[sampler][logits]") {
  const std::vector<float> logits = {0, 1, 2, 9};
  SamplingParams p;  // nothing else
  CHECK(Process(logits, p, {}, {0}, {}, 3, {3, 1}) == std::vector<float>{0, -kInf, 2, -kInf});
  CHECK(Process(logits, p, {}, {0}, {2}, 3, {3, 1}) == std::vector<float>{0, -kInf, 2, -kInf});
  CHECK(Process(logits, p, {}, {0, 0}, {2}, 3, {3, 1}) == logits);  // 3 generated
  // Greedy through the sampler: the stop token 3 is the argmax but cannot come before 3 tokens.
  SamplingParams g;
  g.temperature = 0;
  const std::vector<int32_t> one = {0}, three = {0, 0, 0};
  CHECK(SampleToken(logits.data(), 4, Row(g, {}, one, 3, {3})).token == 2);
  CHECK(SampleToken(logits.data(), 4, Row(g, {}, three, 3, {3})).token == 3);
}

TEST_CASE("vLLM's order: masks, bias, then repetition, frequency, presence", "[sampler][logits]") {
  const std::vector<float> logits = {-1.0f, 1.0f, 4.0f, 0.0f, 2.0f};
  SamplingParams p;
  p.logit_bias = {{0, 3.0f}, {1, -3.0f}};
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.bad_words_token_ids = {{2}};
  // Generated: 0, 1, 1 (prompt 4). Token 0: (-1 + 3) = 2 > 0 → / 2 = 1, - 0.5 - 0.25 = 0.25.
  // Token 1: (1 - 3) = -2 → · 2 = -4, - 1.0 - 0.25 = -5.25. Token 2 banned. Token 4 (prompt):
  // 2 / 2 = 1, no output count. Token 3 untouched.
  CHECK(Process(logits, p, {4}, {0, 1, 1}) ==
        std::vector<float>{0.25f, -5.25f, -kInf, 0.0f, 1.0f});
}

TEST_CASE("greedy and seeded draws read the processed logits; logprobs stay raw", "[sampler][logits]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  const std::vector<int32_t> none;
  SamplingParams g;
  g.temperature = 0;
  g.logit_bias = {{4, 5.0f}};
  const SampleResult forced = SampleToken(logits.data(), 6, Row(g, {}, none));
  CHECK(forced.token == 4);
  CHECK(forced.logprob == Approx(LogSoftmaxOf(logits, 4)).margin(1e-6));
  // The top log-probabilities are the raw distribution's.
  SampleRow top = Row(g, none, none);
  top.num_top_logprobs = 2;
  const SampleResult t = SampleToken(logits.data(), 6, top);
  REQUIRE(t.top_logprobs.size() == 2);
  CHECK(t.top_logprobs[0].token == 1);
  CHECK(t.top_logprobs[1].token == 3);

  // Seeded sampling: the same draws as sampling the processed logits directly, every counter.
  SamplingParams s;
  s.temperature = 0.9f;
  s.top_p = 0.9f;
  s.presence_penalty = 1.0f;
  s.repetition_penalty = 1.3f;
  s.allowed_token_ids = {0, 1, 2, 5};
  const std::vector<int32_t> prompt = {5}, output = {1, 1, 2};
  const std::vector<float> processed = Process(logits, s, prompt, output);
  std::set<int32_t> seen;
  for (uint64_t counter = 0; counter < 400; ++counter) {
    SampleRow row = Row(s, prompt, output);
    row.counter = counter;
    const SampleResult got = SampleToken(logits.data(), 6, row);
    const SampleResult want = SampleToken(logits.data(), processed.data(), 6, s, row.seed, counter, 0, -1);
    REQUIRE(got.token == want.token);
    CHECK(got.logprob == Approx(LogSoftmaxOf(logits, static_cast<size_t>(got.token))).margin(1e-6));
    seen.insert(got.token);
  }
  CHECK(seen.count(3) == 0);  // not allowed
  CHECK(seen.count(4) == 0);
  CHECK(seen.size() >= 3);  // the draws do vary
  // ... and they differ from the unprocessed draws somewhere.
  int differ = 0;
  for (uint64_t counter = 0; counter < 100; ++counter) {
    differ += SampleToken(logits.data(), processed.data(), 6, s, 7, counter, 0, -1).token !=
              SampleToken(logits.data(), 6, s, 7, counter, 0, -1).token;
  }
  CHECK(differ > 0);
}

TEST_CASE("penalties change greedy decoding step by step", "[sampler][logits]") {
  // A "model" whose logits never change: greedy repeats token 2 forever without penalties;
  // with a frequency penalty of 1 each repeat costs 1, so the draws rotate (ties: lowest id).
  const std::vector<float> logits = {0.0f, 1.5f, 2.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 1.0f;
  std::vector<int32_t> out;
  for (int i = 0; i < 6; ++i) out.push_back(SampleToken(logits.data(), 4, Row(p, {}, out)).token);
  CHECK(out == std::vector<int32_t>{2, 1, 2, 3, 1, 0});
}

TEST_CASE("every token masked: the draw is token 0, as on the device", "[sampler][logits]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const std::vector<int32_t> none;
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.allowed_token_ids = {2};
    p.bad_words_token_ids = {{2}};
    CHECK(SampleToken(logits.data(), 3, Row(p, {}, none)).token == 0);
  }
}

TEST_CASE("RowEntries: one sorted entry per token, masks and bias merged", "[sampler][logits]") {
  SamplingParams p;
  p.logit_bias = {{9, 2.0f}, {3, -1.0f}};
  p.bad_words_token_ids = {{9}, {7, 3}};
  auto lp = LogitsProcessing::For(p, 2, {3, 12});
  const std::vector<int32_t> output = {7};
  const std::vector<LogitsEntry> e = RowEntries(*lp, output, {});
  REQUIRE(e.size() == 3);
  CHECK((e[0].token == 3 && e[0].bias == -1.0f && e[0].masked));  // bias, bad word, min_tokens
  CHECK((e[1].token == 9 && e[1].bias == 2.0f && e[1].masked));
  CHECK((e[2].token == 12 && e[2].bias == 0.0f && e[2].masked));
  const std::vector<int32_t> two = {7, 1};
  const std::vector<LogitsEntry> later = RowEntries(*lp, two, {});
  REQUIRE(later.size() == 2);
  CHECK((later[0].token == 3 && !later[0].masked));
  CHECK((later[1].token == 9 && later[1].masked));
}

// A constraint that masks the ids below the number of tokens generated so far, plus 20 when a
// draft row follows token 5 (structured output's interface; its grammars are tested with the
// tokenizer).
class CountingConstraint final : public TokenConstraint {
 public:
  void Masked(std::span<const int32_t> output, std::span<const int32_t> draft,
              std::vector<int32_t>* masked) const override {
    const size_t n = output.size() + draft.size();
    for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) masked->push_back(id);
    if (!draft.empty() && draft.back() == 5) masked->push_back(20);
  }
};

TEST_CASE("RowEntries: a constraint's masks merged with the other entries", "[sampler][logits]") {
  SamplingParams p;
  p.logit_bias = {{1, 2.0f}, {9, -1.0f}};
  p.constraint = std::make_shared<CountingConstraint>();
  REQUIRE(p.processes_logits());
  auto lp = LogitsProcessing::For(p, 0, {});
  const std::vector<int32_t> output = {4, 4, 4};
  const std::vector<int32_t> draft = {5};
  const std::vector<LogitsEntry> e = RowEntries(*lp, output, draft);
  REQUIRE(e.size() == 6);  // 0..3 masked (bias kept on 1), 9 biased, 20 masked
  for (int i = 0; i < 4; ++i) CHECK((e[i].token == i && e[i].masked));
  CHECK(e[1].bias == 2.0f);
  CHECK((e[4].token == 9 && !e[4].masked && e[4].bias == -1.0f));
  CHECK((e[5].token == 20 && e[5].masked));
  // The processed logits: masked tokens at -inf, the rest biased; the draw avoids them.
  const std::vector<float> logits(24, 1.0f);
  const auto out = Process(logits, p, {}, output, draft);
  for (int i = 0; i < 4; ++i) CHECK(out[i] == -kInf);
  CHECK(out[9] == 0.0f);
  CHECK(out[20] == -kInf);
  CHECK(out[21] == 1.0f);
  p.temperature = 0.0f;
  std::vector<float> greedy(24, 0.0f);
  greedy[2] = 5.0f;  // the raw argmax, masked after two tokens
  CHECK(SampleToken(greedy.data(), 24, Row(p, {}, {})).token == 2);
  CHECK(SampleToken(greedy.data(), 24, Row(p, {}, {7, 7, 7})).token == 3);
}

TEST_CASE("RowEntriesOf: every row's entries, structured rows on several threads", "[sampler][logits]") {
  // Rows with a constraint, with a bias only, with nothing, not needed, speculative: the same
  // entries as RowEntries row by row, whatever the thread count.
  auto constraint = std::make_shared<CountingConstraint>();
  std::vector<std::vector<int32_t>> outputs(40);
  std::vector<SampleRow> rows(40);
  for (int r = 0; r < 40; ++r) {
    outputs[r].assign(static_cast<size_t>(r % 7), 4);
    SamplingParams p;
    if (r % 3 != 2) p.constraint = constraint;
    if (r % 4 == 0) p.logit_bias = {{r, 1.0f}};
    rows[r].params = p;
    rows[r].processing = LogitsProcessing::For(p, 0, {});
    rows[r].output_tokens = outputs[r];
    rows[r].needed = r % 5 != 4;
    if (r % 6 == 1) rows[r].draft_tokens = {5};
  }
  for (size_t threads : {size_t{1}, size_t{2}, size_t{8}}) {
    const std::vector<std::vector<LogitsEntry>> all = RowEntriesOf(rows, threads);
    REQUIRE(all.size() == rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      INFO("threads " << threads << " row " << r);
      if (!rows[r].needed || rows[r].processing == nullptr) {
        CHECK(all[r].empty());
        continue;
      }
      const std::vector<LogitsEntry> want =
          RowEntries(*rows[r].processing, rows[r].output_tokens, rows[r].draft_tokens);
      REQUIRE(all[r].size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        CHECK(all[r][i].token == want[i].token);
        CHECK(all[r][i].bias == want[i].bias);
        CHECK(all[r][i].masked == want[i].masked);
      }
    }
  }
}

TEST_CASE("logits processing parameters are validated, naming them", "[sampler][logits]") {
  auto message = [](const SamplingParams& p, int64_t vocab = 0) {
    return std::string(p.Validate(vocab).message());
  };
  SamplingParams p;
  p.presence_penalty = 2.5f;
  CHECK_THAT(message(p), Catch::Contains("presence_penalty"));
  p = {};
  p.frequency_penalty = -2.01f;
  CHECK_THAT(message(p), Catch::Contains("frequency_penalty"));
  p = {};
  p.repetition_penalty = 0.0f;
  CHECK_THAT(message(p), Catch::Contains("repetition_penalty"));
  p.repetition_penalty = 2.5f;
  CHECK_THAT(message(p), Catch::Contains("repetition_penalty"));
  p = {};
  p.logit_bias = {{3, 101.0f}};
  CHECK_THAT(message(p), Catch::Contains("logit_bias"));
  p.logit_bias = {{10, 1.0f}};
  CHECK(p.Validate().ok());
  CHECK_THAT(message(p, 10), Catch::Contains("logit_bias") && Catch::Contains("vocabulary"));
  p = {};
  p.allowed_token_ids = {1, 10};
  CHECK_THAT(message(p, 10), Catch::Contains("allowed_token_ids"));
  p = {};
  p.bad_words_token_ids = {{1}, {2, 10}};
  CHECK_THAT(message(p, 10), Catch::Contains("bad_words"));
  p.bad_words_token_ids = {{}};
  CHECK_THAT(message(p), Catch::Contains("bad_words"));
  p = {};
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {9, 100.0f}};
  CHECK(p.Validate(10).ok());
}

// Prompt logprobs (EngineRequest::prompt_logprobs, vLLM's prompt_logprobs) on the CPU backend:
// every prompt token's log-probability, rank and top tokens equal a direct computation from
// the full-sequence logits (Generator::PromptLogits), also when the prefill runs in chunks
// and next to other requests; they come on the first event only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "engine/engine.h"
#include "engine/generator.h"
#include "test_engine_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

struct Expected {
  double logprob = 0;
  int64_t rank = 0;
  std::vector<std::pair<int32_t, double>> top;  // best first (ties: lower id first)
};

// From the logits row at position p - 1: the log-softmax of prompt[p], its rank (tokens with
// a logit >= its own) and the k best tokens.
Expected Direct(const float* row, int64_t vocab, int32_t token, int k) {
  const float mx = *std::max_element(row, row + vocab);
  double z = 0;
  for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v] - mx));
  const double lse = mx + std::log(z);
  Expected e;
  e.logprob = row[token] - lse;
  for (int64_t v = 0; v < vocab; ++v) e.rank += row[v] >= row[token] ? 1 : 0;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  for (int i = 0; i < k; ++i) e.top.emplace_back(ids[i], row[ids[i]] - lse);
  return e;
}

// Reads a stream to its end: the prompt logprobs of its events (one event must carry them:
// `events_with` counts those) and its tokens.
struct Read {
  std::vector<PromptTokenLogprob> prompt;
  int events_with = 0;
  std::vector<int32_t> tokens;
  bool finished = false;
};
Read ReadAll(RequestStream& stream) {
  Read r;
  while (auto ev = stream.Next(std::chrono::seconds(60))) {
    if (!ev->prompt_logprobs.empty()) {
      ++r.events_with;
      r.prompt = ev->prompt_logprobs;
      CHECK_FALSE(ev->tokens.empty());  // with the first token
    }
    for (const GeneratedToken& t : ev->tokens) r.tokens.push_back(t.token);
    if (ev->finished) {
      r.finished = true;
      break;
    }
  }
  return r;
}

std::vector<int32_t> RandomPrompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(3 + rng() % 500);
  return p;
}

}  // namespace

TEST_CASE("prompt logprobs equal the log-softmax of the full-sequence logits", "[engine]") {
  TinyModel tm(512);
  const int64_t V = tm.config.vocab_size;
  // 16 tokens a step: the 45-token prompt is prefilled in 3 chunks (the others share steps).
  const int64_t budget = GENERATE(int64_t{2048}, int64_t{16});
  INFO("max_num_batched_tokens " << budget);
  EngineOptions options;
  options.max_num_batched_tokens = budget;
  Engine engine(*tm.runner, nullptr, options);
  engine.Start();
  const std::vector<int32_t> prompt = RandomPrompt(45, 7);
  const int k = 3;
  EngineRequest r = Request("plp", prompt, 4);
  r.prompt_logprobs = k;
  r.ignore_eos = true;
  EngineRequest other = Request("other", RandomPrompt(30, 8), 6);  // no prompt logprobs
  other.ignore_eos = true;
  auto s_other = engine.Submit(other);
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  REQUIRE(s_other.ok());

  const Read read = ReadAll(**s);
  REQUIRE(read.finished);
  const std::vector<PromptTokenLogprob>& got = read.prompt;
  const std::vector<int32_t>& generated = read.tokens;
  const Collected o = Drain(**s_other);
  CHECK(o.tokens.size() == 6);
  CHECK(read.events_with == 1);
  REQUIRE(got.size() == prompt.size() - 1);
  CHECK(generated.size() == 4);

  Generator gen(*tm.model, tm.backend, {.num_kv_slots = 256, .max_step_tokens = 64});
  auto logits = gen.PromptLogits(prompt);
  REQUIRE(logits.ok());
  for (size_t p = 1; p < prompt.size(); ++p) {
    INFO("prompt position " << p);
    const PromptTokenLogprob& e = got[p - 1];
    const Expected want =
        Direct(logits->data<float>() + static_cast<int64_t>(p - 1) * V, V, prompt[p], k);
    CHECK(e.token == prompt[p]);
    CHECK(e.logprob == Approx(want.logprob).margin(1e-4));
    CHECK(e.rank == want.rank);
    REQUIRE(e.top_logprobs.size() == static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) {
      CHECK(e.top_logprobs[i].token == want.top[i].first);
      CHECK(e.top_logprobs[i].logprob == Approx(want.top[i].second).margin(1e-4));
    }
  }
  // The generated tokens are those of the same request without prompt logprobs.
  EngineRequest plain = Request("plain", prompt, 4);
  plain.ignore_eos = true;
  auto sp = engine.Submit(plain);
  REQUIRE(sp.ok());
  CHECK(Drain(**sp).tokens == generated);
  WaitIdle(engine);
}

TEST_CASE("prompt logprobs: k = 0, one-token prompts, validation", "[engine]") {
  TinyModel tm(256);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  EngineRequest r = Request("zero", {5, 6, 7}, 2);
  r.prompt_logprobs = 0;
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  const Read zero = ReadAll(**s);
  REQUIRE(zero.finished);
  CHECK(zero.events_with == 1);
  REQUIRE(zero.prompt.size() == 2);
  for (const PromptTokenLogprob& e : zero.prompt) {
    CHECK(e.top_logprobs.empty());
    CHECK(e.rank >= 1);
    CHECK(e.logprob <= 0.0f);
  }
  CHECK(zero.prompt[0].token == 6);
  CHECK(zero.prompt[1].token == 7);
  // One prompt token: nothing to report (the response's list is just [null]).
  EngineRequest one = Request("one", {9}, 2);
  one.prompt_logprobs = 5;
  auto s1 = engine.Submit(one);
  REQUIRE(s1.ok());
  const Read single = ReadAll(**s1);
  REQUIRE(single.finished);
  CHECK(single.events_with == 0);
  CHECK(single.tokens.size() == 2);
  EngineRequest bad = Request("bad", {5, 6}, 2);
  bad.prompt_logprobs = kMaxTopLogprobs + 1;
  CHECK(engine.Submit(bad).status().code() == StatusCode::kInvalidArgument);
  bad.prompt_logprobs = 1;
  bad.handoff = true;
  CHECK(engine.Submit(bad).status().code() == StatusCode::kInvalidArgument);
}

// GPU: lookahead decoding on the CUDA backend (graphs with two stacked query tokens and the
// residual capture, the EAGLE-3 head on the device) gives plain decoding's greedy tokens in
// both modes — exactly until a near-tie, where bf16 arithmetic with another batch shape may
// flip the argmax (docs/lookahead.md states the tolerance: the two best log-probabilities of
// plain decoding within 0.05 of each other at the first divergence).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>

#include "runner/cuda/cuda_draft_runner.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "engine/engine.h"
#include "loader/weights.h"
#include "models/eagle3.h"
#include "test_support.h"

using namespace oasis;
using namespace std::chrono_literals;

namespace {

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> margin;  // top-1 minus top-2 log-probability at each position
};

std::vector<Out> RunAll(ModelRunner& runner, DraftRunner* draft, LookaheadMode mode, int n, EngineStats* stats) {
  EngineOptions o;
  o.lookahead = mode;
  o.max_num_batched_tokens = 256;
  Engine engine(runner, nullptr, o, mode == LookaheadMode::kOff ? nullptr : draft);
  engine.Start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    for (int j = 0; j < 5 + 7 * i; ++j) r.prompt.push_back(static_cast<int32_t>((31 * i + 17 * j + 3) % 250 + 1));
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.detokenize = false;
    r.logprobs = true;
    r.num_top_logprobs = 2;
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  std::vector<Out> outs(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    while (true) {
      auto ev = streams[i]->Next(60s);
      REQUIRE(ev.has_value());
      for (const GeneratedToken& t : ev->tokens) {
        outs[i].tokens.push_back(t.token);
        outs[i].margin.push_back(t.top_logprobs.size() == 2 ? t.top_logprobs[0].logprob - t.top_logprobs[1].logprob
                                                            : 1e9f);
      }
      if (ev->finished) {
        REQUIRE(ev->finish_reason == FinishReasonKind::kLength);
        break;
      }
    }
  }
  if (stats) *stats = engine.Stats();
  engine.Stop();
  return outs;
}

}  // namespace

TEST_CASE("lookahead decoding on CUDA keeps plain greedy decoding's tokens", "[gpu][lookahead]") {
  auto dir = testing::FixturePath("models/qwen3-tiny");
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  auto backend = CudaBackend::Create();
  REQUIRE(backend.ok());
  auto model = DecoderLM::Create(*config, **weights, **backend);
  REQUIRE(model.ok());
  auto head = Eagle3Head::Load(testing::FixturePath("eagle3/qwen3-tiny"), **model, **backend);
  REQUIRE(head.ok());
  CudaGraphOptions go{.num_kv_slots = 2048, .max_batch = 16, .max_context = 512};
  auto runner = CudaGraphRunner::Create(**model, **backend, go);
  REQUIRE(runner.ok());
  CudaDraftRunner draft(**head, **backend, 2048);

  const int n = 12;
  const std::vector<Out> plain = RunAll(**runner, nullptr, LookaheadMode::kOff, n, nullptr);
  for (LookaheadMode mode : {LookaheadMode::kReject, LookaheadMode::kSpeculate}) {
    EngineStats stats;
    const std::vector<Out> got = RunAll(**runner, &draft, mode, n, &stats);
    INFO("mode " << LookaheadModeName(mode));
    CHECK(stats.lookahead.draft_tokens_proposed_total > 0);
    // Reject queues the head's step behind the target's on the device; speculate runs it after.
    if (mode == LookaheadMode::kReject) {
      CHECK(stats.lookahead.draft_chained_steps_total > 0);
    } else {
      CHECK(stats.lookahead.draft_chained_steps_total == 0);
    }
    int diverged = 0;
    for (int i = 0; i < n; ++i) {
      const Out &a = plain[static_cast<size_t>(i)], &b = got[static_cast<size_t>(i)];
      REQUIRE(b.tokens.size() == a.tokens.size());
      size_t same = 0;
      while (same < a.tokens.size() && a.tokens[same] == b.tokens[same]) ++same;
      if (same < a.tokens.size()) {
        ++diverged;
        INFO("request " << i << " diverges at " << same << " with margin " << a.margin[same]);
        CHECK(a.margin[same] < 0.05f);
      }
    }
    CHECK(diverged <= n / 4);
  }
  CHECK((*runner)->num_graphs() >= 2);  // plain and stacked decode steps both replayed graphs
}

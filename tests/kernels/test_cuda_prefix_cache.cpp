// GPU: automatic prefix caching on the CUDA backend (docs/prefix_caching.md). A prompt that
// adopts cached blocks runs its prefill from the cached boundary (graphs and the prefill
// kernel reading blocks other sequences wrote); with caching on, the greedy tokens equal
// caching off — exactly until a near-tie, where bf16 arithmetic over another batch shape may
// flip the argmax (the two best log-probabilities within 0.05 of each other at the first
// divergence, as docs/lookahead.md states for lookahead) — with and without lookahead (the
// EAGLE-3 head's blocks cached along), and every block comes back.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "kvcache/host_prefix_tier.h"
#include "loader/weights.h"
#include "models/eagle3.h"
#include "runner/cuda/cuda_draft_runner.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "test_support.h"

using namespace oasis;
using namespace std::chrono_literals;

namespace {

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> margin;  // top-1 minus top-2 log-probability at each position
  int64_t cached = 0;
};

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p;
  for (int j = 0; j < 100; ++j) p.push_back((53 * j + 7) % 250 + 1);  // a shared 100-token prefix
  const int doc = i % 3;  // one of three 40-token "documents"
  for (int j = 0; j < 40; ++j) p.push_back((29 * j + 11 * doc + 5) % 250 + 1);
  for (int j = 0; j < 3 + 5 * i; ++j) p.push_back((31 * i + 17 * j + 3) % 250 + 1);
  return p;
}

// The qwen3-tiny fixture on a CUDA backend.
struct TinyCuda {
  TinyCuda() {
    const auto dir = testing::FixturePath("models/qwen3-tiny");
    auto c = LoadModelConfig(dir);
    REQUIRE(c.ok());
    config = *c;
    auto w = OpenSafetensorsWeights(dir);
    REQUIRE(w.ok());
    weights = std::move(*w);
    auto b = CudaBackend::Create();
    REQUIRE(b.ok());
    backend = std::move(*b);
    auto m = DecoderLM::Create(config, *weights, *backend);
    REQUIRE(m.ok());
    model = std::move(*m);
  }
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<DecoderLM> model;
};

// A greedy request with two top log-probabilities per token (the margins of Out).
EngineRequest GreedyRequest(std::string id, std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.detokenize = false;
  r.logprobs = true;
  r.num_top_logprobs = 2;
  return r;
}

// Reads a request's stream to its end.
Out Collect(RequestStream& s, FinishReasonKind* reason) {
  Out out;
  while (true) {
    auto ev = s.Next(60s);
    REQUIRE(ev.has_value());
    for (const GeneratedToken& t : ev->tokens) {
      out.tokens.push_back(t.token);
      out.margin.push_back(t.top_logprobs.size() == 2 ? t.top_logprobs[0].logprob - t.top_logprobs[1].logprob
                                                      : 1e9f);
    }
    if (ev->finished) {
      *reason = ev->finish_reason;
      out.cached = ev->cached_tokens;
      return out;
    }
  }
}

// The engine's stats once every request has ended and every block is back.
EngineStats IdleStats(Engine& engine) {
  EngineStats st;
  for (int i = 0; i < 200; ++i) {
    st = engine.Stats();
    if (st.kv.num_free_slots == st.kv.num_slots && st.requests.num_running == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  return st;
}

// Half the requests one after another (each sees the cache the earlier ones left), then the
// rest together (siblings of one prefix admitted in one step).
std::vector<Out> Run(ModelRunner& runner, DraftRunner* draft, bool caching, int n, EngineStats* stats) {
  EngineOptions o;
  o.enable_prefix_caching = caching;
  o.lookahead = draft != nullptr ? LookaheadMode::kReject : LookaheadMode::kOff;
  o.max_num_batched_tokens = 256;
  Engine engine(runner, nullptr, o, draft);
  engine.Start();
  auto submit = [&](int i) {
    auto s = engine.Submit(GreedyRequest("p" + std::to_string(i), Prompt(i), 20));
    REQUIRE(s.ok());
    return *s;
  };
  auto collect = [](RequestStream& s) {
    FinishReasonKind reason = FinishReasonKind::kNone;
    Out out = Collect(s, &reason);
    REQUIRE(reason == FinishReasonKind::kLength);
    return out;
  };
  std::vector<Out> outs;
  for (int i = 0; i < n / 2; ++i) outs.push_back(collect(*submit(i)));
  std::vector<std::shared_ptr<RequestStream>> together;
  for (int i = n / 2; i < n; ++i) together.push_back(submit(i));
  for (auto& s : together) outs.push_back(collect(*s));
  *stats = IdleStats(engine);
  engine.Stop();
  return outs;
}

}  // namespace

TEST_CASE("prefix caching on CUDA keeps greedy decoding's tokens", "[gpu][prefix]") {
  TinyCuda tiny;
  auto head = Eagle3Head::Load(testing::FixturePath("eagle3/qwen3-tiny"), *tiny.model, *tiny.backend);
  REQUIRE(head.ok());
  CudaGraphOptions go{.num_kv_slots = 2048, .max_batch = 16, .max_context = 512};
  auto runner = CudaGraphRunner::Create(*tiny.model, *tiny.backend, go);
  REQUIRE(runner.ok());
  CudaDraftRunner draft(**head, *tiny.backend, 2048);

  const int n = 12;
  for (bool lookahead : {false, true}) {
    INFO((lookahead ? "lookahead reject" : "plain"));
    EngineStats off_stats, on_stats;
    const std::vector<Out> off = Run(**runner, lookahead ? &draft : nullptr, false, n, &off_stats);
    const std::vector<Out> on = Run(**runner, lookahead ? &draft : nullptr, true, n, &on_stats);
    int diverged = 0;
    int64_t cached = 0;
    for (int i = 0; i < n; ++i) {
      const Out &a = off[static_cast<size_t>(i)], &b = on[static_cast<size_t>(i)];
      REQUIRE(b.tokens.size() == a.tokens.size());
      CHECK(a.cached == 0);
      cached += b.cached;
      size_t same = 0;
      while (same < a.tokens.size() && a.tokens[same] == b.tokens[same]) ++same;
      if (same < a.tokens.size()) {
        ++diverged;
        INFO("request " << i << " diverges at " << same << " with margin " << a.margin[same]);
        CHECK(a.margin[same] < 0.05f);
      }
    }
    CHECK(diverged <= n / 4);
    CHECK(on[0].cached == 0);
    CHECK(on[1].cached >= 96);  // the shared 100-token prefix's six full blocks at least
    CHECK(cached >= (n - 1) * 96);
    CHECK(on_stats.kv.prefix_cache_hits_total == cached);
    CHECK(on_stats.kv.num_free_slots == on_stats.kv.num_slots);
    CHECK(on_stats.kv.num_free_draft_slots == on_stats.kv.num_draft_slots);
  }
}

// Runs `prompts` one after another (greedy, 10 tokens each) on a fresh engine.
std::vector<Out> RunInTurn(ModelRunner& runner, bool caching, double host_tier_bytes,
                           const std::vector<std::vector<int32_t>>& prompts, EngineStats* stats,
                           DraftRunner* draft = nullptr) {
  EngineOptions o;
  o.enable_prefix_caching = caching;
  o.prefix_cache_host_bytes = host_tier_bytes;
  o.max_num_batched_tokens = 256;
  o.lookahead = draft != nullptr ? LookaheadMode::kReject : LookaheadMode::kOff;
  Engine engine(runner, nullptr, o, draft);
  engine.Start();
  std::vector<Out> outs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto st = engine.Submit(GreedyRequest("h" + std::to_string(i), prompts[i], 10));
    REQUIRE(st.ok());
    FinishReasonKind reason = FinishReasonKind::kNone;
    outs.push_back(Collect(**st, &reason));
  }
  *stats = IdleStats(engine);
  engine.Stop();
  return outs;
}

TEST_CASE("prefix caching on CUDA: the host tier reloads evicted prefixes", "[gpu][prefix][host]") {
  // A pool of 64 head-blocks (32 blocks of 2 KV heads, 512 tokens): prompt "b" evicts the
  // blocks prompt "a" left cached; "a2" (= "a" + a question) finds them only in the host tier.
  TinyCuda tiny;
  CudaGraphOptions go{.num_kv_slots = 64, .max_batch = 16, .max_context = 512};
  auto runner = CudaGraphRunner::Create(*tiny.model, *tiny.backend, go);
  REQUIRE(runner.ok());
  const double tier_bytes =
      64.0 * static_cast<double>(HostPrefixTier::BytesPerSlot(tiny.config.num_hidden_layers, tiny.config.head_dim,
                                                              tiny.backend->activation_dtype())) *
      static_cast<double>(tiny.config.num_key_value_heads);
  std::vector<int32_t> a, b;
  for (int j = 0; j < 170; ++j) a.push_back((37 * j + 5) % 250 + 1);
  for (int j = 0; j < 480; ++j) b.push_back((41 * j + 9) % 250 + 1);
  std::vector<int32_t> a2 = a;
  for (int j = 0; j < 21; ++j) a2.push_back((13 * j + 2) % 250 + 1);
  const std::vector<std::vector<int32_t>> prompts = {a, b, a2};
  auto head = Eagle3Head::Load(testing::FixturePath("eagle3/qwen3-tiny"), *tiny.model, *tiny.backend);
  REQUIRE(head.ok());
  CudaDraftRunner draft_runner(**head, *tiny.backend, 64);
  const bool lookahead = GENERATE(false, true);  // with the draft head: its blocks reload too
  INFO((lookahead ? "lookahead reject" : "plain"));
  DraftRunner* draft = lookahead ? &draft_runner : nullptr;
  EngineStats off_stats, gpu_stats, host_stats;
  const std::vector<Out> off = RunInTurn(**runner, false, 0, prompts, &off_stats, draft);
  const std::vector<Out> gpu = RunInTurn(**runner, true, 0, prompts, &gpu_stats, draft);
  const std::vector<Out> host = RunInTurn(**runner, true, tier_bytes, prompts, &host_stats, draft);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Out &x = off[i], &y = host[i];
    REQUIRE(y.tokens.size() == x.tokens.size());
    size_t same = 0;
    while (same < x.tokens.size() && x.tokens[same] == y.tokens[same]) ++same;
    if (same < x.tokens.size()) {
      INFO("request " << i << " diverges at " << same << " with margin " << x.margin[same]);
      CHECK(x.margin[same] < 0.05f);
    }
  }
  const int64_t in_pool = gpu[2].cached;  // what "b" left of "a" in the pool
  CHECK(in_pool < 160);
  CHECK(host[2].cached == 160);
  CHECK(host_stats.kv.prefix_cache_host_hits_total == 160 - in_pool);
  CHECK(host_stats.kv.prefix_cache_host_reloaded_bytes_total > 0);
  CHECK(host_stats.kv.num_free_slots == host_stats.kv.num_slots);
  CHECK(host_stats.kv.num_free_draft_slots == host_stats.kv.num_draft_slots);
}

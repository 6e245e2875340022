// Engine on the CPU backend with the tiny fixture models (vocab 512, no tokenizer):
// batching invariance (a request's greedy or seeded output is the same alone and among 32
// concurrent requests, also with a pool small enough to force preemptions and a budget small
// enough to force chunked prefill), every KV block back in the pool, abort, stop ids,
// length limits, validation errors, runner failures and stats.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>
#include "engine/engine.h"
#include "engine/generator.h"
#include "test_engine_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

// 32 requests: prompts of 1..70 ids, 1..40 new tokens; a third seeded sampling, some
// honouring EOS, a few with logprobs.
std::vector<EngineRequest> Workload() {
  std::mt19937_64 rng(2024);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 70);
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 500);
    EngineRequest r = Request("req-" + std::to_string(i), std::move(prompt),
                              1 + static_cast<int64_t>(rng() % 40));
    r.ignore_eos = i % 4 != 0;
    if (i % 3 == 1) {
      r.sampling.temperature =
          20.0f;  // the random tiny model is so peaked that lower T stays greedy
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    }
    if (i % 5 == 0) r.num_top_logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Submits `reqs` from `threads` threads at once (each drains its own streams).
std::vector<Collected> RunConcurrently(Engine& engine, const std::vector<EngineRequest>& reqs,
                                       int threads) {
  std::vector<Collected> out(reqs.size());
  std::vector<std::thread> pool;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::pair<size_t, std::shared_ptr<RequestStream>>> mine;
      for (size_t i = static_cast<size_t>(t); i < reqs.size(); i += static_cast<size_t>(threads)) {
        auto s = engine.Submit(reqs[i]);
        if (!s.ok()) {
          ++failures;
          continue;
        }
        mine.emplace_back(i, *s);
      }
      for (auto& [i, s] : mine) out[i] = Collect(*s);
    });
  }
  for (auto& th : pool) th.join();
  REQUIRE(failures == 0);
  for (const Collected& c : out) CheckCollected(c);
  return out;
}

}  // namespace

TEST_CASE("outputs are the same alone and among 32 concurrent requests", "[engine]") {
  const std::vector<EngineRequest> reqs = Workload();
  // References: each request alone, with a roomy pool and budget.
  std::vector<Collected> alone;
  {
    TinyModel tm(512);
    Engine engine(*tm.runner, nullptr, {});
    engine.Start();
    for (const EngineRequest& r : reqs) {
      auto s = engine.Submit(r);
      REQUIRE(s.ok());
      alone.push_back(Drain(**s));
    }
    // One request at a time, each prompt in one chunk: a prefill step giving the first token,
    // then one decode-only step per further token.
    const EngineStats st = WaitIdle(engine);
    int64_t tokens = 0;
    for (const Collected& c : alone) tokens += static_cast<int64_t>(c.tokens.size());
    CHECK(st.loop.steps_total == tokens);
    CHECK(st.loop.decode_steps_total == tokens - static_cast<int64_t>(reqs.size()));
    CHECK(st.loop.decode_step_seconds_total > 0.0);
    CHECK(st.loop.decode_step_seconds_total <= st.loop.step_seconds_total);
    CHECK(st.loop.decode_model_step_seconds_total <= st.loop.decode_step_seconds_total);
    CHECK(st.loop.decode_model_step_seconds_total <= st.loop.model_step_seconds_total);
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    REQUIRE(alone[i].error.ok());
    const bool by_eos = alone[i].reason == FinishReasonKind::kStop;
    CHECK((by_eos || static_cast<int64_t>(alone[i].tokens.size()) == reqs[i].max_tokens));
    CHECK(alone[i].completion_tokens == static_cast<int64_t>(alone[i].tokens.size()));
    CHECK(alone[i].prompt_tokens == static_cast<int64_t>(reqs[i].prompt.size()));
    for (size_t n : alone[i].top_logprobs)
      CHECK(n == static_cast<size_t>(reqs[i].num_top_logprobs));
  }
  // The seeded requests really sample (the comparison below would be weak otherwise).
  int varied = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].sampling.seed &&
        std::set<int32_t>(alone[i].tokens.begin(), alone[i].tokens.end()).size() > 2)
      ++varied;
  }
  CHECK(varied >= 5);

  struct Config {
    const char* name;
    int64_t slots, budget, max_seqs;
    bool expect_preemption;
  };
  const Config configs[] = {
      {"roomy pool, large budget", 512, 2048, 256, false},
      {"small budget: chunked prefill", 512, 24, 256, false},
      {"small pool and budget: preemptions", 28, 40, 16, true},
  };
  for (const Config& cfg : configs) {
    DYNAMIC_SECTION(cfg.name) {
      TinyModel tm(cfg.slots);
      EngineOptions opt;
      opt.max_num_batched_tokens = cfg.budget;
      opt.max_num_seqs = cfg.max_seqs;
      Engine engine(*tm.runner, nullptr, opt);
      engine.Start();
      std::vector<Collected> together = RunConcurrently(engine, reqs, 4);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO(reqs[i].id << " prompt " << reqs[i].prompt.size() << " max_tokens "
                        << reqs[i].max_tokens);
        CHECK(together[i].error.ok());
        CHECK(together[i].tokens == alone[i].tokens);
        CHECK(together[i].reason == alone[i].reason);
      }
      EngineStats st = WaitIdle(engine);
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.kv.usage == 0.0);
      CHECK(st.requests.finished_total == 32);
      CHECK(st.ttft.count == 32);
      CHECK(st.e2e.count == 32);
      int64_t generated = 0, prompt = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        generated += static_cast<int64_t>(together[i].tokens.size());
        prompt += static_cast<int64_t>(reqs[i].prompt.size());
      }
      CHECK(st.requests.generation_tokens_total == generated);
      CHECK(st.requests.prompt_tokens_total == prompt);
      CHECK(st.itl.count == generated - 32);
      // The per-request histograms: one observation per finished request; the token counts
      // sum to the totals; queue + inference add up to at most the end-to-end latency.
      const EngineStats::PerRequest& pr = st.per_request;
      for (const Histogram* h : {&pr.queue_seconds, &pr.prefill_seconds, &pr.decode_seconds,
                                 &pr.inference_seconds, &pr.prompt_tokens, &pr.generation_tokens})
        CHECK(h->count == 32);
      CHECK(pr.prompt_tokens.sum == static_cast<double>(prompt));
      CHECK(pr.generation_tokens.sum == static_cast<double>(generated));
      CHECK(pr.queue_seconds.sum + pr.inference_seconds.sum <= st.e2e.sum + 1e-9);
      CHECK(pr.prefill_seconds.sum + pr.decode_seconds.sum ==
            Approx(pr.inference_seconds.sum).margin(1e-9));
      CHECK(pr.prompt_tokens.bounds.front() == 1.0);
      CHECK(pr.prompt_tokens.bounds[1] == 2.0);
      CHECK(pr.prompt_tokens.bounds[2] == 5.0);
      CHECK(st.requests.stop_total + st.requests.length_total == 32);
      if (cfg.expect_preemption) CHECK(st.requests.preemptions_total > 0);
      if (!cfg.expect_preemption) CHECK(st.requests.preemptions_total == 0);
      engine.Stop();
      CHECK(engine.Stats().kv.num_free_slots == cfg.slots);
    }
  }
}

TEST_CASE("seeded sampling is reproducible; different seeds differ", "[engine]") {
  TinyModel tm(256);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  auto run = [&](const std::string& id, uint64_t seed) {
    EngineRequest r = Request(id, {5, 6, 7, 8}, 24);
    r.sampling.temperature = 20.0f;  // the random tiny model is very peaked at T = 1
    r.sampling.seed = seed;
    r.ignore_eos = true;
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    return Drain(**s).tokens;
  };
  const auto a = run("a", 7), b = run("b", 7), c = run("c", 8);
  CHECK(a.size() == 24);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("abort finishes a running request with kAbort and frees its blocks", "[engine]") {
  TinyModel tm(128);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  EngineRequest r = Request("long", {1, 2, 3, 4, 5}, 900);
  r.ignore_eos = true;
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  auto first = (*s)->Next(60s);
  REQUIRE(first.has_value());
  REQUIRE_FALSE(first->finished);
  // Stats are published after each step: wait for the one that shows the request's blocks.
  int64_t free_slots = 128;
  for (int i = 0; i < 1000 && free_slots == 128; ++i, std::this_thread::sleep_for(1ms)) {
    free_slots = engine.Stats().kv.num_free_slots;
  }
  CHECK(free_slots < 128);
  engine.Abort("long");
  engine.Abort("no-such-request");  // no-op
  Collected c = Drain(**s);
  CHECK(c.reason == FinishReasonKind::kAbort);
  CHECK(c.tokens.size() + first->tokens.size() < 900);
  EngineStats st = WaitIdle(engine);
  CHECK(st.kv.num_free_slots == 128);
  CHECK(st.requests.abort_total == 1);
  // The id is free again.
  auto again = engine.Submit(Request("long", {1, 2, 3}, 2));
  REQUIRE(again.ok());
  CHECK(Drain(**again).tokens.size() == 2);

  // Stop() aborts what is still live.
  auto pending = engine.Submit(r);
  REQUIRE(pending.ok());
  engine.Stop();
  CHECK(Drain(**pending).reason == FinishReasonKind::kAbort);
  CHECK(engine.Submit(Request("late", {1}, 1)).status().code() == StatusCode::kUnavailable);
}

TEST_CASE("stop token ids, min_tokens, EOS and the context limit", "[engine]") {
  TinyModel tm(256);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  auto run = [&](EngineRequest r) {
    auto s = engine.Submit(std::move(r));
    REQUIRE(s.ok());
    return Drain(**s);
  };
  EngineRequest base = Request("x", {11, 12, 13}, 30);
  base.ignore_eos = true;
  base.sampling.temperature = 20.0f;  // varied ids: greedy repeats one id on this model
  base.sampling.seed = 5;
  const Collected free_run = run(base);
  REQUIRE(free_run.tokens.size() == 30);
  CHECK(free_run.reason == FinishReasonKind::kLength);

  // Stop at the first occurrence of the 6th token.
  const int32_t stop_id = free_run.tokens[5];
  const size_t first = static_cast<size_t>(
      std::find(free_run.tokens.begin(), free_run.tokens.end(), stop_id) - free_run.tokens.begin());
  EngineRequest with_stop = base;
  with_stop.stop_token_ids = {stop_id};
  Collected stopped = run(with_stop);
  CHECK(stopped.reason == FinishReasonKind::kStop);
  CHECK(stopped.stop_reason == std::to_string(stop_id));
  CHECK(stopped.tokens ==
        std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + first + 1));

  // min_tokens past every occurrence: the stop id is masked until then (vLLM's rule), so it is
  // never drawn; the draws before its first occurrence are the free run's (the Gumbel-max
  // draw only changes where the masked id would have won).
  EngineRequest min = with_stop;
  min.min_tokens = 30;
  const Collected masked = run(min);
  REQUIRE(masked.tokens.size() == 30);
  CHECK(masked.reason == FinishReasonKind::kLength);
  CHECK(std::count(masked.tokens.begin(), masked.tokens.end(), stop_id) == 0);
  CHECK(std::vector<int32_t>(masked.tokens.begin(), masked.tokens.begin() + first) ==
        std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + first));

  // The model's EOS (id 2) as a stop when not ignored: tokens up to the first EOS.
  EngineRequest eos = base;
  eos.ignore_eos = false;
  eos.max_tokens = 30;
  Collected e = run(eos);
  const auto eos_at = std::find(free_run.tokens.begin(), free_run.tokens.end(), 2);
  if (eos_at == free_run.tokens.end()) {
    CHECK(e.tokens == free_run.tokens);
  } else {
    CHECK(e.reason == FinishReasonKind::kStop);
    CHECK(e.tokens == std::vector<int32_t>(free_run.tokens.begin(), eos_at + 1));
  }

  // max_tokens = -1 runs to the usable context: 1024 positions (the pool holds 2048 tokens).
  CHECK(engine.max_context_tokens() == 1024);
  EngineRequest ctx = Request("ctx", std::vector<int32_t>(1000, 7), -1);
  ctx.ignore_eos = true;
  Collected full = run(ctx);
  CHECK(full.reason == FinishReasonKind::kLength);
  CHECK(full.tokens.size() == 24);
}

TEST_CASE("an EOS id outside the vocabulary never stops a generation (no int32 wrap)", "[engine]") {
  EngineRequest r = Request("x", {11, 12, 13}, 30);
  r.sampling.temperature = 20.0f;
  r.sampling.seed = 5;
  std::vector<int32_t> free_tokens;
  {
    TinyModel tm(256);
    Engine engine(*tm.runner, nullptr, {});
    engine.Start();
    EngineRequest free_run = r;
    free_run.ignore_eos = true;
    auto s = engine.Submit(free_run);
    REQUIRE(s.ok());
    free_tokens = Drain(**s).tokens;
  }
  REQUIRE(free_tokens.size() == 30);
  // config.json's EOS 2^32 + (the 6th token): read as int32 it was that token, and the request
  // stopped there.
  const auto dir = testing::MakeTempDir("engine_eos_outside");
  const auto fixture = testing::FixturePath("models/qwen3-tiny");
  std::ifstream in(fixture / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["eos_token_id"] = (int64_t{1} << 32) + free_tokens[5];
  std::ofstream(dir / "config.json") << config.dump();
  std::filesystem::create_symlink(fixture / "model.safetensors", dir / "model.safetensors");
  TinyModel tm(dir, 256);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  const Collected out = Drain(**s);
  CHECK(out.reason == FinishReasonKind::kLength);
  CHECK(out.tokens == free_tokens);
}

TEST_CASE("forced output: the given tokens come out with the model's log-probs", "[engine]") {
  TinyModel tm(256);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  std::mt19937 rng(31);
  std::vector<int32_t> forced(20);
  for (int32_t& t : forced) t = static_cast<int32_t>(3 + rng() % 500);
  EngineRequest r = Request("forced", prompt, 26);
  r.forced_output = forced;
  r.ignore_eos = true;
  r.logprobs = true;
  r.num_top_logprobs = 1;
  r.sampling.temperature = 0.9f;  // forcing overrides any sampling
  r.sampling.seed = 4;
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  const Collected c = Drain(**s);
  REQUIRE(c.tokens.size() == 26);
  CHECK(std::vector<int32_t>(c.tokens.begin(), c.tokens.begin() + 20) ==
        forced);  // then sampled freely
  // Each forced token's log-prob: the log-softmax of the dense logits over prompt + forced.
  Generator gen(*tm.model, tm.backend, {.num_kv_slots = 128, .max_step_tokens = 64});
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), forced.begin(), forced.end());
  auto logits = gen.PromptLogits(all);
  REQUIRE(logits.ok());
  const int64_t V = tm.config.vocab_size;
  for (size_t k = 0; k < forced.size(); ++k) {
    const float* row = logits->data<float>() + static_cast<int64_t>(prompt.size() + k - 1) * V;
    double z = 0;
    const float mx = *std::max_element(row, row + V);
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v] - mx));
    const double want = row[forced[k]] - mx - std::log(z);
    INFO("forced token " << k);
    CHECK(c.logprobs[k] == Approx(want).margin(1e-4));
    CHECK(c.top_logprobs[k] == 1);
  }
  // Out-of-vocabulary forced ids are refused.
  EngineRequest bad = Request("bad", prompt, 4);
  bad.forced_output = {3, 512};
  CHECK(engine.Submit(bad).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Submit validates requests", "[engine]") {
  TinyModel tm(64);  // 32 blocks per head: 512 tokens
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  auto code = [&](EngineRequest r) { return engine.Submit(std::move(r)).status().code(); };
  CHECK(code(Request("a", {}, 4)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("a", {1, 512}, 4)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("a", {1, -1}, 4)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("a", {1}, 0)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("", {1}, 4)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("a", std::vector<int32_t>(1000, 1), 25)) == StatusCode::kOutOfRange);
  CHECK(code(Request("a", std::vector<int32_t>(1024, 1), -1)) == StatusCode::kOutOfRange);
  CHECK(code(Request("a", {1}, std::numeric_limits<int64_t>::max())) == StatusCode::kOutOfRange);
  // The pool holds 512 tokens: a request needing more can never run (InvalidArgument, a 400,
  // never ResourceExhausted, a retryable 429).
  CHECK(code(Request("a", std::vector<int32_t>(500, 1), 13)) == StatusCode::kInvalidArgument);
  CHECK(code(Request("a", std::vector<int32_t>(512, 1), -1)) == StatusCode::kInvalidArgument);
  auto fits = engine.Submit(Request("fits", std::vector<int32_t>(500, 1), 12));
  REQUIRE(fits.ok());
  CHECK(Drain(**fits).error.ok());
  EngineRequest bad = Request("a", {1}, 4);
  bad.sampling.temperature = -1;
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  bad = Request("a", {1}, 4);
  bad.sampling.top_p = 0;
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  bad = Request("a", {1}, 4);
  bad.num_top_logprobs = 21;
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  bad = Request("a", {1}, 4);
  bad.min_tokens = 5;
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  // Without max_tokens min_tokens is held against the room the prompt leaves (1024 - 24).
  bad = Request("a", std::vector<int32_t>(24, 1), -1);
  bad.min_tokens = 1001;
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  bad = Request("a", {1}, 4);
  bad.detokenize = true;  // no tokenizer
  CHECK(code(bad) == StatusCode::kInvalidArgument);
  bad = Request("a", {1}, 4);
  bad.stop = {"x"};
  CHECK(code(bad) == StatusCode::kInvalidArgument);

  EngineRequest ok = Request("dup", {1, 2}, 200);
  ok.ignore_eos = true;
  auto s = engine.Submit(ok);
  REQUIRE(s.ok());
  CHECK(code(ok) == StatusCode::kInvalidArgument);  // duplicate live id
  engine.Abort("dup");
  CHECK(Drain(**s).reason == FinishReasonKind::kAbort);
}

TEST_CASE("the waiting queue is bounded", "[engine]") {
  TinyModel tm(64);
  EngineOptions opt;
  opt.max_waiting = 3;
  Engine engine(*tm.runner, nullptr, opt);  // not started: everything stays queued
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    auto s = engine.Submit(Request("q" + std::to_string(i), {1}, 1));
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  CHECK(engine.Stats().requests.num_waiting == 3);
  CHECK(engine.Submit(Request("q3", {1}, 1)).status().code() == StatusCode::kResourceExhausted);
  engine.Stop();  // never started: the queued requests are aborted
  for (auto& s : streams) CHECK(Drain(*s).reason == FinishReasonKind::kAbort);
}

TEST_CASE("SubmitGroup queues all of a request's sequences or none", "[engine]") {
  TinyModel tm(64);
  EngineOptions opt;
  opt.max_waiting = 4;
  Engine engine(*tm.runner, nullptr, opt);  // not started: everything stays queued
  auto group = [](const std::string& prefix, int n) {
    std::vector<EngineRequest> g;
    for (int i = 0; i < n; ++i) g.push_back(Request(prefix + std::to_string(i), {1}, 1));
    return g;
  };
  // More sequences than the queue holds at all: refused as never admissible (InvalidArgument,
  // a 400 rather than a retryable 429), nothing queued.
  auto big = engine.SubmitGroup(group("big", 5));
  CHECK(big.status().code() == StatusCode::kInvalidArgument);
  CHECK(engine.Stats().requests.num_waiting == 0);
  auto first = engine.SubmitGroup(group("a", 3));
  REQUIRE(first.ok());
  CHECK(first->size() == 3);
  CHECK(engine.Stats().requests.num_waiting == 3);
  // Two more do not fit beside the three: refused whole (not one queued and one refused).
  CHECK(engine.SubmitGroup(group("b", 2)).status().code() == StatusCode::kResourceExhausted);
  CHECK(engine.Stats().requests.num_waiting == 3);
  // One invalid sequence (an empty prompt) or a repeated id refuses the whole group.
  std::vector<EngineRequest> bad = group("c", 1);
  bad.push_back(Request("c1", {}, 1));
  CHECK(engine.SubmitGroup(std::move(bad)).status().code() == StatusCode::kInvalidArgument);
  std::vector<EngineRequest> twice = group("d", 1);
  twice.push_back(Request("d0", {1}, 1));
  CHECK(engine.SubmitGroup(std::move(twice)).status().code() == StatusCode::kInvalidArgument);
  CHECK(engine.Stats().requests.num_waiting == 3);
  auto last = engine.SubmitGroup(group("e", 1));
  REQUIRE(last.ok());
  CHECK(engine.Stats().requests.num_waiting == 4);
  engine.Stop();
  for (auto& s : *first) CHECK(Drain(*s).reason == FinishReasonKind::kAbort);
}

namespace {
// A runner whose steps fail from the `fail_from`-th call until `fail_until`.
class FailingRunner : public ModelRunner {
 public:
  FailingRunner(DecoderLM& model, Backend& backend, int64_t slots)
      : ModelRunner(model, backend, slots) {}
  std::vector<SampleResult> Run(const StepInputs& step) override {
    const int call = calls++;
    if (call >= fail_from && call < fail_until) throw std::runtime_error("injected device fault");
    return ModelRunner::Run(step);
  }
  std::atomic<int> calls{0};
  int fail_from = 3, fail_until = 4;
};
}  // namespace

TEST_CASE("a failing step fails its requests with kError; the engine keeps serving", "[engine]") {
  TinyModel tm(64);
  FailingRunner runner(*tm.model, tm.backend, 64);
  Engine engine(runner, nullptr, {});
  engine.Start();
  EngineRequest r = Request("f", {1, 2, 3}, 20);
  r.ignore_eos = true;
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  Collected c = Drain(**s);
  CHECK(c.reason == FinishReasonKind::kError);
  CHECK(c.error.code() == StatusCode::kInternal);
  CHECK(c.error.message().find("injected device fault") != std::string::npos);
  CHECK(c.tokens.size() == 3);
  auto next = engine.Submit(Request("g", {1, 2, 3}, 5));
  REQUIRE(next.ok());
  CHECK(Drain(**next).tokens.size() == 5);
  EngineStats st = WaitIdle(engine);
  CHECK(st.requests.error_total == 1);
  CHECK(st.kv.num_free_slots == 64);
}

TEST_CASE("Stop from several threads at once aborts live requests once", "[engine]") {
  TinyModel tm(64);
  Engine engine(*tm.runner, nullptr, {});
  engine.Start();
  EngineRequest r = Request("s", {1, 2, 3}, 400);
  r.ignore_eos = true;
  auto s = engine.Submit(r);
  REQUIRE(s.ok());
  REQUIRE((*s)->Next(60s).has_value());
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 3; ++i) stoppers.emplace_back([&] { engine.Stop(); });
  for (auto& t : stoppers) t.join();
  CHECK(Drain(**s).reason == FinishReasonKind::kAbort);
  EngineStats st = engine.Stats();
  CHECK(st.requests.abort_total == 1);
  CHECK(st.kv.num_free_slots == 64);
}

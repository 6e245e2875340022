// Sparse KV admission and release through the engine (docs/sparse.md §6, §9) on the CPU
// backend with the tiny fixture target: a request whose KV can never fit the host store is
// refused at Submit with RESOURCE_EXHAUSTED naming the sizes; requests that only have to
// wait for host room are queued and finish exactly like dense decoding; aborted requests and
// requests of a failing step return every GPU and host head-block; bad sparse options are
// clear errors.
#include <catch2/catch.hpp>

#include <limits>

#include "lookahead_test_util.h"
#include "sparse_engine_test_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

constexpr int64_t kSlots = 1024;

EngineRequest Long(const std::string& id, int64_t prompt_len, int64_t max_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 500);
  EngineRequest r = Request(id, std::move(prompt), max_tokens);
  r.ignore_eos = true;
  r.logprobs = true;
  return r;
}

// Submits every request at once, then collects each one's output.
std::vector<Collected> SubmitAllAndDrain(Engine& engine, const std::vector<EngineRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) {
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  std::vector<Collected> got;
  for (auto& s : streams) got.push_back(Drain(*s));
  return got;
}

}  // namespace

TEST_CASE(
    "a request whose KV can never fit the host store is refused, one that must wait is queued",
    "[engine][sparse]") {
  TinyModel tm(kSlots);
  RecordingRunner runner(*tm.model, tm.backend, kSlots);
  EngineOptions opt;
  // 40 host head-blocks = 20 blocks per KV head: one request of at most 320 tokens at a time.
  opt.sparse = TinySparse(24, 0.25, SparsePredictor::kPreviousQuery, 40);
  std::vector<EngineRequest> reqs = {Long("a", 150, 150, 1), Long("b", 100, 200, 2),
                                     Long("c", 200, 100, 3), Long("short", 20, 40, 4)};
  const std::vector<Collected> dense = [&] {
    TinyModel plain(kSlots);
    return RunEngine(*plain.runner, nullptr, {}, reqs).out;
  }();

  Engine engine(runner, nullptr, opt);
  engine.Start();
  // Never fits: 330 tokens = 21 blocks x 2 heads > 40; max_tokens -1 reaches the context (1024).
  for (auto [prompt, max_tokens] : {std::pair<int64_t, int64_t>{300, 30}, {100, -1}}) {
    INFO("prompt " << prompt << " max_tokens " << max_tokens);
    const Status room = engine.CheckHostKvRoom(prompt, max_tokens);
    CHECK(room.code() == StatusCode::kResourceExhausted);
    CHECK(room.message().find("--host-kv-gib") != std::string::npos);
    CHECK(room.message().find("40") != std::string::npos);
    auto s = engine.Submit(Long("too-long", prompt, max_tokens, 5));
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kResourceExhausted);
    CHECK(s.status().message() == room.message());
  }
  CHECK(engine.CheckHostKvRoom(10, std::numeric_limits<int64_t>::max()).code() ==
        StatusCode::kResourceExhausted);
  CHECK(engine.CheckHostKvRoom(300, 20).ok());  // exactly 20 blocks
  CHECK(engine.CheckHostKvRoom(20, 40).ok());   // never sparse: no host room needed

  // Three requests that each fill the store alone: they run one after the other.
  const std::vector<Collected> got = SubmitAllAndDrain(engine, reqs);
  CheckSameOutputs(reqs, got, dense);
  const EngineStats st = WaitSparseIdle(engine);
  CHECK(st.sparse.admission_waits_total == 2);  // b and c, once each
  CHECK(st.sparse.switches_total == 3);
  CHECK(st.sparse.num_free_host_kv_slots == 40);
  CHECK(st.sparse.num_host_kv_slots == 40);
  CHECK(st.sparse.host_kv_usage() == 0.0);
  CHECK(st.kv.num_free_slots == st.kv.num_slots);
}

TEST_CASE(
    "with --kv-home auto, a request the pool could hold waits for it when the host store "
    "cannot hold it",
    "[engine][sparse]") {
  // A pool of 100 head-blocks holds two of these requests in place (300 tokens: 19 blocks x 2
  // KV heads = 38 each), the host store none of them (10 head-blocks). Submitted together, the
  // third must wait for the pool, not be failed (it was: "request failed: OK", an HTTP 500).
  constexpr int64_t kPool = 100;
  TinyModel tm(kPool);
  RecordingRunner runner(*tm.model, tm.backend, kPool);
  EngineOptions opt;
  // K = 24 blocks covers every block of these requests: their outputs equal dense decoding.
  opt.sparse = TinySparse(24, 0.25, SparsePredictor::kPreviousQuery, 10);
  opt.sparse->home = KvHome::kAuto;
  std::vector<EngineRequest> reqs = {Long("a", 200, 100, 1), Long("b", 200, 100, 2),
                                     Long("c", 200, 100, 3), Long("d", 150, 150, 4)};
  const std::vector<Collected> dense = [&] {
    TinyModel plain(kSlots);
    return RunEngine(*plain.runner, nullptr, {}, reqs).out;
  }();
  Engine engine(runner, nullptr, opt);
  engine.Start();
  CHECK(engine.CheckHostKvRoom(200, 100).ok());  // the pool can hold one whole
  const std::vector<Collected> got = SubmitAllAndDrain(engine, reqs);
  for (const Collected& c : got) {
    INFO(c.error.ToString());
    CHECK(c.reason == FinishReasonKind::kLength);
  }
  CheckSameOutputs(reqs, got, dense);
  const EngineStats st = WaitSparseIdle(engine);
  CHECK(st.kv.num_free_slots == st.kv.num_slots);
  CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
}

TEST_CASE("aborted sparse requests and the requests of a failing sparse step return all memory",
          "[engine][sparse]") {
  // Under reject, and under speculate with chains of 3 drafts in flight (the copy head's
  // drafts are mostly accepted: sparse steps advance by several tokens).
  for (const int64_t k : {0, 3}) {
    DYNAMIC_SECTION((k == 0 ? "reject" : "speculate, chains of 3 drafts")) {
      TinyModel tm(kSlots);
      RecordingRunner runner(*tm.model, tm.backend, kSlots);
      auto head = k == 0 ? FixtureHead(tm) : CopyHead(tm);
      EngineOptions opt;
      opt.lookahead = k == 0 ? LookaheadMode::kReject : LookaheadMode::kSpeculate;
      opt.num_speculative_tokens = std::max<int64_t>(1, k);
      opt.sparse = TinySparse(4, 0.25, SparsePredictor::kDraft);
      auto draft =
          MakeSparseDraftRunner(tm, *head, *opt.sparse, kSlots, tm.config.num_key_value_heads);
      Engine engine(runner, nullptr, opt, draft.get());
      engine.Start();

      SECTION("abort") {
        auto a = engine.Submit(Long("a", 200, 600, 1));
        auto b = engine.Submit(Long("b", 30, 20, 2));
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        bool sparse_seen = false;
        for (int i = 0; i < 4000 && !sparse_seen; ++i) {
          const EngineStats s = engine.Stats();
          sparse_seen = s.sparse.num_requests == 1 && s.sparse.gpu_slots == 6 * 2 &&
                        s.sparse.num_free_host_kv_slots < s.sparse.num_host_kv_slots;
          if (!sparse_seen) std::this_thread::sleep_for(2ms);
        }
        REQUIRE(sparse_seen);  // "a" runs sparse: (K + 2) x 2 GPU head-blocks, host room reserved
        engine.Abort("a");
        CHECK(Drain(**a).reason == FinishReasonKind::kAbort);
        CHECK(Drain(**b).reason == FinishReasonKind::kLength);
      }
      SECTION("a failing sparse step") {
        runner.log.throw_at_step = 3;
        auto a = engine.Submit(Long("a", 100, 50, 1));
        REQUIRE(a.ok());
        const Collected c = Drain(**a);
        CHECK(c.reason == FinishReasonKind::kError);
        CHECK(c.error.code() == StatusCode::kInternal);
        CHECK(c.error.message().find("injected sparse step failure") != std::string::npos);
        // The engine serves on, sparse again.
        auto b = engine.Submit(Long("b", 100, 30, 2));
        REQUIRE(b.ok());
        CHECK(Drain(**b).reason == FinishReasonKind::kLength);
        CHECK(runner.log.sparse_steps > 4);
      }
      const EngineStats st = WaitSparseIdle(engine);
      CHECK(st.kv.num_free_slots == st.kv.num_slots);
      CHECK(st.sparse.num_free_host_kv_slots == st.sparse.num_host_kv_slots);
      CHECK(st.kv.num_free_draft_slots == st.kv.num_draft_slots);
      CHECK(st.sparse.gpu_slots == 0);
      CHECK(st.sparse.num_requests == 0);
      if (k > 0) CHECK(runner.log.max_tokens_sparse == 1 + k);
    }
  }
}

TEST_CASE("sparse options are checked with clear errors", "[engine][sparse]") {
  TinyModel tm(256);
  auto head = FixtureHead(tm);
  EngineOptions ok;
  ok.sparse = TinySparse(8, 0.25, SparsePredictor::kPreviousQuery);
  auto draft = MakeSparseDraftRunner(tm, *head, *ok.sparse, 256, tm.config.num_key_value_heads);
  auto error = [&](EngineOptions o, const DraftRunner* d) {
    const Status st = Engine::CheckOptions(o, *tm.runner, d);
    return st.ok() ? std::string("OK") : st.message();
  };
  CHECK(error(ok, nullptr) == "OK");
  EngineOptions o = ok;
  o.sparse->predictor = SparsePredictor::kDraft;
  CHECK(error(o, nullptr).find("--sparse-predictor draft needs lookahead") != std::string::npos);
  CHECK(error(o, draft.get()).find("--sparse-predictor draft needs lookahead") !=
        std::string::npos);  // lookahead off
  o.lookahead = LookaheadMode::kReject;
  CHECK(error(o, draft.get()) == "OK");
  // A head pool that holds only the KV pool's tokens would run out once requests live in the
  // host store (it keeps every running request's tokens): refused, naming what it needs.
  auto small = MakeDraftRunner(tm, *head);
  const std::string e = error(o, small.get());
  CHECK(e.find("the draft head's KV pool") != std::string::npos);
  CHECK(e.find("it needs " + std::to_string(draft->num_kv_slots())) != std::string::npos);
  o.lookahead = LookaheadMode::kOff;  // without lookahead the head is not used
  o.sparse->predictor = SparsePredictor::kPreviousQuery;
  CHECK(error(o, small.get()) == "OK");
  o = ok;
  o.sparse->topk_blocks = 0;
  CHECK(error(o, nullptr).find("--topk-blocks") != std::string::npos);
  o = ok;
  o.sparse->topk_blocks = 127;  // (127 + 2) x 2 heads > 256 head-blocks
  CHECK(error(o, nullptr).find("258 KV head-blocks per sparse request") != std::string::npos);
  o = ok;
  o.sparse->fetch_ratio = 0;
  CHECK(error(o, nullptr).find("--fetch-ratio") != std::string::npos);
  o = ok;
  o.sparse->sparse_threshold = 8;
  CHECK(error(o, nullptr).find("--sparse-threshold must be at least one block") !=
        std::string::npos);
  o = ok;
  o.sparse->dense_layers = 3;
  CHECK(error(o, nullptr).find("--dense-layers") != std::string::npos);
  o = ok;
  o.sparse->host_kv_gib = 0;
  CHECK(error(o, nullptr).find("--host-kv-gib") != std::string::npos);
  o = ok;
  o.sparse->max_sparse_seqs = 0;
  CHECK(error(o, nullptr).find("sparse sequences") != std::string::npos);
  o = ok;
  o.sparse_metrics_interval = 0;
  CHECK(error(o, nullptr).find("metrics interval") != std::string::npos);
}

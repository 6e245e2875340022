// Disaggregated prefill and decode through two ENGINES in one process on the CPU backend
// (engine/kv_handoff.h, docs/disaggregation.md §2, §5, §6): a prefill engine hands requests
// off into a real staging pool served by a StagingServer on loopback; a decode engine imports
// them through a RemoteKvImporter (UCX gets) and decodes on. With K >= the number of blocks
// the decode engine's outputs equal a single engine's exactly (tokens, log-probabilities,
// finish reasons), with and without the EAGLE-3 head, in full-transfer and partial mode; every
// lease ends (completed) and every GPU, host and draft head-block comes back on both sides;
// an import aborted on the decode side aborts its lease; a ticket for another prompt and
// misuse (a handoff on an instance without a staging pool, an import without sparse KV) are
// refused with a clear error.
#include <catch2/catch.hpp>

#include <functional>
#include <chrono>
#include <thread>

#include "../engine/lookahead_test_util.h"
#include "../engine/sparse_engine_test_util.h"
#include "disagg/kv_transfer.h"
#include "disagg/staging_server.h"

using namespace oasis;
using namespace oasis::engine_test;
using namespace oasis::disagg;

namespace {

constexpr int64_t kSlots = 2048;

// The plain runner plus a check after every sparse step: no working set of any (row, layer,
// head) holds a block whose K/V is still remote (select never admits one).
class RemoteCheckingRunner final : public ModelRunner {
 public:
  using ModelRunner::ModelRunner;
  int64_t remote_resident = 0;  // violations
  int64_t steps_with_remote = 0;
  // Set by a test that needs drift to land: until it says so, a step with remote blocks takes
  // 10 ms longer, so that a loaded machine's fetch worker gets its turn before the request ends
  // (the fetch runs on its own thread; the engine lands it between steps).
  std::function<bool()> drift_landed;
  std::vector<SampleResult> Run(const StepInputs& step) override {
    auto out = ModelRunner::Run(step);
    if (!step.sparse) return out;
    SparseKvManager& m = sparse_pipeline().manager();
    SparseDeviceState& st = m.state();
    if (st.remote_cap() == 0) return out;
    const int64_t hkv = st.kv_heads(), k = st.topk(), mb = st.max_blocks();
    bool any = false;
    for (int64_t l = m.config().dense_layers; l < m.shape().num_layers; ++l) {
      const int32_t* ws = st.layer(l).ws_blocks.data<int32_t>();
      const uint8_t* remote = st.layer(l).remote.data<uint8_t>();
      for (int64_t r = 0; r < st.rows(); ++r) {
        for (int64_t h = 0; h < hkv; ++h) {
          for (int64_t j = 0; j < k; ++j) {
            const int32_t b = ws[(r * hkv + h) * k + j];
            if (b >= 0 && remote[(r * hkv + h) * mb + b]) ++remote_resident;
          }
          for (int64_t b = 0; b < mb; ++b) any = any || remote[(r * hkv + h) * mb + b];
        }
      }
    }
    steps_with_remote += any ? 1 : 0;
    if (any && drift_landed && !drift_landed()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return out;
  }
};

struct Instance {
  // `speculate`: the copy head under speculate with chains of 3 drafts (mostly accepted: the
  // decode side's sparse steps advance by several tokens; the prefill side still hands off
  // after exactly two tokens).
  explicit Instance(bool with_head, bool speculate = false) : tm(kSlots), speculate(speculate) {
    if (with_head) {
      head = speculate ? CopyHead(tm) : FixtureHead(tm);
      SparseConfig s = *Options(4).sparse;  // the largest store a case asks for: remote rows too
      s.remote_kv_gib = s.host_kv_gib;
      draft = MakeSparseDraftRunner(tm, *head, s, kSlots, tm.config.num_key_value_heads);
    }
  }
  EngineOptions Options(int32_t k) const {
    EngineOptions o;
    o.lookahead = !draft ? LookaheadMode::kOff
                  : speculate ? LookaheadMode::kSpeculate
                              : LookaheadMode::kReject;
    o.num_speculative_tokens = speculate ? 3 : 1;
    o.sparse = TinySparse(k, 0.05, draft ? SparsePredictor::kDraft : SparsePredictor::kPreviousQuery);
    o.sparse->remote_fetch_cap = o.sparse->max_fetch();  // (used by decode engines)
    o.sparse_metrics_interval = 4;
    return o;
  }
  TinyModel tm;
  bool speculate = false;
  std::unique_ptr<Eagle3Head> head;
  std::unique_ptr<DraftRunner> draft;
  RemoteCheckingRunner checking{*tm.model, tm.backend, kSlots};
};

// The prefill side: a pool of one head-block per slot (qwen3-tiny on the CPU: 16 x 32 x 4 B).
struct PrefillSide {
  PrefillSide(std::shared_ptr<UcxContext> ctx, uint64_t slots, std::chrono::milliseconds ttl) {
    auto p = StagingPool::Create(ctx, {.block_bytes = 16 * 32 * 4, .num_blocks = slots, .default_lease_ttl = ttl});
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    pool = std::move(*p);
    // (Once in a CI run the listener failed to come up, with no message kept: say why, and
    // give an ephemeral port a second chance.)
    auto s = StagingServer::Start(ctx, pool.get(), {.listen_address = "127.0.0.1:0"});
    for (int attempt = 1; !s.ok() && attempt < 3; ++attempt) {
      WARN("staging server did not start (attempt " << attempt << "): " << s.status().ToString());
      std::this_thread::sleep_for(50ms);
      s = StagingServer::Start(ctx, pool.get(), {.listen_address = "127.0.0.1:0"});
    }
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    server = std::move(*s);
    exporter = std::make_unique<StagingExporter>(*pool, server->address(), ttl);
  }
  std::unique_ptr<StagingPool> pool;
  std::unique_ptr<StagingServer> server;
  std::unique_ptr<StagingExporter> exporter;
};

std::shared_ptr<UcxContext> Context() {
  auto c = UcxContext::Create({.transports = "tcp"});
  REQUIRE(c.ok());
  return *c;
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

// Runs `r` on the prefill engine as a handoff (it must not stop at x1 or x2): its ticket.
HandoffTicket HandOff(Engine& prefill, EngineRequest r) {
  r.handoff = true;
  auto s = prefill.Submit(r);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  Collected c = Collect(**s);
  REQUIRE(c.reason == FinishReasonKind::kHandoff);
  auto t = ParseHandoffTicket(c.handoff_ticket);
  REQUIRE(t.ok());
  return *t;
}

// Runs `reqs` through prefill (handoff) then decode (import); a request that finished on the
// prefill side (a stop at x1 or x2) keeps the prefill side's output.
std::vector<Collected> RunDisaggregated(Engine& prefill, Engine& decode, RemoteKvImporter& importer,
                                        const std::vector<EngineRequest>& reqs, bool full,
                                        int* handed_off) {
  std::vector<Collected> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EngineRequest p = reqs[i];
    p.handoff = true;
    auto ps = prefill.Submit(p);
    INFO(ps.status().ToString());
    REQUIRE(ps.ok());
    Collected first = Collect(**ps);
    INFO(reqs[i].id << ": " << first.error.ToString());
    REQUIRE(first.error.ok());
    if (first.reason != FinishReasonKind::kHandoff) {
      out[i] = first;
      continue;
    }
    ++*handed_off;
    CHECK(first.tokens.size() == 2);  // x1, x2 on the prefill side's own stream
    REQUIRE(!first.handoff_ticket.empty());
    auto ticket = ParseHandoffTicket(first.handoff_ticket);
    REQUIRE(ticket.ok());
    EngineRequest d = reqs[i];
    d.import = importer.Source(*ticket, full);
    auto ds = decode.Submit(d);
    INFO(ds.status().ToString());
    REQUIRE(ds.ok());
    out[i] = Collect(**ds);
  }
  return out;
}

}  // namespace

TEST_CASE("a request handed off by a prefill engine and imported by a decode engine decodes as one engine does",
          "[disagg][engine]") {
  const auto ctx = Context();
  for (int variant : {0, 1, 2}) {
    const bool with_head = variant > 0, speculate = variant == 2;
    for (bool full : {true, false}) {
      DYNAMIC_SECTION((!with_head   ? "previous-query predictor"
                       : speculate ? "EAGLE-3 draft predictor, speculate with chains of 3"
                                   : "EAGLE-3 draft predictor")
                      << (full ? ", full transfer" : ", partial (admission lists)")) {
        std::vector<EngineRequest> reqs = LongWorkload(8, 11);
        for (auto& r : reqs) r.max_tokens = std::max<int64_t>(r.max_tokens, 3);
        Instance ref(with_head, speculate), pre(with_head, speculate), dec(with_head, speculate);
        // K = 24 blocks >= the longest context: every block is in the working set.
        const std::vector<Collected> want = RunEngine(*ref.tm.runner, ref.draft.get(), ref.Options(24), reqs).out;

        PrefillSide side(ctx, 1 << 16, 30s);
        EngineOptions po = pre.Options(24);
        po.handoff_exporter = side.exporter.get();
        Engine prefill(*pre.tm.runner, nullptr, po, pre.draft.get());
        Engine decode(*dec.tm.runner, nullptr, dec.Options(24), dec.draft.get());
        auto importer = RemoteKvImporter::Create(ctx);
        prefill.Start();
        decode.Start();
        int handed_off = 0;
        const std::vector<Collected> got = RunDisaggregated(prefill, decode, *importer, reqs, full, &handed_off);
        CHECK(handed_off >= 6);  // those that did not stop at x1 or x2
        CheckSameOutputs(reqs, got, want);

        // Every lease ends (completed), and both engines give every head-block back.
        CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
        const StagingPoolStats ps = side.pool->Stats();
        CHECK(ps.leases_granted == static_cast<uint64_t>(handed_off));
        CHECK(ps.leases_completed == static_cast<uint64_t>(handed_off));
        CHECK(ps.leases_aborted + ps.leases_expired == 0);
        const EngineStats pst = WaitSparseIdle(prefill), dst = WaitSparseIdle(decode);
        CHECK(pst.disagg.handoffs_total == handed_off);
        CHECK(pst.requests.handoff_total == handed_off);
        CHECK(pst.disagg.handoff_staged_bytes_total > 0);
        CHECK(dst.disagg.imports_total == handed_off);
        CHECK(dst.disagg.import_failures_total == 0);
        CHECK(dst.disagg.import_admission_bytes_total > 0);
        if (speculate) CHECK(dst.lookahead.sparse_tokens_per_step() > 1.3);
        for (const EngineStats* st : {&pst, &dst}) {
          CHECK(st->kv.num_free_slots == st->kv.num_slots);
          CHECK(st->sparse.num_free_host_kv_slots == st->sparse.num_host_kv_slots);
          CHECK(st->sparse.num_requests == 0);
          CHECK(st->kv.num_free_draft_slots == st->kv.num_draft_slots);
        }
        const RemoteKvImporterStats is = importer->Stats();
        CHECK(is.leases_completed == static_cast<uint64_t>(handed_off));
        CHECK(is.leases_live == 0);
        CHECK(is.fetch_failures == 0);
        prefill.Stop();
        decode.Stop();
      }
    }
  }
}

// Prefix caching on the prefill instance (issue 33): handoffs adopt the blocks earlier
// prompts left cached (a shared 100-token prefix, one repeated prompt) and compute only the
// rest; the staged KV (every block, adopted or computed, through the host store) decodes on
// the decode instance exactly as one engine without caching does.
TEST_CASE("a prefill instance reuses its prefix cache; the decode side decodes as one engine does",
          "[disagg][engine][prefix]") {
  const auto ctx = Context();
  for (bool with_head : {false, true}) {
    DYNAMIC_SECTION((with_head ? "EAGLE-3 draft predictor" : "previous-query predictor")) {
      std::vector<EngineRequest> reqs = LongWorkload(6, 17, 200);
      std::vector<int32_t> prefix(100);
      for (size_t j = 0; j < prefix.size(); ++j) prefix[j] = static_cast<int32_t>(5 + (j * 37) % 480);
      for (auto& r : reqs) {
        r.prompt.insert(r.prompt.begin(), prefix.begin(), prefix.end());
        r.max_tokens = std::max<int64_t>(r.max_tokens, 3);
      }
      reqs.push_back(reqs[2]);
      reqs.back().id = "repeat";
      Instance ref(with_head), pre(with_head), dec(with_head);
      const std::vector<Collected> want = RunEngine(*ref.tm.runner, ref.draft.get(), ref.Options(24), reqs).out;
      PrefillSide side(ctx, 1 << 16, 30s);
      EngineOptions po = pre.Options(24);
      po.handoff_exporter = side.exporter.get();
      po.enable_prefix_caching = true;
      REQUIRE(Engine::CheckOptions(po, *pre.tm.runner, pre.draft.get()).ok());
      Engine prefill(*pre.tm.runner, nullptr, po, pre.draft.get());
      Engine decode(*dec.tm.runner, nullptr, dec.Options(24), dec.draft.get());
      auto importer = RemoteKvImporter::Create(ctx);
      prefill.Start();
      decode.Start();
      int handed_off = 0;
      const std::vector<Collected> got = RunDisaggregated(prefill, decode, *importer, reqs, true, &handed_off);
      CHECK(handed_off >= 5);
      CheckSameOutputs(reqs, got, want);
      const EngineStats pst = WaitSparseIdle(prefill), dst = WaitSparseIdle(decode);
      CHECK(pst.kv.prefix_cache_hits_total >= static_cast<int64_t>(reqs.size() - 1) * 96);
      CHECK(pst.disagg.handoffs_total == handed_off);
      CHECK(dst.disagg.import_failures_total == 0);
      for (const EngineStats* st : {&pst, &dst}) {
        CHECK(st->kv.num_free_slots == st->kv.num_slots);
        CHECK(st->sparse.num_free_host_kv_slots == st->sparse.num_host_kv_slots);
        CHECK(st->kv.num_free_draft_slots == st->kv.num_draft_slots);
      }
      CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
      prefill.Stop();
      decode.Stop();
    }
  }
}

// Prefix caching on the decode instance (issue 33): an import's prompt blocks stay in the
// host store when it ends (kvcache/store_prefix_cache.h); a later import whose prompt starts
// with them takes them instead of fetching them. Conversations resend their history, so every
// later turn's admission fetches only what is new: the bytes saved are exactly two lease slots
// (K and V) per head-block taken. Outputs equal one engine without caching, in full-transfer
// and partial mode, with a roomy store and with one so small that parked blocks are evicted
// for the imports that need room.
TEST_CASE("a decode instance reuses the prompt blocks it holds; later imports fetch only the rest",
          "[disagg][engine][prefix]") {
  const auto ctx = Context();
  for (bool full : {true, false}) {
    for (int64_t host_slots : {int64_t{4096}, int64_t{40}}) {
      DYNAMIC_SECTION((full ? "full transfer" : "partial (admission lists)")
                      << ", host store of " << host_slots << " head-blocks") {
        // Three conversations of three turns (each turn: the history plus 40 new tokens), then
        // a repeat of a first turn, then an unrelated prompt, all one after the other.
        std::mt19937_64 rng(91);
        std::vector<EngineRequest> reqs;
        for (int c = 0; c < 3; ++c) {
          std::vector<int32_t> history;
          for (int turn = 0; turn < 3; ++turn) {
            for (int j = 0; j < 40 + 30 * (turn == 0); ++j)
              history.push_back(static_cast<int32_t>(3 + rng() % 500));
            EngineRequest r = Request("c" + std::to_string(c) + "t" + std::to_string(turn), history, 6);
            r.ignore_eos = true;
            reqs.push_back(r);
          }
        }
        reqs.push_back(reqs[0]);
        reqs.back().id = "repeat";
        reqs.push_back(LongWorkload(2, 4)[1]);
        reqs.back().max_tokens = 6;
        Instance ref(false), pre(false), dec(false), plain(false);
        const std::vector<Collected> want = RunEngine(*ref.tm.runner, nullptr, ref.Options(24), reqs).out;
        PrefillSide side(ctx, 1 << 16, 30s);
        EngineOptions po = pre.Options(24);
        po.handoff_exporter = side.exporter.get();
        Engine prefill(*pre.tm.runner, nullptr, po, nullptr);
        EngineOptions doo = dec.Options(24);
        doo.sparse->host_kv_gib = TinySparse(24, 0.05, SparsePredictor::kPreviousQuery, host_slots).host_kv_gib;
        doo.enable_prefix_caching = true;
        REQUIRE(Engine::CheckOptions(doo, *dec.tm.runner, nullptr).ok());
        EngineOptions no = doo;
        no.enable_prefix_caching = false;
        Engine decode(*dec.tm.runner, nullptr, doo, nullptr);
        Engine uncached(*plain.tm.runner, nullptr, no, nullptr);
        auto importer = RemoteKvImporter::Create(ctx);
        prefill.Start();
        decode.Start();
        uncached.Start();
        int handed_off = 0, handed_off_again = 0;
        const std::vector<Collected> got = RunDisaggregated(prefill, decode, *importer, reqs, full, &handed_off);
        const std::vector<Collected> again =
            RunDisaggregated(prefill, uncached, *importer, reqs, full, &handed_off_again);
        REQUIRE(handed_off == static_cast<int>(reqs.size()));
        CheckSameOutputs(reqs, got, want);
        CheckSameOutputs(reqs, again, want);
        const EngineStats dst = WaitSparseIdle(decode), ust = WaitSparseIdle(uncached);
        CHECK(dst.disagg.import_failures_total == 0);
        CHECK(dst.disagg.import_prefix_queries_total == handed_off);
        CHECK(ust.disagg.import_prefix_queries_total == 0);
        // Later turns and the repeat take blocks; the bytes fetched drop by exactly the K and V
        // slots of every head-block taken.
        CHECK(dst.disagg.import_prefix_hit_tokens_total > 0);
        CHECK(dst.disagg.import_prefix_cells_adopted_total > 0);
        const int64_t slot_bytes = 16 * 32 * 4;  // qwen3-tiny's head-block (K or V), float32
        CHECK(ust.disagg.import_admission_bytes_total - dst.disagg.import_admission_bytes_total ==
              2 * slot_bytes * dst.disagg.import_prefix_cells_adopted_total);
        int64_t cached = 0;
        for (const Collected& c : got) cached += c.cached_tokens;
        CHECK(cached == dst.disagg.import_prefix_hit_tokens_total);
        CHECK(got[0].cached_tokens == 0);  // a first turn
        if (host_slots > 1000) {
          // Roomy: turn t + 1 takes every full block of turn t's prompt, and the repeat all of
          // its own.
          CHECK(got[1].cached_tokens == static_cast<int64_t>(reqs[0].prompt.size()) / 16 * 16);
          CHECK(got[9].cached_tokens == static_cast<int64_t>(reqs[9].prompt.size()) / 16 * 16);
          CHECK(dst.disagg.import_prefix_evictions_total == 0);
        } else {
          CHECK(dst.disagg.import_prefix_evictions_total > 0);
        }
        // Parked cells count as room: an idle store is all free, and the cache holds blocks.
        CHECK(dst.sparse.num_free_host_kv_slots == dst.sparse.num_host_kv_slots);
        CHECK(dst.disagg.import_prefix_cells > 0);
        CHECK(dst.kv.num_free_slots == dst.kv.num_slots);
        // Three imports of one prompt at once share its cached blocks (read-only): each takes
        // every full block of the prompt.
        std::vector<HandoffTicket> tickets;
        for (int i = 0; i < 3; ++i) tickets.push_back(HandOff(prefill, reqs[2]));
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (int i = 0; i < 3; ++i) {
          EngineRequest d = reqs[2];
          d.id = "shared-" + std::to_string(i);
          d.max_tokens = 40;  // long enough to overlap
          d.import = importer->Source(tickets[static_cast<size_t>(i)], full);
          auto ds = decode.Submit(d);
          REQUIRE(ds.ok());
          streams.push_back(*ds);
        }
        int64_t peak_held = 0;
        for (int i = 0; i < 200 && peak_held == 0; ++i) {
          peak_held = std::max(peak_held, decode.Stats().disagg.import_prefix_held_blocks);
          std::this_thread::sleep_for(1ms);
        }
        std::vector<int32_t> first_tokens;
        for (const auto& st : streams) {
          const Collected c = Collect(*st);
          CHECK(c.error.ok());
          CHECK(c.completion_tokens == 40);
          // Greedy: its first tokens are the 6-token run's, and the three agree.
          REQUIRE(c.tokens.size() >= want[2].tokens.size());
          CHECK(std::equal(want[2].tokens.begin(), want[2].tokens.end(), c.tokens.begin()));
          if (st != streams.front()) CHECK(c.tokens == first_tokens);
          first_tokens = c.tokens;
          if (host_slots > 1000) CHECK(c.cached_tokens == static_cast<int64_t>(reqs[2].prompt.size()) / 16 * 16);
        }
        CHECK(peak_held > 0);
        // A prompt no import brought before, twice at once: the second waits for the first's
        // fetch (its blocks are in flight) and then holds them, as do imports arriving while
        // the first decodes.
        std::vector<int32_t> fresh_prompt(150);
        for (auto& t : fresh_prompt) t = static_cast<int32_t>(3 + rng() % 500);
        EngineRequest fresh = Request("fresh", fresh_prompt, 40);
        fresh.ignore_eos = true;
        const HandoffTicket t1 = HandOff(prefill, fresh), t2 = HandOff(prefill, fresh);
        EngineRequest d1 = fresh, d2 = fresh;
        d1.id = "fresh-1";
        d2.id = "fresh-2";
        d1.import = importer->Source(t1, full);
        d2.import = importer->Source(t2, full);
        auto s1 = decode.Submit(d1);
        auto s2 = decode.Submit(d2);
        REQUIRE(s1.ok());
        REQUIRE(s2.ok());
        const Collected c2 = Collect(**s2), c1 = Collect(**s1);
        CHECK(c1.error.ok());
        CHECK(c2.error.ok());
        CHECK(c1.tokens == c2.tokens);
        CHECK(c1.cached_tokens == 0);
        if (host_slots > 1000)
          CHECK(c2.cached_tokens == static_cast<int64_t>(fresh.prompt.size()) / 16 * 16);
        const EngineStats after = WaitSparseIdle(decode);
        CHECK(after.disagg.import_prefix_blocks_published_total > 0);
        CHECK(after.disagg.import_prefix_queries_total == handed_off + 5);
        CHECK(after.disagg.import_prefix_held_blocks == 0);
        CHECK(after.disagg.import_failures_total == 0);
        if (host_slots > 1000) {
          CHECK(after.disagg.import_prefix_hit_tokens_total - dst.disagg.import_prefix_hit_tokens_total ==
                3 * (static_cast<int64_t>(reqs[2].prompt.size()) / 16 * 16) + c2.cached_tokens);
        }
        CHECK(after.sparse.num_free_host_kv_slots == after.sparse.num_host_kv_slots);
        CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
        prefill.Stop();
        decode.Stop();
        uncached.Stop();
      }
    }
  }
}

TEST_CASE("partial mode with a small K: drifted blocks are fetched once each and never attended before they land",
          "[disagg][engine]") {
  const auto ctx = Context();
  for (bool with_head : {false, true}) {
    // The draft-predictor run also gives remote blocks summary-only rows (--remote-kv-gib):
    // they then hold no host slot until they land.
    const bool rows = with_head;
    DYNAMIC_SECTION((with_head ? "EAGLE-3 draft predictor, remote blocks on summary-only rows"
                               : "previous-query predictor, remote blocks on host slots")) {
      std::vector<EngineRequest> reqs = LongWorkload(8, 5);
      for (auto& r : reqs) {
        r.max_tokens = std::max<int64_t>(r.max_tokens, 40);
        r.ignore_eos = true;
      }
      Instance pre(with_head), dec(with_head);
      PrefillSide side(ctx, 1 << 16, 30s);
      // K = 4 of up to 21 blocks, C = 1: most blocks stay on the prefill side at admission.
      EngineOptions po = pre.Options(4);
      po.handoff_exporter = side.exporter.get();
      Engine prefill(*pre.tm.runner, nullptr, po, pre.draft.get());
      EngineOptions dopt = dec.Options(4);
      if (rows) dopt.sparse->remote_kv_gib = dopt.sparse->host_kv_gib;
      Engine decode(dec.checking, nullptr, dopt, dec.draft.get());
      // (Once in a CI run no drifted block landed before its request's last token: the fetch
      // thread had not run. Steps with remote blocks wait a little until the first one lands.)
      dec.checking.drift_landed = [&decode] { return decode.Stats().disagg.drift_blocks_total > 0; };
      auto importer = RemoteKvImporter::Create(ctx);
      prefill.Start();
      decode.Start();
      int64_t remote_at_admission = 0, full_bytes = 0, reserved_bytes = 0, expected_bytes = 0;
      int handed_off = 0;
      std::vector<Collected> got(reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) {
        const HandoffTicket t = HandOff(prefill, reqs[i]);
        ++handed_off;
        auto layout = StagedKvLayout::Create(t.geometry);
        REQUIRE(layout.ok());
        full_bytes += static_cast<int64_t>(layout->num_slots() * layout->slot_bytes());
        // What a local sparse request reserves: every block it can reach, all layers, K and V.
        reserved_bytes += (t.prompt_length + reqs[i].max_tokens + 15) / 16 * t.geometry.num_kv_heads * 2 *
                          static_cast<int64_t>(layout->slot_bytes()) * t.geometry.num_layers;
        // With summary-only rows it holds whole slots (every layer) for the tail block and the
        // output, and one layer's cell per admitted complete block.
        const int64_t lb = (t.prompt_length + 1) / 16, cell = 2 * static_cast<int64_t>(layout->slot_bytes());
        expected_bytes += ((t.prompt_length + reqs[i].max_tokens + 15) / 16 - lb) * t.geometry.num_kv_heads *
                          cell * t.geometry.num_layers;
        for (const auto& list : t.admission) {
          expected_bytes += cell * std::count_if(list.begin(), list.end(), [&](uint16_t b) { return b < lb; });
        }
        for (const auto& list : t.admission) {
          CHECK(list.size() <= 2 * 4 + 1);
          remote_at_admission += t.geometry.num_blocks - static_cast<int64_t>(list.size());
        }
        EngineRequest d = reqs[i];
        d.import = importer->Source(t, false);
        auto ds = decode.Submit(d);
        INFO(ds.status().ToString());
        REQUIRE(ds.ok());
        got[i] = Collect(**ds);
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO(reqs[i].id);
        CHECK(got[i].error.ok());
        CHECK(got[i].reason == FinishReasonKind::kLength);
        CHECK(got[i].completion_tokens == reqs[i].max_tokens);
      }
      CHECK(remote_at_admission > 100);
      const EngineStats dst = WaitSparseIdle(decode);
      INFO("drift fetches " << dst.disagg.drift_fetches_total << " in " << dst.disagg.drift_fetch_seconds_total
                            << " s, steps with remote blocks " << dec.checking.steps_with_remote);
      CHECK(dst.disagg.drift_blocks_total > 0);                      // drift happened
      CHECK(dst.disagg.drift_blocks_total <= remote_at_admission);   // each block crossed at most once
      CHECK(dst.disagg.drift_bytes_total == dst.disagg.drift_blocks_total * 2 * 16 * 32 * 4);
      CHECK(dst.disagg.import_failures_total == 0);
      CHECK(dec.checking.steps_with_remote > 0);
      CHECK(dec.checking.remote_resident == 0);  // never attended before it landed
      // Admission moved less than the whole KV: the point of the partial mode.
      CHECK(dst.disagg.import_admission_bytes_total + remote_at_admission * 2 * 2048 == full_bytes);
      CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
      CHECK(side.pool->Stats().leases_completed == static_cast<uint64_t>(handed_off));
      CHECK(dst.kv.num_free_slots == dst.kv.num_slots);
      CHECK(dst.sparse.num_free_host_kv_slots == dst.sparse.num_host_kv_slots);
      // Decode-side host memory per request: with summary-only rows only the admission set,
      // the drifted blocks and the output's blocks take host slots.
      CHECK(dst.disagg.imports_finished_total == handed_off);
      CHECK(dst.disagg.import_host_kv_bytes == 0);
      CHECK(dst.disagg.import_host_kv_bytes_peak > 0);
      CHECK(dst.disagg.num_free_summary_rows == dst.disagg.num_summary_rows);
      if (rows) {
        CHECK(dst.disagg.num_summary_rows > 0);
        CHECK(dst.disagg.drift_blocks_dropped_total == 0);
        // ... plus a cell per drifted block.
        CHECK(dst.disagg.import_host_kv_bytes_finished_total == expected_bytes + dst.disagg.drift_blocks_total * 2 * 2048);
        CHECK(dst.disagg.import_host_kv_bytes_finished_total < reserved_bytes);
      } else {
        CHECK(dst.disagg.num_summary_rows == 0);
        CHECK(dst.disagg.import_host_kv_bytes_finished_total == reserved_bytes);
      }
      prefill.Stop();
      decode.Stop();
    }
  }
}

TEST_CASE("disaggregation: aborts and misuse are clear errors and release the lease",
          "[disagg][engine]") {
  const auto ctx = Context();
  Instance pre(false), dec(false);
  PrefillSide side(ctx, 1 << 16, 30s);
  EngineOptions po = pre.Options(24);
  po.handoff_exporter = side.exporter.get();
  Engine prefill(*pre.tm.runner, nullptr, po);
  Engine decode(*dec.tm.runner, nullptr, dec.Options(24));
  auto importer = RemoteKvImporter::Create(ctx);
  prefill.Start();
  decode.Start();
  std::vector<int32_t> prompt(150);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + (i * 37) % 400);
  EngineRequest r = Request("a", prompt, 60);
  r.ignore_eos = true;
  auto handoff = [&](const std::string& id) {
    EngineRequest p = r;
    p.id = id;
    return HandOff(prefill, p);
  };

  SECTION("an import aborted on the decode side aborts its lease") {
    // Long enough that the abort lands before the last token, even on a loaded machine.
    r.max_tokens = 300;
    const HandoffTicket t = handoff("p1");
    EngineRequest d = r;
    d.import = importer->Source(t, false);
    auto s = decode.Submit(d);
    REQUIRE(s.ok());
    auto first = (*s)->Next(10s);  // x1 and x2 (maybe more)
    REQUIRE(first.has_value());
    decode.Abort("a");
    Collected rest = Collect(**s);
    CHECK(rest.reason == FinishReasonKind::kAbort);
    CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
    CHECK(side.pool->Stats().leases_aborted == 1);
  }
  SECTION("a ticket for another prompt, a handoff without an exporter, an import without sparse KV") {
    const HandoffTicket t = handoff("p2");
    EngineRequest d = r;
    d.prompt.pop_back();
    d.import = importer->Source(t, false);
    auto s = decode.Submit(d);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.status().message(), Catch::Contains("prompt of 150 tokens"));
    EngineRequest h = r;
    h.handoff = true;
    auto s2 = decode.Submit(h);
    REQUIRE_FALSE(s2.ok());
    CHECK_THAT(s2.status().message(), Catch::Contains("not a prefill instance"));
    Instance dense(false);
    Engine plain(*dense.tm.runner, nullptr, EngineOptions{});
    EngineRequest d2 = r;
    d2.import = importer->Source(t, false);
    auto s3 = plain.Submit(d2);
    REQUIRE_FALSE(s3.ok());
    CHECK_THAT(s3.status().message(), Catch::Contains("--sparse on"));
    // Sources dropped without running release (abort) their lease.
    d.import.reset();
    d2.import.reset();
    CHECK(WaitFor([&] { return side.pool->Stats().requests_held == 0; }));
  }
  prefill.Stop();
  decode.Stop();
}

TEST_CASE("a lease the prefill side no longer holds, or one not renewed for its TTL, fails every later read",
          "[disagg][engine]") {
  const auto ctx = Context();
  Instance pre(false);
  // A short TTL: the importer renews every 100 ms.
  PrefillSide side(ctx, 1 << 16, 300ms);
  EngineOptions po = pre.Options(24);
  po.handoff_exporter = side.exporter.get();
  Engine prefill(*pre.tm.runner, nullptr, po);
  prefill.Start();
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(5 + (i * 31) % 400);
  auto handoff = [&](const std::string& id) { return HandOff(prefill, Request(id, prompt, 20)); };
  RemoteKvImporterOptions io;
  io.reader.connect_timeout = 1s;
  auto importer = RemoteKvImporter::Create(ctx, io);
  std::vector<char> buf(16 * 32 * 4);

  // Held and renewed: reads work, and keep working past the TTL.
  const HandoffTicket a = handoff("a");
  auto sa = importer->Source(a, false);
  REQUIRE(sa->Fetch({{0, buf.data()}}).ok());
  std::this_thread::sleep_for(500ms);
  REQUIRE(sa->Fetch({{0, buf.data()}}).ok());

  // Freed on the prefill side (as an expiry does): the next renewal hears it is gone.
  const HandoffTicket b = handoff("b");
  auto sb = importer->Source(b, false);
  REQUIRE(sb->Fetch({{0, buf.data()}}).ok());
  REQUIRE(side.pool->Release(b.lease_id, LeaseEnd::kAborted).ok());
  CHECK(WaitFor([&] { return importer->Stats().leases_lost == 1; }, 5s));
  Status st = sb->Fetch({{0, buf.data()}});
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains("may no longer hold"));
  CHECK(side.server->Stats().gone_replies >= 1);
  CHECK(sa->Fetch({{0, buf.data()}}).ok());  // the other lease is untouched

  // The prefill instance's staging server goes away: no renewal reaches it, and once the TTL
  // has passed the lease is not trusted any more.
  // (Sends may still be handed to the transport until the connection is seen to be dead.)
  side.server.reset();
  std::this_thread::sleep_for(1500ms);
  st = sa->Fetch({{0, buf.data()}});
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains("may no longer hold"));
  CHECK(importer->Stats().leases_lost == 2);
  sa->Release(false);
  sb->Release(false);
  prefill.Stop();
}

// Automatic prefix caching on the CPU backend (issue 33, engine/prefix_reuse.h): with caching
// on every output equals caching off exactly — greedy and seeded sampling, requests sharing
// prefixes, chunked prefill across the cached boundary, preemption, aborts racing a hit —
// the stats and usage count the cached tokens, and every block is back in the pool (cached
// ones as evictable) when the requests end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/prefix_reuse.h"
#include "kvcache/host_prefix_tier.h"
#include "test_engine_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

// `n` requests sharing prefixes: a system prompt of 37 tokens, then one of three "documents"
// of 20..50 tokens, then a question of 1..20; some identical prompts, a third seeded sampling.
std::vector<EngineRequest> SharedPrefixWorkload(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto random_tokens = [&](size_t len) {
    std::vector<int32_t> t(len);
    for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 500);
    return t;
  };
  const std::vector<int32_t> system = random_tokens(37);
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 3; ++d) docs.push_back(random_tokens(20 + rng() % 31));
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt = system;
    const auto& doc = docs[rng() % docs.size()];
    prompt.insert(prompt.end(), doc.begin(), doc.end());
    if (i % 5 != 4) {  // every fifth prompt ends with its document (repeats)
      const auto q = random_tokens(1 + rng() % 20);
      prompt.insert(prompt.end(), q.begin(), q.end());
    }
    EngineRequest r = Request("r" + std::to_string(i), std::move(prompt),
                              1 + static_cast<int64_t>(rng() % 30));
    r.ignore_eos = true;
    if (i % 3 == 1) {
      r.sampling.temperature = 20.0f;  // the random tiny model is very peaked at T = 1
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 500 + static_cast<uint64_t>(i);
    }
    if (i % 7 == 0) r.num_top_logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Runs `reqs` one after another on a fresh engine (each sees the cache the earlier ones left).
std::vector<Collected> RunInOrder(const EngineOptions& o, int64_t slots,
                                  const std::vector<EngineRequest>& reqs, EngineStats* stats) {
  TinyModel tm(slots);
  Engine engine(*tm.runner, nullptr, o);
  engine.Start();
  std::vector<Collected> out;
  for (const EngineRequest& r : reqs) {
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    out.push_back(Drain(**s));
  }
  *stats = WaitIdle(engine);
  return out;
}

std::vector<Collected> RunTogether(const EngineOptions& o, int64_t slots,
                                   const std::vector<EngineRequest>& reqs, EngineStats* stats) {
  TinyModel tm(slots);
  Engine engine(*tm.runner, nullptr, o);
  engine.Start();
  std::vector<Collected> out = SubmitConcurrently(engine, reqs);
  *stats = WaitIdle(engine);
  return out;
}

void CheckSame(const std::vector<Collected>& on, const std::vector<Collected>& off) {
  REQUIRE(on.size() == off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    INFO("request " << i);
    CHECK(on[i].tokens == off[i].tokens);
    CHECK(on[i].logprobs == off[i].logprobs);
    CHECK(on[i].reason == off[i].reason);
    CHECK(on[i].prompt_tokens == off[i].prompt_tokens);
  }
}

EngineOptions Caching(bool on, int64_t budget = 2048) {
  EngineOptions o;
  o.enable_prefix_caching = on;
  o.max_num_batched_tokens = budget;
  return o;
}

}  // namespace

TEST_CASE("prefix caching: requests in turn reuse cached prefixes and answer as without",
          "[engine][prefix]") {
  const auto reqs = SharedPrefixWorkload(15, 33);
  for (int64_t budget : {2048, 24}) {  // 24: chunked prefill, chunks crossing the cached boundary
    INFO("budget " << budget);
    EngineStats off_stats, on_stats;
    const auto off = RunInOrder(Caching(false, budget), 512, reqs, &off_stats);
    const auto on = RunInOrder(Caching(true, budget), 512, reqs, &on_stats);
    CheckSame(on, off);
    CHECK(off_stats.kv.prefix_cache_queries_total == 0);
    CHECK(on_stats.kv.prefix_cache_hits_total > 0);
    CHECK(on_stats.kv.prefix_cache_hits_total % kBlockSize == 0);
    int64_t prompt_total = 0, cached_total = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      prompt_total += static_cast<int64_t>(reqs[i].prompt.size());
      cached_total += on[i].cached_tokens;
      CHECK(on[i].cached_tokens < static_cast<int64_t>(reqs[i].prompt.size()));
      CHECK(off[i].cached_tokens == 0);
    }
    CHECK(on[0].cached_tokens == 0);
    CHECK(on[1].cached_tokens >= 32);  // the system prompt's two full blocks at least
    CHECK(cached_total == on_stats.kv.prefix_cache_hits_total);
    CHECK(on_stats.kv.prefix_cache_queries_total == prompt_total);
    // Every block is back: the cached ones as evictable.
    CHECK(on_stats.kv.num_free_slots == on_stats.kv.num_slots);
    CHECK(on_stats.kv.num_cached_free_slots > 0);
    CHECK(on_stats.kv.usage == 0.0);
    CHECK(on_stats.requests.prompt_tokens_total == off_stats.requests.prompt_tokens_total);
  }
}

TEST_CASE("prefix caching: concurrent requests, a pool small enough to evict and preempt",
          "[engine][prefix]") {
  const auto reqs = SharedPrefixWorkload(24, 7);
  // 48 head-blocks = 24 blocks of 2 heads = 384 tokens: a few requests at a time.
  for (int64_t slots : {512, 48}) {
    INFO("pool " << slots);
    EngineStats off_stats, on_stats;
    const auto off = RunTogether(Caching(false, 40), slots, reqs, &off_stats);
    const auto on = RunTogether(Caching(true, 40), slots, reqs, &on_stats);
    CheckSame(on, off);
    CHECK(on_stats.kv.num_free_slots == on_stats.kv.num_slots);
    CHECK(on_stats.kv.prefix_cache_hits_total > 0);
    if (slots == 48) {
      CHECK(on_stats.requests.preemptions_total > 0);
      CHECK(on_stats.kv.prefix_cache_evictions_total > 0);
    }
  }
}

TEST_CASE("prefix caching: an abort racing a hit leaves the cache consistent",
          "[engine][prefix]") {
  const auto reqs = SharedPrefixWorkload(12, 99);
  EngineStats off_stats;
  const auto off = RunInOrder(Caching(false), 512, reqs, &off_stats);

  TinyModel tm(96);
  Engine engine(*tm.runner, nullptr, Caching(true, 24));
  engine.Start();
  auto first = engine.Submit(reqs[0]);
  REQUIRE(first.ok());
  Drain(**first);  // its blocks are cached now
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 1; i < reqs.size(); ++i) {
      EngineRequest r = reqs[i];
      r.id += "-" + std::to_string(round);
      auto s = engine.Submit(r);
      REQUIRE(s.ok());
      streams.push_back(*s);
      // Abort every third request at once (before or right after its admission adopts
      // cached blocks), or a bit later while it runs.
      if (i % 3 == static_cast<size_t>(round)) engine.Abort(r.id);
    }
    for (size_t i = 1; i < reqs.size(); ++i) {
      Collected c = Drain(*streams[i - 1]);
      if (c.reason == FinishReasonKind::kAbort) {
        // A prefix of the answer, never a different one.
        REQUIRE(c.tokens.size() <= off[i].tokens.size());
        CHECK(std::equal(c.tokens.begin(), c.tokens.end(), off[i].tokens.begin()));
      } else {
        CHECK(c.tokens == off[i].tokens);
      }
    }
  }
  const EngineStats st = WaitIdle(engine);
  CHECK(st.kv.num_free_slots == st.kv.num_slots);
  CHECK(st.kv.prefix_cache_hits_total > 0);
}

TEST_CASE("prefix caching: prompt logprobs bypass it, cache salts separate it",
          "[engine][prefix]") {
  TinyModel tm(256);
  {
    Engine engine(*tm.runner, nullptr, Caching(true));
    engine.Start();
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(10 + i);
    auto a = engine.Submit(Request("a", prompt, 3));
    REQUIRE(a.ok());
    CHECK(Drain(**a).cached_tokens == 0);
    EngineRequest b = Request("b", prompt, 3);
    b.prompt_logprobs = 1;
    auto sb = engine.Submit(b);
    REQUIRE(sb.ok());
    const Collected cb = Drain(**sb);
    CHECK(cb.cached_tokens == 0);
    CHECK(cb.prompt_logprobs.size() == prompt.size() - 1);
    auto c = engine.Submit(Request("c", prompt, 3));
    REQUIRE(c.ok());
    CHECK(Drain(**c).cached_tokens == 32);  // 2 full blocks; the 8 after them are computed
    // Another cache salt: another cache.
    EngineRequest d = Request("d", prompt, 3);
    d.cache_salt = "tenant-b";
    auto sd = engine.Submit(d);
    REQUIRE(sd.ok());
    CHECK(Drain(**sd).cached_tokens == 0);
    d.id = "e";
    auto se = engine.Submit(d);
    REQUIRE(se.ok());
    CHECK(Drain(**se).cached_tokens == 32);
  }
}

// n > 1 siblings (the server submits n requests with one prompt) and requests whose prompts
// start alike, all queued before the engine starts: the first is admitted, the others wait a
// step for its blocks instead of computing them again, and then adopt them — every output as
// without caching.
TEST_CASE("prefix caching: siblings queued together compute their shared prompt once",
          "[engine][prefix]") {
  std::mt19937_64 rng(99);
  std::vector<int32_t> prompt(90);  // 5 full blocks + 10
  for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 500);
  std::vector<EngineRequest> reqs;
  for (int j = 0; j < 4; ++j) {  // n = 4, seeded as the server seeds siblings (seed + j)
    EngineRequest r = Request("sib" + std::to_string(j), prompt, 8);
    r.ignore_eos = true;
    r.sampling.temperature = 20.0f;
    r.sampling.seed = 1000 + static_cast<uint64_t>(j);
    reqs.push_back(std::move(r));
  }
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 40);  // 2 blocks shared + own
  for (int i = 0; i < 30; ++i) other.push_back(static_cast<int32_t>(460 + i));
  reqs.push_back(Request("other", other, 5));
  reqs.back().ignore_eos = true;
  for (int64_t budget : {2048, 40}) {  // 40: the first sibling's prompt takes three steps
    INFO("budget " << budget);
    auto run = [&](bool caching, EngineStats* stats) {
      TinyModel tm(256);
      Engine engine(*tm.runner, nullptr, Caching(caching, budget));
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (const EngineRequest& r : reqs) {  // all queued before the loop runs
        auto s = engine.Submit(r);
        INFO(s.status().ToString());
        REQUIRE(s.ok());
        streams.push_back(*s);
      }
      engine.Start();
      std::vector<Collected> out;
      for (auto& s : streams) out.push_back(Drain(*s));
      *stats = WaitIdle(engine);
      return out;
    };
    EngineStats off_stats, on_stats;
    const auto off = run(false, &off_stats);
    const auto on = run(true, &on_stats);
    CheckSame(on, off);
    CHECK(on[0].cached_tokens == 0);
    for (int j = 1; j < 4; ++j) CHECK(on[static_cast<size_t>(j)].cached_tokens == 80);
    CHECK(on[4].cached_tokens == 32);
    CHECK(on_stats.kv.num_free_slots == on_stats.kv.num_slots);
  }
}

namespace {

// Bytes of `blocks` blocks in the tiny model's host tier.
double HostTierBytes(int64_t blocks) {
  TinyModel tm(16);
  return static_cast<double>(blocks) *
         static_cast<double>(HostPrefixTier::BytesPerSlot(tm.config.num_hidden_layers,
                                                          tm.config.head_dim,
                                                          tm.backend.activation_dtype())) *
         static_cast<double>(tm.config.num_key_value_heads);
}

EngineOptions WithHostTier(int64_t blocks, int64_t budget = 2048) {
  EngineOptions o = Caching(true, budget);
  o.prefix_cache_host_bytes = HostTierBytes(blocks);
  return o;
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, size_t len) {
  std::vector<int32_t> t(len);
  for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 500);
  return t;
}

}  // namespace

TEST_CASE("prefix caching: the host tier keeps evicted prefixes; hits reload them",
          "[engine][prefix][host]") {
  // A pool of 48 head-blocks (24 blocks, 384 tokens): the second prompt evicts the first
  // one's blocks; its follow-up (the first prompt + a new question) finds them only in the
  // host tier.
  std::mt19937_64 rng(5);
  const std::vector<int32_t> first = RandomTokens(rng, 170);
  std::vector<EngineRequest> reqs;
  reqs.push_back(Request("a", first, 6));
  reqs.push_back(Request("b", RandomTokens(rng, 330), 6));
  std::vector<int32_t> follow = first;
  for (int32_t t : RandomTokens(rng, 21)) follow.push_back(t);
  reqs.push_back(Request("a2", follow, 8));
  for (auto& r : reqs) r.ignore_eos = true;
  reqs[2].sampling.temperature = 20.0f;
  reqs[2].sampling.seed = 9;

  for (int64_t budget : {2048, 24}) {
    INFO("budget " << budget);
    EngineStats off_stats, gpu_stats, host_stats;
    const auto off = RunInOrder(Caching(false, budget), 48, reqs, &off_stats);
    const auto gpu_only = RunInOrder(Caching(true, budget), 48, reqs, &gpu_stats);
    const auto host = RunInOrder(WithHostTier(64, budget), 48, reqs, &host_stats);
    CheckSame(gpu_only, off);
    CheckSame(host, off);
    // Without the tier the follow-up finds only the blocks "b" left in the pool (its first
    // ones: a released table parks its last blocks first, so they are evicted first); with
    // it, the first prompt's ten full blocks are all back, the evicted ones from host memory.
    const int64_t in_pool = gpu_only[2].cached_tokens;
    CHECK(in_pool < 160);
    CHECK(host[2].cached_tokens == 160);
    CHECK(host_stats.kv.prefix_cache_host_hits_total == 160 - in_pool);
    CHECK(host_stats.kv.prefix_cache_hits_total == 160);
    const int64_t block_bytes = static_cast<int64_t>(HostTierBytes(1));
    CHECK(host_stats.kv.prefix_cache_host_reloaded_bytes_total ==
          (160 - in_pool) / kBlockSize * block_bytes);
    CHECK(host_stats.kv.prefix_cache_host_spilled_bytes_total >= 10 * block_bytes);
    CHECK(host_stats.kv.prefix_cache_host_spilled_bytes_total % block_bytes == 0);
    CHECK(host_stats.kv.prefix_cache_host_capacity_blocks == 64);
    CHECK(host_stats.kv.prefix_cache_host_blocks > 0);
    CHECK(host_stats.kv.prefix_cache_host_blocks <= 64);
    CHECK(gpu_stats.kv.prefix_cache_host_capacity_blocks == 0);
    CHECK(host_stats.kv.num_free_slots == host_stats.kv.num_slots);
  }
}

TEST_CASE("prefix caching: a host tier under churn answers as caching off",
          "[engine][prefix][host]") {
  // The shared-prefix workload in a pool that evicts all the time, with tiers from one block
  // (constant host eviction) to room for everything, in turn and concurrently (preemption).
  const auto reqs = SharedPrefixWorkload(24, 11);
  EngineStats off_stats;
  // 24 head-blocks: 12 blocks, 192 tokens (the longest request takes 9 blocks).
  const auto off_in_order = RunInOrder(Caching(false, 40), 24, reqs, &off_stats);
  const auto off_together = RunTogether(Caching(false, 40), 24, reqs, &off_stats);
  for (int64_t blocks : {1, 6, 200}) {
    INFO("tier " << blocks << " blocks");
    EngineStats st;
    CheckSame(RunInOrder(WithHostTier(blocks, 40), 24, reqs, &st), off_in_order);
    CHECK(st.kv.prefix_cache_host_spilled_bytes_total > 0);
    CHECK(st.kv.prefix_cache_host_blocks <= blocks);
    if (blocks == 200) CHECK(st.kv.prefix_cache_host_hits_total > 0);
    CHECK(st.kv.num_free_slots == st.kv.num_slots);
    CheckSame(RunTogether(WithHostTier(blocks, 40), 24, reqs, &st), off_together);
    CHECK(st.kv.num_free_slots == st.kv.num_slots);
  }
}

TEST_CASE("prefix caching: host tier options are checked", "[engine][prefix][host]") {
  TinyModel tm(64);
  EngineOptions o = WithHostTier(4);
  CHECK(Engine::CheckOptions(o, *tm.runner, nullptr).ok());
  o.prefix_cache_host_bytes = HostTierBytes(1) - 1;  // less than one block
  CHECK(Engine::CheckOptions(o, *tm.runner, nullptr).code() == StatusCode::kInvalidArgument);
  o.prefix_cache_host_bytes = -1;
  CHECK(Engine::CheckOptions(o, *tm.runner, nullptr).code() == StatusCode::kInvalidArgument);
  o = WithHostTier(4);
  o.enable_prefix_caching = false;
  CHECK(Engine::CheckOptions(o, *tm.runner, nullptr).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("prefix cache fuzz: runs through a host tier always read the KV of their key",
          "[engine][prefix][host]") {
  // Random chains of blocks are looked up (TakeCachedRun: GPU hits and host-tier reloads),
  // computed where missing (fresh slots written with the key's value and registered) and
  // released, in a pool and a tier both much smaller than the keys: every block a run
  // returns, and every block a holder keeps, must hold its key's value in every layer.
  constexpr int32_t kSlots = 24, kHeads = 2, kPatterns = 6, kIterations = 4000;
  constexpr int64_t kLayers = 2, kDim = 2;
  CpuBackend backend(1);
  std::vector<LayerKvPool> pools;
  for (int64_t l = 0; l < kLayers; ++l)
    pools.push_back({Tensor::Zeros({kSlots, kBlockSize, kDim}, DType::kF32),
                     Tensor::Zeros({kSlots, kBlockSize, kDim}, DType::kF32)});
  BlockAllocator a(kSlots);
  a.EnablePrefixCache(kHeads);
  const size_t per_block = HostPrefixTier::BytesPerSlot(kLayers, kDim, DType::kF32) * kHeads;
  HostPrefixTier tier(backend, pools, kHeads, per_block * 5);
  a.set_host_tier(&tier, &tier);
  const uint64_t root = PrefixCacheRoot(0);
  std::vector<std::vector<int32_t>> token_blocks;
  for (int p = 0; p < kPatterns; ++p) token_blocks.push_back(std::vector<int32_t>(kBlockSize, p));
  auto value = [](uint64_t hash, int32_t h, int64_t l) {
    return static_cast<float>((hash % 9973) * 10 + static_cast<uint64_t>(h) * 3 + static_cast<uint64_t>(l));
  };
  auto write = [&](const std::vector<int32_t>& slots, uint64_t hash) {
    for (int64_t l = 0; l < kLayers; ++l)
      for (Tensor* t : {&pools[l].k, &pools[l].v})
        for (int32_t h = 0; h < kHeads; ++h)
          std::fill_n(t->data<float>() + slots[h] * kBlockSize * kDim, kBlockSize * kDim, value(hash, h, l));
  };
  auto holds = [&](const std::vector<int32_t>& slots, uint64_t hash) {
    for (int64_t l = 0; l < kLayers; ++l)
      for (const Tensor* t : {&pools[l].k, &pools[l].v})
        for (int32_t h = 0; h < kHeads; ++h) {
          const float* p = t->data<float>() + slots[h] * kBlockSize * kDim;
          if (!std::all_of(p, p + kBlockSize * kDim, [&](float x) { return x == value(hash, h, l); }))
            return false;
        }
    return true;
  };
  struct Held {
    std::vector<int32_t> slots;
    uint64_t hash;
  };
  std::vector<std::vector<Held>> holders;
  std::mt19937 rng(33);
  int64_t reloaded_runs = 0;
  for (int it = 0; it < kIterations; ++it) {
    if (rng() % 3 != 0 || holders.empty()) {  // a prompt of 1..4 blocks
      std::vector<PrefixBlockKey> keys;
      uint64_t parent = root;
      const int len = 1 + static_cast<int>(rng() % 4);
      for (int b = 0; b < len; ++b) {
        const auto& toks = token_blocks[rng() % kPatterns];
        const uint64_t hash = HashPrefixBlock(parent, toks);
        keys.push_back({hash, parent, toks});
        parent = hash;
      }
      const int64_t reloads_before = tier.reloaded_blocks_total();
      const int64_t counted = CountCachedRun(a, keys);
      CachedRun run = TakeCachedRun(a, kHeads, keys);
      REQUIRE(static_cast<int64_t>(run.blocks.size()) <= counted);
      if (tier.reloaded_blocks_total() > reloads_before) ++reloaded_runs;
      std::vector<Held> mine;
      for (size_t b = 0; b < run.blocks.size(); ++b) {
        REQUIRE(holds(run.blocks[b], keys[b].hash));
        a.Share(run.blocks[b]);
        mine.push_back({run.blocks[b], keys[b].hash});
      }
      ReleaseCachedRun(a, run);
      for (size_t b = mine.size(); b < keys.size(); ++b) {  // compute the rest
        auto fresh = a.Allocate(kHeads);
        if (!fresh) break;
        write(*fresh, keys[b].hash);
        a.prefix_cache()->Insert(keys[b].hash, keys[b].parent, keys[b].tokens, *fresh);
        mine.push_back({*fresh, keys[b].hash});
      }
      holders.push_back(std::move(mine));
    } else {  // a holder releases everything
      const size_t i = rng() % holders.size();
      for (const Held& h : holders[i]) a.Free(h.slots);
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (holders.size() > 3) {  // keep the pool from filling up with holders
      for (const Held& h : holders.front()) a.Free(h.slots);
      holders.erase(holders.begin());
    }
    for (const auto& hs : holders)
      for (const Held& h : hs) REQUIRE(holds(h.slots, h.hash));
    REQUIRE(tier.num_entries() <= tier.num_blocks_capacity());
  }
  for (const auto& hs : holders)
    for (const Held& h : hs) a.Free(h.slots);
  CHECK(a.num_free() == kSlots);
  CHECK(reloaded_runs > 50);
  CHECK(tier.evictions_total() > 50);
  CHECK(a.prefix_cache()->evictions_total() > 100);
}

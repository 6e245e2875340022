// GPU: lookahead sparse decoding end to end on the CUDA backend with the pipeline's own
// streams (CudaSparseStageSync): a real tiny Qwen3 is prefilled densely, switched to sparse
// and decoded with stacked [x_t, draft] queries, teacher-forced from a dense greedy run on the
// same GPU. With K >= the number of blocks the logits equal dense decoding's within bf16
// tolerance (two query rows and another GEMV shape round differently); with a small K the
// per-step fetch cap holds and every GPU and host slot comes back.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "backend/cuda/cuda_sparse_sync.h"
#include "runner/batch_builder.h"
#include "runner/sparse_ranks.h"
#include "engine/lookahead.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/store_prefix_cache.h"
#include "kvcache/sparse_pipeline.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "gpu_test_util.h"
#include "test_support.h"

using namespace oasis;
using testing::RandomPrompt;
using testing::SmallSparseConfig;

namespace {

constexpr int64_t kSlots = 512;

std::vector<float> Row(const Tensor& logits, int64_t row) {
  const int64_t v = logits.dim(1);
  return std::vector<float>(logits.data<float>() + row * v, logits.data<float>() + (row + 1) * v);
}

int32_t Argmax(const std::vector<float>& v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

Tensor Step(DecoderLM& lm, Backend& b, std::vector<LayerKvPool>& kv, const std::vector<StepSequence>& seqs,
            SparseAttentionPipeline* pipe = nullptr, const SparseStepPlan* plan = nullptr,
            CudaSparseStageSync* sync = nullptr) {
  ForwardInput in = UploadForwardInput(b, BuildHostForwardInput(seqs, LogitsFor::kEveryToken));
  if (pipe != nullptr) pipe->BeginStep(*plan, in.attention, in.slot_mapping);
  Tensor logits = lm.Forward(in, kv, nullptr, pipe);
  if (sync != nullptr) sync->Join();
  Tensor host = b.Download(logits);
  if (pipe != nullptr) pipe->EndStep();
  return host;
}

// The tiny Qwen3 fixture on a CUDA backend.
struct TinyGpuModel {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<DecoderLM> lm;
  TinyGpuModel() {
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
    lm = std::move(*m);
  }
};

}  // namespace

TEST_CASE("sparse decoding on CUDA: K >= blocks matches dense, small K keeps the cap", "[gpu][sparse]") {
  TinyGpuModel tiny;
  CudaBackend& b = *tiny.backend;
  auto& lm = tiny.lm;
  const ModelConfig& c = tiny.config;
  const int32_t hkv = static_cast<int32_t>(c.num_key_value_heads);

  const std::vector<int32_t> prompt = RandomPrompt(c, 150);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int steps = 44;  // crosses block boundaries at 160, 176, 192

  // Dense greedy reference on the GPU.
  std::vector<int32_t> ref_tokens;
  std::vector<std::vector<float>> ref_logits;
  {
    BlockAllocator alloc(kSlots);
    std::vector<LayerKvPool> kv = lm->AllocateKvCache(kSlots);
    HeadBlockTable table(hkv);
    REQUIRE(table.Reserve(n, alloc).ok());
    Tensor logits = Step(*lm, b, kv, {StepSequence{&table, 0, prompt}});
    ref_tokens.push_back(Argmax(Row(logits, n - 1)));
    for (int i = 0; i < steps; ++i) {
      REQUIRE(table.Reserve(n + i + 1, alloc).ok());
      logits = Step(*lm, b, kv, {StepSequence{&table, n + i, {ref_tokens.back()}}});
      ref_logits.push_back(Row(logits, 0));
      ref_tokens.push_back(Argmax(ref_logits.back()));
    }
    table.Release(alloc);
  }

  for (int32_t k : {16, 4}) {
    for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery, SparsePredictor::kOracle}) {
     // host, hbm, and "moved": in the GPU pool, moved to the host store mid-decode (BeginMove,
     // two blocks a step, FinishMove) while it keeps decoding.
     for (int variant : {0, 1, 2}) {
      const KvHome home = variant == 0 ? KvHome::kHost : variant == 1 ? KvHome::kHbm : KvHome::kAuto;
      const bool moves = variant == 2;
      if (moves && predictor == SparsePredictor::kOracle) continue;  // a move needs a prediction
      DYNAMIC_SECTION("K " << k << " predictor " << SparsePredictorName(predictor) << " home "
                           << (moves ? "moved" : KvHomeName(home))) {
        SparseConfig cfg = SmallSparseConfig(k, predictor, 3);
        cfg.home = home;
        bool in_place = home != KvHome::kHost;
        BlockAllocator alloc(kSlots);
        std::vector<LayerKvPool> kv = lm->AllocateKvCache(kSlots);
        SparseKvManager manager(cfg, {c.num_hidden_layers, hkv, c.head_dim}, b, alloc);
        CudaSparseStageSync sync(b, c.num_hidden_layers);
        SparseAttentionPipeline pipe(manager, b, c.num_attention_heads, &sync);
        const int32_t host_total = manager.host_store().num_slots();
        if (in_place) {
          REQUIRE(manager.ReserveInPlace(1, n + steps + 2).ok());
        } else {
          REQUIRE(manager.Reserve(1, n + steps + 2).ok());
        }
        HeadBlockTable table(hkv);
        REQUIRE(table.Reserve(n, alloc).ok());
        (void)Step(*lm, b, kv, {StepSequence{&table, 0, prompt}});
        REQUIRE(manager.SwitchToSparse(1, table, n, kv).ok());
        REQUIRE(manager.gpu_slots_held() == (in_place ? 0 : (k + 2) * hkv));
        REQUIRE(manager.InPlace(1) == in_place);
        double worst = 0;
        int argmax_flips = 0;
        int64_t steps_in_place = -1, fetched_in_place = -1;  // counted when the move finished
        const auto pools = [&](int) -> std::vector<LayerKvPool>& { return kv; };
        for (int i = 0; i < steps; ++i) {
          if (moves && in_place && i >= steps / 3) {  // between steps: copy two blocks, then finish
            if (!manager.Moving(1)) REQUIRE(manager.BeginMove(1).ok());
            manager.CopySome(1, table, n + i, 2, pools);
            if (manager.BlocksToCopy(1, n + i) == 0) {
              REQUIRE(manager.FinishMove(1, table, n + i, pools).ok());
              in_place = false;
              REQUIRE(!manager.InPlace(1));
              REQUIRE(table.num_blocks() == 0);  // the pool has the table's blocks back
              REQUIRE(manager.gpu_slots_held() == (k + 2) * hkv);
              const SparseMetrics before = pipe.CollectMetrics();
              steps_in_place = before.steps;
              fetched_in_place = 0;
              for (const SparseLayerMetrics& l : before.layers) fetched_in_place += l.fetched;
            }
          }
          // In place the request keeps growing its dense table (the draft's slot too).
          if (in_place) REQUIRE(table.Reserve(n + i + 2, alloc).ok());
          HeadBlockTable* own = in_place ? &table : nullptr;
          SparseStepPlan plan = manager.BuildStepPlan({{1, n + i, 2, own}});
          std::vector<StepSequence> seqs = {StepSequence{own, n + i,
                                                         {ref_tokens[static_cast<size_t>(i)], ref_tokens[static_cast<size_t>(i) + 1]},
                                                         &plan.slots[0]}};
          Tensor logits = Step(*lm, b, kv, seqs, &pipe, &plan, &sync);
          const std::vector<float> got = Row(logits, 0), &want = ref_logits[static_cast<size_t>(i)];
          float scale = 0;
          for (float x : want) scale = std::max(scale, std::fabs(x));
          for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, double(std::fabs(got[j] - want[j]) / scale));
          argmax_flips += Argmax(got) != Argmax(want);
        }
        const SparseMetrics met = pipe.CollectMetrics();
        INFO("worst |sparse - dense| / max|dense| = " << worst << ", argmax flips " << argmax_flips);
        if (k == 16) {  // 13 blocks at most: everything is resident, so sparse is dense up to rounding
          CHECK(worst < 0.03);
          CHECK(argmax_flips <= 2);
        }
        for (const SparseLayerMetrics& l : met.layers) {
          CHECK(l.fetched <= int64_t{steps} * hkv * cfg.max_fetch());
          if (home == KvHome::kHbm && !moves) CHECK(l.fetched == 0);  // read in place: nothing crosses PCIe
        }
        if (home == KvHome::kHbm && !moves) CHECK(met.hit_rate() == 1.0);
        if (moves) {  // the move finished, nothing was fetched before it, and every step counted
          REQUIRE(fetched_in_place == 0);
          CHECK(steps_in_place > 0);
        }
        CHECK(met.steps + (moves ? steps_in_place : 0) == steps);
        WARN("K " << k << " " << SparsePredictorName(predictor) << " "
                  << (moves ? "moved" : KvHomeName(home)) << ": hit rate "
                  << met.hit_rate() << ", fetched/step " << met.fetched_per_step() << ", worst rel diff " << worst);
        manager.Release(1);
        table.Release(alloc);
        REQUIRE(alloc.num_free() == kSlots);
        REQUIRE(manager.host_store().num_free() == host_total);
        REQUIRE(manager.gpu_slots_held() == 0);
      }
     }
    }
  }
}

// One host store (docs/prefix_caching.md): a host-home switch that adopts the host slots an
// earlier request with the same prompt left in the store's prefix cache (no copy, no summary)
// decodes as the switch that copied them: same K/V, same summaries, the same logits on CUDA.
TEST_CASE("sparse decoding on CUDA: a switch that adopts cached host slots equals one that copies",
          "[gpu][sparse][prefix]") {
  TinyGpuModel tiny;
  CudaBackend& b = *tiny.backend;
  auto& lm = tiny.lm;
  const ModelConfig& c = tiny.config;
  const int32_t hkv = static_cast<int32_t>(c.num_key_value_heads);
  const std::vector<int32_t> prompt = RandomPrompt(c, 150);
  const int64_t n = static_cast<int64_t>(prompt.size()), full = n / kBlockSize;
  const int steps = 20;
  SparseConfig cfg = SmallSparseConfig(4, SparsePredictor::kPreviousQuery, 3);
  cfg.home = KvHome::kHost;
  BlockAllocator alloc(kSlots);
  std::vector<LayerKvPool> kv = lm->AllocateKvCache(kSlots);
  SparseKvManager manager(cfg, {c.num_hidden_layers, hkv, c.head_dim}, b, alloc);
  CudaSparseStageSync sync(b, c.num_hidden_layers);
  SparseAttentionPipeline pipe(manager, b, c.num_attention_heads, &sync);
  StorePrefixCache cache(manager.host_store(), hkv, StorePrefixCache::Unit::kSlots);
  std::vector<uint64_t> hashes = HashPrefixBlocks(PrefixCacheRoot(0), prompt);
  auto key = [&](int64_t blk) {
    return PrefixBlockKey{hashes[static_cast<size_t>(blk)], blk == 0 ? PrefixCacheRoot(0) : hashes[static_cast<size_t>(blk - 1)],
                          std::span<const int32_t>(prompt).subspan(static_cast<size_t>(blk * kBlockSize), kBlockSize)};
  };
  // Request id: prefill, switch (adopting what the cache holds), `steps` greedy sparse steps
  // from the same tokens; its logits, then its dense blocks' slots to the cache.
  auto run = [&](uint64_t id, int64_t* adopted) {
    REQUIRE(manager.Reserve(id, n + steps + 2).ok());
    HeadBlockTable table(hkv);
    REQUIRE(table.Reserve(n, alloc).ok());
    Tensor logits = Step(*lm, b, kv, {StepSequence{&table, 0, prompt}});
    int32_t next = Argmax(Row(logits, n - 1));
    std::vector<int32_t> slots;
    *adopted = 0;
    for (int64_t blk = 0; blk < full; ++blk) {
      auto got = cache.Acquire(key(blk));
      if (!got) break;
      slots.insert(slots.end(), got->begin(), got->end());
      ++*adopted;
    }
    if (*adopted > 0) REQUIRE(manager.AdoptHostPrefix(id, *adopted, slots).ok());
    REQUIRE(manager.SwitchToSparse(id, table, n, kv).ok());
    std::vector<std::vector<float>> out;
    for (int i = 0; i < steps; ++i) {
      SparseStepPlan plan = manager.BuildStepPlan({{id, n + i, 1, nullptr}});
      std::vector<StepSequence> seqs = {StepSequence{nullptr, n + i, {next}, &plan.slots[0]}};
      logits = Step(*lm, b, kv, seqs, &pipe, &plan, &sync);
      out.push_back(Row(logits, 0));
      next = Argmax(out.back());
    }
    const std::vector<int32_t> mine = manager.DetachHostPrefix(id, full);
    for (int64_t blk = 0; blk < static_cast<int64_t>(mine.size()) / hkv; ++blk) {
      if (blk < *adopted) {
        cache.Release(key(blk), {}, true);
      } else {
        cache.Release(key(blk), std::span<const int32_t>(mine).subspan(static_cast<size_t>(blk * hkv), static_cast<size_t>(hkv)),
                      false);
      }
    }
    manager.Release(id);
    table.Release(alloc);
    return out;
  };
  int64_t adopted_first = 0, adopted_second = 0;
  const std::vector<std::vector<float>> first = run(1, &adopted_first), second = run(2, &adopted_second);
  CHECK(adopted_first == 0);
  CHECK(adopted_second == full);
  REQUIRE(first.size() == second.size());
  // The same K/V and summaries: equal up to the kernels' own run-to-run differences (none
  // expected; a wrong adopted slot moves the logits by tens of percent).
  double worst = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    float scale = 0;
    for (float x : first[i]) scale = std::max(scale, std::fabs(x));
    for (size_t j = 0; j < first[i].size(); ++j)
      worst = std::max(worst, double(std::fabs(first[i][j] - second[i][j]) / scale));
    CHECK(Argmax(first[i]) == Argmax(second[i]));
  }
  INFO("worst relative difference " << worst);
  CHECK(worst < 1e-3);
  while (cache.EvictOldest()) {
  }
  CHECK(manager.host_store().num_free() == manager.host_store().num_slots());
  CHECK(alloc.num_free() == kSlots);
}

TEST_CASE("CudaSparseStageSync makes the next step's attention wait for the layer's transfer",
          "[gpu][sparse]") {
  auto backend = CudaBackend::Create();
  REQUIRE(backend.ok());
  CudaBackend& b = **backend;
  CudaSparseStageSync sync(b, 2);
  Tensor flag = b.Upload(Tensor::Zeros({1}, DType::kF32));
  Tensor seen = b.Empty({1}, DType::kF32);
  b.Synchronize();  // the allocations and the upload happened on the main stream
  // Layer 1's transfer: the transfer stream is held for 20 ms (a host function), then writes a
  // marker.
  sync.Enter(SparseStage::kTransfer, 1);
  REQUIRE(cudaLaunchHostFunc(b.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); },
                             nullptr) == cudaSuccess);
  b.Fill(flag, 7.0f);
  sync.Exit(SparseStage::kTransfer, 1);
  // Layer 1's attention at the next step waits for it on the main stream: what it reads
  // afterwards must see the marker.
  sync.Enter(SparseStage::kAttention, 1);
  b.Copy(flag, seen);
  sync.Exit(SparseStage::kAttention, 1);
  sync.Join();
  const Tensor host = b.Download(seen);
  CHECK(host.data<float>()[0] == 7.0f);
}

TEST_CASE("sparse decode steps as CUDA graphs equal the eager sparse steps", "[gpu][sparse][graphs]") {
  TinyGpuModel tiny;
  CudaBackend& b = *tiny.backend;
  auto& lm = tiny.lm;
  const ModelConfig& c = tiny.config;
  const int32_t hkv = static_cast<int32_t>(c.num_key_value_heads);
  const std::vector<int32_t> prompt = RandomPrompt(c, 150);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int steps = 40;

  // One run through CudaGraphRunner::Run's sparse steps: one sequence, greedy, decoding with
  // stacked [x_t, draft] queries where a fixed token stands in for the draft.
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    size_t graphs = 0;
  };
  auto run = [&](bool graphs, SparsePredictor predictor, KvHome home) {
    const bool in_place = home == KvHome::kHbm;
    CudaGraphOptions go;
    go.num_kv_slots = kSlots;
    go.max_batch = 4;
    go.max_context = 512;
    go.sparse_graphs = graphs;
    auto runner = CudaGraphRunner::Create(*lm, b, go);
    REQUIRE(runner.ok());
    // Every 4th step measures agreement and so runs eagerly: graph captures follow eager
    // steps, whose device allocations the capture may drop (freed after it, not inside).
    SparseConfig cfg = SmallSparseConfig(4, predictor, 4);
    cfg.home = home;
    BlockAllocator alloc(kSlots);
    SparseKvManager manager(cfg, {c.num_hidden_layers, hkv, c.head_dim}, b, alloc);
    SparseAttachment attachment(**runner, manager);  // the runner's pipeline (after the manager: goes first)
    if (in_place) {
      REQUIRE(manager.ReserveInPlace(1, n + steps + 2).ok());
    } else {
      REQUIRE(manager.Reserve(1, n + steps + 2).ok());
    }
    HeadBlockTable table(hkv);
    REQUIRE(table.Reserve(n, alloc).ok());
    SampleRow greedy;
    greedy.params.temperature = 0.0f;
    Run r;
    auto first = (*runner)->Run(
        {.input = BuildHostForwardInput({StepSequence{&table, 0, prompt}}, LogitsFor::kLastTokenOfEachSequence),
         .rows = {greedy}});
    r.tokens.push_back(first[0].token);
    REQUIRE(manager.SwitchToSparse(1, table, n, (*runner)->kv_pools()).ok());
    for (int i = 0; i < steps; ++i) {
      if (in_place) REQUIRE(table.Reserve(n + i + 2, alloc).ok());  // it keeps its dense table
      HeadBlockTable* own = in_place ? &table : nullptr;
      SparseStepPlan plan = manager.BuildStepPlan({{1, n + i, 2, own}});
      std::vector<StepSequence> seqs = {StepSequence{own, n + i, {r.tokens.back(), 7}, &plan.slots[0]}};
      const ForwardInput in = BuildLookaheadTargetInput(seqs, {1}, false, nullptr);
      auto out = (*runner)->Run(
          {.input = in, .rows = {greedy}, .sparse = SparseStepInputs{&plan, cfg.predictor != SparsePredictor::kOracle,
                                                                     cfg.transfers}});
      REQUIRE(out.size() == 1);
      r.tokens.push_back(out[0].token);
      r.logprobs.push_back(out[0].logprob);
    }
    const SparseMetrics met = (*runner)->CollectSparseMetrics();
    CHECK(met.steps == steps);
    for (const SparseLayerMetrics& l : met.layers) {
      CHECK(l.fetched <= int64_t{steps} * hkv * cfg.max_fetch());
      if (in_place) CHECK(l.fetched == 0);
    }
    // The step ends' waits for the side streams, timed by events (graph replays record them too).
    CHECK(met.transfer_wait_seconds >= 0.0);
    CHECK(met.transfer_wait_seconds < 0.5 * steps);
    WARN((graphs ? "graphs" : "eager") << ": step ends waited " << met.transfer_wait_seconds * 1e3 << " ms in all");
    r.graphs = (*runner)->num_graphs();
    manager.Release(1);
    table.Release(alloc);
    REQUIRE(alloc.num_free() == kSlots);
    REQUIRE(manager.gpu_slots_held() == 0);
    return r;
  };
  for (auto [predictor, home] : {std::pair{SparsePredictor::kDraft, KvHome::kHost},
                                 std::pair{SparsePredictor::kPreviousQuery, KvHome::kHost},
                                 std::pair{SparsePredictor::kDraft, KvHome::kHbm}}) {
    DYNAMIC_SECTION("predictor " << SparsePredictorName(predictor) << " home " << KvHomeName(home)) {
      const Run eager = run(false, predictor, home);
      const Run graphs = run(true, predictor, home);
      CHECK(eager.graphs == 0);
      CHECK(graphs.graphs >= 1);  // the decode steps replayed a sparse graph
      // Same kernels in the same order: the same tokens, up to a divergence at a near-tie.
      size_t same = 0;
      while (same < eager.tokens.size() && eager.tokens[same] == graphs.tokens[same]) ++same;
      INFO("identical for " << same << " of " << eager.tokens.size() << " tokens");
      REQUIRE(same >= 1);  // the prefill is eager in both runs
      for (size_t i = 1; i < same; ++i) CHECK(std::fabs(eager.logprobs[i - 1] - graphs.logprobs[i - 1]) < 5e-2);
      if (same < eager.tokens.size()) CHECK(std::fabs(eager.logprobs[same - 1] - graphs.logprobs[same - 1]) < 0.1);
      CHECK(same >= eager.tokens.size() / 2);
    }
  }
}

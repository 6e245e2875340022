// GPU: tensor parallelism over NCCL (src/runner/tp/cuda_tp_runner.h). A TpModelRunner with one
// rank per GPU (2 when the host has them) must reproduce the single-GPU CudaGraphRunner on the
// tiny fixtures within bf16 tolerance: prompt logits (eager prefill), one-token decode steps
// (CUDA graphs that captured the NCCL all-reduces), greedy continuations (a divergence only at
// a near-tie, as the other GPU tests allow), the EAGLE-3 residual capture; every rank
// captures the same graphs and samples the same tokens; sparse KV runs per rank on its local
// heads; Qwen3-MoE fixtures match up to router flips at near-ties. Build failures name the rank, and
// GPU counts are checked before anything loads. With one GPU the same checks run on a group
// of one (a warning says TP=2 was skipped).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runner/cuda/cuda_graph_runner.h"
#include "common/cuda_rt.h"
#include "runner/batch_builder.h"
#include "engine/generator.h"
#include "runner/sparse_ranks.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "loader/weights.h"
#include "runner/tp/cuda_tp_runner.h"
#include "fixture_model.h"
#include "gpu_test_util.h"
#include "test_support.h"

using namespace oasis;

namespace {

using Checkpoint = testing::FixtureCheckpoint;
constexpr auto Open = testing::OpenFixtureModel;
using testing::NormalizedError;

int TpSize() {
  const int n = cuda::DeviceCount();
  if (n < 2) WARN("fewer than 2 GPUs (" << n << "): TP=2 is skipped, a tensor-parallel group of one GPU runs instead");
  return n >= 2 ? 2 : 1;
}

constexpr int64_t kSlots = 1024;
const CudaGraphOptions kGraphs{.num_kv_slots = 0, .max_batch = 16, .max_context = 512, .enabled = true};

// The whole model on GPU 0 through the graph runner: what the group must reproduce.
struct OneGpu {
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<CudaGraphRunner> runner;
  explicit OneGpu(const Checkpoint& ck) {
    OASIS_CUDA_CHECK(cudaSetDevice(0));
    auto b = CudaBackend::Create();
    REQUIRE(b.ok());
    backend = std::move(*b);
    auto m = DecoderLM::Create(ck.config, *ck.weights, *backend);
    REQUIRE(m.ok());
    model = std::move(*m);
    CudaGraphOptions go = kGraphs;
    go.num_kv_slots = kSlots;
    auto r = CudaGraphRunner::Create(*model, *backend, go);
    REQUIRE(r.ok());
    runner = std::move(*r);
  }
};

std::unique_ptr<TpModelRunner> MakeTp(const Checkpoint& ck, int size) {
  CudaTpOptions o;
  o.size = size;
  o.graph = kGraphs;
  CudaTpHooks h;
  h.load_shard = [&](CudaBackend& b, const TensorParallel& tp) {
    return DecoderLM::Create(ck.config, *ck.weights, b, tp);
  };
  h.kv_slots = [](int, CudaBackend&, DecoderLM&) -> StatusOr<int64_t> { return kSlots; };
  auto r = CreateCudaTpRunner(ck.config, o, h);
  REQUIRE(r.ok());
  return std::move(*r);
}

size_t GraphsOf(TpModelRunner& tp, int r) {
  auto* g = dynamic_cast<CudaGraphRunner*>(&tp.rank(r).runner());
  REQUIRE(g != nullptr);
  return g->num_graphs();
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 300, 11},
    {1, 5, 9},
    {1, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418},
};

// Greedy continuations of kPrompts (24 tokens, top-2 log-probs) on one GPU and on the group:
// equal up to a step where the one-GPU top-2 margin is below `max_margin` (bf16 partial sums
// may flip only a near-tie); over the equal prefix the log-probs within `max_logprob_diff`
// (< 0: not checked).
void CheckGreedyAgainstOneGpu(ModelRunner& one, TpModelRunner& tp, const char* name, int n,
                              float max_margin, double max_logprob_diff) {
  std::vector<GenerationRequest> reqs;
  for (const auto& prompt : kPrompts) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.num_top_logprobs = 2;
    reqs.push_back(r);
  }
  Generator g1(one, {.max_step_tokens = 512});
  Generator g2(tp, {.max_step_tokens = 512});
  auto want = g1.Generate(reqs);
  auto got = g2.Generate(reqs);
  REQUIRE(want.ok());
  REQUIRE(got.ok());
  for (size_t s = 0; s < reqs.size(); ++s) {
    const auto& x = (*got)[s];
    const auto& y = (*want)[s];
    size_t same = 0;
    while (same < y.tokens.size() && same < x.tokens.size() && x.tokens[same] == y.tokens[same]) ++same;
    if (max_logprob_diff >= 0) {
      for (size_t i = 0; i < same; ++i) CHECK(std::fabs(x.samples[i].logprob - y.samples[i].logprob) < max_logprob_diff);
    }
    if (same < y.tokens.size()) {
      const auto& top = y.samples[same].top_logprobs;
      REQUIRE(top.size() == 2);
      const float margin = top[0].logprob - top[1].logprob;
      WARN(name << " request " << s << ": TP=" << n << " greedy diverges at step " << same << ", one-GPU margin "
                << margin);
      CHECK(margin < max_margin);
    }
  }
}

}  // namespace

TEST_CASE("TP on GPUs equals one GPU: prefill, graph decode steps, greedy continuations", "[gpu][tp]") {
  const int n = TpSize();
  for (const char* name : {"qwen3-tiny", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    DYNAMIC_SECTION(name << ", TP=" << n) {
      Checkpoint ck = Open(name);
      OneGpu one(ck);
      CudaGraphRunner& ref = *one.runner;
      auto tp = MakeTp(ck, n);
      REQUIRE(tp->size() == n);
      CHECK(tp->num_kv_slots() == kSlots);
      CHECK(tp->model().config().num_key_value_heads == ck.config.num_key_value_heads / n);

      for (int64_t chunk : {512, 1}) {  // one prefill step; then every token a graph decode step
        for (size_t p = 0; p < kPrompts.size(); ++p) {
          INFO("prompt " << p << ", chunk " << chunk);
          Generator g1(ref, {.max_step_tokens = chunk});
          Generator g2(*tp, {.max_step_tokens = chunk});
          auto want = g1.PromptLogits(kPrompts[p]);
          auto got = g2.PromptLogits(kPrompts[p]);
          REQUIRE(want.ok());
          REQUIRE(got.ok());
          const double err = NormalizedError(*got, *want);
          INFO("normalized error TP=" << n << " vs one GPU: " << err);
          CHECK(err < 2e-2);
        }
      }
      // The log-probs come from bf16 logits: at the fixtures' logit magnitudes (8-16) one bf16
      // step is 0.0625-0.125, and TP's bf16 partial sums move a logit by about one step
      // (measured on the H200 pair: up to 0.107, while the logits' normalized error stays
      // under 2e-2 above). A sharding bug moves them by whole units.
      CheckGreedyAgainstOneGpu(ref, *tp, name, n, 0.1f, 0.15);
      CHECK(tp->sample_mismatches() == 0);  // every rank sampled the same tokens
      // Decode steps ran as graphs on every rank, the same graphs everywhere.
      CHECK(GraphsOf(*tp, 0) >= 1);
      for (int r = 1; r < n; ++r) CHECK(GraphsOf(*tp, r) == GraphsOf(*tp, 0));
    }
  }
}

TEST_CASE("TP on GPUs with Qwen3-MoE equals one GPU up to router flips at near-ties", "[gpu][tp][moe]") {
  // Each rank holds a slice of every expert's intermediate size (the router replicated) and the
  // experts' partial outputs join the down projection's all-reduce. TP's bf16 partial sums move
  // the router's logits a little, which flips an expert choice where two are near-tied (these
  // tiny random models have gaps of ~0.01): the bounds are test_gpu_moe's for the same fixtures
  // against transformers (median position 3e-2, whole prompt 6e-2, greedy flips only at a
  // near-tie); a sharding bug is O(1) everywhere.
  const int n = TpSize();
  for (const char* name : {"qwen3-moe-tiny", "qwen3-moe-tiny-mixed"}) {
    DYNAMIC_SECTION(name << ", TP=" << n) {
      Checkpoint ck = Open(name);
      REQUIRE(ck.config.HasMoeLayers());
      OneGpu one(ck);
      auto tp = MakeTp(ck, n);
      REQUIRE(tp->size() == n);
      const int64_t vocab = ck.config.vocab_size;
      for (int64_t chunk : {512, 1}) {  // one prefill step; then every token a graph decode step
        for (size_t p = 0; p < kPrompts.size(); ++p) {
          INFO("prompt " << p << ", chunk " << chunk);
          Generator g1(*one.runner, {.max_step_tokens = chunk});
          Generator g2(*tp, {.max_step_tokens = chunk});
          auto want = g1.PromptLogits(kPrompts[p]);
          auto got = g2.PromptLogits(kPrompts[p]);
          REQUIRE(want.ok());
          REQUIRE(got.ok());
          REQUIRE(got->numel() == want->numel());
          const int64_t positions = want->numel() / vocab;
          std::vector<double> per_position;
          for (int64_t i = 0; i < positions; ++i) {
            double num = 0, den = 0;
            for (int64_t v = 0; v < vocab; ++v) {
              const double w = want->data<float>()[i * vocab + v], d = got->data<float>()[i * vocab + v] - w;
              num += d * d;
              den += w * w;
            }
            per_position.push_back(std::sqrt(num / std::max(den, 1e-30)));
          }
          std::sort(per_position.begin(), per_position.end());
          const double err = NormalizedError(*got, *want);
          INFO("normalized error TP=" << n << " vs one GPU " << err << ", median position "
                                      << per_position[per_position.size() / 2]);
          CHECK(per_position[per_position.size() / 2] < 3e-2);
          CHECK(err < 6e-2);
        }
      }
      CheckGreedyAgainstOneGpu(*one.runner, *tp, name, n, 0.25f, -1);
      CHECK(tp->sample_mismatches() == 0);
      CHECK(GraphsOf(*tp, 0) >= 1);
      for (int r = 1; r < n; ++r) CHECK(GraphsOf(*tp, r) == GraphsOf(*tp, 0));
    }
  }
}

TEST_CASE("TP on GPUs: decode with the residual capture (lookahead) equals one GPU", "[gpu][tp]") {
  const int n = TpSize();
  Checkpoint ck = Open("qwen3-tiny");
  OneGpu one(ck);
  CudaGraphRunner& ref = *one.runner;
  CudaBackend& backend = *one.backend;
  auto tp = MakeTp(ck, n);
  const int64_t L = ck.config.num_hidden_layers, H = ck.config.hidden_size;
  const std::vector<int32_t> prompt = kPrompts[0];
  // One table per runner: the one-GPU model lists all KV heads, the group its local ones.
  BlockAllocator a1(kSlots), a2(kSlots);
  HeadBlockTable t1(static_cast<int32_t>(ck.config.num_key_value_heads));
  HeadBlockTable t2(static_cast<int32_t>(tp->model().config().num_key_value_heads));
  const int64_t total = static_cast<int64_t>(prompt.size()) + 4;
  REQUIRE(t1.Reserve(total, a1).ok());
  REQUIRE(t2.Reserve(total, a2).ok());
  (void)ref.Execute(BuildHostForwardInput({StepSequence{&t1, 0, prompt}}, LogitsFor::kLastTokenOfEachSequence));
  (void)tp->Execute(BuildHostForwardInput({StepSequence{&t2, 0, prompt}}, LogitsFor::kLastTokenOfEachSequence));
  for (int step = 0; step < 3; ++step) {  // a graph per (bucket, capture ids); replayed after the first
    INFO("decode step " << step);
    const int64_t pos = static_cast<int64_t>(prompt.size()) + step;
    const std::vector<int32_t> tok = {static_cast<int32_t>(20 + step)};
    std::vector<SampleRow> rows(1);
    rows[0].params.temperature = 0;
    ResidualCapture c1, c2;
    c1.layer_ids = c2.layer_ids = {0, 1, L};
    int host_work = 0;
    const ForwardInput in1 = BuildHostForwardInput({StepSequence{&t1, pos, tok}}, LogitsFor::kLastTokenOfEachSequence);
    const ForwardInput in2 = BuildHostForwardInput({StepSequence{&t2, pos, tok}}, LogitsFor::kLastTokenOfEachSequence);
    auto s1 = ref.Run({.input = in1, .rows = rows, .capture = &c1});
    auto s2 = tp->Run({.input = in2, .rows = rows, .capture = &c2, .while_running = [&] { ++host_work; }});
    CHECK(host_work == 1);
    REQUIRE(s1.size() == 1);
    REQUIRE(s2.size() == 1);
    CHECK(std::fabs(s1[0].logprob - s2[0].logprob) < 5e-2);
    // Rank 0's capture (on GPU 0): its first row per layer equals the one-GPU capture's.
    REQUIRE(c2.out.dim(0) == 3);
    REQUIRE(c2.out.dim(2) == H);
    const Tensor h1 = backend.Download(c1.out).ToFloat();
    OASIS_CUDA_CHECK(cudaSetDevice(0));
    Tensor d2 = c2.out;  // device 0 memory; the reference backend's stream is on device 0 too
    const Tensor h2 = backend.Download(d2).ToFloat();
    for (int64_t l = 0; l < 3; ++l) {
      const Tensor r1 = h1.Slice(l, l + 1).Reshape({h1.dim(1), H}).Slice(0, 1);
      const Tensor r2 = h2.Slice(l, l + 1).Reshape({h2.dim(1), H}).Slice(0, 1);
      CHECK(NormalizedError(r2.Clone(), r1.Clone()) < 2e-2);
    }
  }
  CHECK(tp->sample_mismatches() == 0);
  t1.Release(a1);
  t2.Release(a2);
}

TEST_CASE("TP on GPUs: sizes and GPU counts are checked first; a failing rank names itself", "[gpu][tp]") {
  Checkpoint ck = Open("qwen3-tiny");  // 4 query heads, 2 KV heads
  ModelConfig wide = ck.config;
  wide.num_attention_heads = 64;
  wide.num_key_value_heads = 64;
  wide.intermediate_size = 64 * 16;
  CudaTpOptions many;
  many.size = 64;  // more GPUs than any host here
  const Status st = CheckCudaTensorParallel(wide, many);
  CHECK(st.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(st.message(), Catch::Contains("needs 64 GPUs") && Catch::Contains("this host has"));
  CudaTpOptions three;
  three.size = 3;
  CHECK(CheckCudaTensorParallel(ck.config, three).code() == StatusCode::kInvalidArgument);

  const int n = TpSize();
  CudaTpOptions o;
  o.size = n;
  o.graph = kGraphs;
  CudaTpHooks h;
  h.load_shard = [&](CudaBackend& b, const TensorParallel& tp) -> StatusOr<std::unique_ptr<DecoderLM>> {
    if (tp.rank == n - 1) return NotFound("weights of rank " + std::to_string(tp.rank) + " on purpose");
    return DecoderLM::Create(ck.config, *ck.weights, b, tp);
  };
  h.kv_slots = [](int, CudaBackend&, DecoderLM&) -> StatusOr<int64_t> { return kSlots; };
  auto bad = CreateCudaTpRunner(ck.config, o, h);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kNotFound);
  CHECK_THAT(bad.status().message(), Catch::Contains("tensor-parallel rank " + std::to_string(n - 1)));
  // The memory plan is the minimum over ranks.
  h.load_shard = [&](CudaBackend& b, const TensorParallel& tp) { return DecoderLM::Create(ck.config, *ck.weights, b, tp); };
  h.kv_slots = [](int r, CudaBackend&, DecoderLM&) -> StatusOr<int64_t> { return 512 - 100 * r; };
  auto ok = CreateCudaTpRunner(ck.config, o, h);
  REQUIRE(ok.ok());
  CHECK((*ok)->num_kv_slots() == 512 - 100 * (n - 1));
}

// Sparse KV under TP (docs/parallel.md §6): each rank's pipeline runs on its own KV heads
// with its own device side (host store share, summaries, state) and its own streams; the
// ranks share the plan. Teacher-forced from a dense greedy run of the same group: with K >=
// the number of blocks the sparse steps pick the same tokens (a near-tie may flip one or
// two) with log-probs within bf16 rounding; with a small K every rank keeps the per-head
// fetch cap; every GPU and host slot comes back.
TEST_CASE("TP on GPUs: sparse KV per rank matches dense with K >= blocks and keeps the cap", "[gpu][tp][sparse]") {
  const int n_ranks = TpSize();
  Checkpoint ck = Open("qwen3-tiny");
  auto tp = MakeTp(ck, n_ranks);
  const ModelConfig& local = tp->model().config();
  const int32_t hkv = static_cast<int32_t>(local.num_key_value_heads);
  const std::vector<int32_t> prompt = testing::RandomPrompt(local, 150);
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int steps = 40;
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  greedy.num_top_logprobs = 1;  // (log-probs are computed for rows that ask for them)

  // Dense greedy reference: ref[i] is the token at position n + i, lp[i] its log-prob.
  std::vector<int32_t> ref;
  std::vector<float> lp;
  {
    BlockAllocator alloc(kSlots);
    HeadBlockTable table(hkv);
    REQUIRE(table.Reserve(n, alloc).ok());
    auto s = tp->Run({.input = BuildHostForwardInput({StepSequence{&table, 0, prompt}}, LogitsFor::kLastTokenOfEachSequence),
                      .rows = {greedy}});
    ref.push_back(s[0].token);
    lp.push_back(s[0].logprob);
    for (int i = 0; i < steps; ++i) {
      REQUIRE(table.Reserve(n + i + 1, alloc).ok());
      s = tp->Run({.input = BuildHostForwardInput({StepSequence{&table, n + i, {ref.back()}}},
                                                  LogitsFor::kLastTokenOfEachSequence),
                   .rows = {greedy}});
      ref.push_back(s[0].token);
      lp.push_back(s[0].logprob);
    }
    table.Release(alloc);
  }

  const std::vector<std::vector<LayerKvPool>*> pools = RankKvPools(*tp);
  for (int32_t k : {16, 4}) {
    for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery}) {
      DYNAMIC_SECTION("TP=" << n_ranks << " K " << k << " predictor " << SparsePredictorName(predictor)) {
        const SparseConfig cfg = testing::SmallSparseConfig(k, predictor, 3);
        BlockAllocator alloc(kSlots);
        SparseKvManager manager(cfg, {local.num_hidden_layers, hkv, local.head_dim}, RankBackends(*tp), alloc,
                                RankSideRunner(*tp));
        REQUIRE(manager.num_sides() == n_ranks);
        SparseAttachment attachment(*tp, manager);  // (after the manager: detached first, on the ranks)
        const int32_t host_total = manager.host_store().num_slots();
        REQUIRE(manager.Reserve(1, n + steps + 2).ok());
        HeadBlockTable table(hkv);
        REQUIRE(table.Reserve(n, alloc).ok());
        (void)tp->Run({.input = BuildHostForwardInput({StepSequence{&table, 0, prompt}},
                                                      LogitsFor::kLastTokenOfEachSequence),
                       .rows = {greedy}});
        REQUIRE(manager
                    .SwitchToSparse(1, table, n,
                                    [&](int r) -> std::vector<LayerKvPool>& { return *pools[static_cast<size_t>(r)]; })
                    .ok());
        REQUIRE(manager.gpu_slots_held() == (k + 2) * hkv);
        const bool draft = predictor == SparsePredictor::kDraft;
        int flips = 0;
        double worst_lp = 0;
        for (int i = 0; i < steps; ++i) {
          const auto u = static_cast<size_t>(i);
          SparseStepPlan plan = manager.BuildStepPlan({{1, n + i, draft ? 2 : 1, nullptr}});
          std::vector<int32_t> toks = {ref[u]};
          if (draft) toks.push_back(ref[u + 1]);
          const ForwardInput in = BuildHostForwardInput({StepSequence{nullptr, n + i, toks, &plan.slots[0]}},
                                                        LogitsFor::kEveryToken);
          const auto s = tp->Run({.input = in,
                                  .rows = std::vector<SampleRow>(toks.size(), greedy),
                                  .sparse = SparseStepInputs{&plan, cfg.predictor != SparsePredictor::kOracle,
                                                             cfg.transfers}});
          REQUIRE(s.size() == toks.size());
          if (s[0].token != ref[u + 1]) {
            ++flips;
          } else {
            worst_lp = std::max(worst_lp, double(std::fabs(s[0].logprob - lp[u + 1])));
          }
        }
        INFO("argmax flips " << flips << ", worst log-prob difference " << worst_lp);
        if (k == 16) {  // 12 blocks at most: everything stays resident
          CHECK(flips <= 2);
          CHECK(worst_lp < 0.15);
        }
        const std::vector<SparseMetrics> met = tp->CollectSparseMetricsEach();
        for (const SparseMetrics& m : met) {
          CHECK(m.steps == steps);
          for (const SparseLayerMetrics& l : m.layers) CHECK(l.fetched <= int64_t{steps} * hkv * cfg.max_fetch());
        }
        if (k == 4) CHECK(met[0].Total().fetched > 0);
        WARN("TP=" << n_ranks << " K " << k << " " << SparsePredictorName(predictor) << ": hit rate " << met[0].hit_rate()
                   << ", flips " << flips << ", worst log-prob diff " << worst_lp);
        CHECK(tp->sample_mismatches() == 0);
        manager.Release(1);
        table.Release(alloc);
        CHECK(alloc.num_free() == kSlots);
        CHECK(manager.host_store().num_free() == host_total);
        CHECK(manager.gpu_slots_held() == 0);
      }
    }
  }
}

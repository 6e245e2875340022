// Lookahead sparse decoding end to end on the CPU reference (docs/sparse.md): a real tiny
// Qwen3 (tests/fixtures/models/qwen3-tiny) is prefilled densely, switched to sparse and decoded
// step by step with stacked [x_t, draft] queries through SparseKvManager +
// SparseAttentionPipeline as DecoderLM::Forward's layer hook. Tokens are teacher-forced from a
// dense greedy run so the logits of every step can be compared with it.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "runner/batch_builder.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "test_support.h"

using namespace oasis;

namespace {

constexpr int64_t kSlots = 512;

struct Model {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<DecoderLM> lm;
};

Model LoadQwen3Tiny(Backend& backend) {
  auto dir = testing::FixturePath("models/qwen3-tiny");
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  auto lm = DecoderLM::Create(*config, **weights, backend);
  REQUIRE(lm.ok());
  return Model{*config, std::move(*weights), std::move(*lm)};
}

int32_t Argmax(const Tensor& logits, int64_t row) {
  const int64_t v = logits.dim(1);
  const float* p = logits.data<float>() + row * v;
  return static_cast<int32_t>(std::max_element(p, p + v) - p);
}

std::vector<float> RowOf(const Tensor& logits, int64_t row) {
  const int64_t v = logits.dim(1);
  return std::vector<float>(logits.data<float>() + row * v, logits.data<float>() + (row + 1) * v);
}

// `planned`: the CUDA-graph path of the pipeline (persistent plan buffers, predict rows
// padded to R) instead of BeginStep.
Tensor RunStep(Model& m, Backend& b, std::vector<LayerKvPool>& kv, const std::vector<StepSequence>& seqs,
               SparseAttentionPipeline* pipe = nullptr, const SparseStepPlan* plan = nullptr, bool planned = false) {
  ForwardInput in = UploadForwardInput(b, BuildHostForwardInput(seqs, LogitsFor::kEveryToken));
  if (pipe != nullptr && planned) {
    pipe->ReservePlan(in.attention.block_tables.dim(0), in.token_ids.numel());
    pipe->UploadPlan(*plan);
    pipe->BeginPlannedStep(in.attention, in.slot_mapping);
  } else if (pipe != nullptr) {
    pipe->BeginStep(*plan, in.attention, in.slot_mapping);
  }
  Tensor logits = b.Download(m.lm->Forward(in, kv, nullptr, pipe));
  if (pipe != nullptr) pipe->EndStep();
  return logits;
}

std::vector<int32_t> RandomPrompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = tok(rng);
  return p;
}

// A dense greedy run: tokens[0] is the token after the prompt; logits[i] are the logits of the
// step that fed tokens[i].
struct Reference {
  std::vector<int32_t> tokens;              // [steps + 1]
  std::vector<std::vector<float>> logits;   // [steps]
};

Reference DenseReference(Model& m, Backend& b, const std::vector<int32_t>& prompt, int steps) {
  BlockAllocator alloc(kSlots);
  std::vector<LayerKvPool> kv = m.lm->AllocateKvCache(kSlots);
  HeadBlockTable table(static_cast<int32_t>(m.config.num_key_value_heads));
  const int64_t n = static_cast<int64_t>(prompt.size());
  REQUIRE(table.Reserve(n, alloc).ok());
  Tensor logits = RunStep(m, b, kv, {StepSequence{&table, 0, prompt}});
  Reference ref;
  ref.tokens.push_back(Argmax(logits, n - 1));
  for (int i = 0; i < steps; ++i) {
    REQUIRE(table.Reserve(n + i + 1, alloc).ok());
    logits = RunStep(m, b, kv, {StepSequence{&table, n + i, {ref.tokens.back()}}});
    ref.logits.push_back(RowOf(logits, 0));
    ref.tokens.push_back(Argmax(logits, 0));
  }
  table.Release(alloc);
  return ref;
}

SparseConfig BaseConfig(int32_t k, double fetch_ratio, SparsePredictor predictor, int32_t dense_layers) {
  SparseConfig c;
  c.topk_blocks = k;
  c.fetch_ratio = fetch_ratio;
  c.sparse_threshold = 64;
  c.dense_layers = dense_layers;
  c.host_kv_gib = 0.004;
  c.predictor = predictor;
  c.max_sparse_seqs = 4;
  c.max_seq_len = 512;
  c.agreement_interval = 3;
  return c;
}

// Per-step observations of a sparse run.
struct StepCheck {
  std::function<void(int step, const Tensor& logits)> on_logits;
  std::function<void(int step)> after_step;
  bool planned = false;  // RunStep's planned path
};

// Prefills `prompt` densely, switches to sparse, then decodes `steps` tokens teacher-forced
// from `ref` with [x_t, draft] (draft = ref's next token, or `bad_draft` when set). With
// `dense_companion`, a second, dense sequence decodes in the same batches (its logits are
// checked against `companion_ref`). Returns every resource at the end and checks it.
void SparseRun(Model& m, CpuBackend& b, const SparseConfig& cfg, const std::vector<int32_t>& prompt,
               const Reference& ref, int steps, const StepCheck& check, bool bad_draft = false,
               const std::vector<int32_t>* companion_prompt = nullptr, const Reference* companion_ref = nullptr) {
  const int32_t hkv = static_cast<int32_t>(m.config.num_key_value_heads);
  BlockAllocator alloc(kSlots);
  std::vector<LayerKvPool> kv = m.lm->AllocateKvCache(kSlots);
  SparseKvManager manager(cfg, {m.config.num_hidden_layers, hkv, m.config.head_dim}, b, alloc);
  SparseAttentionPipeline pipe(manager, b, m.config.num_attention_heads);
  const int32_t host_total = manager.host_store().num_slots();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const uint64_t id = 7, companion = 8;

  REQUIRE(manager.CheckAdmission(n + steps + 2) == HostAdmission::kFits);
  REQUIRE(manager.Reserve(id, n + steps + 2).ok());
  HeadBlockTable table(hkv), ctable(hkv);
  REQUIRE(table.Reserve(n, alloc).ok());
  Tensor logits = RunStep(m, b, kv, {StepSequence{&table, 0, prompt}});
  REQUIRE(Argmax(logits, n - 1) == ref.tokens[0]);
  int64_t cn = 0;
  if (companion_prompt != nullptr) {
    cn = static_cast<int64_t>(companion_prompt->size());
    REQUIRE(ctable.Reserve(cn, alloc).ok());
    Tensor cl = RunStep(m, b, kv, {StepSequence{&ctable, 0, *companion_prompt}});
    REQUIRE(Argmax(cl, cn - 1) == companion_ref->tokens[0]);
  }
  REQUIRE(manager.ShouldSwitch(id, n));
  REQUIRE(manager.SwitchToSparse(id, table, n, kv).ok());
  REQUIRE(manager.IsSparse(id));
  if (cfg.dense_layers == 0) REQUIRE(table.num_blocks() == 0);  // its slots now belong to the manager

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(m.config.vocab_size) - 1);
  for (int i = 0; i < steps; ++i) {
    const int64_t pos = n + i;
    const int32_t draft = bad_draft ? tok(rng) : ref.tokens[static_cast<size_t>(i) + 1];
    std::vector<SparseBatchEntry> entries = {{id, pos, 2, cfg.dense_layers > 0 ? &table : nullptr}};
    if (cfg.dense_layers > 0) REQUIRE(table.Reserve(pos + 2, alloc).ok());
    if (companion_prompt != nullptr) {
      REQUIRE(ctable.Reserve(cn + i + 1, alloc).ok());
      entries.push_back({companion, cn + i, 1, &ctable});
    }
    SparseStepPlan plan = manager.BuildStepPlan(entries);
    std::vector<StepSequence> seqs = {
        StepSequence{cfg.dense_layers > 0 ? &table : nullptr, pos, {ref.tokens[static_cast<size_t>(i)], draft}, &plan.slots[0]}};
    if (companion_prompt != nullptr) {
      seqs.push_back(StepSequence{&ctable, cn + i, {companion_ref->tokens[static_cast<size_t>(i)]}});
    }
    logits = RunStep(m, b, kv, seqs, &pipe, &plan, check.planned);
    if (check.on_logits) check.on_logits(i, logits);
    if (companion_prompt != nullptr) {
      REQUIRE(RowOf(logits, 2) == companion_ref->logits[static_cast<size_t>(i)]);
    }
    if (check.after_step) check.after_step(i);
  }
  const SparseMetrics metrics = pipe.CollectMetrics();
  CHECK(metrics.steps == steps);
  manager.Release(id);
  table.Release(alloc);
  ctable.Release(alloc);
  REQUIRE(alloc.num_free() == kSlots);  // every GPU slot is back
  REQUIRE(manager.host_store().num_free() == host_total);
  REQUIRE(manager.num_sparse() == 0);
  REQUIRE(manager.gpu_slots_held() == 0);
}

}  // namespace

TEST_CASE("with K >= the number of blocks sparse decoding equals dense decoding exactly", "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(150, m.config.vocab_size, 11);  // 9 full blocks + 6 tokens
  const int steps = 44;                                            // crosses blocks at 160, 176, 192
  const Reference ref = DenseReference(m, b, prompt, steps);
  for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery, SparsePredictor::kOracle}) {
    for (int32_t dense_layers : {0, 1}) {
      for (bool bad_draft : {false, true}) {
        DYNAMIC_SECTION(SparsePredictorName(predictor) << " dense_layers " << dense_layers << " bad draft " << bad_draft) {
          const SparseConfig cfg = BaseConfig(/*k=*/16, /*fetch_ratio=*/0.05, predictor, dense_layers);
          StepCheck check;
          check.on_logits = [&](int i, const Tensor& logits) {
            INFO("step " << i);
            REQUIRE(RowOf(logits, 0) == ref.logits[static_cast<size_t>(i)]);  // bit-exact
          };
          SparseRun(m, b, cfg, prompt, ref, steps, check, bad_draft);
        }
      }
    }
  }
}

TEST_CASE("dense and sparse sequences share a batch", "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(100, m.config.vocab_size, 5);
  const auto other = RandomPrompt(37, m.config.vocab_size, 6);
  const int steps = 30;
  const Reference ref = DenseReference(m, b, prompt, steps);
  const Reference other_ref = DenseReference(m, b, other, steps);
  const SparseConfig cfg = BaseConfig(/*k=*/8, /*fetch_ratio=*/0.25, SparsePredictor::kDraft, 0);
  StepCheck check;
  check.on_logits = [&](int i, const Tensor& logits) {  // K = 8 >= every candidate count: exact too
    REQUIRE(logits.dim(0) == 3);
    REQUIRE(RowOf(logits, 0) == ref.logits[static_cast<size_t>(i)]);
  };
  SparseRun(m, b, cfg, prompt, ref, steps, check, false, &other, &other_ref);
}

TEST_CASE("small K: at most C fetches per head per step, constant working set", "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(200, m.config.vocab_size, 21);  // 12 full blocks + 8 tokens
  const int steps = 60;
  const Reference ref = DenseReference(m, b, prompt, steps);
  for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery, SparsePredictor::kOracle}) {
    DYNAMIC_SECTION(SparsePredictorName(predictor)) {
      const SparseConfig cfg = BaseConfig(/*k=*/4, /*fetch_ratio=*/0.25, predictor, 0);  // C = 1
      REQUIRE(cfg.max_fetch() == 1);
      const int64_t hkv = m.config.num_key_value_heads, k = cfg.topk_blocks;
      // Observe the manager's device state between steps through a second view of it.
      SparseKvManager* mgr = nullptr;
      std::vector<Tensor> before;
      int64_t max_diff_seen = 0;
      // Run manually (as SparseRun, plus per-step state inspection).
      const int32_t h32 = static_cast<int32_t>(hkv);
      BlockAllocator alloc(kSlots);
      std::vector<LayerKvPool> kv = m.lm->AllocateKvCache(kSlots);
      SparseKvManager manager(cfg, {m.config.num_hidden_layers, h32, m.config.head_dim}, b, alloc);
      mgr = &manager;
      SparseAttentionPipeline pipe(manager, b, m.config.num_attention_heads);
      const int64_t n = static_cast<int64_t>(prompt.size());
      REQUIRE(manager.Reserve(1, n + steps + 2).ok());
      HeadBlockTable table(h32);
      REQUIRE(table.Reserve(n, alloc).ok());
      (void)RunStep(m, b, kv, {StepSequence{&table, 0, prompt}});
      const int32_t free_before_switch = alloc.num_free();
      REQUIRE(manager.SwitchToSparse(1, table, n, kv).ok());
      // 13 blocks per head held densely; K + 2 kept: the rest went back to the pool.
      REQUIRE(manager.gpu_slots_held() == (k + 2) * hkv);
      REQUIRE(alloc.num_free() == free_before_switch + (13 - (k + 2)) * hkv);
      for (int i = 0; i < steps; ++i) {
        before.clear();
        for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) before.push_back(mgr->state().layer(l).ws_blocks.Clone());
        SparseStepPlan plan = manager.BuildStepPlan({{1, n + i, 2, nullptr}});
        Tensor logits = RunStep(m, b, kv,
                                {StepSequence{nullptr, n + i, {ref.tokens[static_cast<size_t>(i)], ref.tokens[static_cast<size_t>(i) + 1]}, &plan.slots[0]}},
                                &pipe, &plan);
        for (int64_t x = 0; x < logits.numel(); ++x) REQUIRE(std::isfinite(logits.data<float>()[x]));
        const SparseMetrics met = pipe.CollectMetrics();
        for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
          SparseLayerState& ls = mgr->state().layer(l);
          REQUIRE(met.layers[static_cast<size_t>(l)].fetched <= cfg.max_fetch() * hkv);
          for (int64_t h = 0; h < hkv; ++h) {
            int64_t changed = 0, resident = 0;
            for (int64_t j = 0; j < k; ++j) {
              const int32_t now = ls.ws_blocks.data<int32_t>()[h * k + j];
              changed += now != before[static_cast<size_t>(l)].data<int32_t>()[h * k + j];
              resident += now >= 0;
            }
            REQUIRE(changed <= cfg.max_fetch());  // never more than C new blocks per head per step
            REQUIRE(resident == k);               // the working set stays full (K blocks)
            REQUIRE(ls.num_resident.data<int32_t>()[h] == k);
            max_diff_seen = std::max(max_diff_seen, changed);
          }
        }
        REQUIRE(manager.gpu_slots_held() == (k + 2) * hkv);  // constant working-set size
      }
      CHECK(max_diff_seen == 1);  // the selection did move
      manager.Release(1);
      REQUIRE(alloc.num_free() == kSlots);
      REQUIRE(manager.host_slots_reserved() == 0);
    }
  }
}

TEST_CASE("predictors report hit rate, fetches and sampled top-K agreement", "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(240, m.config.vocab_size, 31);
  const int steps = 24;
  const Reference ref = DenseReference(m, b, prompt, steps);
  for (auto [predictor, reduce] : {std::pair{SparsePredictor::kDraft, GroupReduce::kSum},
                                   std::pair{SparsePredictor::kPreviousQuery, GroupReduce::kSum},
                                   std::pair{SparsePredictor::kDraft, GroupReduce::kMax},
                                   std::pair{SparsePredictor::kPreviousQuery, GroupReduce::kMax}}) {
    const char* reduce_name = reduce == GroupReduce::kSum ? "sum" : "max";
    DYNAMIC_SECTION(SparsePredictorName(predictor) << " group " << reduce_name) {
      SparseConfig cfg = BaseConfig(/*k=*/6, /*fetch_ratio=*/0.34, predictor, 0);  // C = 3
      cfg.agreement_interval = 2;
      cfg.group_reduce = reduce;
      const int32_t hkv = static_cast<int32_t>(m.config.num_key_value_heads);
      BlockAllocator alloc(kSlots);
      std::vector<LayerKvPool> kv = m.lm->AllocateKvCache(kSlots);
      SparseKvManager manager(cfg, {m.config.num_hidden_layers, hkv, m.config.head_dim}, b, alloc);
      SparseAttentionPipeline pipe(manager, b, m.config.num_attention_heads);
      const int64_t n = static_cast<int64_t>(prompt.size());
      REQUIRE(manager.Reserve(3, n + steps + 2).ok());
      HeadBlockTable table(hkv);
      REQUIRE(table.Reserve(n, alloc).ok());
      (void)RunStep(m, b, kv, {StepSequence{&table, 0, prompt}});
      REQUIRE(manager.SwitchToSparse(3, table, n, kv).ok());
      for (int i = 0; i < steps; ++i) {
        SparseStepPlan plan = manager.BuildStepPlan({{3, n + i, 2, nullptr}});
        (void)RunStep(m, b, kv, {StepSequence{nullptr, n + i, {ref.tokens[static_cast<size_t>(i)], ref.tokens[static_cast<size_t>(i) + 1]}, &plan.slots[0]}},
                      &pipe, &plan);
      }
      const SparseMetrics met = pipe.CollectMetrics();
      const SparseLayerMetrics t = met.Total();
      CHECK(met.steps == steps);
      // Every step predicts K blocks per head and layer: hits + misses = steps * layers * heads * K.
      CHECK(t.hits + t.misses == int64_t{steps} * m.config.num_hidden_layers * hkv * cfg.topk_blocks);
      CHECK(t.fetched <= int64_t{steps} * m.config.num_hidden_layers * hkv * cfg.max_fetch());
      CHECK(t.fetched > 0);
      // Sampled on even steps after the first: 11 samples of K blocks per head and layer.
      CHECK(t.agree_total == int64_t{11} * m.config.num_hidden_layers * hkv * cfg.topk_blocks);
      CHECK(t.agree_overlap > 0);
      CHECK(met.h2d_bytes_per_step() == Approx(met.fetched_per_step() * 2 * 16 * m.config.head_dim * 4));
      const double hit = met.hit_rate(), agree = met.agreement();
      CHECK((hit > 0.0 && hit < 1.0));
      CHECK((agree > 0.0 && agree <= 1.0));
      WARN(SparsePredictorName(predictor) << " (group " << reduce_name << "): hit rate " << hit << ", agreement " << agree << ", fetched/step "
                                          << met.fetched_per_step());
      // A second collection starts from zero.
      REQUIRE(pipe.CollectMetrics().Total().hits == 0);
      manager.Release(3);
      REQUIRE(alloc.num_free() == kSlots);
    }
  }
}

TEST_CASE("transfers off (a measurement mode): selection goes on, no block is copied into the working set",
          "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(200, m.config.vocab_size, 41);
  const int steps = 24;
  const Reference ref = DenseReference(m, b, prompt, steps);
  for (bool transfers : {true, false}) {
    DYNAMIC_SECTION("transfers " << transfers) {
      SparseConfig cfg = BaseConfig(/*k=*/4, /*fetch_ratio=*/0.25, SparsePredictor::kPreviousQuery, 0);
      cfg.transfers = transfers;
      const int32_t hkv = static_cast<int32_t>(m.config.num_key_value_heads);
      BlockAllocator alloc(kSlots);
      std::vector<LayerKvPool> kv = m.lm->AllocateKvCache(kSlots);
      SparseKvManager manager(cfg, {m.config.num_hidden_layers, hkv, m.config.head_dim}, b, alloc);
      SparseAttentionPipeline pipe(manager, b, m.config.num_attention_heads);
      const int64_t n = static_cast<int64_t>(prompt.size());
      REQUIRE(manager.Reserve(1, n + steps + 2).ok());
      HeadBlockTable table(hkv);
      REQUIRE(table.Reserve(n, alloc).ok());
      (void)RunStep(m, b, kv, {StepSequence{&table, 0, prompt}});
      REQUIRE(manager.SwitchToSparse(1, table, n, kv).ok());
      // The K rows of every working slot (they change only when a fetched block lands there).
      std::vector<int32_t> slots;
      const Tensor& ws = manager.state().ws_slots;
      for (int64_t i = 0; i < ws.numel(); ++i)
        if (ws.data<int32_t>()[i] >= 0) slots.push_back(ws.data<int32_t>()[i]);
      REQUIRE(!slots.empty());
      const int64_t block_floats = kBlockSize * m.config.head_dim;
      auto snapshot = [&] {
        std::vector<float> out;
        for (int64_t l = 0; l < m.config.num_hidden_layers; ++l)
          for (int32_t s : slots) {
            const float* p = kv[static_cast<size_t>(l)].k.data<float>() + s * block_floats;
            out.insert(out.end(), p, p + block_floats);
          }
        return out;
      };
      const std::vector<float> before = snapshot();
      int64_t fetched = 0;
      for (int i = 0; i < steps; ++i) {
        SparseStepPlan plan = manager.BuildStepPlan({{1, n + i, 2, nullptr}});
        Tensor logits = RunStep(
            m, b, kv,
            {StepSequence{nullptr, n + i, {ref.tokens[static_cast<size_t>(i)], ref.tokens[static_cast<size_t>(i) + 1]},
                          &plan.slots[0]}},
            &pipe, &plan);
        for (int64_t x = 0; x < logits.numel(); ++x) REQUIRE(std::isfinite(logits.data<float>()[x]));
        for (const SparseLayerMetrics& l : pipe.CollectMetrics().layers) fetched += l.fetched;
      }
      CHECK(fetched > 0);  // the selection admitted blocks either way
      CHECK((snapshot() != before) == transfers);
      manager.Release(1);
      REQUIRE(alloc.num_free() == kSlots);
      REQUIRE(manager.host_slots_reserved() == 0);
    }
  }
}

TEST_CASE("the planned path (persistent plan buffers, predict rows padded to R) equals BeginStep's", "[models][sparse]") {
  CpuBackend b;
  Model m = LoadQwen3Tiny(b);
  const auto prompt = RandomPrompt(150, m.config.vocab_size, 13);
  const int steps = 40;
  const Reference ref = DenseReference(m, b, prompt, steps);
  for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery}) {
    DYNAMIC_SECTION(SparsePredictorName(predictor)) {
      // K >= blocks: exact against dense; then small K: equal to BeginStep's run step by step.
      StepCheck exact;
      exact.planned = true;
      exact.on_logits = [&](int i, const Tensor& logits) {
        REQUIRE(RowOf(logits, 0) == ref.logits[static_cast<size_t>(i)]);
      };
      SparseRun(m, b, BaseConfig(/*k=*/16, /*fetch_ratio=*/0.05, predictor, 0), prompt, ref, steps, exact);
      const SparseConfig small = BaseConfig(/*k=*/4, /*fetch_ratio=*/0.25, predictor, 0);
      std::vector<std::vector<float>> eager;
      StepCheck record;
      record.on_logits = [&](int, const Tensor& logits) { eager.push_back(RowOf(logits, 0)); };
      SparseRun(m, b, small, prompt, ref, steps, record);
      StepCheck same;
      same.planned = true;
      same.on_logits = [&](int i, const Tensor& logits) {
        REQUIRE(RowOf(logits, 0) == eager[static_cast<size_t>(i)]);
      };
      SparseRun(m, b, small, prompt, ref, steps, same);
    }
  }
}

TEST_CASE("PadStepPlan pads a plan to a bucket with inert sequences and tokens", "[models][sparse]") {
  SparseStepPlan p;
  const int64_t S = 2, T = 3, H = 2;
  auto filled = [](std::vector<int64_t> shape, DType dt, int64_t v) {
    Tensor t = Tensor::Empty(std::move(shape), dt);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dt == DType::kI64) t.data<int64_t>()[i] = v + i; else t.data<int32_t>()[i] = static_cast<int32_t>(v + i);
    }
    return t;
  };
  p.seq_rows = filled({S}, DType::kI32, 0);
  p.tail_slots = filled({S, H, 2}, DType::kI32, 10);
  p.tail_lens = filled({S}, DType::kI32, 5);
  p.host_mapping = filled({T, H}, DType::kI64, 100);
  p.summary_src = filled({S * H}, DType::kI32, 20);
  p.summary_len = filled({S * H}, DType::kI32, 1);
  p.summary_dst = filled({S * H}, DType::kI32, 30);
  p.predict_gather = filled({1}, DType::kI32, 1);
  p.num_sparse = 1;
  p.slots.resize(S);
  const SparseStepPlan q = PadStepPlan(p, 4, 8);
  REQUIRE(q.seq_rows.numel() == 4);
  REQUIRE(q.tail_slots.shape() == (std::vector<int64_t>{4, H, 2}));
  REQUIRE(q.host_mapping.shape() == (std::vector<int64_t>{8, H}));
  REQUIRE(q.summary_len.numel() == 4 * H);
  REQUIRE(q.slots.size() == 4);
  for (int64_t i = 0; i < 4; ++i) CHECK(q.seq_rows.data<int32_t>()[i] == (i < S ? i : -1));
  for (int64_t i = 0; i < 4 * H * 2; ++i) CHECK(q.tail_slots.data<int32_t>()[i] == (i < S * H * 2 ? 10 + i : -1));
  for (int64_t i = 0; i < 4; ++i) CHECK(q.tail_lens.data<int32_t>()[i] == (i < S ? 5 + i : 0));
  for (int64_t i = 0; i < 8 * H; ++i) CHECK(q.host_mapping.data<int64_t>()[i] == (i < T * H ? 100 + i : -1));
  for (int64_t i = 0; i < 4 * H; ++i) {
    CHECK(q.summary_len.data<int32_t>()[i] == (i < S * H ? 1 + i : 0));
    CHECK(q.summary_dst.data<int32_t>()[i] == (i < S * H ? 30 + i : -1));
  }
  CHECK(q.predict_gather.numel() == 1);  // padded to R by UploadPlan, not here
  CHECK(q.num_sparse == 1);
}

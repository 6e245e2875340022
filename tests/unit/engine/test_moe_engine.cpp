// The engine over a Qwen3-MoE model with dummy weights (--load-format dummy) on the CPU
// backend: continuous batching (concurrent requests, chunked prefill, preemptions) gives each
// request the same tokens and log-probs as running it alone, and lookahead decoding with an
// EAGLE-3 head (aux layers captured from the MoE target) equals plain decoding, and so does
// sparse KV (attention is ordinary GQA) with K covering every block.
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/lookahead.h"
#include "engine/sparse_decoding.h"
#include "kvcache/sparse_config.h"
#include "models/eagle3.h"
#include "runner/draft_runner.h"
#include "test_engine_util.h"

using namespace oasis;
using namespace oasis::engine_test;

namespace {

constexpr int64_t kVocab = 128;

ModelConfig MoeConfig() {
  nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                      {"hidden_size", 32},
                      {"intermediate_size", 48},
                      {"moe_intermediate_size", 16},
                      {"num_experts", 6},
                      {"num_experts_per_tok", 2},
                      {"norm_topk_prob", true},
                      {"mlp_only_layers", {1}},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 8},
                      {"vocab_size", kVocab},
                      {"max_position_embeddings", 512},
                      {"rope_theta", 1000000.0},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2}};
  auto c = ParseModelConfig(j.dump(), "moe config");
  REQUIRE(c.ok());
  return *c;
}

// A dummy-weight MoE model and its runner. Matrices N(0, 0.25) instead of the benchmark
// default 0.02, so routing and greedy choices are well spread.
struct DummyMoe {
  explicit DummyMoe(int64_t num_kv_slots) : config(MoeConfig()), backend(2) {
    std::vector<WeightSpec> specs = DecoderLM::ExpectedWeights(config);
    for (WeightSpec& s : specs) s.stddev = 0.25f;
    weights = MakeDummyWeights(std::move(specs), 11);
    auto m = DecoderLM::Create(config, *weights, backend);
    REQUIRE(m.ok());
    model = std::move(*m);
    runner = std::make_unique<ModelRunner>(*model, backend, num_kv_slots);
  }
  ModelConfig config;
  CpuBackend backend;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<ModelRunner> runner;
};

std::vector<EngineRequest> Workload() {
  std::mt19937_64 rng(77);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % (kVocab - 3));
    EngineRequest r = Request("moe-" + std::to_string(i), std::move(prompt),
                              1 + static_cast<int64_t>(rng() % 20));
    r.ignore_eos = true;
    if (i % 3 == 1) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 500 + static_cast<uint64_t>(i);
    }
    if (i % 4 == 0) r.num_top_logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

std::vector<Collected> RunQueued(ModelRunner& runner, EngineOptions opt,
                                 const std::vector<EngineRequest>& reqs,
                                 DraftRunner* draft = nullptr) {
  Engine engine(runner, nullptr, opt, draft);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) {
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  engine.Start();
  std::vector<Collected> out;
  for (const auto& s : streams) out.push_back(Drain(*s));
  WaitIdle(engine);
  engine.Stop();
  return out;
}

void CheckSame(const std::vector<EngineRequest>& reqs, const std::vector<Collected>& got,
               const std::vector<Collected>& want) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO(reqs[i].id);
    CHECK(got[i].error.ok());
    CHECK(got[i].tokens == want[i].tokens);
    CHECK(got[i].logprobs == want[i].logprobs);  // bit-equal: the CPU ops are row-independent
    CHECK(got[i].top_logprobs == want[i].top_logprobs);
  }
}

}  // namespace

TEST_CASE("MoE (dummy weights): outputs are the same alone and under continuous batching",
          "[engine][moe]") {
  const std::vector<EngineRequest> reqs = Workload();
  std::vector<Collected> alone;
  {
    DummyMoe m(256);
    Engine engine(*m.runner, nullptr, {});
    engine.Start();
    for (const EngineRequest& r : reqs) {
      auto s = engine.Submit(r);
      REQUIRE(s.ok());
      alone.push_back(Drain(**s));
    }
  }
  std::set<int32_t> distinct;
  for (size_t i = 0; i < reqs.size(); ++i) {
    REQUIRE(alone[i].error.ok());
    CHECK(static_cast<int64_t>(alone[i].tokens.size()) == reqs[i].max_tokens);
    distinct.insert(alone[i].tokens.begin(), alone[i].tokens.end());
  }
  CHECK(distinct.size() >= 10);  // the outputs are not degenerate
  struct Config {
    const char* name;
    int64_t slots, budget, max_seqs;
  };
  for (const Config& cfg : {Config{"roomy", 256, 2048, 64}, Config{"chunked prefill", 256, 16, 64},
                            Config{"small pool: preemptions", 12, 24, 8}}) {
    DYNAMIC_SECTION(cfg.name) {
      DummyMoe m(cfg.slots);
      EngineOptions opt;
      opt.max_num_batched_tokens = cfg.budget;
      opt.max_num_seqs = cfg.max_seqs;
      CheckSame(reqs, RunQueued(*m.runner, opt, reqs), alone);
    }
  }
}

TEST_CASE("MoE (dummy weights): lookahead with an EAGLE-3 head equals plain decoding",
          "[engine][moe][lookahead]") {
  std::vector<EngineRequest> reqs = Workload();
  for (EngineRequest& r : reqs) {  // greedy: reject and speculate must reproduce it exactly
    r.sampling.temperature = 0;
    r.sampling.seed.reset();
  }
  DummyMoe m(256);
  const std::vector<Collected> plain = RunQueued(*m.runner, {}, reqs);
  ModelConfig hc = Eagle3Head::ConfigForTarget(m.config);
  CHECK(hc.num_experts == 0);  // the head's one layer is dense
  auto head = Eagle3Head::CreateDummy(hc, *m.model, m.backend, 5);
  REQUIRE(head.ok());
  DraftRunner draft(**head, m.backend,
                    DraftKvSlotsFor(m.runner->num_kv_slots(), m.config.num_key_value_heads,
                                    (*head)->config().num_key_value_heads));
  for (LookaheadMode mode : {LookaheadMode::kReject, LookaheadMode::kSpeculate}) {
    DYNAMIC_SECTION(LookaheadModeName(mode)) {
      EngineOptions opt;
      opt.lookahead = mode;
      CheckSame(reqs, RunQueued(*m.runner, opt, reqs, &draft), plain);
    }
  }
}

TEST_CASE("MoE (dummy weights): sparse KV with K >= the blocks equals dense decoding",
          "[engine][moe][sparse]") {
  std::mt19937_64 rng(9);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt(40 + rng() % 160);  // most pass the threshold of 64 tokens
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % (kVocab - 3));
    EngineRequest r = Request("moe-sparse-" + std::to_string(i), std::move(prompt),
                              20 + static_cast<int64_t>(rng() % 20));
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  DummyMoe m(256);
  const std::vector<Collected> dense = RunQueued(*m.runner, {}, reqs);
  SparseConfig sparse;
  sparse.topk_blocks = 16;  // >= the longest context (240 tokens = 15 blocks): all resident
  sparse.fetch_ratio = 0.1;
  sparse.sparse_threshold = 64;
  sparse.predictor = SparsePredictor::kOracle;
  sparse.max_sparse_seqs = 16;
  // A host slot: K and V of 16 tokens x head_dim 8 x 3 layers in f32.
  sparse.host_kv_gib = 4096.5 * (2.0 * 16 * 8 * 3 * 4) / (1024.0 * 1024.0 * 1024.0);
  EngineOptions opt;
  opt.sparse = sparse;
  REQUIRE(Engine::CheckOptions(opt, *m.runner, nullptr).ok());
  Engine engine(*m.runner, nullptr, opt);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : reqs) {
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  engine.Start();
  std::vector<Collected> out;
  for (const auto& s : streams) out.push_back(Drain(*s));
  CheckSame(reqs, out, dense);
  EngineStats st = engine.Stats();
  for (int i = 0; i < 2000 && st.sparse.num_requests > 0; ++i) {
    std::this_thread::sleep_for(5ms);
    st = engine.Stats();
  }
  CHECK(st.sparse.switches_total >= 4);  // requests really went sparse
  CHECK(st.sparse.steps_total > 0);
  engine.Stop();
}

TEST_CASE("MoE: the pressure policy's read budget counts the k experts a token reads",
          "[engine][moe][sparse]") {
  const ModelConfig moe = MoeConfig();
  int64_t all = 0, experts = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(moe)) {
    const int64_t bytes = w.numel() * 2;  // bf16
    all += bytes;
    if (w.name.find(".mlp.experts.") != std::string::npos) experts += bytes;
  }
  REQUIRE(experts > 0);
  const int64_t kv_per_token = 2 * 3 * 2 * 8 * 2;  // K and V, 3 layers, 2 KV heads, d 8, bf16
  // 2 of 6 experts per token: a third of the expert bytes, all of the rest.
  CHECK(DenseReadBudgetTokens(moe) == (all - experts + experts * 2 / 6) / kv_per_token);
  // The same model with every layer dense reads every weight.
  ModelConfig dense = moe;
  dense.num_experts = 0;
  dense.num_experts_per_tok = 0;
  int64_t dense_bytes = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(dense)) dense_bytes += w.numel() * 2;
  CHECK(DenseReadBudgetTokens(dense) == dense_bytes / kv_per_token);
  // An FP8 KV cache halves a token's bytes; weights kept in e4m3 count once.
  ModelConfig fp8_kv = dense;
  fp8_kv.kv_cache_fp8 = true;
  CHECK(DenseReadBudgetTokens(fp8_kv) == dense_bytes / (kv_per_token / 2));
  CHECK(DenseReadBudgetTokens(fp8_kv, 1000.0) == (dense_bytes - 1000) / (kv_per_token / 2));
}

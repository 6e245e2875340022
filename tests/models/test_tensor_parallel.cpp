// Tensor parallelism on the CPU reference (docs/parallel.md): TP=2 ranks as two threads
// with their own CpuBackend, KV pools (local heads) and model shard, joined by a
// ThreadCommunicator, must reproduce TP=1's logits; shards must read only their slices.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "parallel/thread_communicator.h"
#include "fixture_model.h"
#include "test_support.h"

using namespace oasis;

namespace {

using Checkpoint = testing::FixtureCheckpoint;
constexpr auto Open = testing::OpenFixtureModel;
using testing::NormalizedError;

// What one rank (or the single TP=1 model) computes.
struct RunResult {
  Tensor prefill_logits;  // [n, vocab]: the prompt in one step
  Tensor decode_logits;   // [n, vocab]: the prompt one token per step (every step a decode)
  std::vector<int32_t> greedy;
  Status status;
};

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 300, 11};

RunResult Run(DecoderLM& model, Backend& backend) {
  RunResult r;
  Generator whole(model, backend, {.num_kv_slots = 128, .max_step_tokens = 512});
  auto prefill = whole.PromptLogits(kPrompt);
  if (!prefill.ok()) return {.status = prefill.status()};
  r.prefill_logits = *prefill;
  Generator stepwise(model, backend, {.num_kv_slots = 128, .max_step_tokens = 1});
  auto decode = stepwise.PromptLogits(kPrompt);
  if (!decode.ok()) return {.status = decode.status()};
  r.decode_logits = *decode;
  GenerationRequest req;
  req.prompt = kPrompt;
  req.max_tokens = 12;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto out = whole.Generate({req});
  if (!out.ok()) return {.status = out.status()};
  r.greedy = (*out)[0].tokens;
  return r;
}

// Records which tensors were read whole (Load, RawBytes) and which sliced (LoadSlice).
class RecordingWeights final : public WeightSource {
 public:
  explicit RecordingWeights(const WeightSource& inner) : inner_(inner) {}
  std::string Describe() const override { return "recording " + inner_.Describe(); }
  std::vector<std::string> Names() const override { return inner_.Names(); }
  bool Has(const std::string& n) const override { return inner_.Has(n); }
  StatusOr<TensorInfo> Info(const std::string& n) const override { return inner_.Info(n); }
  StatusOr<Tensor> Load(const std::string& n, DType d) const override {
    Record(whole_, n);
    return inner_.Load(n, d);
  }
  StatusOr<std::span<const uint8_t>> RawBytes(const std::string& n) const override {
    Record(whole_, n);
    return inner_.RawBytes(n);
  }
  StatusOr<Tensor> LoadSlice(const std::string& n, int dim, int64_t begin, int64_t end,
                             DType d) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slices_[n].insert({dim, begin, end});
    }
    return inner_.LoadSlice(n, dim, begin, end, d);
  }

  std::set<std::string> whole() const { return whole_; }
  std::map<std::string, std::set<std::tuple<int, int64_t, int64_t>>> slices() const {
    return slices_;
  }

 private:
  void Record(std::set<std::string>& s, const std::string& n) const {
    std::lock_guard<std::mutex> lock(mu_);
    s.insert(n);
  }
  const WeightSource& inner_;
  mutable std::mutex mu_;
  mutable std::set<std::string> whole_;
  mutable std::map<std::string, std::set<std::tuple<int, int64_t, int64_t>>> slices_;
};

}  // namespace

TEST_CASE("ThreadCommunicator sums in rank order, gathers, and agrees on every rank",
          "[parallel]") {
  constexpr int kRanks = 3;
  ThreadCommGroup group(kRanks);
  std::vector<Tensor> sums(kRanks), halves(kRanks), gathered(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = group.rank(r);
      // Values whose float sum depends on the order: 1e8 + 1 - 1e8 (rank order) = 0 in float.
      const float big[kRanks] = {1e8f, 1.0f, -1e8f};
      Tensor t = Tensor::FromFloats({big[r], static_cast<float>(r), 0.5f, -2.0f * r}, {2, 2});
      for (int rep = 0; rep < 50; ++rep) {  // reuse across many collectives
        Tensor x = t.Clone();
        comm.AllReduceSum(x);
        if (rep == 0) sums[r] = x;
      }
      Tensor h = Tensor::Empty({2}, DType::kBF16);
      ConvertFromFloat(std::vector<float>{0.5f * (r + 1), 1.0f}.data(), h.raw(), DType::kBF16, 2);
      comm.AllReduceSum(h);
      halves[r] = h.ToFloat();
      Tensor mine = Tensor::FromFloats({10.0f * r, 10.0f * r + 1}, {1, 2});
      gathered[r] = Tensor::Empty({kRanks, 2}, DType::kF32);
      comm.AllGather(mine, gathered[r]);
      comm.Barrier();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    REQUIRE(group.rank(r).rank() == r);
    CHECK(group.rank(r).size() == kRanks);
    const float* s = sums[r].data<float>();
    CHECK(s[0] == ((1e8f + 1.0f) + -1e8f));  // rank order, in float
    CHECK(s[1] == 3.0f);
    CHECK(s[2] == 1.5f);
    CHECK(s[3] == -6.0f);
    CHECK(std::memcmp(sums[r].raw(), sums[0].raw(), sums[0].nbytes()) == 0);
    CHECK(halves[r].data<float>()[0] == 3.0f);
    CHECK(halves[r].data<float>()[1] == 3.0f);
    for (int i = 0; i < kRanks; ++i) {
      CHECK(gathered[r].data<float>()[2 * i] == 10.0f * i);
      CHECK(gathered[r].data<float>()[2 * i + 1] == 10.0f * i + 1);
    }
  }
}

TEST_CASE("TP=2 logits equal TP=1 for prefill and decode steps", "[models][parallel]") {
  for (const char* name : {"qwen3-tiny", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    DYNAMIC_SECTION(name) {
      Checkpoint ck = Open(name);
      CpuBackend single_backend;
      auto single = DecoderLM::Create(ck.config, *ck.weights, single_backend);
      REQUIRE(single.ok());
      RunResult ref = Run(**single, single_backend);
      REQUIRE(ref.status.ok());

      constexpr int kRanks = 2;
      ThreadCommGroup group(kRanks);
      std::vector<std::unique_ptr<CpuBackend>> backends;
      std::vector<std::unique_ptr<DecoderLM>> shards;
      for (int r = 0; r < kRanks; ++r) {
        backends.push_back(std::make_unique<CpuBackend>());
        auto shard =
            DecoderLM::Create(ck.config, *ck.weights, *backends[r], {r, kRanks, &group.rank(r)});
        REQUIRE(shard.ok());
        CHECK((*shard)->config().num_attention_heads == ck.config.num_attention_heads / kRanks);
        CHECK((*shard)->config().num_key_value_heads == ck.config.num_key_value_heads / kRanks);
        CHECK((*shard)->full_config().num_key_value_heads == ck.config.num_key_value_heads);
        shards.push_back(std::move(*shard));
      }
      std::vector<RunResult> results(kRanks);
      std::vector<std::thread> threads;
      for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] { results[r] = Run(*shards[r], *backends[r]); });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < kRanks; ++r) {
        INFO("rank " << r);
        REQUIRE(results[r].status.ok());
        const double prefill_err = NormalizedError(results[r].prefill_logits, ref.prefill_logits);
        const double decode_err = NormalizedError(results[r].decode_logits, ref.decode_logits);
        INFO("prefill error " << prefill_err << ", decode error " << decode_err);
        CHECK(prefill_err <= 1e-5);
        CHECK(decode_err <= 1e-5);
        CHECK(results[r].greedy == ref.greedy);
        // The all-reduce is deterministic: every rank holds bit-identical logits.
        CHECK(std::memcmp(results[r].decode_logits.raw(), results[0].decode_logits.raw(),
                          results[0].decode_logits.nbytes()) == 0);
      }
    }
  }
}

TEST_CASE("TP shards read only their slices of the sharded tensors", "[models][parallel]") {
  Checkpoint ck = Open("qwen3-tiny");
  const ModelConfig& c = ck.config;
  constexpr int kRanks = 2;
  ThreadCommGroup group(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    RecordingWeights rec(*ck.weights);
    CpuBackend backend;
    auto shard = DecoderLM::Create(c, rec, backend, {r, kRanks, &group.rank(r)});
    REQUIRE(shard.ok());
    const int64_t q = c.num_attention_heads * c.head_dim / kRanks,
                  kv = c.num_key_value_heads * c.head_dim / kRanks;
    const int64_t inter = c.intermediate_size / kRanks;
    using Ranges = std::set<std::tuple<int, int64_t, int64_t>>;
    const std::map<std::string, Ranges> expected_leaf = {
        {"self_attn.q_proj.weight", {{0, r * q, (r + 1) * q}}},
        {"self_attn.k_proj.weight", {{0, r * kv, (r + 1) * kv}}},
        {"self_attn.v_proj.weight", {{0, r * kv, (r + 1) * kv}}},
        {"self_attn.o_proj.weight", {{1, r * q, (r + 1) * q}}},
        {"mlp.gate_proj.weight", {{0, r * inter, (r + 1) * inter}}},
        {"mlp.up_proj.weight", {{0, r * inter, (r + 1) * inter}}},
        {"mlp.down_proj.weight", {{1, r * inter, (r + 1) * inter}}},
    };
    std::map<std::string, Ranges> expected;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      for (const auto& [leaf, ranges] : expected_leaf) {
        expected["model.layers." + std::to_string(i) + "." + leaf] = ranges;
      }
    }
    CHECK(rec.slices() == expected);
    for (const auto& [name, ranges] : expected) CHECK(rec.whole().count(name) == 0);
    // Replicated tensors are read whole: the embedding and the norms.
    CHECK(rec.whole().count("model.embed_tokens.weight") == 1);
    CHECK(rec.whole().count("model.layers.0.self_attn.q_norm.weight") == 1);
    // The local weights have the sliced shapes.
    REQUIRE((*shard)->FindWeight("model.layers.0.self_attn.o_proj.weight") != nullptr);
    CHECK((*shard)->FindWeight("model.layers.0.self_attn.o_proj.weight")->shape() ==
          std::vector<int64_t>{c.hidden_size, q});
    CHECK((*shard)->FindWeight("model.layers.0.mlp.down_proj.weight")->shape() ==
          std::vector<int64_t>{c.hidden_size, inter});
  }
}

TEST_CASE("TP sizes that do not divide the heads are rejected", "[models][parallel]") {
  Checkpoint ck = Open("qwen3-tiny-untied");  // 4 query heads, 1 KV head
  ThreadCommGroup group(2);
  CpuBackend backend;
  auto bad = DecoderLM::Create(ck.config, *ck.weights, backend, {0, 2, &group.rank(0)});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(),
             Catch::Contains("num_key_value_heads") && Catch::Contains("2"));
  auto dummy = DecoderLM::CreateDummy(ck.config, backend, 1, {0, 2, &group.rank(0)});
  REQUIRE_FALSE(dummy.ok());
  CHECK(dummy.status().code() == StatusCode::kInvalidArgument);

  ThreadCommGroup three(3);  // 4 query heads do not split 3 ways
  Checkpoint qwen = Open("qwen3-tiny");
  auto q3 = DecoderLM::Create(qwen.config, *qwen.weights, backend, {1, 3, &three.rank(1)});
  REQUIRE_FALSE(q3.ok());
  CHECK_THAT(q3.status().message(), Catch::Contains("num_attention_heads"));

  // The communicator must be this rank's of a group of this size.
  auto mismatched = DecoderLM::Create(qwen.config, *qwen.weights, backend, {0, 2, &group.rank(1)});
  REQUIRE_FALSE(mismatched.ok());
  CHECK(mismatched.status().code() == StatusCode::kInvalidArgument);
  auto missing = DecoderLM::Create(qwen.config, *qwen.weights, backend, {0, 2, nullptr});
  CHECK(missing.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("TP=2 dummy shards run at their local shapes", "[models][parallel]") {
  Checkpoint ck = Open("qwen3-tiny");
  ThreadCommGroup group(2);
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<DecoderLM>> shards;
  for (int r = 0; r < 2; ++r) {
    backends.push_back(std::make_unique<CpuBackend>());
    auto shard = DecoderLM::CreateDummy(ck.config, *backends[r], 5, {r, 2, &group.rank(r)});
    REQUIRE(shard.ok());
    shards.push_back(std::move(*shard));
  }
  std::vector<RunResult> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] { results[r] = Run(*shards[r], *backends[r]); });
  for (auto& t : threads) t.join();
  REQUIRE(results[0].status.ok());
  REQUIRE(results[1].status.ok());
  CHECK(results[0].greedy.size() == 12);
  CHECK(results[0].greedy == results[1].greedy);
}

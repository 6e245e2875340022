// EAGLE-3 draft head on the CPU reference backend (docs/eagle3.md): fit validation with
// clear errors, the target's residual-stream capture, the head forward against a plain
// host implementation, chunked/batched/paged equivalence, d2t mapping, and (when present)
// the PyTorch reference fixtures of tools/eagle3_reference.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"
#include "runner/batch_builder.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "models/eagle3.h"
#include "oasis/model_config.h"
#include "../unit/loader/safetensors_builder.h"
#include "test_support.h"

using namespace oasis;

namespace {

// A WeightSource over another one, with some tensors replaced (host tensors, returned as
// stored: tests load floats as F32 on the CPU backend) or removed.
class OverrideWeights final : public WeightSource {
 public:
  explicit OverrideWeights(const WeightSource& base) : base_(base) {}
  void Set(const std::string& name, Tensor t) { overrides_[name] = std::move(t); }
  void Remove(const std::string& name) { removed_.insert(name); }

  std::string Describe() const override { return "test weights over " + base_.Describe(); }
  std::vector<std::string> Names() const override {
    std::set<std::string> names;
    for (const auto& n : base_.Names()) {
      if (!removed_.count(n)) names.insert(n);
    }
    for (const auto& [n, t] : overrides_) names.insert(n);
    return {names.begin(), names.end()};
  }
  bool Has(const std::string& name) const override {
    return overrides_.count(name) || (!removed_.count(name) && base_.Has(name));
  }
  StatusOr<TensorInfo> Info(const std::string& name) const override {
    if (auto it = overrides_.find(name); it != overrides_.end()) {
      return TensorInfo{name, it->second.dtype(), it->second.shape()};
    }
    if (removed_.count(name)) return NotFound(name);
    return base_.Info(name);
  }
  StatusOr<Tensor> Load(const std::string& name, DType dtype) const override {
    if (auto it = overrides_.find(name); it != overrides_.end()) {
      if (it->second.dtype() != dtype) return InvalidArgument("override " + name + " has another dtype");
      return it->second.Clone();
    }
    if (removed_.count(name)) return NotFound(name);
    return base_.Load(name, dtype);
  }
  StatusOr<Tensor> LoadSlice(const std::string& name, int, int64_t, int64_t, DType) const override {
    return Unimplemented("LoadSlice " + name);
  }

 private:
  const WeightSource& base_;
  std::map<std::string, Tensor> overrides_;
  std::set<std::string> removed_;
};

struct Target {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<DecoderLM> model;
};

Target LoadTargetDir(const std::filesystem::path& dir, Backend& backend, int64_t num_layers = 0) {
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  if (num_layers > 0) config->num_hidden_layers = num_layers;  // the first layers only
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  auto model = DecoderLM::Create(*config, **weights, backend);
  REQUIRE(model.ok());
  return Target{*config, std::move(*weights), std::move(*model)};
}

Target LoadTarget(const std::string& name, Backend& backend, int64_t num_layers = 0) {
  return LoadTargetDir(testing::FixturePath("models/" + name), backend, num_layers);
}

// Random head weights at `config`'s shapes: normal(0, stddev) matrices, norms 1 + N(0, 0.1)
// (so swapped norms are caught), d2t 0.
std::unique_ptr<WeightSource> RandomHeadWeights(const ModelConfig& config, bool with_embedding, uint64_t seed,
                                                float stddev = 0.08f) {
  std::vector<WeightSpec> specs = Eagle3Head::ExpectedWeights(config, with_embedding);
  for (WeightSpec& s : specs) {
    if (s.init == DummyInit::kNormal) s.stddev = stddev;
  }
  return MakeDummyWeights(specs, seed);
}

class RandomNorms {
 public:
  // Overrides every norm weight of `w` with 1 + N(0, 0.1).
  static void Apply(OverrideWeights& w, const ModelConfig& c, uint64_t seed) {
    const char* names[] = {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                           "midlayer.post_attention_layernorm.weight", "norm.weight"};
    uint64_t k = 0;
    for (const char* n : names) {
      std::vector<float> v(static_cast<size_t>(c.hidden_size));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f + 0.1f * HashNormal(seed + (++k), i);
      w.Set(n, Tensor::FromFloats(v, {c.hidden_size}));
    }
  }
};

ModelConfig HeadConfigFor(const ModelConfig& target, std::vector<int64_t> aux_ids, int64_t draft_vocab = 0) {
  ModelConfig c = Eagle3Head::ConfigForTarget(target, draft_vocab);
  c.aux_hidden_state_layer_ids = std::move(aux_ids);
  c.intermediate_size = 96;
  return c;
}

std::vector<int32_t> Prompt(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> ids;
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ids.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(vocab)));
  }
  return ids;
}

// Paged KV of one model (target or head): an allocator and one table per sequence.
struct Paging {
  Paging(int32_t slots, int32_t kv_heads) : allocator(slots), heads(kv_heads) {}
  ~Paging() {
    for (auto& t : tables) t->Release(allocator);
  }
  BlockAllocator allocator;
  int32_t heads;
  std::vector<std::unique_ptr<HeadBlockTable>> tables;

  HeadBlockTable& NewSequence(int64_t capacity) {
    tables.push_back(std::make_unique<HeadBlockTable>(heads));
    REQUIRE(tables.back()->Reserve(capacity, allocator).ok());
    return *tables.back();
  }
};

Tensor RunTarget(DecoderLM& model, std::vector<LayerKvPool>& kv, const HeadBlockTable& table, int64_t start,
                 const std::vector<int32_t>& tokens, ResidualCapture* capture) {
  ForwardInput in = BuildHostForwardInput({StepSequence{&table, start, tokens}}, LogitsFor::kEveryToken);
  return model.Forward(in, kv, capture);
}

ResidualCapture MakeCapture(const std::vector<int64_t>& ids, int64_t T, int64_t hidden) {
  ResidualCapture c;
  c.layer_ids = ids;
  c.out = Tensor::Zeros({static_cast<int64_t>(ids.size()), T, hidden}, DType::kF32);
  return c;
}

// The target's aux features for a whole prompt (one step).
Tensor CaptureAux(Target& t, const std::vector<int64_t>& ids, const std::vector<int32_t>& prompt) {
  auto kv = t.model->AllocateKvCache(64);
  Paging paging(64, static_cast<int32_t>(t.config.num_key_value_heads));
  HeadBlockTable& table = paging.NewSequence(static_cast<int64_t>(prompt.size()));
  ResidualCapture cap = MakeCapture(ids, static_cast<int64_t>(prompt.size()), t.config.hidden_size);
  RunTarget(*t.model, kv, table, 0, prompt, &cap);
  return cap.out;
}

std::vector<float> Floats(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

double NormalizedError(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// ---- plain host math (double accumulation) ----
using Mat = std::vector<float>;  // row-major

Mat HostWeight(const WeightSource& w, const std::string& name) {
  auto t = w.Load(name, DType::kF32);
  REQUIRE(t.ok());
  return Floats(*t);
}

// y[T, out] = x[T, in] · W[out, in]ᵀ
Mat MatMulT(const Mat& x, const Mat& W, int64_t T, int64_t in, int64_t out) {
  REQUIRE(static_cast<int64_t>(x.size()) == T * in);
  REQUIRE(static_cast<int64_t>(W.size()) == out * in);
  Mat y(static_cast<size_t>(T * out));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[t * in + i]) * W[o * in + i];
      y[t * out + o] = static_cast<float>(s);
    }
  }
  return y;
}

Mat RmsNormRows(const Mat& x, const Mat& w, int64_t T, int64_t n, double eps) {
  Mat y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[t * n + i]) * x[t * n + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[t * n + i] = static_cast<float>(x[t * n + i] * r * w[i]);
  }
  return y;
}

// The EAGLE-3 head of DESIGN.md §3 for one sequence at positions 0..T-1 (causal), written
// independently of the backend: head rows t use tokens[t] and aux row t.
Mat HostHeadLogits(const ModelConfig& c, const WeightSource& hw, const Mat& embed_table, const Tensor& aux,
                   const std::vector<int32_t>& tokens) {
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, th = c.target_hidden_size;
  const int64_t n = aux.dim(0), Taux = aux.dim(1), D = c.head_dim, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads;
  const double eps = c.rms_norm_eps;
  Mat cat(static_cast<size_t>(T * n * th));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(&cat[(t * n + j) * th], aux.data<float>() + (j * Taux + t) * th, sizeof(float) * th);
    }
  }
  Mat g = MatMulT(cat, HostWeight(hw, "fc.weight"), T, n * th, H);
  Mat e(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) std::memcpy(&e[t * H], &embed_table[tokens[t] * H], sizeof(float) * H);
  Mat a = RmsNormRows(e, HostWeight(hw, "midlayer.input_layernorm.weight"), T, H, eps);
  Mat b = RmsNormRows(g, HostWeight(hw, "midlayer.hidden_norm.weight"), T, H, eps);
  Mat x(static_cast<size_t>(T * 2 * H));
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&x[t * 2 * H], &a[t * H], sizeof(float) * H);
    std::memcpy(&x[t * 2 * H + H], &b[t * H], sizeof(float) * H);
  }
  Mat q = MatMulT(x, HostWeight(hw, "midlayer.self_attn.q_proj.weight"), T, 2 * H, Hq * D);
  Mat k = MatMulT(x, HostWeight(hw, "midlayer.self_attn.k_proj.weight"), T, 2 * H, Hkv * D);
  Mat v = MatMulT(x, HostWeight(hw, "midlayer.self_attn.v_proj.weight"), T, 2 * H, Hkv * D);
  RopeParams rope = ComputeRopeParams(c);
  auto apply_rope = [&](Mat& m, int64_t heads) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t hh = 0; hh < heads; ++hh) {
        float* p = &m[(t * heads + hh) * D];
        for (int64_t i = 0; i < D / 2; ++i) {
          const double ang = static_cast<double>(t) * rope.inv_freq[static_cast<size_t>(i)];
          const double co = std::cos(ang) * rope.attention_scaling, si = std::sin(ang) * rope.attention_scaling;
          const double x1 = p[i], x2 = p[i + D / 2];
          p[i] = static_cast<float>(x1 * co - x2 * si);
          p[i + D / 2] = static_cast<float>(x2 * co + x1 * si);
        }
      }
    }
  };
  apply_rope(q, Hq);
  apply_rope(k, Hkv);
  Mat attn(static_cast<size_t>(T * Hq * D));
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hh = 0; hh < Hq; ++hh) {
      const int64_t kh = hh / (Hq / Hkv);
      std::vector<double> s(static_cast<size_t>(t + 1));
      double mx = -1e300;
      for (int64_t u = 0; u <= t; ++u) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += static_cast<double>(q[(t * Hq + hh) * D + i]) * k[(u * Hkv + kh) * D + i];
        s[u] = d * scale;
        mx = std::max(mx, s[u]);
      }
      double z = 0;
      for (auto& val : s) z += (val = std::exp(val - mx));
      for (int64_t i = 0; i < D; ++i) {
        double o = 0;
        for (int64_t u = 0; u <= t; ++u) o += s[u] / z * v[(u * Hkv + kh) * D + i];
        attn[(t * Hq + hh) * D + i] = static_cast<float>(o);
      }
    }
  }
  Mat o = MatMulT(attn, HostWeight(hw, "midlayer.self_attn.o_proj.weight"), T, Hq * D, H);
  if (c.norm_before_residual) g = b;                     // residual = hidden_norm(g)
  for (size_t i = 0; i < g.size(); ++i) g[i] += o[i];  // else residual = g
  Mat n1 = RmsNormRows(g, HostWeight(hw, "midlayer.post_attention_layernorm.weight"), T, H, eps);
  const int64_t I = c.intermediate_size;
  Mat gate = MatMulT(n1, HostWeight(hw, "midlayer.mlp.gate_proj.weight"), T, H, I);
  Mat up = MatMulT(n1, HostWeight(hw, "midlayer.mlp.up_proj.weight"), T, H, I);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = static_cast<float>(gate[i] / (1.0 + std::exp(-gate[i])) * up[i]);
  Mat m = MatMulT(gate, HostWeight(hw, "midlayer.mlp.down_proj.weight"), T, I, H);
  for (size_t i = 0; i < g.size(); ++i) g[i] += m[i];
  Mat fin = RmsNormRows(g, HostWeight(hw, "norm.weight"), T, H, eps);
  return MatMulT(fin, HostWeight(hw, "lm_head.weight"), T, H, c.draft_vocab_size);
}

// Runs the head over one sequence: rows [0, T) of tokens/aux in the given chunks.
Tensor RunHead(Eagle3Head& head, LayerKvPool& kv, const HeadBlockTable& table, const Tensor& aux,
               const std::vector<int32_t>& tokens, const std::vector<int64_t>& chunks) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  Tensor out = Tensor::Empty({T, head.draft_vocab_size()}, DType::kF32);
  int64_t start = 0;
  for (int64_t len : chunks) {
    std::vector<int32_t> part(tokens.begin() + start, tokens.begin() + start + len);
    ForwardInput in = BuildHostForwardInput({StepSequence{&table, start, part}}, LogitsFor::kEveryToken);
    std::vector<int32_t> rows;
    for (int64_t t = start; t < start + len; ++t) rows.push_back(static_cast<int32_t>(t));
    Tensor logits = head.Forward(in, aux, kv, rows);
    std::memcpy(out.data<float>() + start * head.draft_vocab_size(), logits.raw(), logits.nbytes());
    start += len;
  }
  REQUIRE(start == T);
  return out;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

// ---------------------------------------------------------------- validation

TEST_CASE("a head that does not fit the target is rejected with a clear error", "[eagle3]") {
  CpuBackend backend(2);
  Target t = LoadTarget("qwen3-tiny", backend);  // hidden 64, 3 layers, vocab 512
  const ModelConfig good = HeadConfigFor(t.config, {2, 1, 0}, 128);
  auto base = RandomHeadWeights(good, false, 7);
  const int64_t H = good.hidden_size;

  SECTION("a well-formed head loads") {
    auto head = Eagle3Head::Create(good, *base, *t.model, backend);
    REQUIRE(head.ok());
    CHECK((*head)->aux_layer_ids() == std::vector<int64_t>{2, 1, 0});
  }
  SECTION("wrong fc shape") {
    OverrideWeights w(*base);
    w.Set("fc.weight", Tensor::Zeros({H, 2 * H}, DType::kF32));
    auto head = Eagle3Head::Create(good, w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("fc.weight") && Catch::Contains("[64, 192]"));
  }
  SECTION("q_proj taking hidden instead of 2 * hidden inputs") {
    OverrideWeights w(*base);
    w.Set("midlayer.self_attn.q_proj.weight", Tensor::Zeros({good.q_size(), H}, DType::kF32));
    auto head = Eagle3Head::Create(good, w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("q_proj") && Catch::Contains("2 * hidden_size"));
  }
  SECTION("lm_head not over the draft vocabulary") {
    OverrideWeights w(*base);
    w.Set("lm_head.weight", Tensor::Zeros({512, H}, DType::kF32));
    auto head = Eagle3Head::Create(good, w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("lm_head.weight") && Catch::Contains("draft_vocab_size"));
  }
  SECTION("d2t pointing outside the target vocabulary") {
    for (int64_t bad : {int64_t{1000}, int64_t{-6}}) {
      OverrideWeights w(*base);
      Tensor d2t = Tensor::Zeros({128}, DType::kI64);
      d2t.data<int64_t>()[5] = bad;
      w.Set("d2t", d2t);
      auto head = Eagle3Head::Create(good, w, *t.model, backend);
      REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
      CHECK_THAT(head.status().message(), Catch::Contains("d2t") && Catch::Contains("draft id 5"));
    }
  }
  SECTION("d2t of the wrong length or dtype, or missing") {
    OverrideWeights w(*base);
    w.Set("d2t", Tensor::Zeros({127}, DType::kI64));
    auto head = Eagle3Head::Create(good, w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("d2t") && Catch::Contains("[128]"));
    w.Set("d2t", Tensor::Zeros({128}, DType::kF32));
    CHECK(Eagle3Head::Create(good, w, *t.model, backend).status().code() == StatusCode::kInvalidArgument);
    OverrideWeights missing(*base);
    missing.Remove("d2t");
    auto m = Eagle3Head::Create(good, missing, *t.model, backend);
    REQUIRE(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains("d2t"));
  }
  SECTION("target_hidden_size different from the target's hidden size") {
    ModelConfig c = good;
    c.target_hidden_size = 32;
    auto head = Eagle3Head::Create(c, *base, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("target_hidden_size = 32") && Catch::Contains("64"));
  }
  SECTION("no embedding and a hidden size other than the target's") {
    ModelConfig c = good;
    c.hidden_size = 96;
    auto w = RandomHeadWeights(c, false, 8);
    auto head = Eagle3Head::Create(c, *w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("embed_tokens") && Catch::Contains("hidden_size (96)"));
    // With its own embedding the same head fits (fc maps 3 x 64 target features to 96).
    auto with_embed = RandomHeadWeights(c, true, 8);
    auto ok = Eagle3Head::Create(c, *with_embed, *t.model, backend);
    REQUIRE(ok.ok());
    Tensor aux = CaptureAux(t, (*ok)->aux_layer_ids(), Prompt(9, 1, 512));
    auto kv = (*ok)->AllocateKvCache(8);
    Paging paging(8, static_cast<int32_t>(c.num_key_value_heads));
    Tensor logits = RunHead(**ok, kv, paging.NewSequence(8), aux, Prompt(8, 2, 512), {8});
    for (float f : Floats(logits)) REQUIRE(std::isfinite(f));
  }
  SECTION("a missing weight") {
    OverrideWeights w(*base);
    w.Remove("midlayer.mlp.down_proj.weight");
    auto head = Eagle3Head::Create(good, w, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kNotFound);
    CHECK_THAT(head.status().message(), Catch::Contains("midlayer.mlp.down_proj.weight"));
  }
  SECTION("aux layer ids outside the target") {
    ModelConfig c = good;
    c.aux_hidden_state_layer_ids = {0, 1, 4};
    auto head = Eagle3Head::Create(c, *base, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("layer id 4"));
    c.aux_hidden_state_layer_ids = {0, 1};
    CHECK(Eagle3Head::Create(c, *base, *t.model, backend).status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("the default aux ids (2, L/2, L-3) need at least 3 target layers") {
    Target small = LoadTarget("qwen3-tiny", backend, 2);
    ModelConfig c = good;
    c.aux_hidden_state_layer_ids.clear();
    CHECK(Eagle3Head::AuxLayerIds(c, 32) == std::vector<int64_t>{2, 16, 29});
    CHECK(Eagle3Head::AuxLayerIds(c, 3) == std::vector<int64_t>{2, 1, 0});
    auto head = Eagle3Head::Create(c, *base, *small.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("eagle_aux_hidden_state_layer_ids"));
  }
  SECTION("not an EAGLE-3 config") {
    auto head = Eagle3Head::Create(t.config, *base, *t.model, backend);
    REQUIRE(head.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(head.status().message(), Catch::Contains("LlamaForCausalLMEagle3"));
  }
}

TEST_CASE("an EAGLE-3 config.json parses into a head that fits", "[eagle3]") {
  CpuBackend backend(2);
  Target t = LoadTarget("llama-tiny-rope-scaling", backend);  // hidden 128, 2 layers
  const std::string json = R"({
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
    "hidden_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "intermediate_size": 160, "vocab_size": 512, "draft_vocab_size": 100,
    "target_hidden_size": 128, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}})";
  auto config = ParseModelConfig(json, "eagle config");
  REQUIRE(config.ok());
  auto head = Eagle3Head::CreateDummy(*config, *t.model, backend, 3);
  REQUIRE(head.ok());
  CHECK((*head)->aux_layer_ids() == std::vector<int64_t>{0, 1, 2});
  CHECK((*head)->draft_vocab_size() == 100);
  CHECK((*head)->DraftToTarget(99) == 99);
}

TEST_CASE("a head loads from a checkpoint directory", "[eagle3]") {
  CpuBackend backend(2);
  Target t = LoadTarget("qwen3-tiny", backend);
  const ModelConfig hc = HeadConfigFor(t.config, {}, 64);  // default aux ids (2, 1, 0)
  auto w = RandomHeadWeights(hc, false, 31);
  // The same (bf16-valued) tensors as a safetensors file, plus a config.json.
  std::vector<testing::RawTensor> raw;
  for (const WeightSpec& spec : Eagle3Head::ExpectedWeights(hc, false)) {
    if (spec.dtype == DType::kI64) {
      std::vector<int64_t> d2t(static_cast<size_t>(spec.numel()));
      for (size_t i = 0; i < d2t.size(); ++i) d2t[i] = static_cast<int64_t>(3 * i);  // target id 4i
      raw.push_back({spec.name, "I64", spec.shape, testing::BytesOf(d2t)});
    } else {
      auto f = w->Load(spec.name, DType::kF32);
      REQUIRE(f.ok());
      raw.push_back({spec.name, "BF16", spec.shape, testing::Bf16BytesOf(Floats(*f))});
    }
  }
  raw.push_back({"t2d", "BOOL", {512}, std::string(512, '\1')});
  auto dir = testing::MakeTempDir("eagle3_head");
  testing::WriteBinaryFile(dir / "model.safetensors", testing::BuildSafetensors(raw));
  testing::WriteBinaryFile(dir / "config.json", R"({
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
    "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "intermediate_size": 96, "vocab_size": 512, "draft_vocab_size": 64,
    "target_hidden_size": 64, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
  auto loaded = Eagle3Head::Load(dir, *t.model, backend);
  REQUIRE(loaded.ok());
  CHECK((*loaded)->aux_layer_ids() == std::vector<int64_t>{2, 1, 0});
  CHECK((*loaded)->DraftToTarget(10) == 40);
  auto direct = Eagle3Head::Create(hc, *w, *t.model, backend);
  REQUIRE(direct.ok());
  const std::vector<int32_t> prompt = Prompt(20, 4, 512);
  Tensor aux = CaptureAux(t, {2, 1, 0}, prompt);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  const int64_t T = static_cast<int64_t>(next.size());
  auto kv1 = (*loaded)->AllocateKvCache(8), kv2 = (*direct)->AllocateKvCache(8);
  Paging paging(8, 2);
  HeadBlockTable& table = paging.NewSequence(T);
  CHECK(SameBits(RunHead(**loaded, kv1, table, aux, next, {T}), RunHead(**direct, kv2, table, aux, next, {T})));
  // A broken checkpoint directory is an error, not a crash.
  testing::WriteBinaryFile(dir / "config.json", "{}");
  CHECK_FALSE(Eagle3Head::Load(dir, *t.model, backend).ok());
}

// The head's logits over a prompt: row p from the target's features at position p and the
// token at p + 1, in a fresh paged KV cache.
Tensor HeadLogitsOnPrompt(Eagle3Head& head, Target& t, const std::vector<int32_t>& prompt) {
  Tensor aux = CaptureAux(t, head.aux_layer_ids(), prompt);
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  const int64_t T = static_cast<int64_t>(next.size());
  auto kv = head.AllocateKvCache(16);
  Paging paging(16, static_cast<int32_t>(head.config().num_key_value_heads));
  return RunHead(head, kv, paging.NewSequence(T), aux, next, {T});
}

// The reference fixture's head rewritten in the `speculators` layout (vLLM's published heads):
// the layer's weights under "layers.0.", the config nested in transformer_layer_config with the
// EAGLE-3 fields on top. Same weights and norm_before_residual false: the reference's logits.
TEST_CASE("a head in the speculators layout loads and matches the reference", "[eagle3]") {
  const testing::Eagle3Fixture* spec = nullptr;
  const std::vector<testing::Eagle3Fixture> fixtures = testing::Eagle3Fixtures();
  for (const testing::Eagle3Fixture& f : fixtures) {
    if (f.name == "qwen3-tiny") spec = &f;
  }
  REQUIRE(spec != nullptr);
  // model.safetensors: the same bytes, "midlayer." renamed "layers.0." in the header.
  const std::string image = testing::ReadFileOrFail(spec->head / "model.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(image[static_cast<size_t>(i)]);
  nlohmann::json header = nlohmann::json::parse(image.substr(8, header_len));
  nlohmann::json renamed = nlohmann::json::object();
  int moved = 0;
  for (auto& [name, value] : header.items()) {
    const bool mid = name.rfind("midlayer.", 0) == 0;
    moved += mid ? 1 : 0;
    renamed[mid ? "layers.0." + name.substr(9) : name] = value;
  }
  CHECK(moved == 10);  // q, k, v, o, gate, up, down and the three norms
  std::string text = renamed.dump();
  while (text.size() % 8 != 0) text += ' ';
  auto dir = testing::MakeTempDir("eagle3_speculators");
  testing::WriteBinaryFile(dir / "model.safetensors", testing::RawImage(text, image.substr(8 + header_len)));
  // config.json: the original's fields as transformer_layer_config.
  nlohmann::json original = nlohmann::json::parse(testing::ReadFileOrFail(spec->head / "config.json"));
  nlohmann::json layer = original;
  for (const char* top : {"architectures", "draft_vocab_size", "target_hidden_size", "torch_dtype"}) layer.erase(top);
  const nlohmann::json config = {
      {"architectures", {"Eagle3Speculator"}},
      {"speculators_model_type", "eagle3"},
      {"draft_vocab_size", original["draft_vocab_size"]},
      {"target_hidden_size", original["target_hidden_size"]},
      {"norm_before_residual", false},
      {"torch_dtype", original["torch_dtype"]},
      {"speculators_config",
       {{"algorithm", "eagle3"},
        {"proposal_methods", {{{"proposal_type", "greedy"}, {"speculative_tokens", 3}}}},
        {"verifier", {{"name_or_path", "qwen3-tiny"}}}}},
      {"transformer_layer_config", layer}};
  testing::WriteBinaryFile(dir / "config.json", config.dump(2));

  CpuBackend backend(2);
  Target t = LoadTargetDir(spec->target, backend);
  auto head = Eagle3Head::Load(dir, *t.model, backend);
  REQUIRE(head.ok());
  CHECK((*head)->config().head_layer_prefix == "layers.0.");
  CHECK((*head)->config().architecture_name == "Eagle3Speculator");
  CHECK((*head)->FindWeight("layers.0.hidden_norm.weight") != nullptr);
  auto ref = SafetensorsFile::Open(spec->reference);
  REQUIRE(ref.ok());
  auto ids64 = testing::TensorVector<int64_t>(*ref, "prompt0.ids");
  std::vector<int32_t> prompt(ids64.begin(), ids64.end());
  auto expect = testing::TensorVector<float>(*ref, "prompt0.draft_logits");
  Tensor logits = HeadLogitsOnPrompt(**head, t, prompt);
  const double err = NormalizedError(Floats(logits), expect);
  INFO("normalized error " << err);
  CHECK(err < 1e-4);

  // The same head with the speculators default (norm_before_residual absent: true) is a
  // different head: its logits move away from the reference.
  nlohmann::json defaulted = config;
  defaulted.erase("norm_before_residual");
  testing::WriteBinaryFile(dir / "config.json", defaulted.dump(2));
  auto nbr = Eagle3Head::Load(dir, *t.model, backend);
  REQUIRE(nbr.ok());
  CHECK((*nbr)->config().norm_before_residual);
  CHECK(NormalizedError(Floats(HeadLogitsOnPrompt(**nbr, t, prompt)), expect) > 1e-2);
}

// ---------------------------------------------------------------- target capture

TEST_CASE("the capture is the residual stream entering each target layer", "[eagle3]") {
  CpuBackend backend(2);
  for (const char* name : {"qwen3-tiny", "qwen3-tiny-untied", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    DYNAMIC_SECTION(name) {
      Target full = LoadTarget(name, backend);
      const ModelConfig& c = full.config;
      const int64_t L = c.num_hidden_layers, H = c.hidden_size, V = c.vocab_size;
      const std::vector<int32_t> prompt = Prompt(21, 5, static_cast<int>(V));
      const int64_t T = static_cast<int64_t>(prompt.size());
      std::vector<int64_t> all_ids;
      for (int64_t i = L; i >= 0; --i) all_ids.push_back(i);  // reversed: slots follow the id list

      auto kv = full.model->AllocateKvCache(64);
      Paging paging(64, static_cast<int32_t>(c.num_key_value_heads));
      HeadBlockTable& table = paging.NewSequence(T);
      ResidualCapture cap = MakeCapture(all_ids, T, H);
      Tensor logits = RunTarget(*full.model, kv, table, 0, prompt, &cap).Clone();
      auto slot_of = [&](int64_t id) {
        return cap.out.Slice(L - id, L - id + 1).Reshape({T, H});
      };

      // Capturing changes nothing else.
      auto kv2 = full.model->AllocateKvCache(64);
      CHECK(SameBits(RunTarget(*full.model, kv2, table, 0, prompt, nullptr), logits));

      // Id 0 is the embedding.
      Mat embed = HostWeight(*full.weights, "model.embed_tokens.weight");
      Tensor id0 = slot_of(0);
      for (int64_t t = 0; t < T; ++t) {
        REQUIRE(std::memcmp(id0.data<float>() + t * H, &embed[prompt[t] * H], sizeof(float) * H) == 0);
      }

      // Id k (1 <= k <= L) is what the first k layers leave: a model truncated to k layers
      // captures the same values at its last id, and its logits are lm_head(norm(capture)).
      Mat final_norm = HostWeight(*full.weights, "model.norm.weight");
      Mat lm_head = HostWeight(*full.weights, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
      for (int64_t k = 1; k <= L; ++k) {
        INFO("layers " << k);
        Target part = LoadTarget(name, backend, k);
        auto kvk = part.model->AllocateKvCache(64);
        ResidualCapture capk = MakeCapture({k}, T, H);
        Tensor logits_k = RunTarget(*part.model, kvk, table, 0, prompt, &capk);
        CHECK(SameBits(capk.out.Reshape({T, H}), slot_of(k)));
        Mat expect = MatMulT(RmsNormRows(Floats(capk.out), final_norm, T, H, c.rms_norm_eps), lm_head, T, H, V);
        CHECK(NormalizedError(Floats(logits_k), expect) < 1e-5);
      }
      // Differing streams (a test that always compared equal slots would pass trivially).
      CHECK_FALSE(SameBits(slot_of(0), slot_of(1)));

      // Chunked prefill: the second chunk's capture equals the same rows of the whole.
      auto kv3 = full.model->AllocateKvCache(64);
      std::vector<int32_t> head(prompt.begin(), prompt.begin() + 8), tail(prompt.begin() + 8, prompt.end());
      ResidualCapture c1 = MakeCapture(all_ids, 8, H), c2 = MakeCapture(all_ids, T - 8, H);
      RunTarget(*full.model, kv3, table, 0, head, &c1);
      RunTarget(*full.model, kv3, table, 8, tail, &c2);
      for (int64_t j = 0; j <= L; ++j) {
        const float* whole = cap.out.data<float>() + j * T * H;
        const float* a = c1.out.data<float>() + j * 8 * H;
        const float* b = c2.out.data<float>() + j * (T - 8) * H;
        CHECK(NormalizedError(std::vector<float>(a, a + 8 * H), std::vector<float>(whole, whole + 8 * H)) < 1e-6);
        CHECK(NormalizedError(std::vector<float>(b, b + (T - 8) * H),
                              std::vector<float>(whole + 8 * H, whole + T * H)) < 1e-5);
      }
    }
  }
}

// ---------------------------------------------------------------- head forward

TEST_CASE("the head forward matches a plain host implementation", "[eagle3]") {
  CpuBackend backend(2);
  // GQA + head_dim != hidden/heads; multi-query; llama3 RoPE; full MHA with head_dim 24.
  for (const char* name : {"qwen3-tiny", "qwen3-tiny-untied", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    DYNAMIC_SECTION(name) {
      Target t = LoadTarget(name, backend);
      ModelConfig hc = HeadConfigFor(t.config, {0, t.config.num_hidden_layers / 2 + 0,
                                                t.config.num_hidden_layers}, 200);
      // Both residuals: the fused features (original layout) or their hidden_norm (speculators).
      hc.norm_before_residual = GENERATE(false, true);
      INFO("norm_before_residual " << hc.norm_before_residual);
      auto base = RandomHeadWeights(hc, false, 11);
      OverrideWeights w(*base);
      RandomNorms::Apply(w, hc, 99);
      auto head = Eagle3Head::Create(hc, w, *t.model, backend);
      REQUIRE(head.ok());
      const std::vector<int32_t> prompt = Prompt(30, 3, 512);
      Tensor aux = CaptureAux(t, (*head)->aux_layer_ids(), prompt);
      // Head row p: the target's features at position p and the token at p + 1.
      std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
      const int64_t T = static_cast<int64_t>(next.size());
      auto kv = (*head)->AllocateKvCache(16);
      Paging paging(16, static_cast<int32_t>(hc.num_key_value_heads));
      Tensor logits = RunHead(**head, kv, paging.NewSequence(T), aux, next, {T});
      Mat expect = HostHeadLogits(hc, w, HostWeight(*t.weights, "model.embed_tokens.weight"), aux, next);
      const double err = NormalizedError(Floats(logits), expect);
      INFO("normalized error " << err);
      CHECK(err < 1e-5);
      // Sanity: the logits are not degenerate.
      CHECK(NormalizedError(Floats(logits), Mat(expect.size(), 0.0f)) > 0.5);
    }
  }
}

TEST_CASE("head forward: deterministic, chunked = whole, any block layout, batched = alone", "[eagle3]") {
  CpuBackend backend(2);
  Target t = LoadTarget("qwen3-tiny", backend);
  const ModelConfig hc = HeadConfigFor(t.config, {2, 1, 0}, 256);
  auto w = RandomHeadWeights(hc, false, 21);
  auto head_or = Eagle3Head::Create(hc, *w, *t.model, backend);
  REQUIRE(head_or.ok());
  Eagle3Head& head = **head_or;
  const int32_t kvh = static_cast<int32_t>(hc.num_key_value_heads);
  const std::vector<int32_t> p1 = Prompt(40, 8, 512), p2 = Prompt(19, 9, 512);
  Tensor aux1 = CaptureAux(t, head.aux_layer_ids(), p1), aux2 = CaptureAux(t, head.aux_layer_ids(), p2);
  std::vector<int32_t> n1(p1.begin() + 1, p1.end()), n2(p2.begin() + 1, p2.end());
  const int64_t T1 = static_cast<int64_t>(n1.size()), T2 = static_cast<int64_t>(n2.size());

  auto kv = head.AllocateKvCache(64);
  Paging paging(64, kvh);
  HeadBlockTable& contiguous = paging.NewSequence(T1);
  Tensor whole = RunHead(head, kv, contiguous, aux1, n1, {T1});

  SECTION("deterministic") {
    auto kv_b = head.AllocateKvCache(64);
    CHECK(SameBits(RunHead(head, kv_b, contiguous, aux1, n1, {T1}), whole));
  }
  SECTION("prefill in two chunks equals one step") {
    auto kv_b = head.AllocateKvCache(64);
    Tensor chunked = RunHead(head, kv_b, contiguous, aux1, n1, {17, T1 - 17});
    CHECK(NormalizedError(Floats(chunked), Floats(whole)) < 1e-6);
    auto kv_c = head.AllocateKvCache(64);  // and one row at a time (decode steps)
    std::vector<int64_t> ones(static_cast<size_t>(T1), 1);
    CHECK(NormalizedError(Floats(RunHead(head, kv_c, contiguous, aux1, n1, ones)), Floats(whole)) < 1e-6);
  }
  SECTION("scattered head-blocks give the same result") {
    auto kv_b = head.AllocateKvCache(64);
    Paging scattered(64, kvh);
    HeadBlockTable& hole = scattered.NewSequence(3 * kBlockSize);  // take low slots first
    HeadBlockTable& table = scattered.NewSequence(T1);
    hole.Release(scattered.allocator);
    CHECK(table.head_slots(0) != contiguous.head_slots(0));
    CHECK(SameBits(RunHead(head, kv_b, table, aux1, n1, {T1}), whole));
  }
  SECTION("two sequences in one step equal each alone") {
    auto kv_b = head.AllocateKvCache(64);
    Paging two(64, kvh);
    HeadBlockTable& ta = two.NewSequence(T1);
    HeadBlockTable& tb = two.NewSequence(T2);
    // One aux tensor for both: sequence b's rows follow a's (aux_rows index the concatenation).
    const int64_t H = t.config.hidden_size;
    Tensor aux = Tensor::Empty({3, T1 + T2, H}, DType::kF32);
    for (int64_t j = 0; j < 3; ++j) {
      std::memcpy(aux.data<float>() + j * (T1 + T2) * H, aux1.data<float>() + j * (T1 + 1) * H, sizeof(float) * T1 * H);
      std::memcpy(aux.data<float>() + (j * (T1 + T2) + T1) * H, aux2.data<float>() + j * (T2 + 1) * H,
                  sizeof(float) * T2 * H);
    }
    ForwardInput in = BuildHostForwardInput({StepSequence{&ta, 0, n1}, StepSequence{&tb, 0, n2}}, LogitsFor::kEveryToken);
    Tensor both = head.Forward(in, aux, kv_b);
    auto kv_c = head.AllocateKvCache(64);
    Paging alone(64, kvh);
    Tensor b_alone = RunHead(head, kv_c, alone.NewSequence(T2), aux2, n2, {T2});
    const int64_t V = head.draft_vocab_size();
    std::vector<float> all = Floats(both);
    CHECK(NormalizedError(std::vector<float>(all.begin(), all.begin() + T1 * V), Floats(whole)) < 1e-6);
    CHECK(NormalizedError(std::vector<float>(all.begin() + T1 * V, all.end()), Floats(b_alone)) < 1e-6);
  }
  SECTION("later rows attend to earlier ones through the head's KV") {
    std::vector<int32_t> changed = n1;
    changed[5] = (changed[5] + 1) % 512;
    auto kv_b = head.AllocateKvCache(64);
    Tensor other = RunHead(head, kv_b, contiguous, aux1, changed, {T1});
    const int64_t V = head.draft_vocab_size();
    std::vector<float> a = Floats(whole), b = Floats(other);
    CHECK(std::memcmp(a.data(), b.data(), sizeof(float) * 5 * V) == 0);  // rows before 5: causal
    CHECK(NormalizedError(std::vector<float>(b.end() - V, b.end()), std::vector<float>(a.end() - V, a.end())) > 1e-6);
  }
  SECTION("steps with no logit rows append the same K/V, and later rows read them alike") {
    // Rows [0, T1 - 3) as K/V-only steps (no logits wanted), then the last 3 with logits.
    const auto zeroed = [&head] {  // unused slots compare equal too
      LayerKvPool p = head.AllocateKvCache(64);
      std::memset(p.k.raw(), 0, p.k.nbytes());
      std::memset(p.v.raw(), 0, p.v.nbytes());
      return p;
    };
    LayerKvPool kv_b = zeroed();
    for (int64_t start = 0; start < T1 - 3; start += 5) {
      const int64_t len = std::min<int64_t>(5, T1 - 3 - start);
      std::vector<int32_t> part(n1.begin() + start, n1.begin() + start + len), rows;
      for (int64_t r = start; r < start + len; ++r) rows.push_back(static_cast<int32_t>(r));
      ForwardInput in = BuildHostForwardInput({StepSequence{&contiguous, start, part}}, LogitsFor::kEveryToken);
      in.logit_rows = Tensor::Empty({0}, DType::kI32);
      Tensor none = head.Forward(in, aux1, kv_b, rows);
      CHECK(none.numel() == 0);
    }
    std::vector<int32_t> tail(n1.end() - 3, n1.end()), rows;
    for (int64_t r = T1 - 3; r < T1; ++r) rows.push_back(static_cast<int32_t>(r));
    ForwardInput in = BuildHostForwardInput({StepSequence{&contiguous, T1 - 3, tail}}, LogitsFor::kEveryToken);
    std::vector<float> last = Floats(head.Forward(in, aux1, kv_b, rows)), all = Floats(whole);
    const int64_t V = head.draft_vocab_size();
    CHECK(NormalizedError(last, std::vector<float>(all.end() - 3 * V, all.end())) < 1e-6);
    // The K/V written by the K/V-only steps are those of full steps, bit for bit.
    LayerKvPool kv_full = zeroed();
    RunHead(head, kv_full, contiguous, aux1, n1, {T1 - 3, 3});
    CHECK(SameBits(kv_b.k, kv_full.k));
    CHECK(SameBits(kv_b.v, kv_full.v));
  }
  SECTION("hidden_out returns the pre-norm head output") {
    auto kv_b = head.AllocateKvCache(64);
    ForwardInput in = BuildHostForwardInput({StepSequence{&contiguous, 0, n1}}, LogitsFor::kEveryToken);
    Tensor hidden = Tensor::Zeros({T1, hc.hidden_size}, DType::kF32);
    Tensor logits = head.Forward(in, aux1, kv_b, {}, &hidden);
    CHECK(SameBits(logits, whole));
    Mat expect = MatMulT(RmsNormRows(Floats(hidden), HostWeight(*w, "norm.weight"), T1, hc.hidden_size, hc.rms_norm_eps),
                         HostWeight(*w, "lm_head.weight"), T1, hc.hidden_size, head.draft_vocab_size());
    CHECK(NormalizedError(Floats(logits), expect) < 1e-5);
  }
}

TEST_CASE("d2t maps draft ids to target ids", "[eagle3]") {
  CpuBackend backend(2);
  Target t = LoadTarget("qwen3-tiny", backend);
  const ModelConfig hc = HeadConfigFor(t.config, {2, 1, 0}, 128);
  auto base = RandomHeadWeights(hc, false, 4);
  OverrideWeights w(*base);
  Tensor d2t = Tensor::Empty({128}, DType::kI64);
  for (int64_t i = 0; i < 128; ++i) d2t.data<int64_t>()[i] = (3 * i + 1) - i;  // target id 3i + 1
  w.Set("d2t", d2t);
  auto head = Eagle3Head::Create(hc, w, *t.model, backend);
  REQUIRE(head.ok());
  for (int64_t i = 0; i < 128; ++i) REQUIRE((*head)->DraftToTarget(i) == 3 * i + 1);
  const Tensor& dev = (*head)->draft_to_target_device();
  REQUIRE(dev.numel() == 128);
  CHECK(dev.data<int32_t>()[127] == 382);
  // Greedy: argmax over the draft vocabulary (ties to the lowest id), then mapped.
  Tensor logits = Tensor::Zeros({3, 128}, DType::kF32);
  logits.data<float>()[0 * 128 + 7] = 2.0f;
  logits.data<float>()[1 * 128 + 127] = 0.5f;
  logits.data<float>()[2 * 128 + 3] = -1.0f;  // row 2: all zeros but one negative: id 0
  CHECK((*head)->GreedyTargetTokens(logits) == std::vector<int32_t>{22, 382, 1});
}

// ---------------------------------------------------------------- PyTorch reference

TEST_CASE("draft logits match the PyTorch reference fixtures", "[eagle3]") {
  // Committed fixtures: tools/eagle3_reference.py, and tools/train/export_check.py for the
  // trained default (docs/eagle3.md, docs/trained_model.md).
  for (const testing::Eagle3Fixture& spec : testing::Eagle3Fixtures()) {
    DYNAMIC_SECTION(spec.name) {
      REQUIRE(std::filesystem::exists(spec.reference));
      CpuBackend backend(2);
      Target t = LoadTargetDir(spec.target, backend);
      auto head = Eagle3Head::Load(spec.head, *t.model, backend);
      REQUIRE(head.ok());
      auto ref = SafetensorsFile::Open(spec.reference);
      REQUIRE(ref.ok());
      for (int p = 0; ref->TensorBytes("prompt" + std::to_string(p) + ".ids").ok(); ++p) {
        const std::string key = "prompt" + std::to_string(p);
        auto ids64 = testing::TensorVector<int64_t>(*ref, key + ".ids");
        std::vector<int32_t> prompt(ids64.begin(), ids64.end());
        auto expect = testing::TensorVector<float>(*ref, key + ".draft_logits");
        auto tokens = testing::TensorVector<int64_t>(*ref, key + ".draft_tokens");
        auto margins = testing::TensorVector<float>(*ref, key + ".draft_margins");
        Tensor logits = HeadLogitsOnPrompt(**head, t, prompt);
        const double err = NormalizedError(Floats(logits), expect);
        INFO(key << " normalized error " << err);
        CHECK(err < 1e-4);
        std::vector<int32_t> got = (*head)->GreedyTargetTokens(logits);
        REQUIRE(got.size() == tokens.size());
        for (size_t i = 0; i < got.size(); ++i) {
          if (margins[i] > 1e-3f) CHECK(got[i] == tokens[i]);
        }
      }
    }
  }
}

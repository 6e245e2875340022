// Qwen3-MoE on the CPU reference without generated fixtures: tiny checkpoints the test
// writes itself (tests/support/moe_checkpoint.h) with the attention output zeroed (o_proj = 0),
// so each position's logits are a function of its token alone, computed here by a naive
// per-token implementation in double (router softmax, top-k by sorting, renormalisation,
// expert MLPs, dense mlp_only_layers). Also: the three checkpoint layouts load the same model,
// missing or misshapen expert tensors are clear errors; dummy weights (tensor parallelism:
// test_moe_tp.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "fixture_model.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "moe_checkpoint.h"
#include "oasis/model_config.h"
#include "test_support.h"

using namespace oasis;
using testing::ExpertLayout;
using testing::MoeExpertName;
using testing::MoeLayerName;
using testing::TinyMoeCheckpoint;
using testing::TinyMoeOptions;

namespace {

// The model of a checkpoint with o_proj = 0, token by token, in double.
class NaiveMoeModel {
 public:
  NaiveMoeModel(const TinyMoeCheckpoint& ck, const TinyMoeOptions& o) : ck_(ck), o_(o) {}

  std::vector<double> Logits(int32_t token) {
    const int64_t h = o_.hidden;
    const auto& embed = W("model.embed_tokens.weight");
    std::vector<double> stream(embed.begin() + token * h, embed.begin() + (token + 1) * h);
    for (int64_t l = 0; l < o_.layers; ++l) {
      // Attention adds o_proj · (...) = 0; the MLP's input is the post-attention norm.
      const std::vector<double> x =
          Norm(stream, W(MoeLayerName(l, "post_attention_layernorm.weight")));
      const std::vector<double> y = IsMoe(l) ? Moe(l, x)
                                             : Mlp(MoeLayerName(l, "mlp.gate_proj.weight"),
                                                   MoeLayerName(l, "mlp.up_proj.weight"),
                                                   MoeLayerName(l, "mlp.down_proj.weight"), x);
      for (int64_t i = 0; i < h; ++i) stream[i] += y[i];
    }
    return MatVec("lm_head.weight", Norm(stream, W("model.norm.weight")));
  }

  // Experts chosen for any token so far, per layer (to check the routing is not degenerate).
  std::map<int64_t, std::set<int64_t>> experts_used;

 private:
  const std::vector<float>& W(const std::string& name) const {
    auto it = ck_.weights.find(name);
    REQUIRE(it != ck_.weights.end());
    return it->second.values;
  }
  bool IsMoe(int64_t l) const {
    const auto& only = o_.mlp_only_layers;
    return std::find(only.begin(), only.end(), l) == only.end() && o_.num_experts > 0 &&
           (l + 1) % o_.decoder_sparse_step == 0;
  }
  std::vector<double> MatVec(const std::string& name, const std::vector<double>& x) const {
    const auto& w = W(name);
    const size_t in = x.size(), out = w.size() / in;
    std::vector<double> y(out, 0.0);
    for (size_t r = 0; r < out; ++r) {
      for (size_t i = 0; i < in; ++i) y[r] += static_cast<double>(w[r * in + i]) * x[i];
    }
    return y;
  }
  static std::vector<double> Norm(const std::vector<double>& x, const std::vector<float>& w) {
    double ms = 0;
    for (double v : x) ms += v * v;
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + 1e-6);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  }
  std::vector<double> Mlp(const std::string& gate, const std::string& up, const std::string& down,
                          const std::vector<double>& x) const {
    std::vector<double> g = MatVec(gate, x), u = MatVec(up, x);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return MatVec(down, g);
  }
  std::vector<double> Moe(int64_t l, const std::vector<double>& x) {
    std::vector<double> p = MatVec(MoeLayerName(l, "mlp.gate.weight"), x);
    const double max = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - max));
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < o_.k; ++j) chosen += p[order[j]];
    std::vector<double> out(static_cast<size_t>(o_.hidden), 0.0);
    for (int64_t j = 0; j < o_.k; ++j) {
      const int64_t e = order[j];
      experts_used[l].insert(e);
      const double w = o_.norm_topk_prob ? p[e] / chosen : p[e];
      const std::vector<double> y =
          Mlp(MoeExpertName(l, e, "gate_proj"), MoeExpertName(l, e, "up_proj"),
              MoeExpertName(l, e, "down_proj"), x);
      for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
    }
    return out;
  }

  const TinyMoeCheckpoint& ck_;
  TinyMoeOptions o_;
};

struct Loaded {
  TinyMoeCheckpoint ck;
  testing::FixtureCheckpoint files;
};

Loaded WriteAndOpen(const std::string& tag, const TinyMoeOptions& o) {
  const auto dir = testing::MakeTempDir(tag);
  TinyMoeCheckpoint ck = testing::WriteTinyMoe(dir, o);
  Loaded loaded{std::move(ck), testing::OpenFixtureDir(dir)};
  std::filesystem::remove_all(dir);  // the files stay mapped until the weights go
  return loaded;
}

std::vector<int32_t> EveryToken(int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

double MaxRelativeError(const Tensor& logits, const std::vector<std::vector<double>>& ref) {
  const int64_t vocab = logits.dim(1);
  double num = 0, den = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    for (int64_t v = 0; v < vocab; ++v) {
      const double d = logits.data<float>()[t * vocab + v] - ref[t][v];
      num += d * d;
      den += ref[t][v] * ref[t][v];
    }
  }
  return std::sqrt(num / den);
}

struct Variant {
  const char* name;
  TinyMoeOptions options;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  TinyMoeOptions base;
  base.zero_attention_output = true;
  v.push_back({"k=2 of 6, renormalised", base});
  TinyMoeOptions raw = base;
  raw.norm_topk_prob = false;
  v.push_back({"k=2 of 6, softmax weights", raw});
  TinyMoeOptions top1 = base;
  top1.k = 1;
  v.push_back({"k=1, renormalised (weight 1)", top1});
  TinyMoeOptions top1raw = top1;
  top1raw.norm_topk_prob = false;
  v.push_back({"k=1, softmax weight", top1raw});
  TinyMoeOptions all = base;
  all.k = all.num_experts;
  all.norm_topk_prob = false;
  v.push_back({"k = num_experts", all});
  TinyMoeOptions mixed = base;
  mixed.mlp_only_layers = {1};
  v.push_back({"mlp_only_layers {1}", mixed});
  TinyMoeOptions step = base;
  step.layers = 4;
  step.decoder_sparse_step = 2;
  step.mlp_only_layers = {3};
  step.k = 3;
  v.push_back({"decoder_sparse_step 2, layer 3 dense: only layer 1 MoE", step});
  TinyMoeOptions many = base;
  many.num_experts = 24;
  many.k = 4;
  v.push_back({"24 experts, k=4", many});
  return v;
}

}  // namespace

TEST_CASE("MoE model logits equal a naive per-token reference", "[models][moe]") {
  for (const Variant& variant : Variants()) {
    for (ExpertLayout layout :
         {ExpertLayout::kPerExpert, ExpertLayout::kFused, ExpertLayout::kSharded}) {
      TinyMoeOptions o = variant.options;
      o.layout = layout;
      DYNAMIC_SECTION(variant.name << ", layout " << static_cast<int>(layout)) {
        Loaded m = WriteAndOpen("moe-naive", o);
        CpuBackend backend;
        auto model = DecoderLM::Create(m.files.config, *m.files.weights, backend);
        INFO(model.status().ToString());
        REQUIRE(model.ok());
        NaiveMoeModel naive(m.ck, o);
        std::vector<std::vector<double>> ref;
        for (int32_t t : EveryToken(o.vocab)) ref.push_back(naive.Logits(t));
        // The routing really varies: every MoE layer sends some token to most experts.
        for (const auto& [layer, used] : naive.experts_used) {
          INFO("layer " << layer);
          CHECK(static_cast<int64_t>(used.size()) >= std::min<int64_t>(o.num_experts, 4));
        }
        for (int64_t chunk : {int64_t{512}, int64_t{7}}) {
          Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = chunk});
          auto logits = gen.PromptLogits(EveryToken(o.vocab));
          REQUIRE(logits.ok());
          const double err = MaxRelativeError(*logits, ref);
          INFO("chunk " << chunk << " normalized error " << err);
          CHECK(err <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("norm_topk_prob and k change the MoE output", "[models][moe]") {
  // Guards the reference comparison above against a model that ignores the fields.
  auto logits_of = [](TinyMoeOptions o) {
    Loaded m = WriteAndOpen("moe-fields", o);
    CpuBackend backend;
    auto model = DecoderLM::Create(m.files.config, *m.files.weights, backend);
    REQUIRE(model.ok());
    Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 512});
    auto logits = gen.PromptLogits({1, 5, 9, 30});
    REQUIRE(logits.ok());
    return *logits;
  };
  TinyMoeOptions o;
  const Tensor base = logits_of(o);
  TinyMoeOptions raw = o;
  raw.norm_topk_prob = false;
  TinyMoeOptions top3 = o;
  top3.k = 3;
  TinyMoeOptions dense_first = o;
  dense_first.mlp_only_layers = {0};
  for (const Tensor& other : {logits_of(raw), logits_of(top3), logits_of(dense_first)}) {
    CHECK(testing::NormalizedError(other, base) > 1e-3);
  }
}

TEST_CASE("per-expert, fused and sharded checkpoints load the same MoE model",
          "[models][moe][loader]") {
  std::vector<Tensor> results;
  for (ExpertLayout layout :
       {ExpertLayout::kPerExpert, ExpertLayout::kFused, ExpertLayout::kSharded}) {
    TinyMoeOptions o;
    o.mlp_only_layers = {2};
    o.layout = layout;
    Loaded m = WriteAndOpen("moe-layouts", o);
    if (layout == ExpertLayout::kFused) {
      CHECK(m.files.weights->Has("model.layers.0.mlp.experts.gate_up_proj"));
      CHECK_FALSE(m.files.weights->Has(MoeExpertName(0, 0, "gate_proj")));
    }
    CpuBackend backend;
    auto model = DecoderLM::Create(m.files.config, *m.files.weights, backend);
    REQUIRE(model.ok());
    Generator gen(**model, backend, {.num_kv_slots = 64, .max_step_tokens = 512});
    auto logits = gen.PromptLogits({1, 7, 3, 63, 20, 20, 41});
    REQUIRE(logits.ok());
    results.push_back(*logits);
  }
  for (size_t i = 1; i < results.size(); ++i) {
    REQUIRE(results[i].nbytes() == results[0].nbytes());
    CHECK(std::memcmp(results[i].raw(), results[0].raw(), results[0].nbytes()) == 0);
  }
}

TEST_CASE("missing and misshapen expert tensors are clear errors", "[models][moe][loader]") {
  TinyMoeOptions o;
  const auto dir = testing::MakeTempDir("moe-errors");
  TinyMoeCheckpoint ck = testing::WriteTinyMoe(dir, o);
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  CpuBackend backend;
  // Rewrites model.safetensors from the checkpoint's tensors after `edit`.
  auto rewrite = [&](auto edit) {
    std::map<std::string, testing::HostWeight> w = ck.weights;
    edit(w);
    std::vector<std::pair<std::string, const testing::HostWeight*>> all;
    for (const auto& [name, t] : w) all.emplace_back(name, &t);
    testing::moe_detail::WriteSafetensors(dir / "model.safetensors", all);
    auto weights = OpenSafetensorsWeights(dir);
    REQUIRE(weights.ok());
    return DecoderLM::Create(*config, **weights, backend).status();
  };
  const std::string up3 = MoeExpertName(1, 3, "up_proj");
  Status missing = rewrite([&](auto& w) { w.erase(up3); });
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK_THAT(missing.message(), Catch::Contains(up3));

  const std::string down5 = MoeExpertName(0, 5, "down_proj");
  Status shape = rewrite([&](auto& w) {
    w[down5].shape = {o.hidden, o.moe_intermediate + 1};
    w[down5].values.resize(static_cast<size_t>(o.hidden * (o.moe_intermediate + 1)));
  });
  CHECK(shape.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(shape.message(), Catch::Contains(down5) && Catch::Contains("[32, 17]") &&
                                  Catch::Contains("expected [32, 16]"));

  const std::string router = MoeLayerName(2, "mlp.gate.weight");
  Status no_router = rewrite([&](auto& w) { w.erase(router); });
  CHECK(no_router.code() == StatusCode::kNotFound);
  CHECK_THAT(no_router.message(), Catch::Contains(router));

  // A config with more experts than the checkpoint holds names the first absent one.
  ModelConfig more = *config;
  more.num_experts = 8;
  CHECK(rewrite([](auto&) {}).ok());  // the checkpoint as written loads
  auto weights = OpenSafetensorsWeights(dir);
  REQUIRE(weights.ok());
  auto bad = DecoderLM::Create(more, **weights, backend);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains(MoeLayerName(0, "mlp.gate.weight")) ||
                                         Catch::Contains(MoeExpertName(0, 6, "gate_proj")));

  // Fused layout: a down_proj that does not match gate_up_proj.
  TinyMoeOptions fused = o;
  fused.layout = ExpertLayout::kFused;
  const auto fdir = testing::MakeTempDir("moe-errors-fused");
  TinyMoeCheckpoint fck = testing::WriteTinyMoe(fdir, fused);
  {
    auto fw = OpenSafetensorsWeights(fdir);
    REQUIRE(fw.ok());
    std::vector<std::pair<std::string, testing::HostWeight>> disk;
    for (const std::string& name : (*fw)->Names()) {
      auto t = (*fw)->Load(name, DType::kF32);
      REQUIRE(t.ok());
      testing::HostWeight hw{t->shape(),
                             std::vector<float>(t->data<float>(), t->data<float>() + t->numel())};
      if (name == MoeLayerName(1, "mlp.experts.down_proj"))
        hw.shape = {o.num_experts, o.moe_intermediate, o.hidden};
      disk.emplace_back(name, std::move(hw));
    }
    std::vector<std::pair<std::string, const testing::HostWeight*>> all;
    for (const auto& [name, t] : disk) all.emplace_back(name, &t);
    testing::moe_detail::WriteSafetensors(fdir / "model.safetensors", all);
  }
  auto fw = OpenSafetensorsWeights(fdir);
  REQUIRE(fw.ok());
  auto fbad = DecoderLM::Create(*config, **fw, backend);
  REQUIRE_FALSE(fbad.ok());
  CHECK(fbad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(fbad.status().message(), Catch::Contains(MoeLayerName(1, "mlp.experts.down_proj")) &&
                                          Catch::Contains("[6, 16, 32]"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(fdir);
}

TEST_CASE("dummy weights build a MoE model at its real shapes", "[models][moe]") {
  TinyMoeOptions o;
  o.mlp_only_layers = {0};
  const auto dir = testing::MakeTempDir("moe-dummy");
  testing::WriteTinyMoe(dir, o);
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  std::filesystem::remove_all(dir);  // only its config.json was needed
  const auto specs = DecoderLM::ExpectedWeights(*config);
  // Layer 0 dense, layers 1 and 2: router + 6 experts x 3 projections.
  int64_t expert_tensors = 0;
  for (const WeightSpec& s : specs) {
    if (s.name.find(".mlp.experts.") != std::string::npos) ++expert_tensors;
    if (s.name == MoeLayerName(1, "mlp.gate.weight")) CHECK(s.shape == std::vector<int64_t>{6, 32});
    if (s.name == MoeExpertName(2, 5, "down_proj")) CHECK(s.shape == std::vector<int64_t>{32, 16});
  }
  CHECK(expert_tensors == 2 * 6 * 3);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const WeightSpec& s) {
          return s.name == MoeLayerName(0, "mlp.gate_proj.weight");
        }) == 1);
  CpuBackend backend;
  auto dummy = MakeDummyWeights(specs, 3);
  auto from_source = DecoderLM::Create(*config, *dummy, backend);
  REQUIRE(from_source.ok());
  auto direct = DecoderLM::CreateDummy(*config, backend, 3);
  REQUIRE(direct.ok());
  for (DecoderLM* model : {from_source->get(), direct->get()}) {
    Generator gen(*model, backend, {.num_kv_slots = 64, .max_step_tokens = 64});
    GenerationRequest r;
    r.prompt = {1, 5, 9};
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    auto a = gen.Generate({r});
    auto b = gen.Generate({r, r});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK((*a)[0].tokens.size() == 6);
    CHECK((*b)[0].tokens == (*a)[0].tokens);
    CHECK((*b)[1].tokens == (*a)[0].tokens);
  }
  // Hand-built configs with impossible expert counts are refused before any weight is read.
  for (auto [k, inter] : {std::pair{int64_t{0}, int64_t{16}}, std::pair{int64_t{7}, int64_t{16}},
                          std::pair{int64_t{2}, int64_t{0}}}) {
    ModelConfig bad = *config;
    bad.num_experts_per_tok = k;
    bad.moe_intermediate_size = inter;
    auto refused = DecoderLM::CreateDummy(bad, backend, 3);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(refused.status().message(), Catch::Contains("num_experts_per_tok"));
    CHECK(DecoderLM::Create(bad, *dummy, backend).status().code() == StatusCode::kInvalidArgument);
  }
  // An MoE layer has no dense down_proj to find.
  CHECK((*direct)->FindWeight(MoeLayerName(1, "mlp.down_proj.weight")) == nullptr);
  CHECK((*direct)->FindWeight(MoeLayerName(0, "mlp.down_proj.weight")) != nullptr);
}

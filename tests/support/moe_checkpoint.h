// Tiny Qwen3-MoE checkpoints written by the tests themselves (no generated fixtures needed):
// config.json and float32 safetensors with random weights, in the per-expert layout of the
// Hub releases, transformers 5's fused layout, or sharded over two files with an index.
// The weights are also returned, for references computed in the tests. Header-only.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace oasis::testing {

enum class ExpertLayout { kPerExpert, kFused, kSharded };

struct TinyMoeOptions {
  int64_t layers = 3;
  int64_t hidden = 32;
  int64_t vocab = 64;
  int64_t intermediate = 48;  // dense (mlp_only_layers) layers
  int64_t num_experts = 6;
  int64_t k = 2;
  int64_t moe_intermediate = 16;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // o_proj = 0: attention adds nothing to the residual stream, so a test can compute the
  // model token by token without attention.
  bool zero_attention_output = false;
  ExpertLayout layout = ExpertLayout::kPerExpert;
  uint64_t seed = 1;
};

struct HostWeight {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct TinyMoeCheckpoint {
  nlohmann::json config;
  // Every weight by its per-expert checkpoint name, whatever the layout on disk.
  std::map<std::string, HostWeight> weights;
};

namespace moe_detail {

inline std::string Header(const std::vector<std::pair<std::string, const HostWeight*>>& tensors,
                          std::string* data) {
  nlohmann::json header = nlohmann::json::object();
  for (const auto& [name, w] : tensors) {
    const size_t bytes = w->values.size() * sizeof(float);
    header[name] = {{"dtype", "F32"},
                    {"shape", w->shape},
                    {"data_offsets", {data->size(), data->size() + bytes}}};
    data->append(reinterpret_cast<const char*>(w->values.data()), bytes);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  return text;
}

inline void WriteSafetensors(
    const std::filesystem::path& path,
    const std::vector<std::pair<std::string, const HostWeight*>>& tensors) {
  std::string data;
  const std::string text = Header(tensors, &data);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  REQUIRE(out.good());
}

}  // namespace moe_detail

inline std::string MoeLayerName(int64_t layer, const std::string& leaf) {
  return "model.layers." + std::to_string(layer) + "." + leaf;
}
inline std::string MoeExpertName(int64_t layer, int64_t e, const std::string& proj) {
  return MoeLayerName(layer, "mlp.experts." + std::to_string(e) + "." + proj + ".weight");
}

// Writes the checkpoint into `dir` (created) and returns what it wrote.
inline TinyMoeCheckpoint WriteTinyMoe(const std::filesystem::path& dir, const TinyMoeOptions& o) {
  constexpr int64_t kHeads = 4, kKvHeads = 2, kHeadDim = 8;
  TinyMoeCheckpoint ck;
  ck.config = {{"architectures", {"Qwen3MoeForCausalLM"}},
               {"model_type", "qwen3_moe"},
               {"hidden_size", o.hidden},
               {"intermediate_size", o.intermediate},
               {"moe_intermediate_size", o.moe_intermediate},
               {"num_experts", o.num_experts},
               {"num_experts_per_tok", o.k},
               {"norm_topk_prob", o.norm_topk_prob},
               {"decoder_sparse_step", o.decoder_sparse_step},
               {"mlp_only_layers", o.mlp_only_layers},
               {"num_hidden_layers", o.layers},
               {"num_attention_heads", kHeads},
               {"num_key_value_heads", kKvHeads},
               {"head_dim", kHeadDim},
               {"vocab_size", o.vocab},
               {"max_position_embeddings", 512},
               {"rope_theta", 1000000.0},
               {"rms_norm_eps", 1e-6},
               {"tie_word_embeddings", false},
               {"bos_token_id", 1},
               {"eos_token_id", 2},
               {"torch_dtype", "float32"}};
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal;
  auto& w = ck.weights;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    HostWeight t{std::move(shape), std::vector<float>(static_cast<size_t>(n))};
    for (float& v : t.values) v = offset + scale * normal(rng);
    w[name] = std::move(t);
  };
  const auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, 1.0f / std::sqrt(static_cast<float>(in)), 0.0f);
  };
  const auto norm = [&](const std::string& name, int64_t n) { add(name, {n}, 0.3f, 1.0f); };
  const int64_t h = o.hidden;
  add("model.embed_tokens.weight", {o.vocab, h}, 1.0f, 0.0f);
  add("lm_head.weight", {o.vocab, h}, 1.0f, 0.0f);
  norm("model.norm.weight", h);
  for (int64_t l = 0; l < o.layers; ++l) {
    norm(MoeLayerName(l, "input_layernorm.weight"), h);
    norm(MoeLayerName(l, "post_attention_layernorm.weight"), h);
    norm(MoeLayerName(l, "self_attn.q_norm.weight"), kHeadDim);
    norm(MoeLayerName(l, "self_attn.k_norm.weight"), kHeadDim);
    matrix(MoeLayerName(l, "self_attn.q_proj.weight"), kHeads * kHeadDim, h);
    matrix(MoeLayerName(l, "self_attn.k_proj.weight"), kKvHeads * kHeadDim, h);
    matrix(MoeLayerName(l, "self_attn.v_proj.weight"), kKvHeads * kHeadDim, h);
    add(MoeLayerName(l, "self_attn.o_proj.weight"), {h, kHeads * kHeadDim},
        o.zero_attention_output ? 0.0f : 1.0f / std::sqrt(static_cast<float>(kHeads * kHeadDim)),
        0.0f);
    const bool only =
        std::find(o.mlp_only_layers.begin(), o.mlp_only_layers.end(), l) != o.mlp_only_layers.end();
    const bool moe = !only && o.num_experts > 0 && (l + 1) % o.decoder_sparse_step == 0;
    if (!moe) {
      matrix(MoeLayerName(l, "mlp.gate_proj.weight"), o.intermediate, h);
      matrix(MoeLayerName(l, "mlp.up_proj.weight"), o.intermediate, h);
      matrix(MoeLayerName(l, "mlp.down_proj.weight"), h, o.intermediate);
      continue;
    }
    // Router logits of spread ~3: routing probabilities far from ties.
    add(MoeLayerName(l, "mlp.gate.weight"), {o.num_experts, h},
        3.0f / std::sqrt(static_cast<float>(h)), 0.0f);
    for (int64_t e = 0; e < o.num_experts; ++e) {
      matrix(MoeExpertName(l, e, "gate_proj"), o.moe_intermediate, h);
      matrix(MoeExpertName(l, e, "up_proj"), o.moe_intermediate, h);
      matrix(MoeExpertName(l, e, "down_proj"), h, o.moe_intermediate);
    }
  }

  // What goes to disk: per expert as it is, or fused per layer.
  std::map<std::string, HostWeight> disk;
  for (const auto& [name, t] : w) {
    const bool expert = name.find(".mlp.experts.") != std::string::npos;
    if (o.layout != ExpertLayout::kFused || !expert) disk[name] = t;
  }
  if (o.layout == ExpertLayout::kFused) {
    for (int64_t l = 0; l < o.layers; ++l) {
      if (!w.count(MoeExpertName(l, 0, "gate_proj"))) continue;
      const int64_t E = o.num_experts, I = o.moe_intermediate;
      HostWeight gate_up{{E, 2 * I, h}, {}}, down{{E, h, I}, {}};
      for (int64_t e = 0; e < E; ++e) {
        for (const char* proj : {"gate_proj", "up_proj"}) {
          const auto& v = w[MoeExpertName(l, e, proj)].values;
          gate_up.values.insert(gate_up.values.end(), v.begin(), v.end());
        }
        const auto& d = w[MoeExpertName(l, e, "down_proj")].values;
        down.values.insert(down.values.end(), d.begin(), d.end());
      }
      disk[MoeLayerName(l, "mlp.experts.gate_up_proj")] = std::move(gate_up);
      disk[MoeLayerName(l, "mlp.experts.down_proj")] = std::move(down);
    }
  }

  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << ck.config.dump(2);
  std::vector<std::pair<std::string, const HostWeight*>> all;
  for (const auto& [name, t] : disk) all.emplace_back(name, &t);
  if (o.layout != ExpertLayout::kSharded) {
    moe_detail::WriteSafetensors(dir / "model.safetensors", all);
    return ck;
  }
  // Two shards split in the middle of the layers' tensors, and the index naming them.
  const size_t half = all.size() / 2;
  const std::vector<std::pair<std::string, const HostWeight*>> first(all.begin(),
                                                                     all.begin() + half),
      second(all.begin() + half, all.end());
  moe_detail::WriteSafetensors(dir / "model-00001-of-00002.safetensors", first);
  moe_detail::WriteSafetensors(dir / "model-00002-of-00002.safetensors", second);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : first)
    index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (const auto& [name, t] : second)
    index["weight_map"][name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
  return ck;
}

}  // namespace oasis::testing

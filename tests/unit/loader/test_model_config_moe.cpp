// config.json -> ModelConfig for Qwen3-MoE (Qwen3MoeForCausalLM): the expert fields, the
// layer rule transformers applies, and the errors of inconsistent configs.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "oasis/model_config.h"

using namespace oasis;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

// As published for Qwen/Qwen3-30B-A3B.
const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

template <typename Edit>
StatusOr<ModelConfig> ParseEdited(Edit edit) {
  json j = json::parse(kQwen3_30B_A3B);
  edit(j);
  return ParseModelConfig(j.dump(), "/m/qwen3-moe/config.json");
}

template <typename Edit>
ModelConfig ParseEditedOk(Edit edit) {
  auto parsed = ParseEdited(edit);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  return *parsed;
}

template <typename Edit>
void ExpectError(Edit edit, const std::string& fragment) {
  auto parsed = ParseEdited(edit);
  REQUIRE_FALSE(parsed.ok());
  INFO(parsed.status().ToString());
  CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(parsed.status().message(), Contains("/m/qwen3-moe/config.json"));
  CHECK_THAT(parsed.status().message(), Contains(fragment));
}

std::vector<int64_t> MoeLayers(const ModelConfig& c) {
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) layers.push_back(l);
  }
  return layers;
}

}  // namespace

TEST_CASE("moe config: Qwen3-30B-A3B", "[loader][config][moe]") {
  ModelConfig c = ParseEditedOk([](json&) {});
  CHECK(c.architecture == Architecture::kQwen3Moe);
  CHECK(c.architecture_name == "Qwen3MoeForCausalLM");
  CHECK(c.model_type == "qwen3_moe");
  CHECK(c.qk_norm);  // Qwen3 attention
  CHECK(c.hidden_size == 2048);
  CHECK(c.num_attention_heads == 32);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.head_dim == 128);
  CHECK(c.intermediate_size == 6144);
  CHECK(c.num_experts == 128);
  CHECK(c.num_experts_per_tok == 8);
  CHECK(c.moe_intermediate_size == 768);
  CHECK(c.norm_topk_prob);
  CHECK(c.decoder_sparse_step == 1);
  CHECK(c.mlp_only_layers.empty());
  CHECK(MoeLayers(c).size() == 48);  // every layer
  CHECK(c.HasMoeLayers());
  CHECK_FALSE(c.HasDenseMlpLayers());
  CHECK(c.rope_theta == 1e6);
}

TEST_CASE("moe config: transformers 5's num_local_experts names the expert count",
          "[loader][config][moe]") {
  ModelConfig c = ParseEditedOk([](json& j) {
    j.erase("num_experts");
    j["num_local_experts"] = 16;
  });
  CHECK(c.num_experts == 16);
  CHECK(ParseEditedOk([](json& j) { j["num_local_experts"] = 128; }).num_experts == 128);
  // The alias has num_experts' bound (2^40 experts ran for 20 s, then bad_alloc).
  ExpectError(
      [](json& j) {
        j.erase("num_experts");
        j["num_local_experts"] = int64_t{1} << 40;
      },
      "'num_local_experts' must be at most 65536");
  ExpectError([](json& j) { j["num_local_experts"] = int64_t{1} << 40; },
              "'num_local_experts' must be at most 65536");
}

TEST_CASE("moe config: optional fields default as in Qwen3MoeConfig", "[loader][config][moe]") {
  ModelConfig c = ParseEditedOk([](json& j) {
    j.erase("norm_topk_prob");
    j.erase("decoder_sparse_step");
    j.erase("mlp_only_layers");
  });
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.decoder_sparse_step == 1);
  CHECK(c.mlp_only_layers.empty());
  // A JSON null counts as absent.
  ModelConfig n = ParseEditedOk([](json& j) { j["mlp_only_layers"] = nullptr; });
  CHECK(n.mlp_only_layers.empty());
}

TEST_CASE("moe config: which layers are MoE (transformers' rule)", "[loader][config][moe]") {
  auto small = [](int64_t layers, int64_t step, std::vector<int64_t> only, int64_t experts) {
    return ParseEditedOk([&](json& j) {
      j["num_hidden_layers"] = layers;
      j["decoder_sparse_step"] = step;
      j["mlp_only_layers"] = only;
      j["num_experts"] = experts;
      j["num_experts_per_tok"] = 1;
    });
  };
  // (l + 1) % step == 0: with step 2, layers 1, 3, 5.
  CHECK(MoeLayers(small(6, 2, {}, 8)) == std::vector<int64_t>{1, 3, 5});
  // step 3 over 7 layers: 2 and 5.
  CHECK(MoeLayers(small(7, 3, {}, 8)) == std::vector<int64_t>{2, 5});
  // mlp_only_layers take precedence.
  CHECK(MoeLayers(small(4, 1, {0, 2}, 8)) == std::vector<int64_t>{1, 3});
  CHECK(MoeLayers(small(6, 2, {3}, 8)) == std::vector<int64_t>{1, 5});
  // A step larger than the model: no MoE layer at all.
  ModelConfig none = small(3, 4, {}, 8);
  CHECK(MoeLayers(none).empty());
  CHECK_FALSE(none.HasMoeLayers());
  CHECK(none.HasDenseMlpLayers());
  // num_experts 0: every layer dense (transformers builds Qwen3MoeMLP everywhere).
  ModelConfig dense = small(4, 1, {}, 0);
  CHECK(MoeLayers(dense).empty());
  // Every layer listed: dense.
  CHECK(MoeLayers(small(3, 1, {0, 1, 2}, 8)).empty());
  // Duplicates are harmless and dropped; the list is kept sorted.
  ModelConfig dup = small(4, 1, {2, 0, 2}, 8);
  CHECK(dup.mlp_only_layers == std::vector<int64_t>{0, 2});
  CHECK(MoeLayers(dup) == std::vector<int64_t>{1, 3});
  // Mixed dense and MoE.
  CHECK(dup.HasMoeLayers());
  CHECK(dup.HasDenseMlpLayers());
  // A single integer is accepted for the list, as for token ids.
  ModelConfig one = ParseEditedOk([](json& j) {
    j["num_hidden_layers"] = 2;
    j["mlp_only_layers"] = 1;
  });
  CHECK(MoeLayers(one) == std::vector<int64_t>{0});
  // k == num_experts is allowed.
  ModelConfig all = ParseEditedOk([](json& j) {
    j["num_experts"] = 4;
    j["num_experts_per_tok"] = 4;
  });
  CHECK(all.num_experts_per_tok == 4);
}

TEST_CASE("moe config: inconsistent configs are InvalidArgument naming the field",
          "[loader][config][moe]") {
  ExpectError([](json& j) { j["num_experts_per_tok"] = 129; },
              "'num_experts_per_tok' (129) must not exceed num_experts (128)");
  ExpectError([](json& j) { j["num_experts_per_tok"] = 0; },
              "'num_experts_per_tok' must be positive");
  ExpectError([](json& j) { j["num_experts_per_tok"] = -2; }, "'num_experts_per_tok'");
  ExpectError([](json& j) { j.erase("num_experts_per_tok"); }, "'num_experts_per_tok' is missing");
  ExpectError([](json& j) { j["num_experts"] = -1; }, "'num_experts' must be >= 0");
  ExpectError([](json& j) { j.erase("num_experts"); }, "'num_experts' is missing");
  ExpectError([](json& j) { j["num_experts"] = 8.5; }, "'num_experts' must be an integer");
  ExpectError([](json& j) { j["num_local_experts"] = 64; },
              "'num_local_experts' (64) disagrees with num_experts (128)");
  ExpectError(
      [](json& j) {
        j.erase("num_experts");
        j["num_local_experts"] = -3;
      },
      "'num_local_experts' must be >= 0");
  ExpectError([](json& j) { j["moe_intermediate_size"] = 0; },
              "'moe_intermediate_size' must be positive");
  ExpectError([](json& j) { j.erase("moe_intermediate_size"); },
              "'moe_intermediate_size' is missing");
  ExpectError([](json& j) { j["decoder_sparse_step"] = 0; },
              "'decoder_sparse_step' must be positive");
  ExpectError([](json& j) { j["decoder_sparse_step"] = -1; }, "'decoder_sparse_step'");
  ExpectError(
      [](json& j) {
        j["mlp_only_layers"] = {0, 48};
      },
      "'mlp_only_layers' names layer 48, outside [0, num_hidden_layers = 48)");
  ExpectError([](json& j) { j["mlp_only_layers"] = {-1}; },
              "'mlp_only_layers' must hold non-negative integers");
  ExpectError([](json& j) { j["mlp_only_layers"] = {"3"}; }, "'mlp_only_layers'");
  ExpectError([](json& j) { j["norm_topk_prob"] = 1; }, "'norm_topk_prob' must be true or false");
  ExpectError([](json& j) { j["shared_expert_intermediate_size"] = 512; },
              "'shared_expert_intermediate_size'");
  // The attention fields are checked as for Qwen3.
  ExpectError([](json& j) { j["num_key_value_heads"] = 5; }, "'num_key_value_heads'");
}

TEST_CASE("moe config: expert fields belong to Qwen3-MoE only", "[loader][config][moe]") {
  // A dense Qwen3 config ignores the fields (they are not read), so its layers stay dense.
  json j = json::parse(kQwen3_30B_A3B);
  j["architectures"] = {"Qwen3ForCausalLM"};
  auto parsed = ParseModelConfig(j.dump(), "config.json");
  REQUIRE(parsed.ok());
  CHECK(parsed->architecture == Architecture::kQwen3);
  CHECK(parsed->num_experts == 0);
  CHECK_FALSE(parsed->HasMoeLayers());
}

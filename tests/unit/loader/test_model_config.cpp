// config.json -> ModelConfig for Qwen3, Llama 3.x and EAGLE-3 draft heads.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "oasis/model_config.h"
#include "safetensors_builder.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::testing;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

// As published for Qwen/Qwen3-8B.
const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// As published for meta-llama/Llama-3.1-8B-Instruct.
const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// An EAGLE-3 draft head for Llama-3.1-8B (as in yuhuili/EAGLE3-LLaMA3.1-Instruct-8B).
const char* kEagle3Llama = R"({
  "architectures": ["LlamaForCausalLMEagle3"],
  "bos_token_id": 128000,
  "draft_vocab_size": 32000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 1,
  "num_key_value_heads": 8,
  "pad_token_id": 0,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.28.1",
  "use_cache": true,
  "vocab_size": 128256
})";

ModelConfig ParseOk(const std::string& text) {
  auto parsed = ParseModelConfig(text, "config.json");
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  return *parsed;
}

// Applies `edit` to the Llama-3.1-8B config and expects an error naming `fragment`.
template <typename Edit>
void ExpectLlamaError(Edit edit, StatusCode code, const std::string& fragment) {
  json j = json::parse(kLlama31_8B);
  edit(j);
  auto parsed = ParseModelConfig(j.dump(), "/models/llama/config.json");
  REQUIRE_FALSE(parsed.ok());
  INFO(parsed.status().ToString());
  CHECK(parsed.status().code() == code);
  CHECK_THAT(parsed.status().message(), Contains("/models/llama/config.json"));
  CHECK_THAT(parsed.status().message(), Contains(fragment));
}

}  // namespace

TEST_CASE("model config: Qwen3-8B", "[loader][config]") {
  const ModelConfig c = ParseOk(kQwen3_8B);
  CHECK(c.architecture == Architecture::kQwen3);
  CHECK(c.architecture_name == "Qwen3ForCausalLM");
  CHECK(c.model_type == "qwen3");
  CHECK(c.hidden_size == 4096);
  CHECK(c.num_hidden_layers == 36);
  CHECK(c.num_attention_heads == 32);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.intermediate_size == 12288);
  CHECK(c.vocab_size == 151936);
  CHECK(c.max_position_embeddings == 40960);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.rope_scaling.type == RopeScalingType::kNone);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK(c.qk_norm);
  CHECK(c.dtype == DType::kBF16);
  CHECK(c.bos_token_ids == std::vector<int64_t>{151643});
  CHECK(c.eos_token_ids == std::vector<int64_t>{151645});
  CHECK(c.q_size() == 4096);
  CHECK(c.kv_size() == 1024);
  CHECK(c.draft_vocab_size == 0);
  CHECK(c.aux_hidden_state_layer_ids.empty());
}

TEST_CASE("model config: Llama-3.1-8B with llama3 rope scaling", "[loader][config]") {
  const ModelConfig c = ParseOk(kLlama31_8B);
  CHECK(c.architecture == Architecture::kLlama);
  CHECK(c.num_hidden_layers == 32);
  CHECK(c.head_dim == 128);  // hidden / heads
  CHECK(c.intermediate_size == 14336);
  CHECK(c.vocab_size == 128256);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.type == RopeScalingType::kLlama3);
  CHECK(c.rope_scaling.factor == 8.0);
  CHECK(c.rope_scaling.low_freq_factor == 1.0);
  CHECK(c.rope_scaling.high_freq_factor == 4.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
  CHECK_FALSE(c.qk_norm);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
}

TEST_CASE("model config: variants that are accepted", "[loader][config]") {
  json j = json::parse(kLlama31_8B);
  SECTION("legacy 'type' key, default type, null and absent scaling") {
    j["rope_scaling"].erase("rope_type");
    j["rope_scaling"]["type"] = "llama3";
    CHECK(ParseOk(j.dump()).rope_scaling.type == RopeScalingType::kLlama3);
    j["rope_scaling"] = {{"rope_type", "default"}};
    CHECK(ParseOk(j.dump()).rope_scaling.type == RopeScalingType::kNone);
    j["rope_scaling"] = nullptr;
    CHECK(ParseOk(j.dump()).rope_scaling.type == RopeScalingType::kNone);
    j.erase("rope_scaling");
    j.erase("rope_theta");
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.rope_scaling.type == RopeScalingType::kNone);
    CHECK(c.rope_theta == 10000.0);
  }
  SECTION("transformers 5 rope_parameters override the top level") {
    j.erase("rope_scaling");
    j["rope_theta"] = 1.0;
    j["rope_parameters"] = {{"rope_theta", 250000.0}, {"rope_type", "llama3"}, {"factor", 32.0},
                            {"low_freq_factor", 2.0}, {"high_freq_factor", 8.0},
                            {"original_max_position_embeddings", 4096}};
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.rope_theta == 250000.0);
    CHECK(c.rope_scaling.type == RopeScalingType::kLlama3);
    CHECK(c.rope_scaling.factor == 32.0);
    CHECK(c.rope_scaling.low_freq_factor == 2.0);
    CHECK(c.rope_scaling.high_freq_factor == 8.0);
    CHECK(c.rope_scaling.original_max_position_embeddings == 4096);
  }
  SECTION("yarn as Qwen3 documents it: context = original × factor, transformers' defaults") {
    json q = json::parse(kQwen3_8B);
    q["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
    const ModelConfig c = ParseOk(q.dump());
    CHECK(c.rope_scaling.type == RopeScalingType::kYarn);
    CHECK(c.rope_scaling.factor == 4.0);
    CHECK(c.rope_scaling.original_max_position_embeddings == 32768);
    CHECK(c.max_position_embeddings == 131072);  // vLLM's derived max_model_len, not 40960
    CHECK(c.rope_scaling.attention_factor == 0.0);
    CHECK(c.rope_scaling.beta_fast == 32.0);
    CHECK(c.rope_scaling.beta_slow == 1.0);
    CHECK(c.rope_scaling.truncate);
    CHECK(c.rope_theta == 1e6);
  }
  SECTION("yarn in rope_parameters with every optional field; original defaults to the config's") {
    j.erase("rope_scaling");
    j["max_position_embeddings"] = 4096;
    j["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "yarn"}, {"factor", 8},
                            {"attention_factor", 1.5}, {"mscale", 0.7}, {"mscale_all_dim", 0.5},
                            {"beta_fast", 16}, {"beta_slow", 2}, {"truncate", false}};
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.rope_scaling.type == RopeScalingType::kYarn);
    CHECK(c.rope_scaling.original_max_position_embeddings == 4096);
    CHECK(c.max_position_embeddings == 8 * 4096);
    CHECK(c.rope_scaling.attention_factor == 1.5);
    CHECK(c.rope_scaling.mscale == 0.7);
    CHECK(c.rope_scaling.mscale_all_dim == 0.5);
    CHECK(c.rope_scaling.beta_fast == 16.0);
    CHECK(c.rope_scaling.beta_slow == 2.0);
    CHECK_FALSE(c.rope_scaling.truncate);
    CHECK(c.rope_theta == 10000.0);
  }
  SECTION("linear and dynamic: context = max_position_embeddings × factor; dynamic keeps the original") {
    j["max_position_embeddings"] = 2048;
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    ModelConfig c = ParseOk(j.dump());
    CHECK(c.rope_scaling.type == RopeScalingType::kLinear);
    CHECK(c.rope_scaling.factor == 2.0);
    CHECK(c.max_position_embeddings == 4096);
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 3}};
    c = ParseOk(j.dump());
    CHECK(c.rope_scaling.type == RopeScalingType::kDynamic);
    CHECK(c.rope_scaling.original_max_position_embeddings == 2048);
    CHECK(c.max_position_embeddings == 6144);
  }
  SECTION("llama3 keeps the configured context") {
    CHECK(ParseOk(j.dump()).max_position_embeddings == 131072);
  }
  SECTION("defaults: kv heads, tie, dtype, token ids") {
    for (const char* key : {"num_key_value_heads", "tie_word_embeddings", "torch_dtype", "bos_token_id",
                            "eos_token_id", "rms_norm_eps"}) {
      j.erase(key);
    }
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.num_key_value_heads == 32);
    CHECK_FALSE(c.tie_word_embeddings);
    CHECK(c.dtype == DType::kBF16);
    CHECK(c.bos_token_ids.empty());
    CHECK(c.eos_token_ids.empty());
    CHECK(c.rms_norm_eps == 1e-6);
  }
  SECTION("explicit head_dim, dtype key, attention bias, tied") {
    j["head_dim"] = 96;
    j["dtype"] = "float16";
    j["torch_dtype"] = "float32";  // "dtype" (transformers 5) wins
    j["attention_bias"] = true;
    j["tie_word_embeddings"] = true;
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.head_dim == 96);
    CHECK(c.q_size() == 32 * 96);
    CHECK(c.dtype == DType::kF16);
    CHECK(c.attention_bias);
    CHECK(c.tie_word_embeddings);
  }
  SECTION("the first supported name in 'architectures'") {
    j["architectures"] = {"SomethingElse", "LlamaForCausalLM"};
    CHECK(ParseOk(j.dump()).architecture == Architecture::kLlama);
  }
}

TEST_CASE("model config: EAGLE-3 draft heads", "[loader][config]") {
  SECTION("published Llama-3.1 head: defaults for target size and aux layers") {
    const ModelConfig c = ParseOk(kEagle3Llama);
    CHECK(c.architecture == Architecture::kEagle3Llama);
    CHECK(c.num_hidden_layers == 1);
    CHECK(c.draft_vocab_size == 32000);
    CHECK(c.vocab_size == 128256);
    CHECK(c.target_hidden_size == 4096);
    CHECK(c.aux_hidden_state_layer_ids.empty());
    CHECK(c.dtype == DType::kF16);
    CHECK_FALSE(c.qk_norm);
  }
  SECTION("explicit target size and eagle_config aux layers") {
    json j = json::parse(kEagle3Llama);
    j["target_hidden_size"] = 5120;
    j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {1, 23, 44}}, {"use_aux_hidden_state", true}};
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.target_hidden_size == 5120);
    CHECK(c.aux_hidden_state_layer_ids == std::vector<int64_t>{1, 23, 44});
  }
  SECTION("draft vocab defaults to the vocab") {
    json j = json::parse(kEagle3Llama);
    j.erase("draft_vocab_size");
    CHECK(ParseOk(j.dump()).draft_vocab_size == 128256);
  }
  SECTION("bad aux layer ids") {
    json j = json::parse(kEagle3Llama);
    j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", {1, -2}}};
    auto parsed = ParseModelConfig(j.dump(), "config.json");
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(parsed.status().message(), Contains("eagle_config.eagle_aux_hidden_state_layer_ids"));
  }
}

// An EAGLE-3 head in the `speculators` layout (as vLLM's published heads, e.g.
// RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3): the layer nests, the EAGLE-3 fields do not.
const char* kSpeculatorsEagle3 = R"({
  "architectures": ["Eagle3Speculator"],
  "draft_vocab_size": 32000,
  "norm_before_residual": false,
  "target_hidden_size": null,
  "speculators_model_type": "eagle3",
  "speculators_version": "0.1.0.dev13",
  "speculators_config": {
    "algorithm": "eagle3",
    "default_proposal_method": "greedy",
    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
    "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}
  },
  "torch_dtype": "bfloat16",
  "transformer_layer_config": {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 1, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": false, "vocab_size": 128256, "attention_bias": false, "mlp_bias": false
  }
})";

TEST_CASE("model config: EAGLE-3 heads in the speculators layout", "[loader][config]") {
  SECTION("the published layout") {
    const ModelConfig c = ParseOk(kSpeculatorsEagle3);
    CHECK(c.architecture == Architecture::kEagle3Llama);
    CHECK(c.architecture_name == "Eagle3Speculator");
    CHECK(c.hidden_size == 4096);
    CHECK(c.num_hidden_layers == 1);
    CHECK(c.num_key_value_heads == 8);
    CHECK(c.vocab_size == 128256);
    CHECK(c.draft_vocab_size == 32000);
    CHECK(c.target_hidden_size == 4096);  // null: the head's own hidden size
    CHECK(c.max_position_embeddings == 131072);
    CHECK(c.rope_scaling.type == RopeScalingType::kLlama3);
    CHECK(c.dtype == DType::kBF16);
    CHECK_FALSE(c.norm_before_residual);
    CHECK(c.aux_hidden_state_layer_ids.empty());
  }
  SECTION("defaults and top-level EAGLE-3 fields") {
    json j = json::parse(kSpeculatorsEagle3);
    j.erase("norm_before_residual");  // absent: true in this layout
    j["target_hidden_size"] = 5120;
    j["eagle_aux_hidden_state_layer_ids"] = {1, 15, 28};
    j["transformer_layer_config"].erase("num_hidden_layers");
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.norm_before_residual);
    CHECK(c.target_hidden_size == 5120);
    CHECK(c.aux_hidden_state_layer_ids == std::vector<int64_t>{1, 15, 28});
    CHECK(c.num_hidden_layers == 1);
  }
  SECTION("the original layout may say norm_before_residual and vLLM's architecture name") {
    json j = json::parse(kEagle3Llama);
    j["architectures"] = {"Eagle3LlamaForCausalLM"};
    j["norm_before_residual"] = true;
    j["eagle_aux_hidden_state_layer_ids"] = {2, 16, 29};
    const ModelConfig c = ParseOk(j.dump());
    CHECK(c.architecture == Architecture::kEagle3Llama);
    CHECK(c.norm_before_residual);
    CHECK(c.aux_hidden_state_layer_ids == std::vector<int64_t>{2, 16, 29});
    CHECK_FALSE(ParseOk(kEagle3Llama).norm_before_residual);  // absent: false in that layout
  }
  SECTION("what is refused, by name") {
    auto error_of = [](const json& j) {
      auto parsed = ParseModelConfig(j.dump(), "head/config.json");
      REQUIRE_FALSE(parsed.ok());
      return parsed.status().message();
    };
    json j = json::parse(kSpeculatorsEagle3);
    j["speculators_model_type"] = "eagle";
    CHECK(error_of(j).find("speculators_model_type \"eagle\" is not supported") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j.erase("speculators_model_type");
    CHECK(error_of(j).find("speculators_model_type") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j.erase("transformer_layer_config");
    CHECK(error_of(j).find("transformer_layer_config") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["transformer_layer_config"] = "llama";
    CHECK(error_of(j).find("transformer_layer_config") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["norm_before_fc"] = true;
    CHECK(error_of(j).find("norm_before_fc") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["transformer_layer_config"]["model_type"] = "qwen3";
    CHECK(error_of(j).find("only llama") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["transformer_layer_config"]["num_hidden_layers"] = 2;
    CHECK(error_of(j).find("only 1") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["transformer_layer_config"].erase("hidden_size");
    CHECK(error_of(j).find("hidden_size") != std::string::npos);
    j = json::parse(kSpeculatorsEagle3);
    j["norm_before_residual"] = "yes";
    CHECK(error_of(j).find("norm_before_residual") != std::string::npos);
  }
}

TEST_CASE("model config: errors name the field and the file", "[loader][config]") {
  using SC = StatusCode;
  ExpectLlamaError([](json& j) { j["architectures"] = {"MistralForCausalLM"}; }, SC::kUnimplemented,
                   "MistralForCausalLM");
  ExpectLlamaError([](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; }, SC::kUnimplemented,
                   SupportedArchitectures());
  ExpectLlamaError([](json& j) { j.erase("architectures"); }, SC::kInvalidArgument, "architectures");
  ExpectLlamaError([](json& j) { j.erase("hidden_size"); }, SC::kInvalidArgument, "'hidden_size' is missing");
  ExpectLlamaError([](json& j) { j["hidden_size"] = "4096"; }, SC::kInvalidArgument, "'hidden_size' must be an integer");
  ExpectLlamaError([](json& j) { j["hidden_size"] = 4096.5; }, SC::kInvalidArgument, "'hidden_size'");
  ExpectLlamaError([](json& j) { j["num_hidden_layers"] = 0; }, SC::kInvalidArgument, "'num_hidden_layers' must be positive");
  // Upper bounds: a broken file, not a model (1e12 layers ran for minutes, then bad_alloc; 2^62
  // positions overflowed the KV sizing).
  ExpectLlamaError([](json& j) { j["num_hidden_layers"] = int64_t{1000000000000}; }, SC::kInvalidArgument,
                   "'num_hidden_layers' must be at most 65536");
  ExpectLlamaError([](json& j) { j["max_position_embeddings"] = int64_t{1} << 62; }, SC::kInvalidArgument,
                   "'max_position_embeddings' must be at most 2147483647");
  ExpectLlamaError([](json& j) { j["vocab_size"] = int64_t{1} << 31; }, SC::kInvalidArgument, "'vocab_size' must be at most");
  ExpectLlamaError([](json& j) { j["hidden_size"] = int64_t{1} << 40; }, SC::kInvalidArgument, "'hidden_size' must be at most");
  ExpectLlamaError([](json& j) { j["num_attention_heads"] = int64_t{1} << 20; }, SC::kInvalidArgument,
                   "'num_attention_heads' must be at most");
  ExpectLlamaError([](json& j) { j["vocab_size"] = -5; }, SC::kInvalidArgument, "'vocab_size'");
  ExpectLlamaError([](json& j) { j["num_key_value_heads"] = 6; }, SC::kInvalidArgument, "'num_key_value_heads'");
  ExpectLlamaError([](json& j) { j["num_attention_heads"] = 24; }, SC::kInvalidArgument, "'num_attention_heads'");
  ExpectLlamaError([](json& j) { j["head_dim"] = 0; }, SC::kInvalidArgument, "'head_dim'");
  ExpectLlamaError([](json& j) { j["rms_norm_eps"] = -1; }, SC::kInvalidArgument, "'rms_norm_eps'");
  ExpectLlamaError([](json& j) { j["rope_theta"] = "big"; }, SC::kInvalidArgument, "'rope_theta'");
  ExpectLlamaError([](json& j) { j["tie_word_embeddings"] = 1; }, SC::kInvalidArgument, "'tie_word_embeddings'");
  ExpectLlamaError([](json& j) { j["torch_dtype"] = "float8"; }, SC::kInvalidArgument, "'torch_dtype'");
  ExpectLlamaError([](json& j) { j["eos_token_id"] = {1, "two"}; }, SC::kInvalidArgument, "'eos_token_id'");
  ExpectLlamaError([](json& j) { j["rope_scaling"]["rope_type"] = "longrope"; }, SC::kUnimplemented,
                   "\"longrope\" is not supported (supported: default, llama3, linear, dynamic, yarn)");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"type", "su"}, {"factor", 2.0}}; },
                   SC::kUnimplemented, "\"su\"");
  ExpectLlamaError([](json& j) { j["rope_scaling"].erase("factor"); }, SC::kInvalidArgument,
                   "'rope_scaling.factor' is missing");
  ExpectLlamaError([](json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; }, SC::kInvalidArgument,
                   "'rope_scaling.high_freq_factor'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = 3; }, SC::kInvalidArgument, "'rope_scaling'");
  ExpectLlamaError([](json& j) { j["rope_parameters"] = {{"rope_type", "dynamic"}}; }, SC::kInvalidArgument,
                   "'rope_parameters.factor' is missing");
  ExpectLlamaError([](json& j) { j["rope_parameters"] = {{"rope_type", "proportional"}, {"factor", 2}}; },
                   SC::kUnimplemented, "\"proportional\"");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2}, {"alpha", 1000}}; },
                   SC::kInvalidArgument, "'rope_scaling.alpha'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0}}; },
                   SC::kInvalidArgument, "'rope_scaling.factor' must be positive");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"beta_fast", 1}, {"beta_slow", 8}}; },
                   SC::kInvalidArgument, "'rope_scaling.beta_fast'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"mscale", "x"}}; },
                   SC::kInvalidArgument, "'rope_scaling.mscale'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"truncate", 0}}; },
                   SC::kInvalidArgument, "'rope_scaling.truncate'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"attention_factor", -1.0}}; },
                   SC::kInvalidArgument, "'rope_scaling.attention_factor'");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 0}}; },
                   SC::kInvalidArgument, "'rope_scaling.original_max_position_embeddings'");
  ExpectLlamaError([](json& j) { j["partial_rotary_factor"] = 0.5; }, SC::kInvalidArgument,
                   "'partial_rotary_factor' other than 1");
  ExpectLlamaError([](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}, {"extrapolation_factor", 2}}; },
                   SC::kInvalidArgument, "'rope_scaling.extrapolation_factor'");
  // head_dim preconditions of RoPE (src/backend/rope.cpp CHECKs them): refused at parse, not
  // an abort when the model is built (head_dim 2 with dynamic scaling hit a CHECK).
  ExpectLlamaError([](json& j) { j["head_dim"] = 15; }, SC::kInvalidArgument,
                   "'head_dim' gives an odd head_dim (15)");
  ExpectLlamaError(
      [](json& j) {
        j["head_dim"] = 2;
        j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
      },
      SC::kInvalidArgument, "dynamic RoPE scaling needs head_dim > 2, got 2");
  ExpectLlamaError(
      [](json& j) {
        j["head_dim"] = 2;
        j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e4}};
      },
      SC::kInvalidArgument, "dynamic RoPE scaling needs head_dim > 2");
  for (const char* type : {"linear", "yarn"}) {  // no such limit: head_dim 2 is fine
    json j = json::parse(kLlama31_8B);
    j["head_dim"] = 2;
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    CHECK(ParseModelConfig(j.dump(), "config.json").ok());
  }
  ExpectLlamaError([](json& j) { j["hidden_act"] = "gelu"; }, SC::kUnimplemented, "'hidden_act'");
  ExpectLlamaError([](json& j) { j["mlp_bias"] = true; }, SC::kUnimplemented, "'mlp_bias'");

  auto not_json = ParseModelConfig("{\"architectures\": [", "x/config.json");
  REQUIRE_FALSE(not_json.ok());
  CHECK(not_json.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(not_json.status().message(), Contains("x/config.json"));
  CHECK(ParseModelConfig("[]", "config.json").status().code() == StatusCode::kInvalidArgument);
  CHECK(SupportedArchitectures() ==
        "Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM, LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM");
}

TEST_CASE("model config: LoadModelConfig from a directory or a file", "[loader][config]") {
  const auto dir = MakeTempDir("config");
  WriteBinaryFile(dir / "config.json", kQwen3_8B);
  auto from_dir = LoadModelConfig(dir);
  REQUIRE(from_dir.ok());
  CHECK(from_dir->num_hidden_layers == 36);
  auto from_file = LoadModelConfig(dir / "config.json");
  REQUIRE(from_file.ok());
  CHECK(from_file->vocab_size == 151936);
  auto missing = LoadModelConfig(dir / "absent");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("absent"));
}

// Only a regular file of at most 16 MiB is read: /dev/zero (endless: bad_alloc), a FIFO
// (blocked forever) and a directory are errors naming what they are.
TEST_CASE("model config: config.json that is no regular file", "[loader][config]") {
  namespace fs = std::filesystem;
  const auto dir = MakeTempDir("config-special");
  fs::create_directories(dir / "as_dir" / "config.json");
  auto as_dir = LoadModelConfig(dir / "as_dir");
  REQUIRE_FALSE(as_dir.ok());
  CHECK(as_dir.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(as_dir.status().message(), Contains("config.json: model config is a directory"));

  fs::create_directories(dir / "zero");
  fs::create_symlink("/dev/zero", dir / "zero" / "config.json");
  auto zero = LoadModelConfig(dir / "zero");
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(zero.status().message(), Contains("is not a regular file"));

  fs::create_directories(dir / "fifo");
  REQUIRE(mkfifo((dir / "fifo" / "config.json").c_str(), 0600) == 0);
  auto fifo = LoadModelConfig(dir / "fifo");  // returns: no reader waits for a writer
  REQUIRE_FALSE(fifo.ok());
  CHECK_THAT(fifo.status().message(), Contains("is not a regular file"));

  fs::create_directories(dir / "big");
  {
    std::ofstream big(dir / "big" / "config.json", std::ios::binary);
    big << "{\"architectures\": [\"LlamaForCausalLM\"], \"pad\": \"";
    big << std::string((size_t{16} << 20) + 1, 'x') << "\"}";
  }
  auto too_big = LoadModelConfig(dir / "big");
  REQUIRE_FALSE(too_big.ok());
  CHECK_THAT(too_big.status().message(), Contains("more than the 16 MiB"));

  // A symlink to a regular file is read as the file.
  fs::create_directories(dir / "link");
  WriteBinaryFile(dir / "real.json", kQwen3_8B);
  fs::create_symlink(dir / "real.json", dir / "link" / "config.json");
  auto linked = LoadModelConfig(dir / "link");
  INFO(linked.status().ToString());
  CHECK(linked.ok());
}

TEST_CASE("model config: the committed transformers-5 fixtures", "[loader][config]") {
  auto qwen = LoadModelConfig(FixturePath("models/qwen3-tiny"));
  REQUIRE(qwen.ok());
  CHECK(qwen->head_dim == 32);  // explicit, != 64 / 4
  CHECK(qwen->hidden_size == 64);
  CHECK(qwen->tie_word_embeddings);
  CHECK(qwen->qk_norm);
  CHECK(qwen->rope_theta == 1e6);  // from rope_parameters
  CHECK(qwen->rope_scaling.type == RopeScalingType::kNone);

  auto llama = LoadModelConfig(FixturePath("models/llama-tiny-rope-scaling"));
  REQUIRE(llama.ok());
  CHECK(llama->rope_theta == 500000.0);
  CHECK(llama->rope_scaling.type == RopeScalingType::kLlama3);
  CHECK(llama->rope_scaling.original_max_position_embeddings == 64);
  CHECK(llama->eos_token_ids == std::vector<int64_t>{2, 3});
  CHECK(llama->num_key_value_heads == 2);

  auto tied = LoadModelConfig(FixturePath("models/llama-tiny-tied"));
  REQUIRE(tied.ok());
  CHECK(tied->tie_word_embeddings);
  CHECK(tied->head_dim == 24);
  CHECK(tied->num_key_value_heads == tied->num_attention_heads);

  auto untied = LoadModelConfig(FixturePath("models/qwen3-tiny-untied"));
  REQUIRE(untied.ok());
  CHECK(untied->num_key_value_heads == 1);
  CHECK_FALSE(untied->tie_word_embeddings);
}

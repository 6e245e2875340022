// config.json's quantization_config: block-scaled FP8 accepted, everything else refused by name.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "oasis/model_config.h"

using namespace oasis;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

// Qwen/Qwen3-8B-FP8's config.json, cut to the fields that matter here.
json Qwen3Fp8() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
    "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rope_theta": 1000000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]}
  })");
}

StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), "config.json"); }

// Parses `j` and expects InvalidArgument whose message holds every one of `parts`.
void ExpectRefused(const json& j, std::initializer_list<std::string> parts) {
  auto c = Parse(j);
  REQUIRE_FALSE(c.ok());
  INFO(c.status().ToString());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  for (const std::string& p : parts) CHECK_THAT(c.status().message(), Contains(p));
}

}  // namespace

TEST_CASE("quantization_config: Qwen3-8B-FP8's block-scaled fp8 is read", "[loader][fp8]") {
  auto c = Parse(Qwen3Fp8());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->quantization.fp8());
  CHECK(c->quantization.method == WeightQuantization::kFp8Block);
  CHECK(c->quantization.block_out == 128);
  CHECK(c->quantization.block_in == 128);
  CHECK(c->quantization.modules_to_not_convert.empty());
  CHECK(c->dtype == DType::kBF16);  // activations stay bf16
}

TEST_CASE("quantization_config: absent or null means unquantized", "[loader][fp8]") {
  json j = Qwen3Fp8();
  j.erase("quantization_config");
  auto c = Parse(j);
  REQUIRE(c.ok());
  CHECK_FALSE(c->quantization.fp8());
  j["quantization_config"] = nullptr;
  c = Parse(j);
  REQUIRE(c.ok());
  CHECK(c->quantization.method == WeightQuantization::kNone);
}

TEST_CASE("quantization_config: optional fields, any block size, modules_to_not_convert",
          "[loader][fp8]") {
  json j = Qwen3Fp8();
  auto& q = j["quantization_config"];
  q.erase("fmt");
  q.erase("activation_scheme");
  q["weight_block_size"] = {64, 32};
  q["modules_to_not_convert"] = {"lm_head", "model.layers.0.mlp.gate"};
  q["dequantize"] = false;  // other FineGrainedFP8Config keys are ignored
  auto c = Parse(j);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->quantization.fp8());
  CHECK(c->quantization.block_out == 64);
  CHECK(c->quantization.block_in == 32);
  CHECK(c->quantization.modules_to_not_convert ==
        std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate"});
  q["modules_to_not_convert"] = nullptr;
  q["fmt"] = nullptr;
  REQUIRE(Parse(j).ok());
}

TEST_CASE("quantization_config: other quant_methods are refused by name", "[loader][fp8]") {
  for (const char* method : {"awq", "gptq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8",
                             "torchao", "modelopt", "FP8"}) {
    json j = Qwen3Fp8();
    j["quantization_config"] = {{"quant_method", method}, {"bits", 4}};
    ExpectRefused(
        j, {"quantization_config.quant_method '" + std::string(method) + "' is not supported",
            "OasisKV loads bf16/f16/f32 and fp8 block-scaled checkpoints"});
  }
  json j = Qwen3Fp8();
  j["quantization_config"].erase("quant_method");
  ExpectRefused(j, {"quantization_config.quant_method", "missing"});
  j["quantization_config"]["quant_method"] = 8;
  ExpectRefused(j, {"quantization_config.quant_method", "must be a string"});
  j["quantization_config"] = "fp8";
  ExpectRefused(j, {"'quantization_config' must be an object"});
}

TEST_CASE("quantization_config: e5m2, static activations and bad fields are refused",
          "[loader][fp8]") {
  json j = Qwen3Fp8();
  j["quantization_config"]["fmt"] = "e5m2";
  ExpectRefused(j, {"quantization_config.fmt", "'e5m2' is not supported"});
  j = Qwen3Fp8();
  j["quantization_config"]["activation_scheme"] = "static";
  ExpectRefused(j, {"quantization_config.activation_scheme", "'static' is not supported"});
  j = Qwen3Fp8();
  j["quantization_config"].erase("weight_block_size");
  ExpectRefused(j, {"quantization_config.weight_block_size", "required", "per-tensor"});
  for (const json& bad : {json::array({128}), json::array({128, 128, 128}), json::array({0, 128}),
                          json::array({128, -1}), json::array({128.5, 128}),
                          json::array({"128", 128}), json(128), json::array()}) {
    j = Qwen3Fp8();
    j["quantization_config"]["weight_block_size"] = bad;
    INFO(bad.dump());
    ExpectRefused(j, {"quantization_config.weight_block_size", "two positive integers"});
  }
  j = Qwen3Fp8();
  j["quantization_config"]["modules_to_not_convert"] = "lm_head";
  ExpectRefused(j, {"quantization_config.modules_to_not_convert", "list of module names"});
  j["quantization_config"]["modules_to_not_convert"] = {"lm_head", 3};
  ExpectRefused(j, {"quantization_config.modules_to_not_convert"});
}

// ModelConfig: the subset of a Hugging Face `config.json` the engine needs, for the
// supported architectures. Plain value type; thread-compatible.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "oasis/dtype.h"
#include "oasis/status.h"

namespace oasis {

enum class Architecture {
  kQwen3,        // "Qwen3ForCausalLM"
  kLlama,        // "LlamaForCausalLM"
  kEagle3Llama,  // "LlamaForCausalLMEagle3" (EAGLE-3 draft head)
  kQwen3Moe,     // "Qwen3MoeForCausalLM" (Qwen3 attention, mixture-of-experts MLPs)
};

// `rope_type` of config.json's "rope_scaling" (or transformers-5 "rope_parameters"); the
// formulas are in src/backend/rope.h, the accepted fields in docs/loader.md.
enum class RopeScalingType { kNone, kLlama3, kLinear, kDynamic, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;            // llama3, linear, dynamic, yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3 and yarn: the pretraining context (yarn: config.json's max_position_embeddings when
  // absent); dynamic: config.json's max_position_embeddings, the length its NTK base is
  // computed against (kept here because ModelConfig::max_position_embeddings is the scaled one).
  int64_t original_max_position_embeddings = 8192;
  // yarn only (transformers' defaults). attention_factor 0 = unset: derived from factor, mscale
  // and mscale_all_dim (0 = unset) as transformers' _compute_yarn_parameters does.
  double attention_factor = 0.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
};

// "default", "llama3", "linear", "dynamic" or "yarn".
const char* RopeTypeName(RopeScalingType type);

// config.json's "quantization_config" (docs/loader.md#fp8-checkpoints). Only block-scaled FP8
// weights are read: quant_method "fp8", fmt e4m3, dynamic activations — the layout of
// Qwen3-8B-FP8 and DeepSeek-V3 (transformers' FineGrainedFP8). Every other method is refused
// when the config is parsed.
enum class WeightQuantization {
  kNone,      // no quantization_config: weights are bf16 / f16 / f32
  kFp8Block,  // a quantized `X.weight` is F8_E4M3 [out, in] with `X.weight_scale_inv` F32/BF16
              // [ceil(out / block_out), ceil(in / block_in)]; real = weight * scale_inv
};

struct QuantizationConfig {
  WeightQuantization method = WeightQuantization::kNone;
  int64_t block_out = 0;  // weight_block_size[0]: rows of one scale block
  int64_t block_in = 0;   // weight_block_size[1]: columns of one scale block
  // As written in config.json. Informational: the loader decides per tensor by its stored
  // dtype (an F8_E4M3 weight is kept in e4m3 or dequantized, anything else is read as it is).
  std::vector<std::string> modules_to_not_convert;

  bool fp8() const { return method == WeightQuantization::kFp8Block; }
};

struct ModelConfig {
  Architecture architecture = Architecture::kQwen3;
  std::string architecture_name;  // as written in config.json, e.g. "Qwen3ForCausalLM"
  std::string model_type;         // "qwen3", "llama"

  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads when absent
  int64_t head_dim = 0;             // explicit `head_dim`, else hidden_size / num_attention_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  // The context length: config.json's max_position_embeddings, scaled as vLLM derives its
  // max_model_len for RoPE scaling: × factor for linear and dynamic, original_max_position_
  // embeddings × factor for yarn (llama3: unscaled). The server may lower it (--max-model-len).
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool qk_norm = false;  // per-head RMSNorm on q and k before RoPE (Qwen3)
  std::string hidden_act = "silu";
  DType dtype = DType::kBF16;  // `torch_dtype` / `dtype`
  // FP8 checkpoints: linear weights kept in e4m3 where the backend computes with them, else
  // dequantized when loaded (the activation dtype is still `dtype`; docs/fp8.md).
  QuantizationConfig quantization;

  std::vector<int64_t> bos_token_ids;
  std::vector<int64_t> eos_token_ids;

  // Qwen3-MoE only (docs/loader.md). num_experts 0: every layer keeps the dense MLP.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;    // k of the router's top-k, in [1, num_experts]
  int64_t moe_intermediate_size = 0;  // each expert's intermediate size
  // Renormalise the k routing weights to sum to 1 (else they stay softmax probabilities).
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;       // every step-th layer is MoE (see IsMoeLayer)
  std::vector<int64_t> mlp_only_layers;  // layers that keep the dense MLP (intermediate_size)

  // EAGLE-3 draft heads only.
  int64_t draft_vocab_size = 0;
  int64_t target_hidden_size = 0;
  // Target layers whose *input* residual stream the draft head consumes (see docs).
  std::vector<int64_t> aux_hidden_state_layer_ids;
  // The head layer's residual: hidden_norm(g) when true (the `speculators` layout's default),
  // else the fused features g themselves (the original EAGLE-3 layout's).
  bool norm_before_residual = false;
  // Weight names of the head's one layer: "midlayer." (original layout) or "layers.0."
  // (`speculators`), as found in the checkpoint.
  std::string head_layer_prefix = "midlayer.";

  // Not from config.json: the server's `--kv-cache-dtype fp8` (docs/fp8.md). The KV pools, the
  // host KV store and the prefix cache's host tier hold e4m3 with per-KV-head scales
  // (LayerKvPool); activations and summaries keep the activation dtype.
  bool kv_cache_fp8 = false;

  int64_t q_size() const { return num_attention_heads * head_dim; }
  // transformers' rule (Qwen3MoeDecoderLayer): layer l has a sparse MoE block iff l is not in
  // mlp_only_layers, num_experts > 0 and (l + 1) % decoder_sparse_step == 0.
  // (Inline: the backend's shape checks use them without the loader.)
  bool IsMoeLayer(int64_t layer) const {
    if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
    for (int64_t l : mlp_only_layers) {
      if (l == layer) return false;
    }
    return (layer + 1) % decoder_sparse_step == 0;
  }
  // Whether any layer is MoE.
  bool HasMoeLayers() const {
    for (int64_t l = 0; l < num_hidden_layers; ++l) {
      if (IsMoeLayer(l)) return true;
    }
    return false;
  }
  // Whether any layer keeps the dense MLP of intermediate_size.
  bool HasDenseMlpLayers() const {
    for (int64_t l = 0; l < num_hidden_layers; ++l) {
      if (!IsMoeLayer(l)) return true;
    }
    return false;
  }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
};

// Names accepted in `architectures`, for error messages: "Qwen3ForCausalLM, ...".
std::string SupportedArchitectures();

// Parses config.json text. `source` names the file in error messages.
StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
// Reads `<dir>/config.json` (or the file itself when a file is given).
StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& dir_or_file);

}  // namespace oasis

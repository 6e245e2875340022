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
};

enum class RopeScalingType { kNone, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
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
  int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool qk_norm = false;  // per-head RMSNorm on q and k before RoPE (Qwen3)
  std::string hidden_act = "silu";
  DType dtype = DType::kBF16;  // `torch_dtype` / `dtype`

  std::vector<int64_t> bos_token_ids;
  std::vector<int64_t> eos_token_ids;

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

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
};

// Names accepted in `architectures`, for error messages: "Qwen3ForCausalLM, ...".
std::string SupportedArchitectures();

// Parses config.json text. `source` names the file in error messages.
StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
// Reads `<dir>/config.json` (or the file itself when a file is given).
StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& dir_or_file);

}  // namespace oasis

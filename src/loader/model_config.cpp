// HF config.json -> ModelConfig for Qwen3ForCausalLM, Qwen3MoeForCausalLM, LlamaForCausalLM
// and LlamaForCausalLMEagle3. Field rules are documented in docs/loader.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_depth.h"
#include "loader/quantization_config.h"
#include "loader/small_file.h"
#include "oasis/model_config.h"

namespace oasis {
namespace {

// Bounds on config.json's sizes, far above any real model's: past them an integer field is
// a broken file, and sizes computed from it (per-layer tables, KV pools) would overflow or
// run for minutes before the weights were ever checked.
constexpr int64_t kMaxLayers = 1 << 16;
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxWidth = 1 << 24;
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;  // token ids and positions are int32

using json = nlohmann::json;

struct ArchitectureName {
  const char* name;
  Architecture architecture;
};
constexpr ArchitectureName kArchitectures[] = {
    {"Qwen3ForCausalLM", Architecture::kQwen3},
    {"Qwen3MoeForCausalLM", Architecture::kQwen3Moe},
    {"LlamaForCausalLM", Architecture::kLlama},
    {"LlamaForCausalLMEagle3", Architecture::kEagle3Llama},
    {"Eagle3LlamaForCausalLM", Architecture::kEagle3Llama},  // vLLM's name for the same head
};

enum class Presence { kRequired, kOptional };

// Reads typed fields of one JSON object; errors name the field (with `prefix`, e.g.
// "rope_scaling.") and the file. A JSON null counts as absent. Not thread-shared.
class FieldReader {
 public:
  FieldReader(const json& obj, const std::string& source, std::string prefix = "")
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  const std::string& source() const { return source_; }

  Status Bad(const char* key, const std::string& what) const {
    return InvalidArgument(source_ + ": field '" + prefix_ + key + "' " + what);
  }

  // Integer >= min_value. Leaves *out unchanged when optional and absent.
  Status Int(const char* key, Presence presence, int64_t min_value, int64_t* out,
             int64_t max_value = INT64_MAX) const {
    const json* v = Find(key);
    if (v == nullptr) return Missing(key, presence);
    if (!v->is_number_integer()) return Bad(key, "must be an integer, got " + v->dump());
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(key, "is too large: " + v->dump());
    }
    const int64_t value = v->get<int64_t>();
    if (value < min_value) {
      return Bad(key,
                 "must be " +
                     std::string(min_value == 1 ? "positive" : ">= " + std::to_string(min_value)) +
                     ", got " + std::to_string(value));
    }
    if (value > max_value) {
      return Bad(key,
                 "must be at most " + std::to_string(max_value) + ", got " + std::to_string(value));
    }
    *out = value;
    return Status::Ok();
  }

  // A finite number > 0.
  Status PositiveNumber(const char* key, Presence presence, double* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Missing(key, presence);
    if (!v->is_number()) return Bad(key, "must be a number, got " + v->dump());
    const double value = v->get<double>();
    if (!(value > 0) || !std::isfinite(value))
      return Bad(key, "must be positive, got " + v->dump());
    *out = value;
    return Status::Ok();
  }

  Status Bool(const char* key, bool* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Bad(key, "must be true or false, got " + v->dump());
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status String(const char* key, Presence presence, std::string* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Missing(key, presence);
    if (!v->is_string()) return Bad(key, "must be a string, got " + v->dump());
    *out = v->get<std::string>();
    return Status::Ok();
  }

  // An integer or a list of integers (>= 0); absent leaves *out empty.
  Status IntList(const char* key, std::vector<int64_t>* out) const {
    out->clear();
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    auto take = [&](const json& x) -> Status {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return Bad(key, "must hold non-negative integers, got " + x.dump());
      }
      out->push_back(x.get<int64_t>());
      return Status::Ok();
    };
    if (!v->is_array()) return take(*v);
    for (const json& x : *v) OASIS_RETURN_IF_ERROR(take(x));
    return Status::Ok();
  }

 private:
  Status Missing(const char* key, Presence presence) const {
    if (presence == Presence::kOptional) return Status::Ok();
    return InvalidArgument(source_ + ": required field '" + prefix_ + key + "' is missing");
  }

  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

Status ParseArchitecture(const json& root, const std::string& source, ModelConfig* config) {
  auto it = root.find("architectures");
  if (it == root.end() || !it->is_array() || it->empty()) {
    return InvalidArgument(source + ": field 'architectures' must be a non-empty list of names");
  }
  std::string names;
  for (const json& name : *it) {
    if (!name.is_string())
      return InvalidArgument(source + ": field 'architectures' holds a non-string");
    const auto& text = name.get_ref<const std::string&>();
    for (const auto& a : kArchitectures) {
      if (text == a.name) {
        config->architecture = a.architecture;
        config->architecture_name = text;
        return Status::Ok();
      }
    }
    names += (names.empty() ? "" : ", ") + text;
  }
  return Unimplemented(source + ": unsupported architecture " + names +
                       " (supported: " + SupportedArchitectures() + ")");
}

Status ParseDType(const FieldReader& fields, ModelConfig* config) {
  const char* key = fields.Find("dtype") != nullptr ? "dtype" : "torch_dtype";
  std::string name;
  OASIS_RETURN_IF_ERROR(fields.String(key, Presence::kOptional, &name));
  if (name.empty()) return Status::Ok();  // absent: keep the bf16 default
  if (name == "bfloat16") {
    config->dtype = DType::kBF16;
  } else if (name == "float16" || name == "half") {
    config->dtype = DType::kF16;
  } else if (name == "float32" || name == "float") {
    config->dtype = DType::kF32;
  } else {
    return fields.Bad(key, "names unsupported dtype \"" + name + "\"");
  }
  return Status::Ok();
}

// The fields of one rope_type beyond rope_type/rope_theta, read from `fields`; `max_positions`
// is config.json's max_position_embeddings, `head_dim` the head width RoPE rotates.
Status ParseRopeScalingFields(const FieldReader& fields, int64_t max_positions, int64_t head_dim,
                              RopeScaling* rs) {
  OASIS_RETURN_IF_ERROR(fields.PositiveNumber("factor", Presence::kRequired, &rs->factor));
  switch (rs->type) {
    case RopeScalingType::kLlama3:
      OASIS_RETURN_IF_ERROR(
          fields.PositiveNumber("low_freq_factor", Presence::kRequired, &rs->low_freq_factor));
      OASIS_RETURN_IF_ERROR(
          fields.PositiveNumber("high_freq_factor", Presence::kRequired, &rs->high_freq_factor));
      OASIS_RETURN_IF_ERROR(fields.Int("original_max_position_embeddings", Presence::kRequired, 1,
                                       &rs->original_max_position_embeddings));
      if (rs->high_freq_factor <= rs->low_freq_factor)
        return fields.Bad("high_freq_factor", "must be greater than low_freq_factor");
      return Status::Ok();
    case RopeScalingType::kLinear:
      return Status::Ok();
    case RopeScalingType::kDynamic:
      if (fields.Find("alpha") != nullptr)
        return fields.Bad("alpha", "(dynamic NTK-alpha scaling) is not supported");
      // The NTK base is theta * (...)^(head_dim / (head_dim - 2)) (src/backend/rope.cpp).
      if (head_dim <= 2) {
        return InvalidArgument(fields.source() + ": dynamic RoPE scaling needs head_dim > 2, got " +
                               std::to_string(head_dim));
      }
      rs->original_max_position_embeddings = max_positions;
      return Status::Ok();
    case RopeScalingType::kYarn:
      break;
    case RopeScalingType::kNone:
      return Status::Ok();
  }
  rs->original_max_position_embeddings = max_positions;  // transformers' default
  OASIS_RETURN_IF_ERROR(fields.Int("original_max_position_embeddings", Presence::kOptional, 1,
                                   &rs->original_max_position_embeddings));
  OASIS_RETURN_IF_ERROR(
      fields.PositiveNumber("attention_factor", Presence::kOptional, &rs->attention_factor));
  // transformers reads `mscale and mscale_all_dim` and `beta_fast or 32`: 0 counts as unset.
  for (auto [key, out] :
       {std::pair{"mscale", &rs->mscale}, std::pair{"mscale_all_dim", &rs->mscale_all_dim},
        std::pair{"beta_fast", &rs->beta_fast}, std::pair{"beta_slow", &rs->beta_slow}}) {
    const json* v = fields.Find(key);
    if (v == nullptr) continue;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0)
      return fields.Bad(key, "must be a number >= 0, got " + v->dump());
    if (v->get<double>() != 0) *out = v->get<double>();
  }
  if (rs->beta_fast < rs->beta_slow) return fields.Bad("beta_fast", "must not be below beta_slow");
  const json* extrapolation = fields.Find("extrapolation_factor");  // vLLM's own key
  if (extrapolation != nullptr &&
      (!extrapolation->is_number() || extrapolation->get<double>() != 1))
    return fields.Bad("extrapolation_factor", "other than 1 is not supported");
  return fields.Bool("truncate", &rs->truncate);
}

// rope_theta and rope_scaling, from transformers-5 "rope_parameters" when present, else
// from the top-level "rope_theta" / "rope_scaling". Scales config->max_position_embeddings as
// vLLM derives max_model_len (see ModelConfig).
Status ParseRope(const json& root, const std::string& source, ModelConfig* config) {
  FieldReader top(root, source);
  const json* params = top.Find("rope_parameters");
  if (params != nullptr && !params->is_object())
    return top.Bad("rope_parameters", "must be an object");
  if (params != nullptr && params->contains("rope_theta")) {
    OASIS_RETURN_IF_ERROR(
        FieldReader(*params, source, "rope_parameters.")
            .PositiveNumber("rope_theta", Presence::kRequired, &config->rope_theta));
  } else {
    OASIS_RETURN_IF_ERROR(
        top.PositiveNumber("rope_theta", Presence::kOptional, &config->rope_theta));
  }

  const char* scaling_key = params != nullptr ? "rope_parameters" : "rope_scaling";
  const json* scaling = params != nullptr ? params : top.Find("rope_scaling");
  config->rope_scaling = RopeScaling{};
  // Llama and Qwen3 rotate the whole head: a partial rotary factor would be silently wrong.
  double partial = 1.0;
  OASIS_RETURN_IF_ERROR(top.PositiveNumber("partial_rotary_factor", Presence::kOptional, &partial));
  if (params != nullptr) {
    OASIS_RETURN_IF_ERROR(
        FieldReader(*params, source, "rope_parameters.")
            .PositiveNumber("partial_rotary_factor", Presence::kOptional, &partial));
  }
  if (partial != 1.0) return top.Bad("partial_rotary_factor", "other than 1 is not supported");
  if (scaling == nullptr) return Status::Ok();
  if (!scaling->is_object()) return top.Bad(scaling_key, "must be an object or null");
  FieldReader fields(*scaling, source, std::string(scaling_key) + ".");
  std::string type;
  const char* type_key = fields.Find("rope_type") != nullptr ? "rope_type" : "type";
  OASIS_RETURN_IF_ERROR(fields.String(type_key, Presence::kOptional, &type));
  if (type.empty() || type == "default") return Status::Ok();
  RopeScaling& rs = config->rope_scaling;
  constexpr RopeScalingType kTypes[] = {RopeScalingType::kLlama3, RopeScalingType::kLinear,
                                        RopeScalingType::kDynamic, RopeScalingType::kYarn};
  for (RopeScalingType t : kTypes) {
    if (type == RopeTypeName(t)) rs.type = t;
  }
  if (rs.type == RopeScalingType::kNone) {
    return Unimplemented(source + ": " + scaling_key + " type \"" + type +
                         "\" is not supported (supported: default, llama3, linear, dynamic, yarn)");
  }
  OASIS_RETURN_IF_ERROR(
      ParseRopeScalingFields(fields, config->max_position_embeddings, config->head_dim, &rs));
  // vLLM's derived max_model_len (_get_and_verify_max_len): llama3 keeps the configured length.
  double scaled = static_cast<double>(config->max_position_embeddings);
  if (rs.type == RopeScalingType::kLinear || rs.type == RopeScalingType::kDynamic)
    scaled *= rs.factor;
  if (rs.type == RopeScalingType::kYarn)
    scaled = static_cast<double>(rs.original_max_position_embeddings) * rs.factor;
  if (!(scaled >= 1 && scaled <= static_cast<double>(kMaxTokens)))
    return fields.Bad("factor",
                      "gives a context length out of range (" + std::to_string(scaled) + ")");
  config->max_position_embeddings = static_cast<int64_t>(scaled);
  return Status::Ok();
}

Status ParseEagle3(const json& root, const std::string& source, ModelConfig* config) {
  FieldReader fields(root, source);
  config->draft_vocab_size = config->vocab_size;
  config->target_hidden_size = config->hidden_size;
  OASIS_RETURN_IF_ERROR(
      fields.Int("draft_vocab_size", Presence::kOptional, 1, &config->draft_vocab_size));
  OASIS_RETURN_IF_ERROR(
      fields.Int("target_hidden_size", Presence::kOptional, 1, &config->target_hidden_size));
  OASIS_RETURN_IF_ERROR(fields.Bool("norm_before_residual", &config->norm_before_residual));
  OASIS_RETURN_IF_ERROR(
      fields.IntList("eagle_aux_hidden_state_layer_ids", &config->aux_hidden_state_layer_ids));
  const json* eagle = fields.Find("eagle_config");
  if (eagle == nullptr) return Status::Ok();
  if (!eagle->is_object()) return fields.Bad("eagle_config", "must be an object");
  return FieldReader(*eagle, source, "eagle_config.")
      .IntList("eagle_aux_hidden_state_layer_ids", &config->aux_hidden_state_layer_ids);
}

// Qwen3-MoE's expert fields. num_experts, num_experts_per_tok and moe_intermediate_size are
// required (they fix the checkpoint's shapes; transformers' defaults describe a 30B model);
// norm_topk_prob, decoder_sparse_step and mlp_only_layers default as in Qwen3MoeConfig.
// transformers 5 saves num_experts under its attribute_map name, num_local_experts (the Hub's
// Qwen3-MoE releases say num_experts); either is read, and both must agree.
Status ParseMoe(const FieldReader& f, ModelConfig* c) {
  if (f.Find("num_experts") == nullptr && f.Find("num_local_experts") != nullptr) {
    OASIS_RETURN_IF_ERROR(
        f.Int("num_local_experts", Presence::kRequired, 0, &c->num_experts, kMaxHeads));
  } else {
    OASIS_RETURN_IF_ERROR(f.Int("num_experts", Presence::kRequired, 0, &c->num_experts, kMaxHeads));
    int64_t local = c->num_experts;
    OASIS_RETURN_IF_ERROR(f.Int("num_local_experts", Presence::kOptional, 0, &local, kMaxHeads));
    if (local != c->num_experts) {
      return f.Bad("num_local_experts", "(" + std::to_string(local) +
                                            ") disagrees with num_experts (" +
                                            std::to_string(c->num_experts) + ")");
    }
  }
  OASIS_RETURN_IF_ERROR(
      f.Int("num_experts_per_tok", Presence::kRequired, 1, &c->num_experts_per_tok));
  OASIS_RETURN_IF_ERROR(
      f.Int("moe_intermediate_size", Presence::kRequired, 1, &c->moe_intermediate_size, kMaxWidth));
  OASIS_RETURN_IF_ERROR(f.Bool("norm_topk_prob", &c->norm_topk_prob));
  OASIS_RETURN_IF_ERROR(
      f.Int("decoder_sparse_step", Presence::kOptional, 1, &c->decoder_sparse_step));
  OASIS_RETURN_IF_ERROR(f.IntList("mlp_only_layers", &c->mlp_only_layers));
  if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts) {
    return f.Bad("num_experts_per_tok", "(" + std::to_string(c->num_experts_per_tok) +
                                            ") must not exceed num_experts (" +
                                            std::to_string(c->num_experts) + ")");
  }
  for (int64_t layer : c->mlp_only_layers) {
    if (layer >= c->num_hidden_layers) {
      return f.Bad("mlp_only_layers", "names layer " + std::to_string(layer) +
                                          ", outside [0, num_hidden_layers = " +
                                          std::to_string(c->num_hidden_layers) + ")");
    }
  }
  std::sort(c->mlp_only_layers.begin(), c->mlp_only_layers.end());
  c->mlp_only_layers.erase(std::unique(c->mlp_only_layers.begin(), c->mlp_only_layers.end()),
                           c->mlp_only_layers.end());
  // Qwen2-MoE's shared expert has no place in Qwen3-MoE: refuse rather than drop it.
  int64_t shared = 0;
  OASIS_RETURN_IF_ERROR(f.Int("shared_expert_intermediate_size", Presence::kOptional, 0, &shared));
  if (shared > 0) return f.Bad("shared_expert_intermediate_size", "> 0 is not supported");
  return Status::Ok();
}

StatusOr<ModelConfig> Parse(const json& root, const std::string& source) {
  if (!root.is_object()) return InvalidArgument(source + ": not a JSON object");
  ModelConfig c;
  OASIS_RETURN_IF_ERROR(ParseArchitecture(root, source, &c));
  FieldReader f(root, source);
  OASIS_RETURN_IF_ERROR(f.String("model_type", Presence::kOptional, &c.model_type));
  OASIS_RETURN_IF_ERROR(f.Int("hidden_size", Presence::kRequired, 1, &c.hidden_size, kMaxWidth));
  OASIS_RETURN_IF_ERROR(
      f.Int("num_hidden_layers", Presence::kRequired, 1, &c.num_hidden_layers, kMaxLayers));
  OASIS_RETURN_IF_ERROR(
      f.Int("num_attention_heads", Presence::kRequired, 1, &c.num_attention_heads, kMaxHeads));
  c.num_key_value_heads = c.num_attention_heads;
  OASIS_RETURN_IF_ERROR(
      f.Int("num_key_value_heads", Presence::kOptional, 1, &c.num_key_value_heads, kMaxHeads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return f.Bad("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                            ") must divide num_attention_heads (" +
                                            std::to_string(c.num_attention_heads) + ")");
  }
  if (f.Find("head_dim") != nullptr) {
    OASIS_RETURN_IF_ERROR(f.Int("head_dim", Presence::kRequired, 1, &c.head_dim, kMaxWidth));
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    return f.Bad("num_attention_heads",
                 "(" + std::to_string(c.num_attention_heads) + ") must divide hidden_size (" +
                     std::to_string(c.hidden_size) + ") when head_dim is absent");
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // RoPE rotates pairs of a head's dimensions (every rope type; src/backend/rope.cpp).
  if (c.head_dim % 2 != 0) {
    return f.Bad(
        f.Find("head_dim") != nullptr ? "head_dim" : "hidden_size",
        "gives an odd head_dim (" + std::to_string(c.head_dim) + "): RoPE needs an even head_dim");
  }
  OASIS_RETURN_IF_ERROR(
      f.Int("intermediate_size", Presence::kRequired, 1, &c.intermediate_size, kMaxWidth));
  OASIS_RETURN_IF_ERROR(f.Int("vocab_size", Presence::kRequired, 1, &c.vocab_size, kMaxTokens));
  OASIS_RETURN_IF_ERROR(f.Int("max_position_embeddings", Presence::kRequired, 1,
                              &c.max_position_embeddings, kMaxTokens));
  OASIS_RETURN_IF_ERROR(f.PositiveNumber("rms_norm_eps", Presence::kOptional, &c.rms_norm_eps));
  OASIS_RETURN_IF_ERROR(ParseRope(root, source, &c));
  OASIS_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  OASIS_RETURN_IF_ERROR(f.Bool("attention_bias", &c.attention_bias));
  bool mlp_bias = false;
  OASIS_RETURN_IF_ERROR(f.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) return Unimplemented(source + ": field 'mlp_bias' = true is not supported");
  bool sliding_window = false;
  OASIS_RETURN_IF_ERROR(f.Bool("use_sliding_window", &sliding_window));
  if (sliding_window) {
    return Unimplemented(source + ": field 'use_sliding_window' = true is not supported");
  }
  OASIS_RETURN_IF_ERROR(f.String("hidden_act", Presence::kOptional, &c.hidden_act));
  if (c.hidden_act != "silu") {
    return Unimplemented(source + ": field 'hidden_act' = \"" + c.hidden_act +
                         "\" is not supported (only silu)");
  }
  OASIS_RETURN_IF_ERROR(ParseDType(f, &c));
  OASIS_RETURN_IF_ERROR(ParseQuantizationConfig(root, source, &c.quantization));
  OASIS_RETURN_IF_ERROR(f.IntList("bos_token_id", &c.bos_token_ids));
  OASIS_RETURN_IF_ERROR(f.IntList("eos_token_id", &c.eos_token_ids));
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe;
  if (c.architecture == Architecture::kQwen3Moe) OASIS_RETURN_IF_ERROR(ParseMoe(f, &c));
  if (c.architecture == Architecture::kEagle3Llama)
    OASIS_RETURN_IF_ERROR(ParseEagle3(root, source, &c));
  return c;
}

// The `speculators` layout of an EAGLE-3 head (vLLM's published heads): the decoder layer's
// fields nest in "transformer_layer_config"; the EAGLE-3 fields and "speculators_config" sit
// at the top level. Flattened into the original layout's config and parsed as one.
StatusOr<ModelConfig> ParseSpeculators(const json& root, const std::string& source) {
  FieldReader top(root, source);
  std::string type;
  OASIS_RETURN_IF_ERROR(top.String("speculators_model_type", Presence::kRequired, &type));
  if (type != "eagle3") {
    return Unimplemented(source + ": speculators_model_type \"" + type +
                         "\" is not supported (only eagle3)");
  }
  const json* layer = top.Find("transformer_layer_config");
  if (layer == nullptr || !layer->is_object())
    return top.Bad("transformer_layer_config", "must be an object (the draft layer's config)");
  for (const char* unsupported : {"norm_before_fc", "fc_norm", "norm_output"}) {
    bool on = false;
    OASIS_RETURN_IF_ERROR(top.Bool(unsupported, &on));
    if (on) return Unimplemented(source + ": field '" + unsupported + "' = true is not supported");
  }
  json flat = *layer;
  std::string layer_type = "llama";
  if (auto it = flat.find("model_type"); it != flat.end() && !it->is_null()) {
    if (!it->is_string()) return top.Bad("transformer_layer_config.model_type", "must be a string");
    layer_type = it->get<std::string>();
  }
  if (layer_type != "llama") {
    return Unimplemented(source + ": transformer_layer_config.model_type \"" + layer_type +
                         "\" is not supported (only llama)");
  }
  flat["architectures"] = json::array({"LlamaForCausalLMEagle3"});
  if (!flat.contains("num_hidden_layers")) flat["num_hidden_layers"] = 1;
  for (const char* key : {"draft_vocab_size", "target_hidden_size",
                          "eagle_aux_hidden_state_layer_ids", "torch_dtype", "dtype"}) {
    if (root.contains(key) && !root[key].is_null()) flat[key] = root[key];
  }
  // Absent, the speculators layout normalises before the residual (vLLM's default for it).
  flat["norm_before_residual"] =
      root.contains("norm_before_residual") && !root["norm_before_residual"].is_null()
          ? root["norm_before_residual"]
          : json(true);
  OASIS_ASSIGN_OR_RETURN(ModelConfig c, Parse(flat, source + " (transformer_layer_config)"));
  if (c.num_hidden_layers != 1) {
    return Unimplemented(source + ": an EAGLE-3 head of " + std::to_string(c.num_hidden_layers) +
                         " layers is not supported (only 1)");
  }
  c.architecture_name = "Eagle3Speculator";
  return c;
}

}  // namespace

const char* RopeTypeName(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "default";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kDynamic:
      return "dynamic";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

std::string SupportedArchitectures() {
  std::string out;
  for (const auto& a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  if (JsonNestedDeeperThan(json_text))
    return InvalidArgument(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  try {
    if (root.is_object() &&
        (root.contains("speculators_model_type") || root.contains("speculators_config"))) {
      return ParseSpeculators(root, source);
    }
    return Parse(root, source);
  } catch (const json::exception& e) {  // defensive: typed accessors are checked above
    return InvalidArgument(source + ": " + e.what());
  }
}

StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& dir_or_file) {
  std::error_code ec;
  std::filesystem::path path = dir_or_file;
  if (std::filesystem::is_directory(path, ec)) path /= "config.json";
  OASIS_ASSIGN_OR_RETURN(const std::string text,
                         ReadSmallFile(path, "model config", kMaxConfigJsonBytes));
  return ParseModelConfig(text, path.string());
}

}  // namespace oasis

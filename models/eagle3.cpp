#include "models/eagle3.h"

#include <cmath>
#include <cstring>

#include "backend/rope.h"
#include "common/check.h"

namespace oasis {
namespace {

std::string Shape(const std::vector<int64_t>& s) { return ShapeToString(s); }

// The head's fit to the target, checked before any weight is read.
Status CheckConfig(const ModelConfig& c, const ModelConfig& target,
                   const std::vector<int64_t>& aux_ids) {
  const std::string who = "EAGLE-3 head (" + c.architecture_name + ")";
  if (c.architecture != Architecture::kEagle3Llama) {
    return InvalidArgument("draft model architecture is " + c.architecture_name +
                           ", expected LlamaForCausalLMEagle3");
  }
  if (c.num_hidden_layers != 1) {
    return Unimplemented(who + ": num_hidden_layers = " + std::to_string(c.num_hidden_layers) +
                         " (only one-layer heads are supported)");
  }
  if (c.attention_bias) return Unimplemented(who + ": attention_bias=true is not supported");
  if (c.hidden_act != "silu")
    return Unimplemented(who + ": hidden_act '" + c.hidden_act + "' (only silu)");
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return InvalidArgument(who + ": head_dim must be positive and even for RoPE, got " +
                           std::to_string(c.head_dim));
  }
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgument(who + ": num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
                           ") must divide num_attention_heads (" +
                           std::to_string(c.num_attention_heads) + ")");
  }
  if (c.target_hidden_size != target.hidden_size) {
    return InvalidArgument(who + ": target_hidden_size = " + std::to_string(c.target_hidden_size) +
                           " but the target model's hidden_size is " +
                           std::to_string(target.hidden_size));
  }
  if (c.draft_vocab_size <= 0) return InvalidArgument(who + ": draft_vocab_size must be positive");
  if (aux_ids.size() != 3) {
    return InvalidArgument(who +
                           ": eagle_aux_hidden_state_layer_ids must name 3 target layers, got " +
                           std::to_string(aux_ids.size()));
  }
  for (int64_t id : aux_ids) {
    if (id < 0 || id > target.num_hidden_layers) {
      return InvalidArgument(who + ": aux hidden state layer id " + std::to_string(id) +
                             " is outside [0, " + std::to_string(target.num_hidden_layers) +
                             "] for a target of " + std::to_string(target.num_hidden_layers) +
                             " layers (set eagle_config.eagle_aux_hidden_state_layer_ids)");
    }
  }
  return Status::Ok();
}

// Loads `name` as `dtype` and checks its shape; errors say what the shape must match.
StatusOr<Tensor> LoadChecked(const WeightSource& w, const std::string& name,
                             const std::vector<int64_t>& shape, DType dtype,
                             const std::string& why) {
  if (!w.Has(name))
    return NotFound("EAGLE-3 head: weight '" + name + "' missing from " + w.Describe());
  OASIS_ASSIGN_OR_RETURN(TensorInfo info, w.Info(name));
  if (info.shape != shape) {
    return InvalidArgument("EAGLE-3 head does not fit the target: weight '" + name +
                           "' has shape " + Shape(info.shape) + ", expected " + Shape(shape) +
                           " (" + why + "; " + w.Describe() + ")");
  }
  return w.Load(name, dtype);
}

constexpr const char* kMid = "midlayer.";
constexpr const char* kSpeculatorsLayer = "layers.0.";

}  // namespace

std::vector<int64_t> Eagle3Head::AuxLayerIds(const ModelConfig& config, int64_t target_layers) {
  if (!config.aux_hidden_state_layer_ids.empty()) return config.aux_hidden_state_layer_ids;
  return {2, target_layers / 2, target_layers - 3};
}

ModelConfig Eagle3Head::ConfigForTarget(const ModelConfig& t, int64_t draft_vocab) {
  ModelConfig c = t;
  c.architecture = Architecture::kEagle3Llama;
  c.architecture_name = "LlamaForCausalLMEagle3";
  c.model_type = "llama";
  c.num_hidden_layers = 1;
  c.qk_norm = false;
  c.tie_word_embeddings = false;
  c.draft_vocab_size = draft_vocab > 0 ? draft_vocab : t.vocab_size;
  c.target_hidden_size = t.hidden_size;
  c.aux_hidden_state_layer_ids.clear();
  // The head's one layer is a dense Llama layer, whatever the target's MLPs are.
  c.num_experts = 0;
  c.num_experts_per_tok = 0;
  c.moe_intermediate_size = 0;
  c.mlp_only_layers.clear();
  return c;
}

std::vector<WeightSpec> Eagle3Head::ExpectedWeights(const ModelConfig& c, bool with_embedding) {
  const int64_t h = c.hidden_size, th = c.target_hidden_size;
  const std::string m = kMid;
  std::vector<WeightSpec> s;
  if (with_embedding) s.push_back({"embed_tokens.weight", {c.vocab_size, h}});
  s.push_back({"fc.weight", {h, 3 * th}});
  s.push_back({m + "hidden_norm.weight", {h}, DType::kBF16, DummyInit::kOnes});
  s.push_back({m + "input_layernorm.weight", {h}, DType::kBF16, DummyInit::kOnes});
  s.push_back({m + "self_attn.q_proj.weight", {c.q_size(), 2 * h}});
  s.push_back({m + "self_attn.k_proj.weight", {c.kv_size(), 2 * h}});
  s.push_back({m + "self_attn.v_proj.weight", {c.kv_size(), 2 * h}});
  s.push_back({m + "self_attn.o_proj.weight", {h, c.q_size()}});
  s.push_back({m + "post_attention_layernorm.weight", {h}, DType::kBF16, DummyInit::kOnes});
  s.push_back({m + "mlp.gate_proj.weight", {c.intermediate_size, h}});
  s.push_back({m + "mlp.up_proj.weight", {c.intermediate_size, h}});
  s.push_back({m + "mlp.down_proj.weight", {h, c.intermediate_size}});
  s.push_back({"norm.weight", {h}, DType::kBF16, DummyInit::kOnes});
  s.push_back({"lm_head.weight", {c.draft_vocab_size, h}});
  s.push_back({"d2t", {c.draft_vocab_size}, DType::kI64, DummyInit::kZeros, 0.0f});
  return s;
}

Eagle3Head::Eagle3Head(const ModelConfig& config, Backend& backend)
    : config_(config), backend_(backend) {}

StatusOr<std::unique_ptr<Eagle3Head>> Eagle3Head::Load(const std::filesystem::path& dir,
                                                       const DecoderLM& target, Backend& backend) {
  OASIS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> weights, OpenSafetensorsWeights(dir));
  return Create(config, *weights, target, backend);
}

StatusOr<std::unique_ptr<Eagle3Head>> Eagle3Head::CreateDummy(const ModelConfig& config,
                                                              const DecoderLM& target,
                                                              Backend& backend, uint64_t seed) {
  if (config.draft_vocab_size > target.config().vocab_size) {
    return InvalidArgument(
        "dummy EAGLE-3 head: draft_vocab_size " + std::to_string(config.draft_vocab_size) +
        " exceeds the target vocabulary " + std::to_string(target.config().vocab_size) +
        " (dummy d2t is the identity)");
  }
  const bool own_embedding = config.hidden_size != target.config().hidden_size;
  std::unique_ptr<WeightSource> weights =
      MakeDummyWeights(ExpectedWeights(config, own_embedding), seed);
  return Create(config, *weights, target, backend);
}

StatusOr<std::unique_ptr<Eagle3Head>> Eagle3Head::Create(const ModelConfig& config,
                                                         const WeightSource& w,
                                                         const DecoderLM& target,
                                                         Backend& backend) {
  const ModelConfig& tc = target.config();
  std::vector<int64_t> aux_ids = AuxLayerIds(config, tc.num_hidden_layers);
  OASIS_RETURN_IF_ERROR(CheckConfig(config, tc, aux_ids));
  // The head runs whole on each rank (no tensor-parallel split).
  OASIS_RETURN_IF_ERROR(backend.CheckModelShapes(config, 1));
  std::unique_ptr<Eagle3Head> head(new Eagle3Head(config, backend));
  head->aux_layer_ids_ = aux_ids;
  head->target_hidden_ = tc.hidden_size;
  head->rope_ = ComputeRopeParams(config);
  backend.PrepareRope(head->rope_);  // as DecoderLM: before any step
  const ModelConfig& c = config;
  const int64_t h = c.hidden_size, th = tc.hidden_size;
  const DType dt = backend.activation_dtype();
  // The layer's weight names: "layers.0." in the `speculators` layout, else "midlayer.".
  const std::string m =
      w.Has(std::string(kSpeculatorsLayer) + "hidden_norm.weight") ? kSpeculatorsLayer : kMid;
  head->config_.head_layer_prefix = m;
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape,
                 const std::string& why) -> StatusOr<Tensor> {
    OASIS_ASSIGN_OR_RETURN(Tensor t, LoadChecked(w, name, shape, dt, why));
    return backend.Upload(t);
  };

  // Embedding: the head's own, or the target's (then the hidden sizes must agree).
  if (w.Has("embed_tokens.weight")) {
    OASIS_ASSIGN_OR_RETURN(head->embed_tokens_,
                           get("embed_tokens.weight", {tc.vocab_size, h},
                               "the head's embedding covers the target vocabulary"));
  } else {
    if (h != th) {
      return InvalidArgument(
          "EAGLE-3 head has no embed_tokens.weight, so it uses the target's embedding, which "
          "needs hidden_size (" +
          std::to_string(h) + ") == the target's hidden_size (" + std::to_string(th) + ")");
    }
    head->embed_tokens_ = target.embed_tokens();
  }
  OASIS_ASSIGN_OR_RETURN(head->fc_,
                         get("fc.weight", {h, 3 * th}, "[hidden_size, 3 * target hidden_size]"));
  const std::string norm_why = "[hidden_size]";
  OASIS_ASSIGN_OR_RETURN(head->hidden_norm_, get(m + "hidden_norm.weight", {h}, norm_why));
  OASIS_ASSIGN_OR_RETURN(head->input_norm_, get(m + "input_layernorm.weight", {h}, norm_why));
  OASIS_ASSIGN_OR_RETURN(head->post_norm_,
                         get(m + "post_attention_layernorm.weight", {h}, norm_why));
  OASIS_ASSIGN_OR_RETURN(head->final_norm_, get("norm.weight", {h}, norm_why));
  {
    const std::string why = "q/k/v projections take 2 * hidden_size inputs";
    OASIS_ASSIGN_OR_RETURN(
        Tensor q, LoadChecked(w, m + "self_attn.q_proj.weight", {c.q_size(), 2 * h}, dt, why));
    OASIS_ASSIGN_OR_RETURN(
        Tensor k, LoadChecked(w, m + "self_attn.k_proj.weight", {c.kv_size(), 2 * h}, dt, why));
    OASIS_ASSIGN_OR_RETURN(
        Tensor v, LoadChecked(w, m + "self_attn.v_proj.weight", {c.kv_size(), 2 * h}, dt, why));
    head->qkv_ = backend.Upload(Tensor::ConcatRows({q, k, v}));
  }
  OASIS_ASSIGN_OR_RETURN(head->o_proj_, get(m + "self_attn.o_proj.weight", {h, c.q_size()},
                                            "[hidden, heads * head_dim]"));
  {
    const std::string why = "[intermediate_size, hidden_size]";
    OASIS_ASSIGN_OR_RETURN(
        Tensor g, LoadChecked(w, m + "mlp.gate_proj.weight", {c.intermediate_size, h}, dt, why));
    OASIS_ASSIGN_OR_RETURN(
        Tensor u, LoadChecked(w, m + "mlp.up_proj.weight", {c.intermediate_size, h}, dt, why));
    head->gate_up_ = backend.Upload(Tensor::ConcatRows({g, u}));
  }
  OASIS_ASSIGN_OR_RETURN(head->down_, get(m + "mlp.down_proj.weight", {h, c.intermediate_size},
                                          "[hidden_size, intermediate_size]"));
  OASIS_ASSIGN_OR_RETURN(head->lm_head_, get("lm_head.weight", {c.draft_vocab_size, h},
                                             "[draft_vocab_size, hidden_size]"));

  // d2t: target_id = draft_id + d2t[draft_id], every one inside the target vocabulary.
  if (!w.Has("d2t")) {
    return NotFound("EAGLE-3 head: tensor 'd2t' (draft -> target id offsets) missing from " +
                    w.Describe());
  }
  OASIS_ASSIGN_OR_RETURN(TensorInfo d2t_info, w.Info("d2t"));
  if (d2t_info.shape != std::vector<int64_t>{c.draft_vocab_size}) {
    return InvalidArgument("EAGLE-3 head: 'd2t' has shape " + Shape(d2t_info.shape) +
                           ", expected [" + std::to_string(c.draft_vocab_size) +
                           "] (one offset per draft id)");
  }
  if (d2t_info.dtype != DType::kI64) {
    return InvalidArgument("EAGLE-3 head: 'd2t' must hold int64 offsets");
  }
  OASIS_ASSIGN_OR_RETURN(Tensor d2t, w.Load("d2t", DType::kI64));
  head->draft_to_target_.resize(static_cast<size_t>(c.draft_vocab_size));
  for (int64_t i = 0; i < c.draft_vocab_size; ++i) {
    const int64_t target_id = i + d2t.data<int64_t>()[i];
    if (target_id < 0 || target_id >= tc.vocab_size) {
      return InvalidArgument("EAGLE-3 head: d2t maps draft id " + std::to_string(i) +
                             " to target id " + std::to_string(target_id) +
                             ", outside the target vocabulary [0, " +
                             std::to_string(tc.vocab_size) + ")");
    }
    head->draft_to_target_[static_cast<size_t>(i)] = static_cast<int32_t>(target_id);
  }
  Tensor host_map = Tensor::Empty({c.draft_vocab_size}, DType::kI32);
  std::memcpy(host_map.raw(), head->draft_to_target_.data(), host_map.nbytes());
  head->draft_to_target_device_ = backend.Upload(host_map);
  return head;
}

LayerKvPool Eagle3Head::AllocateKvCache(int64_t num_slots) const {
  LayerKvPool p;
  p.k = backend_.Empty({num_slots, kBlockSize, config_.head_dim}, backend_.activation_dtype());
  p.v = backend_.Empty({num_slots, kBlockSize, config_.head_dim}, backend_.activation_dtype());
  return p;
}

Tensor Eagle3Head::Forward(const ForwardInput& in, const Tensor& aux, LayerKvPool& kv,
                           std::span<const int32_t> aux_rows, Tensor* hidden_out) {
  return Run(in, aux, nullptr, kv, aux_rows, hidden_out);
}

Tensor Eagle3Head::ForwardFromFeatures(const ForwardInput& in, const Tensor& features,
                                       LayerKvPool& kv, Tensor* hidden_out) {
  return Run(in, Tensor(), &features, kv, {}, hidden_out);
}

Tensor Eagle3Head::Run(const ForwardInput& in, const Tensor& aux, const Tensor* features,
                       LayerKvPool& kv, std::span<const int32_t> aux_rows, Tensor* hidden_out) {
  const ModelConfig& c = config_;
  Backend& B = backend_;
  const DType dt = B.activation_dtype();
  const int64_t T = in.token_ids.numel(), h = c.hidden_size, th = target_hidden_;
  const int64_t n = features != nullptr ? 0 : static_cast<int64_t>(aux_layer_ids_.size());
  OASIS_CHECK(features != nullptr || (aux.ndim() == 3 && aux.dim(0) == n && aux.dim(2) == th))
      << "aux features " << aux.ToString() << ", expected [" << n << ", T, " << th << "]";
  const int64_t T_aux = features != nullptr ? T : aux.dim(1);
  OASIS_CHECK(aux_rows.empty() || static_cast<int64_t>(aux_rows.size()) == T)
      << "aux_rows needs one entry per row";
  OASIS_CHECK(!aux_rows.empty() || T_aux >= T)
      << "aux has " << T_aux << " rows for " << T << " head rows";
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  // Host-built gather indices for the two concatenations (the op set has no concat):
  // cat_aux[t] = [aux[0, r_t], aux[1, r_t], aux[2, r_t]] and x[t] = [e_t, g_t].
  Tensor idx =
      Tensor::Empty({n * T + 3 * T}, DType::kI32);  // aux gather | concat gather | identity
  int32_t* ix = idx.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = aux_rows.empty() ? t : aux_rows[static_cast<size_t>(t)];
    OASIS_CHECK(r >= 0 && r < T_aux) << "aux row " << r << " outside [0, " << T_aux << ")";
    for (int64_t j = 0; j < n; ++j) ix[t * n + j] = static_cast<int32_t>(j * T_aux + r);
    ix[n * T + 2 * t] = static_cast<int32_t>(t);
    ix[n * T + 2 * t + 1] = static_cast<int32_t>(T + t);
    ix[n * T + 2 * T + t] = static_cast<int32_t>(t);
  }
  Tensor idx_dev = B.UploadAsync(idx);  // read by this forward's ops on the same stream
  Tensor aux_idx = idx_dev.Slice(0, n * T), x_idx = idx_dev.Slice(n * T, n * T + 2 * T);

  Tensor g = B.Empty({T, h}, dt);
  if (features != nullptr) {
    // A chained draft step: the previous step's pre-norm outputs in place of fc(aux).
    OASIS_CHECK(features->shape() == (std::vector<int64_t>{T, h}))
        << "features " << features->ToString() << ", expected [" << T << ", " << h << "]";
    B.GatherRows(*features, idx_dev.Slice(n * T + 2 * T, n * T + 3 * T), g);  // a copy
  } else {
    // g = fc(concat(h_low, h_mid, h_high))
    Tensor cat_aux = B.Empty({n * T, th}, dt);
    B.GatherRows(aux.Reshape({n * T_aux, th}), aux_idx, cat_aux);
    B.Linear(cat_aux.Reshape({T, n * th}), fc_, g);
  }

  // x = concat(input_layernorm(embed(token)), hidden_norm(g)): [T, 2H]
  Tensor embed = B.Empty({T, h}, dt);
  B.Embedding(in.token_ids, embed_tokens_, embed);
  Tensor stacked = B.Empty({2 * T, h}, dt);  // rows [0, T): normed embeddings, [T, 2T): normed g
  Tensor top = stacked.Slice(0, T), bottom = stacked.Slice(T, 2 * T);
  B.RmsNorm(embed, input_norm_, eps, top);
  B.RmsNorm(g, hidden_norm_, eps, bottom);
  Tensor x = B.Empty({2 * T, h}, dt);
  B.GatherRows(stacked, x_idx, x);
  // The layer's residual stream: hidden_norm(g) (norm_before_residual: it is updated in place
  // in `stacked`, which x no longer needs), or g itself.
  Tensor residual = c.norm_before_residual ? bottom : g;

  // Attention over the head's own paged KV.
  Tensor qkv = B.Empty({T, c.q_size() + 2 * c.kv_size()}, dt);
  B.Linear(x.Reshape({T, 2 * h}), qkv_, qkv);
  Tensor q = B.Empty({T, c.num_attention_heads, c.head_dim}, dt);
  B.QkvRopeAppend(qkv, q, nullptr, nullptr, eps, in.positions, rope_, in.slot_mapping, kv);
  // No logits and no feature wanted: the step only appends the rows' K/V (a dense request
  // that needs no draft keeps its head KV whole for a later switch): nothing below is read.
  if (in.logit_rows.numel() == 0 && hidden_out == nullptr) {
    return Tensor::Empty({0, c.draft_vocab_size}, DType::kF32);
  }
  Tensor attn = B.Empty({T, c.num_attention_heads, c.head_dim}, dt);
  AttentionMetadata after_append = in.attention;  // the append was the launch before
  after_append.after_append = true;
  B.Attention(q, kv, after_append, scale, attn);
  Tensor o = B.Empty({T, h}, dt);
  B.Linear(attn.Reshape({T, c.q_size()}), o_proj_, o);

  // residual += o; post_attention_layernorm; MLP; final norm.
  Tensor normed = B.Empty({T, h}, dt);
  B.AddRmsNorm(o, residual, post_norm_, eps, normed);  // residual += o
  Tensor gate_up = B.Empty({T, 2 * c.intermediate_size}, dt);
  B.Linear(normed, gate_up_, gate_up);
  Tensor mlp = B.Empty({T, h}, dt);
  B.SiluMulLinear(gate_up, down_, mlp);
  B.AddRmsNorm(mlp, residual, final_norm_, eps, normed);  // += mlp: the pre-norm output
  if (hidden_out != nullptr) {
    OASIS_CHECK(hidden_out->shape() == (std::vector<int64_t>{T, h}))
        << "hidden_out " << hidden_out->ToString();
    B.GatherRows(residual, idx_dev.Slice(n * T + 2 * T, n * T + 3 * T),
                 *hidden_out);  // identity rows: a copy
  }

  const int64_t R = in.logit_rows.numel();
  if (R == 0) return Tensor::Empty({0, c.draft_vocab_size}, DType::kF32);  // no empty GEMMs
  Tensor rows = B.Empty({R, h}, dt);
  B.GatherRows(normed, in.logit_rows, rows);
  Tensor logits = B.Empty({R, c.draft_vocab_size}, DType::kF32);
  B.Linear(rows, lm_head_, logits);
  return logits;
}

Tensor* Eagle3Head::FindWeight(const std::string& name) {
  if (name == "fc.weight") return &fc_;
  if (name == "norm.weight") return &final_norm_;
  if (name == "lm_head.weight") return &lm_head_;
  std::string layer;  // the name after either layout's layer prefix
  for (const char* prefix : {kMid, kSpeculatorsLayer}) {
    if (name.rfind(prefix, 0) == 0) layer = name.substr(std::string(prefix).size());
  }
  if (layer == "hidden_norm.weight") return &hidden_norm_;
  if (layer == "input_layernorm.weight") return &input_norm_;
  if (layer == "post_attention_layernorm.weight") return &post_norm_;
  if (layer == "self_attn.o_proj.weight") return &o_proj_;
  if (layer == "mlp.down_proj.weight") return &down_;
  return nullptr;
}

int32_t Eagle3Head::DraftToTarget(int64_t draft_id) const {
  OASIS_CHECK(draft_id >= 0 && draft_id < config_.draft_vocab_size)
      << "draft id " << draft_id << " outside [0, " << config_.draft_vocab_size << ")";
  return draft_to_target_[static_cast<size_t>(draft_id)];
}

std::vector<int32_t> Eagle3Head::GreedyTargetTokens(const Tensor& host_logits) const {
  OASIS_CHECK(host_logits.ndim() == 2 && host_logits.dim(1) == config_.draft_vocab_size &&
              host_logits.dtype() == DType::kF32)
      << "logits " << host_logits.ToString();
  std::vector<int32_t> out;
  const int64_t R = host_logits.dim(0), V = host_logits.dim(1);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = host_logits.data<float>() + r * V;
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i) {
      if (row[i] > row[best]) best = i;
    }
    out.push_back(DraftToTarget(best));
  }
  return out;
}

}  // namespace oasis

#include "models/decoder_lm.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

#include "backend/rope.h"
#include "common/check.h"
#include "common/logging.h"
#include "loader/expert_weights.h"
#include "loader/fp8_weights.h"
#include "models/decoder_lm_fp8.h"

namespace oasis {
namespace {

std::string LayerName(int64_t i, const std::string& leaf) {
  return "model.layers." + std::to_string(i) + "." + leaf;
}

// "mlp.experts.{e}.{proj}.weight" (the per-expert layout of the Qwen3-MoE releases).
std::string ExpertLeaf(int64_t e, const char* proj) {
  return "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
}

bool ServedArchitecture(Architecture a) {
  return a == Architecture::kQwen3 || a == Architecture::kLlama || a == Architecture::kQwen3Moe;
}

// The architecture, and for MoE layers the expert counts a hand-built config could get wrong
// (ParseModelConfig already refuses them in config.json).
Status CheckServed(const ModelConfig& config) {
  if (!ServedArchitecture(config.architecture)) {
    return Unimplemented(
        "DecoderLM serves Qwen3ForCausalLM, Qwen3MoeForCausalLM and LlamaForCausalLM, not " +
        config.architecture_name);
  }
  if (config.HasMoeLayers() &&
      (config.num_experts_per_tok < 1 || config.num_experts_per_tok > config.num_experts ||
       config.moe_intermediate_size < 1)) {
    return InvalidArgument("MoE layers need 1 <= num_experts_per_tok (" +
                           std::to_string(config.num_experts_per_tok) + ") <= num_experts (" +
                           std::to_string(config.num_experts) + ") and moe_intermediate_size (" +
                           std::to_string(config.moe_intermediate_size) + ") >= 1");
  }
  return Status::Ok();
}

// Loads `name` as `dtype` and checks its shape.
StatusOr<Tensor> LoadChecked(const WeightSource& w, const std::string& name,
                             const std::vector<int64_t>& shape, DType dtype) {
  if (!w.Has(name)) return NotFound("weight '" + name + "' missing from " + w.Describe());
  OASIS_ASSIGN_OR_RETURN(Tensor t, w.Load(name, dtype));
  if (t.shape() != shape) {
    return InvalidArgument("weight '" + name + "' has shape " + ShapeToString(t.shape()) +
                           ", expected " + ShapeToString(shape) + " (" + w.Describe() + ")");
  }
  return t;
}

// Loads this rank's part of a checkpoint tensor: the whole tensor (shape-checked), or only
// the slice (LoadSlice; the full shape checked from the header, nothing else read).
StatusOr<Tensor> LoadPart(const WeightSource& w, const WeightPart& part, DType dtype) {
  if (part.dim < 0) return LoadChecked(w, part.name, part.shape, dtype);
  if (!w.Has(part.name)) return NotFound("weight '" + part.name + "' missing from " + w.Describe());
  OASIS_ASSIGN_OR_RETURN(TensorInfo info, w.Info(part.name));
  if (info.shape != part.shape) {
    return InvalidArgument("weight '" + part.name + "' has shape " + ShapeToString(info.shape) +
                           ", expected " + ShapeToString(part.shape) + " (" + w.Describe() + ")");
  }
  return w.LoadSlice(part.name, part.dim, part.begin, part.end, dtype);
}

}  // namespace

std::vector<WeightSpec> DecoderLM::ExpectedWeights(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<WeightSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    specs.push_back({LayerName(i, "input_layernorm.weight"), {h}, DType::kBF16, DummyInit::kOnes});
    specs.push_back({LayerName(i, "self_attn.q_proj.weight"), {c.q_size(), h}});
    specs.push_back({LayerName(i, "self_attn.k_proj.weight"), {c.kv_size(), h}});
    specs.push_back({LayerName(i, "self_attn.v_proj.weight"), {c.kv_size(), h}});
    specs.push_back({LayerName(i, "self_attn.o_proj.weight"), {h, c.q_size()}});
    if (c.qk_norm) {
      specs.push_back(
          {LayerName(i, "self_attn.q_norm.weight"), {c.head_dim}, DType::kBF16, DummyInit::kOnes});
      specs.push_back(
          {LayerName(i, "self_attn.k_norm.weight"), {c.head_dim}, DType::kBF16, DummyInit::kOnes});
    }
    specs.push_back(
        {LayerName(i, "post_attention_layernorm.weight"), {h}, DType::kBF16, DummyInit::kOnes});
    if (c.IsMoeLayer(i)) {
      const int64_t mi = c.moe_intermediate_size;
      specs.push_back({LayerName(i, "mlp.gate.weight"), {c.num_experts, h}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        specs.push_back({LayerName(i, ExpertLeaf(e, "gate_proj")), {mi, h}});
        specs.push_back({LayerName(i, ExpertLeaf(e, "up_proj")), {mi, h}});
        specs.push_back({LayerName(i, ExpertLeaf(e, "down_proj")), {h, mi}});
      }
      continue;
    }
    specs.push_back({LayerName(i, "mlp.gate_proj.weight"), {c.intermediate_size, h}});
    specs.push_back({LayerName(i, "mlp.up_proj.weight"), {c.intermediate_size, h}});
    specs.push_back({LayerName(i, "mlp.down_proj.weight"), {h, c.intermediate_size}});
  }
  specs.push_back({"model.norm.weight", {h}, DType::kBF16, DummyInit::kOnes});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

DecoderLM::DecoderLM(const ModelConfig& config, Backend& backend, const TensorParallel& tp)
    : config_(LocalConfig(config, tp)),
      full_config_(config),
      tp_(tp),
      backend_(backend),
      rope_(ComputeRopeParams(config)) {
  backend_.PrepareRope(rope_);  // its device copy now, never first inside a graph's arena
}

namespace {

// A checkpoint with layers past config.json's num_hidden_layers loads its first layers only (a
// config from a smaller model of the family, or a checkpoint cut short on purpose): said once,
// as transformers warns of checkpoint weights it did not use.
void WarnExtraLayers(const ModelConfig& config, const WeightSource& checkpoint) {
  constexpr std::string_view kLayers = "model.layers.";
  int64_t last = -1, tensors = 0;
  for (const std::string& name : checkpoint.Names()) {
    if (name.compare(0, kLayers.size(), kLayers) != 0) continue;
    int64_t layer = 0;
    const char* digits = name.data() + kLayers.size();
    if (std::from_chars(digits, name.data() + name.size(), layer).ec != std::errc()) continue;
    if (layer < config.num_hidden_layers) continue;
    last = std::max(last, layer);
    ++tensors;
  }
  if (last < 0) return;
  spdlog::warn(
      "{} holds layers up to {} but config.json's num_hidden_layers is {}: layers {}..{} ({} "
      "tensors) are not used",
      checkpoint.Describe(), last, config.num_hidden_layers, config.num_hidden_layers, last,
      tensors);
}

}  // namespace

StatusOr<std::unique_ptr<DecoderLM>> DecoderLM::Create(const ModelConfig& config,
                                                       const WeightSource& checkpoint,
                                                       Backend& backend, const TensorParallel& tp) {
  OASIS_RETURN_IF_ERROR(CheckServed(config));
  OASIS_RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  OASIS_RETURN_IF_ERROR(backend.CheckModelShapes(config, tp.size));
  if (config.attention_bias) return Unimplemented("attention_bias=true is not supported");
  if (config.hidden_act != "silu")
    return Unimplemented("hidden_act '" + config.hidden_act + "' (only silu)");
  if (config.head_dim % 2 != 0) return InvalidArgument("head_dim must be even for RoPE");
  // FP8 checkpoints: F8_E4M3 weights read as float, dequantized with their block scales
  // (every FP8 tensor and scale is checked here, before anything is uploaded).
  std::unique_ptr<WeightSource> dequantized;
  if (config.quantization.fp8()) {
    OASIS_ASSIGN_OR_RETURN(dequantized, DequantizeFp8Weights(checkpoint, config.quantization));
  } else {
    OASIS_RETURN_IF_ERROR(CheckNoFp8Weights(checkpoint));
  }
  const WeightSource& stored = dequantized != nullptr ? *dequantized : checkpoint;
  // transformers 5's fused expert tensors are read through their per-expert names.
  std::unique_ptr<WeightSource> split_experts;
  if (HasFusedExperts(stored)) {
    OASIS_ASSIGN_OR_RETURN(split_experts, SplitFusedExperts(stored));
  }
  const WeightSource& weights = split_experts != nullptr ? *split_experts : stored;
  WarnExtraLayers(config, checkpoint);
  std::unique_ptr<DecoderLM> model(new DecoderLM(config, backend, tp));
  const DType dt = backend.activation_dtype();
  const bool tied_without_head = config.tie_word_embeddings && !weights.Has("lm_head.weight");
  if (!tied_without_head && config.tie_word_embeddings) {
    spdlog::warn("config ties word embeddings; ignoring the checkpoint's lm_head.weight");
  }
  // FP8 checkpoints: which linear weights stay in e4m3 (read from the stored tensors).
  const QuantizationConfig& quant = config.quantization;
  const auto keep_fp8 = [&](const std::vector<WeightPart>& parts, WeightUse use) {
    return quant.fp8() && use == WeightUse::kLinear &&
           model->ChooseFp8(parts, &checkpoint) == Fp8Choice::kKeep;
  };
  // Progress for large checkpoints: one log line per tenth of this rank's bytes (counted by
  // a dry run of the loading plan that allocates nothing; e4m3 weights count 1 byte each).
  double total_bytes = 0, loaded_bytes = 0;
  int reported_tenths = 0;
  OASIS_RETURN_IF_ERROR(model->LoadWeights(
      [&](const std::vector<WeightPart>& parts, DummyInit, WeightUse use) -> StatusOr<Tensor> {
        const DType stored = keep_fp8(parts, use) ? DType::kF8E4M3 : dt;
        for (const WeightPart& part : parts) {
          double n = static_cast<double>(DTypeSize(stored));
          for (int64_t d : part.LocalShape()) n *= static_cast<double>(d);
          total_bytes += n;
        }
        return Tensor();
      }));
  const auto progress = [&](const Tensor& uploaded) {
    loaded_bytes += static_cast<double>(uploaded.nbytes());
    const int tenths = static_cast<int>(10 * loaded_bytes / std::max(total_bytes, 1.0));
    if (total_bytes > 1e9 && tenths > reported_tenths) {
      reported_tenths = tenths;
      spdlog::info("loading weights: {:3d}% ({:.1f} / {:.1f} GB)", std::min(100, tenths * 10),
                   loaded_bytes / 1e9, total_bytes / 1e9);
    }
  };
  WeightProvider from_checkpoint = [&](const std::vector<WeightPart>& wanted, DummyInit,
                                       WeightUse use) -> StatusOr<Tensor> {
    if (quant.fp8() && use == WeightUse::kLinear) {
      const Fp8Choice choice = model->ChooseFp8(wanted, &checkpoint);
      if (choice == Fp8Choice::kKeep) {
        OASIS_ASSIGN_OR_RETURN(Tensor kept, LoadFp8Parts(checkpoint, wanted, quant, backend));
        model->CountFp8(choice, static_cast<double>(kept.nbytes() + kept.block_scales()->nbytes()));
        progress(kept);
        return kept;
      }
      model->CountFp8(choice, 0);
    }
    if (quant.fp8() && use == WeightUse::kExperts) {
      for (const WeightPart& part : wanted) {
        auto info = checkpoint.Info(part.name);
        if (info.ok() && info->dtype == DType::kF8E4M3) ++model->fp8_counts_.expert_tensors;
      }
    }
    // Fast path: every part whole, stored in the backend's dtype and mapped in memory goes
    // from the mapping straight to its rows of the device tensor (no host copy, no concat).
    bool direct = true;
    for (size_t i = 0; i < wanted.size() && direct; ++i) {
      auto info = weights.Info(wanted[i].name);
      direct = wanted[i].dim < 0 && info.ok() && info->dtype == dt &&
               info->shape == wanted[i].shape && weights.RawBytes(wanted[i].name).ok();
    }
    Tensor uploaded;
    if (direct) {
      std::vector<int64_t> fused = wanted[0].shape;
      for (size_t i = 1; i < wanted.size(); ++i) fused[0] += wanted[i].shape[0];
      uploaded = backend.Empty(fused, dt);
      size_t offset = 0;
      for (const WeightPart& part : wanted) {
        OASIS_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, weights.RawBytes(part.name));
        backend.UploadBytes(uploaded, offset, bytes.data(), bytes.size());
        offset += bytes.size();
      }
    } else {  // converting, slicing (tensor parallel), or checking shapes for a clear error
      std::vector<Tensor> parts;
      for (const WeightPart& part : wanted) {
        OASIS_ASSIGN_OR_RETURN(Tensor t, LoadPart(weights, part, dt));
        parts.push_back(std::move(t));
      }
      uploaded = backend.Upload(parts.size() == 1 ? parts[0] : Tensor::ConcatRows(parts));
    }
    progress(uploaded);
    return uploaded;
  };
  OASIS_RETURN_IF_ERROR(model->LoadWeights(from_checkpoint));
  if (quant.fp8()) model->LogFp8Weights();
  return model;
}

StatusOr<std::unique_ptr<DecoderLM>> DecoderLM::CreateDummy(const ModelConfig& config,
                                                            Backend& backend, uint64_t seed,
                                                            const TensorParallel& tp) {
  OASIS_RETURN_IF_ERROR(CheckServed(config));
  OASIS_RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  OASIS_RETURN_IF_ERROR(backend.CheckModelShapes(config, tp.size));
  std::unique_ptr<DecoderLM> model(new DecoderLM(config, backend, tp));
  uint64_t counter = seed * 0x9E3779B97F4A7C15ULL;
  const QuantizationConfig& quant = config.quantization;
  WeightProvider fill = [&](const std::vector<WeightPart>& parts, DummyInit init,
                            WeightUse use) -> StatusOr<Tensor> {
    std::vector<int64_t> shape = parts[0].LocalShape();
    for (size_t i = 1; i < parts.size(); ++i) shape[0] += parts[i].LocalShape()[0];
    if (quant.fp8() && use == WeightUse::kLinear) {  // e4m3 where a checkpoint's would be
      const Fp8Choice choice = model->ChooseFp8(parts, nullptr);
      if (choice == Fp8Choice::kKeep) {
        Tensor codes = backend.Empty(shape, DType::kF8E4M3);
        backend.FillNormal(codes, ++counter, kDummyFp8Stddev);
        Tensor scales = backend.Upload(DummyFp8Scales(shape, quant, ++counter));
        const double bytes = static_cast<double>(codes.nbytes() + scales.nbytes());
        model->CountFp8(choice, bytes);
        return codes.WithBlockScales(std::move(scales), static_cast<int>(quant.block_out),
                                     static_cast<int>(quant.block_in));
      }
      model->CountFp8(choice, 0);
    }
    Tensor t = backend.Empty(shape, backend.activation_dtype());
    if (init == DummyInit::kNormal) {
      backend.FillNormal(t, ++counter, 0.02f);
    } else {
      backend.Fill(t, init == DummyInit::kOnes ? 1.0f : 0.0f);
    }
    return t;
  };
  OASIS_RETURN_IF_ERROR(model->LoadWeights(fill));
  if (quant.fp8()) model->LogFp8Weights();
  return model;
}

Status DecoderLM::LoadWeights(const WeightProvider& get) {
  const ModelConfig& c = full_config_;  // checkpoint shapes; each rank takes its parts
  const TensorParallel& tp = tp_;
  const int64_t h = c.hidden_size;
  using Parts = std::vector<WeightPart>;
  const auto whole = [&](int64_t i, const std::string& leaf, std::vector<int64_t> shape) {
    return Replicated(LayerName(i, leaf), std::move(shape));
  };
  const auto rows = [&](int64_t i, const std::string& leaf,
                        std::vector<int64_t> shape) {  // column-parallel
    return Shard(LayerName(i, leaf), std::move(shape), 0, tp);
  };
  const auto cols = [&](int64_t i, const std::string& leaf,
                        std::vector<int64_t> shape) {  // row-parallel
    return Shard(LayerName(i, leaf), std::move(shape), 1, tp);
  };
  OASIS_ASSIGN_OR_RETURN(embed_tokens_,
                         get(Parts{Replicated("model.embed_tokens.weight", {c.vocab_size, h})},
                             DummyInit::kNormal, WeightUse::kOther));
  OASIS_ASSIGN_OR_RETURN(final_norm_, get(Parts{Replicated("model.norm.weight", {h})},
                                          DummyInit::kOnes, WeightUse::kOther));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_tokens_;
  } else {
    OASIS_ASSIGN_OR_RETURN(lm_head_, get(Parts{Replicated("lm_head.weight", {c.vocab_size, h})},
                                         DummyInit::kNormal, WeightUse::kOther));
  }
  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer& L = layers_[static_cast<size_t>(i)];
    OASIS_ASSIGN_OR_RETURN(L.input_norm, get(Parts{whole(i, "input_layernorm.weight", {h})},
                                             DummyInit::kOnes, WeightUse::kOther));
    OASIS_ASSIGN_OR_RETURN(L.post_norm, get(Parts{whole(i, "post_attention_layernorm.weight", {h})},
                                            DummyInit::kOnes, WeightUse::kOther));
    OASIS_ASSIGN_OR_RETURN(L.qkv, get(Parts{rows(i, "self_attn.q_proj.weight", {c.q_size(), h}),
                                            rows(i, "self_attn.k_proj.weight", {c.kv_size(), h}),
                                            rows(i, "self_attn.v_proj.weight", {c.kv_size(), h})},
                                      DummyInit::kNormal, WeightUse::kLinear));
    OASIS_ASSIGN_OR_RETURN(L.o_proj, get(Parts{cols(i, "self_attn.o_proj.weight", {h, c.q_size()})},
                                         DummyInit::kNormal, WeightUse::kLinear));
    if (c.qk_norm) {
      OASIS_ASSIGN_OR_RETURN(L.q_norm, get(Parts{whole(i, "self_attn.q_norm.weight", {c.head_dim})},
                                           DummyInit::kOnes, WeightUse::kOther));
      OASIS_ASSIGN_OR_RETURN(L.k_norm, get(Parts{whole(i, "self_attn.k_norm.weight", {c.head_dim})},
                                           DummyInit::kOnes, WeightUse::kOther));
    }
    if (c.IsMoeLayer(i)) {
      OASIS_RETURN_IF_ERROR(LoadExperts(get, i, L));
      continue;
    }
    OASIS_ASSIGN_OR_RETURN(L.gate_up,
                           get(Parts{rows(i, "mlp.gate_proj.weight", {c.intermediate_size, h}),
                                     rows(i, "mlp.up_proj.weight", {c.intermediate_size, h})},
                               DummyInit::kNormal, WeightUse::kLinear));
    OASIS_ASSIGN_OR_RETURN(L.down,
                           get(Parts{cols(i, "mlp.down_proj.weight", {h, c.intermediate_size})},
                               DummyInit::kNormal, WeightUse::kLinear));
  }
  return Status::Ok();
}

Status DecoderLM::LoadExperts(const WeightProvider& get, int64_t i, Layer& L) {
  const ModelConfig& c = full_config_;
  const int64_t h = c.hidden_size, experts = c.num_experts, mi = c.moe_intermediate_size;
  const int64_t local_mi = config_.moe_intermediate_size;
  L.moe = true;
  // The router is replicated; each expert is split along its intermediate size like the
  // dense MLP (gate/up rows, down columns), so every rank holds a slice of every expert.
  OASIS_ASSIGN_OR_RETURN(
      L.router,
      get(std::vector<WeightPart>{Replicated(LayerName(i, "mlp.gate.weight"), {experts, h})},
          DummyInit::kNormal, WeightUse::kOther));
  std::vector<WeightPart> gate_up, down;
  for (int64_t e = 0; e < experts; ++e) {
    gate_up.push_back(Shard(LayerName(i, ExpertLeaf(e, "gate_proj")), {mi, h}, 0, tp_));
    gate_up.push_back(Shard(LayerName(i, ExpertLeaf(e, "up_proj")), {mi, h}, 0, tp_));
    down.push_back(Shard(LayerName(i, ExpertLeaf(e, "down_proj")), {h, mi}, 1, tp_));
  }
  // Stacked along dimension 0: [E * 2 * mi, h] is [E, 2 * mi, h] (gate then up per expert),
  // [E * h, mi] is [E, h, mi]. (A dry run of the loading plan returns empty tensors.)
  const auto as3d = [](Tensor t, std::vector<int64_t> shape) {
    return t.raw() == nullptr ? t : t.Reshape(std::move(shape));
  };
  OASIS_ASSIGN_OR_RETURN(Tensor gu, get(gate_up, DummyInit::kNormal, WeightUse::kExperts));
  L.experts_gate_up = as3d(std::move(gu), {experts, 2 * local_mi, h});
  OASIS_ASSIGN_OR_RETURN(Tensor dn, get(down, DummyInit::kNormal, WeightUse::kExperts));
  L.experts_down = as3d(std::move(dn), {experts, h, local_mi});
  return Status::Ok();
}

Tensor* DecoderLM::FindWeight(const std::string& name) {
  if (name == "model.embed_tokens.weight") return &embed_tokens_;
  if (name == "model.norm.weight") return &final_norm_;
  if (name == "lm_head.weight") return &lm_head_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    if (rest == "input_layernorm.weight") return &L.input_norm;
    if (rest == "post_attention_layernorm.weight") return &L.post_norm;
    if (rest == "self_attn.o_proj.weight") return &L.o_proj;
    if (rest == "mlp.down_proj.weight") return L.moe ? nullptr : &L.down;
    return nullptr;
  }
  return nullptr;
}

std::vector<LayerKvPool> DecoderLM::AllocateKvCache(int64_t num_slots) const {
  std::vector<LayerKvPool> pools(static_cast<size_t>(config_.num_hidden_layers));
  const DType dt = KvCacheDtype(backend_, config_.kv_cache_fp8);
  const int64_t hkv = config_.num_key_value_heads;  // this rank's
  for (auto& p : pools) {
    p.k = backend_.Empty({num_slots, kBlockSize, config_.head_dim}, dt);
    p.v = backend_.Empty({num_slots, kBlockSize, config_.head_dim}, dt);
    if (config_.kv_cache_fp8) {
      // Unit scales until calibration (ModelRunner::CalibrateKvScales) sets them; each its
      // own tensor (the CPU backend's Upload returns the host tensor itself).
      auto filled = [&](float value) {
        return backend_.Upload(
            Tensor::FromFloats(std::vector<float>(static_cast<size_t>(hkv), value), {hkv}));
      };
      p.k_scale = filled(1.0f);
      p.v_scale = filled(1.0f);
      p.k_amax = filled(0.0f);
      p.v_amax = filled(0.0f);
    }
  }
  return pools;
}

Tensor DecoderLM::Forward(const ForwardInput& in, std::vector<LayerKvPool>& kv,
                          ResidualCapture* capture, AttentionLayerHook* hook) {
  const ModelConfig& c = config_;
  OASIS_CHECK_EQ(static_cast<int64_t>(kv.size()), c.num_hidden_layers) << "one KV pool per layer";
  const int64_t T = in.token_ids.numel(), h = c.hidden_size;
  const DType dt = backend_.activation_dtype();
  Backend& B = backend_;
  // The residual stream alternates between two buffers: a fused norm + projection writes the
  // updated stream while other CTAs still read the previous one.
  Tensor hidden = B.Empty({T, h}, dt), normed = B.Empty({T, h}, dt);
  Tensor residual[2] = {B.Empty({T, h}, dt), B.Empty({T, h}, dt)};
  int cur = 0;
  Tensor qkv = B.Empty({T, c.q_size() + 2 * c.kv_size()}, dt);
  Tensor q = B.Empty({T, c.num_attention_heads, c.head_dim}, dt);
  Tensor attn = B.Empty({T, c.num_attention_heads, c.head_dim}, dt);
  Tensor act = B.Empty({T, c.intermediate_size}, dt);  // SiLU(gate) · up
  // MoE layers: each token's experts and routing weights.
  const bool has_moe = c.HasMoeLayers();
  const int64_t k = has_moe ? c.num_experts_per_tok : 0;
  Tensor expert_ids = has_moe ? B.Empty({T, k}, DType::kI32) : Tensor();
  Tensor expert_weights = has_moe ? B.Empty({T, k}, DType::kF32) : Tensor();
  const MoeTopKWeights topk_weights =
      c.norm_topk_prob ? MoeTopKWeights::kRenormalized : MoeTopKWeights::kSoftmax;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Residual-stream capture (EAGLE-3 aux features): a row copy of the stream per id.
  const bool capturing = capture != nullptr && !capture->layer_ids.empty();
  if (capturing) {
    const int64_t n = static_cast<int64_t>(capture->layer_ids.size());
    for (int64_t id : capture->layer_ids) {
      OASIS_CHECK(id >= 0 && id <= c.num_hidden_layers)
          << "capture layer id " << id << " outside [0, " << c.num_hidden_layers << "]";
    }
    OASIS_CHECK(capture->out.shape() == (std::vector<int64_t>{n, T, h}) &&
                capture->out.dtype() == dt)
        << "capture tensor " << capture->out.ToString() << ", expected [" << n << ", " << T << ", "
        << h << "]";
  }
  auto capture_stream = [&](int64_t id, const Tensor& stream) {
    if (!capturing) return;
    for (size_t j = 0; j < capture->layer_ids.size(); ++j) {
      if (capture->layer_ids[j] != id) continue;
      Tensor dst =
          capture->out.Slice(static_cast<int64_t>(j), static_cast<int64_t>(j) + 1).Reshape({T, h});
      B.Copy(stream, dst);  // a device copy: nothing uploaded, so graph capture works
    }
  };

  // Without a hook, each layer's attention runs right after its KV append.
  AttentionMetadata after_append = in.attention;
  after_append.after_append = true;

  B.Embedding(in.token_ids, embed_tokens_, residual[cur]);
  capture_stream(0, residual[cur]);
  bool first = true;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    // hidden holds the previous sub-layer's output; residual[cur] the running stream.
    const Tensor* q_norm = c.qk_norm ? &L.q_norm : nullptr;
    const Tensor* k_norm = c.qk_norm ? &L.k_norm : nullptr;
    if (first) {
      B.AddRmsNormQkvRopeAppend(nullptr, residual[cur], nullptr, L.input_norm, eps, L.qkv, qkv, q,
                                q_norm, k_norm, in.positions, rope_, in.slot_mapping, kv[i]);
      first = false;
    } else {
      B.AddRmsNormQkvRopeAppend(&hidden, residual[cur], &residual[1 - cur], L.input_norm, eps,
                                L.qkv, qkv, q, q_norm, k_norm, in.positions, rope_, in.slot_mapping,
                                kv[i]);
      cur = 1 - cur;
      capture_stream(static_cast<int64_t>(i), residual[cur]);  // the stream entering layer i
    }
    if (hook == nullptr) {
      B.Attention(q, kv[i], after_append, scale, attn);
    } else {
      const int layer = static_cast<int>(i);
      B.Attention(q, kv[i], hook->BeforeAttention(layer, q, kv[i], in.attention), scale, attn);
      hook->AfterAttention(layer, q, kv[i]);
    }
    B.Linear(attn.Reshape({T, c.q_size()}), L.o_proj, hidden);
    if (tp_.comm != nullptr)
      tp_.comm->AllReduceSum(hidden);  // row-parallel o_proj: sum the partials
    if (L.moe) {
      // residual[1 - cur] = residual[cur] + hidden, normed = RmsNorm of it, the routing of
      // `normed`: decode batches run the norm inside the router's GEMV (its CTAs all read
      // residual[cur], hence the ping-pong), larger ones the add + norm kernel first.
      B.AddRmsNormMoeRoute(hidden, residual[cur], residual[1 - cur], L.post_norm, eps, L.router, k,
                           topk_weights, normed, expert_ids, expert_weights);
      cur = 1 - cur;
      B.MoeExperts(normed, expert_ids, expert_weights, L.experts_gate_up, L.experts_down, hidden);
    } else {
      B.AddRmsNormGateUpSilu(&hidden, residual[cur], &residual[1 - cur], L.post_norm, eps,
                             L.gate_up, act);
      cur = 1 - cur;
      B.Linear(act, L.down, hidden);
    }
    // Row-parallel down_proj (each expert's too): sum the partials.
    if (tp_.comm != nullptr) tp_.comm->AllReduceSum(hidden);
  }
  B.AddRmsNorm(hidden, residual[cur], final_norm_, eps, normed);
  capture_stream(c.num_hidden_layers, residual[cur]);  // leaving the last layer (pre-norm)
  const int64_t R = in.logit_rows.numel();
  Tensor rows = B.Empty({R, h}, dt);
  B.GatherRows(normed, in.logit_rows, rows);
  Tensor logits = B.Empty({R, c.vocab_size}, DType::kF32);  // float logits on every backend
  B.Linear(rows, lm_head_, logits);
  return logits;
}

}  // namespace oasis

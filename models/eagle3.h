// Eagle3Head: an EAGLE-3 draft head (`LlamaForCausalLMEagle3`, one decoder layer) attached
// to a target DecoderLM, written in the Backend op set (CPU reference and CUDA run the same
// code). DESIGN.md §3 gives the checkpoint format; docs/eagle3.md the forward pass, the
// aux-layer convention and the token alignment.
//
// Owns its weights; borrows the target's embedding when the checkpoint has none. The head's
// paged KV cache (one layer, head-level block tables like the target's) is owned by the
// caller. Forward() is called by one thread at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"

namespace oasis {

class Eagle3Head {
 public:
  // Loads `<dir>/config.json` (LlamaForCausalLMEagle3) and the safetensors in `dir`.
  static StatusOr<std::unique_ptr<Eagle3Head>> Load(const std::filesystem::path& dir,
                                                    const DecoderLM& target, Backend& backend);
  // Checks that `config` and `weights` form an EAGLE-3 head that fits `target` (hidden
  // sizes, fc / q / k / v / lm_head shapes, d2t range, aux layer ids, embedding) and loads
  // it. Errors name the offending field or tensor: InvalidArgument for a misfit, NotFound
  // for a missing tensor, Unimplemented for unsupported features. Never crashes on a bad
  // checkpoint.
  static StatusOr<std::unique_ptr<Eagle3Head>> Create(const ModelConfig& config,
                                                      const WeightSource& weights,
                                                      const DecoderLM& target, Backend& backend);
  // Random weights at the config's real shapes (`--load-format dummy`): normal(0, 0.02)
  // matrices, unit norms, d2t = 0 (draft id i is target id i). Same checks as Create.
  static StatusOr<std::unique_ptr<Eagle3Head>> CreateDummy(const ModelConfig& config,
                                                           const DecoderLM& target,
                                                           Backend& backend, uint64_t seed);

  // A head config shaped like `target` (same hidden size, heads, head_dim, intermediate
  // size, RoPE), for dummy heads: draft_vocab_size = `draft_vocab` (0 = the target vocab),
  // default aux layer ids.
  static ModelConfig ConfigForTarget(const ModelConfig& target, int64_t draft_vocab = 0);
  // The checkpoint tensors of a head (embed_tokens only when `with_embedding`).
  static std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config, bool with_embedding);
  // The aux layer ids used with `target_layers` target layers: the config's
  // eagle_aux_hidden_state_layer_ids when given, else (2, L/2, L-3). Ids name the residual
  // stream ENTERING that target layer (id L: leaving the last layer); see docs/eagle3.md.
  static std::vector<int64_t> AuxLayerIds(const ModelConfig& config, int64_t target_layers);

  const ModelConfig& config() const { return config_; }
  // The target layer ids to capture (ResidualCapture::layer_ids of the target's Forward).
  const std::vector<int64_t>& aux_layer_ids() const { return aux_layer_ids_; }
  int64_t draft_vocab_size() const { return config_.draft_vocab_size; }

  // KV pool of the head's one layer for `num_slots` head-blocks.
  LayerKvPool AllocateKvCache(int64_t num_slots) const;

  // One head step over T rows. `in` is laid out like the target's ForwardInput, for the
  // head: token_ids[t] is the token embedded at row t (the NEXT token after the target
  // token whose features row t uses), positions/slot_mapping/attention address the head's
  // KV cache ([T, head num_kv_heads] slot mapping). `aux` is the target's capture
  // [num_aux, T_aux, target_hidden]; row t uses aux row aux_rows[t] (empty = row t, which
  // needs T_aux >= T). Appends the rows' K/V to `kv`. Returns float logits [R, draft_vocab]
  // for in.logit_rows; with no logit rows and no `hidden_out` the step stops after the K/V
  // append (a quarter of the weights' bytes) and returns an empty host tensor [0, draft_vocab].
  // With `hidden_out` ([T, hidden], activation dtype), also writes the head's pre-norm output (the
  // feature a chained draft step would reuse).
  Tensor Forward(const ForwardInput& in, const Tensor& aux, LayerKvPool& kv,
                 std::span<const int32_t> aux_rows = {}, Tensor* hidden_out = nullptr);
  // A chained draft step (EAGLE-3's later draft positions, as vLLM runs them): row t's
  // residual input is features[t] ([T, hidden], activation dtype: a previous step's
  // `hidden_out` rows) instead of fc(aux); the rest is Forward's.
  Tensor ForwardFromFeatures(const ForwardInput& in, const Tensor& features, LayerKvPool& kv,
                             Tensor* hidden_out = nullptr);

  // The device tensor behind an unfused checkpoint name ("fc.weight", "norm.weight",
  // "lm_head.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
  // "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.o_proj.weight",
  // "midlayer.mlp.down_proj.weight"), or nullptr. For tools that construct heads.
  Tensor* FindWeight(const std::string& name);

  // Draft id -> target id (draft_id + d2t[draft_id]); CHECKs the range.
  int32_t DraftToTarget(int64_t draft_id) const;
  // Host table [draft_vocab] of target ids, and the same on the backend's device (int32).
  const std::vector<int32_t>& draft_to_target() const { return draft_to_target_; }
  const Tensor& draft_to_target_device() const { return draft_to_target_device_; }
  // Greedy draft tokens as target ids: argmax over each row of host float logits
  // [R, draft_vocab] (ties: the lowest draft id), mapped through d2t.
  std::vector<int32_t> GreedyTargetTokens(const Tensor& host_logits) const;

 private:
  // Forward (features null: g = fc(aux)) and ForwardFromFeatures (g = *features).
  Tensor Run(const ForwardInput& in, const Tensor& aux, const Tensor* features, LayerKvPool& kv,
             std::span<const int32_t> aux_rows, Tensor* hidden_out);
  Eagle3Head(const ModelConfig& config, Backend& backend);

  ModelConfig config_;
  Backend& backend_;
  RopeParams rope_;
  std::vector<int64_t> aux_layer_ids_;
  int64_t target_hidden_ = 0;

  Tensor embed_tokens_;  // [vocab, hidden]: the head's own or the target's
  Tensor fc_;            // [hidden, num_aux * target_hidden]
  Tensor hidden_norm_;   // [hidden]
  Tensor input_norm_;    // [hidden]
  Tensor qkv_;           // [q_size + 2 * kv_size, 2 * hidden]
  Tensor o_proj_;        // [hidden, q_size]
  Tensor post_norm_;     // [hidden]
  Tensor gate_up_;       // [2 * intermediate, hidden]
  Tensor down_;          // [hidden, intermediate]
  Tensor final_norm_;    // [hidden]
  Tensor lm_head_;       // [draft_vocab, hidden]
  std::vector<int32_t> draft_to_target_;
  Tensor draft_to_target_device_;
};

}  // namespace oasis

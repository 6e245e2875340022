// DecoderLM: the decoder-only transformer of Qwen3, Qwen3-MoE and Llama 3.x, written once in
// the Backend op set. The architectures differ only in config: Qwen3 adds per-head q/k
// RMSNorm before RoPE; Llama 3.x may use llama3 RoPE scaling; Qwen3-MoE replaces the MLP of
// its MoE layers (ModelConfig::IsMoeLayer) by a top-k routed mixture of experts
// (Backend::MoeRoute / MoeExperts, docs/moe.md). (EAGLE-3 heads are separate.)
//
// Owns its weights (device tensors of the backend). Forward() is called by one thread at
// a time; the KV pools are owned by the caller and passed in.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "loader/weights.h"
#include "models/tp_sharding.h"
#include "oasis/model_config.h"

namespace oasis {

// One forward pass over a batch of T tokens from S sequences (prefill chunks and decode
// tokens mixed). All tensors are on the backend's device.
struct ForwardInput {
  Tensor token_ids;     // [T] int32
  Tensor positions;     // [T] int32
  Tensor slot_mapping;  // [T, num_kv_heads] int64: where each token's K/V is written
  AttentionMetadata attention;
  Tensor logit_rows;  // [R] int32: the batch rows whose logits are returned
};

// Optional copy of the target's residual stream for an EAGLE-3 head (docs/eagle3.md).
// Id i < num_hidden_layers names the residual stream ENTERING layer i (embedding + the
// outputs of layers 0..i-1, before layer i's input_layernorm; id 0 is the embedding);
// id num_hidden_layers names the stream leaving the last layer, before the final norm.
// Forward fills `out` with backend ops (a row copy per id, no extra pass), so it works on
// every backend.
struct ResidualCapture {
  std::vector<int64_t> layer_ids;  // each in [0, num_hidden_layers]
  Tensor out;                      // [layer_ids.size(), T, hidden] activation dtype, device
};

// How the linear weights of an FP8 checkpoint (or of dummy weights for an FP8 config) were
// loaded: kept in e4m3 with their block scales, or not, and why (docs/fp8.md "FP8 weights").
// One count per device weight (qkv, o_proj, gate_up, down of each layer). All zero for a
// checkpoint without FP8 quantization.
struct Fp8WeightCounts {
  int64_t kept = 0;         // F8E4M3 on the device, with block scales
  int64_t off_blocks = 0;   // dequantized at load: a part or this rank's slice not on whole blocks
  int64_t unsupported = 0;  // dequantized at load: Backend::Fp8WeightSupported is false
  int64_t not_fp8 = 0;      // a part is not F8 in the checkpoint: loaded as stored (float)
  int64_t expert_tensors = 0;  // F8 MoE expert tensors: always dequantized at load
  double kept_bytes = 0;       // device bytes of the kept weights and their scales

  int64_t dequantized() const { return off_blocks + unsupported; }
};

class DecoderLM {
 public:
  // Checks the config and loads every weight the architecture needs from `weights`
  // (NotFound naming the tensor, InvalidArgument for a wrong shape). MoE experts may be
  // stored per expert or fused as transformers 5 saves them (loader/expert_weights.h).
  // With tp.size > 1 the model is rank tp.rank's shard (models/tp_sharding.h): it reads only
  // its slices of the sharded tensors (WeightSource::LoadSlice), computes with the local
  // head counts (config()) and all-reduces through tp.comm inside Forward, which every rank
  // must then call in lock-step with the same batch. InvalidArgument when the head counts
  // or intermediate size do not divide by tp.size.
  static StatusOr<std::unique_ptr<DecoderLM>> Create(const ModelConfig& config,
                                                     const WeightSource& weights, Backend& backend,
                                                     const TensorParallel& tp = {});
  // Random weights at the config's real shapes (this rank's shard of them), generated on the
  // backend's device (`--load-format dummy`, for benchmarks): normal(0, 0.02) matrices, unit
  // norms. Shards of different tp sizes are not slices of one dummy model. With an FP8
  // quantization config, the linear weights that Create would keep in e4m3 are e4m3 too:
  // FillNormal(F8E4M3, stddev 64) codes with deterministic per-block scales of about 0.02 / 64
  // (real weights about normal(0, 0.02)).
  //
  // FP8 checkpoints (config.quantization.fp8()): each linear weight (qkv, o_proj, gate_up,
  // down) is kept in e4m3 with its block scales (Tensor::block_scales) when every part is
  // F8 in the checkpoint, its parts and this rank's slices are whole blocks
  // (PartsOnFp8Blocks) and backend.Fp8WeightSupported(local out, local in, blocks); else it
  // is dequantized at load to the activation dtype. Embeddings, norms, lm_head, routers and
  // MoE experts are float (experts dequantized). fp8_weights() counts the outcomes.
  static StatusOr<std::unique_ptr<DecoderLM>> CreateDummy(const ModelConfig& config,
                                                          Backend& backend, uint64_t seed,
                                                          const TensorParallel& tp = {});
  // The checkpoint tensors this architecture reads (also the recipe for dummy weights).
  static std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config);

  // The config this rank computes with: num_attention_heads, num_key_value_heads,
  // intermediate_size and moe_intermediate_size are the local (per-rank) counts under tensor
  // parallelism.
  const ModelConfig& config() const { return config_; }
  // The checkpoint's config (global head counts).
  const ModelConfig& full_config() const { return full_config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The input embedding [vocab, hidden] on the backend's device (EAGLE-3 heads share it).
  const Tensor& embed_tokens() const { return embed_tokens_; }
  // How an FP8 checkpoint's linear weights were loaded (all zero for other checkpoints).
  const Fp8WeightCounts& fp8_weights() const { return fp8_counts_; }

  // The device tensor behind a checkpoint name that maps to one unfused weight
  // ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight" (the embedding when
  // tied), "model.layers.{i}.input_layernorm.weight", ".post_attention_layernorm.weight",
  // ".self_attn.o_proj.weight", ".mlp.down_proj.weight"), or nullptr. For tools that shape
  // dummy weights (benchmarks of constructed behaviour); the model does not notice changes.
  // Under tensor parallelism o_proj and down_proj are this rank's column slices. An FP8
  // checkpoint's o_proj / down_proj may be F8E4M3 with block scales (fp8_weights()).
  Tensor* FindWeight(const std::string& name);

  // KV pools for `num_slots` head-blocks per layer, on the backend's device.
  std::vector<LayerKvPool> AllocateKvCache(int64_t num_slots) const;

  // Runs all layers, appends the batch's K/V to `kv`, returns logits [R, vocab]. With
  // `capture` (its `out` allocated by the caller), also copies the residual stream at
  // capture->layer_ids for every token of the batch; nullptr or no ids = no copies.
  // With `hook` (the sparse-KV pipeline, docs/sparse.md), each layer calls
  // hook->BeforeAttention after its KV append (the attention uses the metadata it returns)
  // and hook->AfterAttention after its attention; nullptr = the plain dense path.
  Tensor Forward(const ForwardInput& input, std::vector<LayerKvPool>& kv,
                 ResidualCapture* capture = nullptr, AttentionLayerHook* hook = nullptr);

 private:
  struct Layer {
    Tensor input_norm;  // [hidden]
    // Shapes with the local sizes (config_): q_size, kv_size and intermediate per rank.
    Tensor qkv;             // [q_size + 2 * kv_size, hidden]
    Tensor q_norm, k_norm;  // [head_dim] (Qwen3 only)
    Tensor o_proj;          // [hidden, q_size]
    Tensor post_norm;       // [hidden]
    Tensor gate_up;         // [2 * intermediate, hidden] (dense MLP layers)
    Tensor down;            // [hidden, intermediate] (dense MLP layers)
    // MoE layers (shapes with the local moe_intermediate_size):
    bool moe = false;
    Tensor router;           // [num_experts, hidden]
    Tensor experts_gate_up;  // [num_experts, 2 * moe_intermediate, hidden]
    Tensor experts_down;     // [num_experts, hidden, moe_intermediate]
  };

  // What a weight is for: a Linear-op weight (qkv, o_proj, gate_up, down) may be kept in
  // e4m3 with block scales; MoE expert stacks and everything else are float.
  enum class WeightUse { kOther, kLinear, kExperts };
  // Produces one device weight: this rank's parts of the named checkpoint tensors stacked
  // along dimension 0, or a dummy fill of that shape.
  using WeightProvider = std::function<StatusOr<Tensor>(const std::vector<WeightPart>& parts,
                                                        DummyInit init, WeightUse use)>;
  // For an FP8 config: whether a kLinear weight of these parts stays in e4m3, or why not.
  // `checkpoint` (the stored tensors) null = dummy weights (all F8).
  enum class Fp8Choice { kKeep, kOffBlocks, kUnsupported, kNotFp8 };
  Fp8Choice ChooseFp8(const std::vector<WeightPart>& parts, const WeightSource* checkpoint) const;
  // Counts a kLinear weight's outcome in fp8_counts_ (`bytes`: its device bytes when kept).
  void CountFp8(Fp8Choice choice, double bytes);
  // One log line (rank 0) summing fp8_counts_.
  void LogFp8Weights() const;
  DecoderLM(const ModelConfig& config, Backend& backend, const TensorParallel& tp);
  Status LoadWeights(const WeightProvider& get);
  // Layer i's router and experts (an MoE layer).
  Status LoadExperts(const WeightProvider& get, int64_t i, Layer& layer);

  ModelConfig config_;       // local head counts
  ModelConfig full_config_;  // as in the checkpoint
  TensorParallel tp_;
  Backend& backend_;
  RopeParams rope_;
  Tensor embed_tokens_;  // [vocab, hidden]
  Tensor final_norm_;    // [hidden]
  Tensor lm_head_;       // [vocab, hidden] (the embedding when tied)
  std::vector<Layer> layers_;
  Fp8WeightCounts fp8_counts_;
};

}  // namespace oasis

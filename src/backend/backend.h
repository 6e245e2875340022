// Backend: the op set the model code is written in (DESIGN.md §2). One implementation per
// device: cpu/ (plain float32, the reference and the CI path) and cuda/ (fast, bf16).
//
// Conventions for every op:
//  - tensors live on the backend's device and have the backend's activation dtype unless a
//    parameter says otherwise (ids, positions, tables are int32; slot mappings int64);
//  - linear weights use the Hugging Face layout [out_features, in_features];
//  - outputs are written in full; inputs are never modified unless documented.
// A Backend instance is used by one thread at a time (the engine loop or one TP worker).
#pragma once

#include <cstdint>
#include <vector>

#include "oasis/sampling.h"
#include "oasis/tensor.h"

namespace oasis {

// Number of tokens in one KV block (one head-block holds kBlockSize × head_dim values).
inline constexpr int kBlockSize = 16;

// The paged KV cache of one layer: pools of head-blocks. Slot s holds kBlockSize tokens of
// one KV head: k[s, i, :] is the key of the i-th token of that head-block.
struct LayerKvPool {
  Tensor k;  // [num_slots, kBlockSize, head_dim]
  Tensor v;  // [num_slots, kBlockSize, head_dim]
};

// Where the tokens of a batch attend, with head-level block tables. Sequence s owns query
// rows [query_start[s], query_start[s+1]) of the batch; for each of its KV heads h the
// visible keys are the first kv_lens[s, h] tokens listed by block_tables[s, h, :], and its
// queries are the last (query_start[s+1] - query_start[s]) of those tokens (causal among
// themselves). Dense sequences have identical lengths for all heads; sparse ones need not.
struct AttentionMetadata {
  Tensor query_start;   // [num_seqs + 1] int32
  Tensor kv_lens;       // [num_seqs, num_kv_heads] int32
  Tensor block_tables;  // [num_seqs, num_kv_heads, max_blocks_per_seq] int32 slot ids
  int32_t max_query_len = 0;  // host-known bound of the query tokens per sequence
  int32_t max_kv_len = 0;     // host-known bound of kv_lens (0 = table width × kBlockSize)
};

// RoPE frequencies for one model: inv_freq[i] for i < rotary_dim / 2 (HF rotate_half layout).
struct RopeParams {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attention_scaling = 1.0f;
};

// N(0, 1) value derived from (seed, index) by hashing (splitmix64 + Box-Muller); the same
// function backs FillNormal on every backend.
float HashNormal(uint64_t seed, uint64_t index);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Activations and KV dtype: F32 on the CPU reference, BF16 on CUDA.
  virtual DType activation_dtype() const = 0;

  // A new uninitialised tensor on this backend's device.
  virtual Tensor Empty(std::vector<int64_t> shape, DType dtype) = 0;
  // Copies a host tensor to this device (a no-op view on the CPU backend) and back.
  virtual Tensor Upload(const Tensor& host) = 0;
  virtual Tensor Download(const Tensor& device_tensor) = 0;
  // Copies `bytes` host bytes into `dst` (a tensor of this device) at byte `offset`; returns
  // once `src` may be reused. For weights straight from a mapped checkpoint.
  virtual void UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) = 0;

  // Fills a float tensor (F32/BF16) with N(0, stddev) values, deterministic in `seed`.
  virtual void FillNormal(Tensor& t, uint64_t seed, float stddev) = 0;
  // Fills a float tensor (F32/BF16) with `value`.
  virtual void Fill(Tensor& t, float value) = 0;

  // out[t, :] = table[ids[t], :]
  virtual void Embedding(const Tensor& ids,    // [T] int32
                         const Tensor& table,  // [vocab, hidden]
                         Tensor& out) = 0;     // [T, hidden]

  // out = x / sqrt(mean(x^2) + eps) * weight, per row.
  virtual void RmsNorm(const Tensor& x,       // [T, hidden]
                       const Tensor& weight,  // [hidden]
                       float eps, Tensor& out) = 0;

  // residual += x; out = RmsNorm(residual).
  virtual void AddRmsNorm(const Tensor& x,       // [T, hidden]
                          Tensor& residual,      // [T, hidden], updated in place
                          const Tensor& weight,  // [hidden]
                          float eps, Tensor& out) = 0;

  // out = a + b
  virtual void Add(const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // out = x · weightᵀ
  virtual void Linear(const Tensor& x,       // [T, in]
                      const Tensor& weight,  // [out, in]
                      Tensor& out) = 0;      // [T, out]

  // In place on q and k: optional per-head RMSNorm (Qwen3 q_norm / k_norm, nullptr = none),
  // then RoPE (rotate_half layout) at each token's position.
  virtual void QkNormRope(Tensor& q,                // [T, num_q_heads, head_dim]
                          Tensor& k,                // [T, num_kv_heads, head_dim]
                          const Tensor* q_norm,     // [head_dim] or nullptr
                          const Tensor* k_norm,     // [head_dim] or nullptr
                          float eps,
                          const Tensor& positions,  // [T] int32
                          const RopeParams& rope) = 0;

  // out = silu(gate) * up where gate_up = [gate | up] along the last dimension.
  virtual void SiluMul(const Tensor& gate_up,  // [T, 2 * inter]
                       Tensor& out) = 0;       // [T, inter]

  // Writes each token's key and value of each KV head into its head-block slot:
  // slot_mapping[t, h] = slot * kBlockSize + offset (negative = skip).
  virtual void KvAppend(const Tensor& k,             // [T, num_kv_heads, head_dim]
                        const Tensor& v,             // [T, num_kv_heads, head_dim]
                        const Tensor& slot_mapping,  // [T, num_kv_heads] int64
                        LayerKvPool& pool) = 0;

  // Attention of every query row over its sequence's head-level block tables (GQA: query
  // head j uses KV head j / (num_q_heads / num_kv_heads)), softmax(q·k * scale) · v.
  virtual void Attention(const Tensor& q,  // [T, num_q_heads, head_dim]
                         const LayerKvPool& pool, const AttentionMetadata& meta, float scale,
                         Tensor& out) = 0;  // [T, num_q_heads, head_dim]

  // Splits the fused QKV projection into its parts.
  virtual void SplitQkv(const Tensor& qkv,  // [T, (num_q_heads + 2 * num_kv_heads) * head_dim]
                        Tensor& q,          // [T, num_q_heads, head_dim]
                        Tensor& k,          // [T, num_kv_heads, head_dim]
                        Tensor& v) = 0;     // [T, num_kv_heads, head_dim]

  // The attention block's input side from the fused QKV projection: q (optional q_norm,
  // RoPE) into `q`; k (optional k_norm, RoPE) and v appended to the KV pool at slot_mapping.
  // Default: SplitQkv + QkNormRope + KvAppend; backends may fuse it.
  virtual void QkvRopeAppend(const Tensor& qkv,           // [T, (Hq + 2 Hkv) * head_dim]
                             Tensor& q,                   // [T, Hq, head_dim]
                             const Tensor* q_norm, const Tensor* k_norm, float eps,
                             const Tensor& positions,     // [T] int32
                             const RopeParams& rope,
                             const Tensor& slot_mapping,  // [T, Hkv] int64
                             LayerKvPool& pool);

  // out = SiluMul(gate_up) · weightᵀ. Default: SiluMul + Linear; backends may fuse it. (A
  // SiLU fused into the GEMV's input recomputes it once per CTA: measured slower on the H200.)
  virtual void SiluMulLinear(const Tensor& gate_up,  // [T, 2 * inter]
                             const Tensor& weight,   // [out, inter]
                             Tensor& out);           // [T, out]

  // The pre-norm of a sub-layer and its first projection: with x, residual_out = residual + x
  // and n = RmsNorm(residual_out); without x (the first layer), n = RmsNorm(residual) and
  // residual_out must be null. out = n · weightᵀ. residual_out must not alias residual.
  // Default: Add + RmsNorm + Linear; backends may fuse it.
  virtual void AddRmsNormLinear(const Tensor* x,             // [T, hidden] or nullptr
                                const Tensor& residual,      // [T, hidden]
                                Tensor* residual_out,        // [T, hidden] or nullptr
                                const Tensor& norm_weight,   // [hidden]
                                float eps, const Tensor& weight,  // [out, hidden]
                                Tensor& out);                // [T, out]

  // The MLP's input side with SiLU·mul folded in: out = SiluMul(n · gate_upᵀ) where n is the
  // pre-norm of AddRmsNormLinear (same x / residual / residual_out contract) and gate_up is
  // the fused [gate | up] weight. Default: AddRmsNormLinear + SiluMul; backends may fuse it.
  virtual void AddRmsNormGateUpSilu(const Tensor* x,                 // [T, hidden] or nullptr
                                    const Tensor& residual,          // [T, hidden]
                                    Tensor* residual_out,            // [T, hidden] or nullptr
                                    const Tensor& norm_weight,       // [hidden]
                                    float eps, const Tensor& gate_up_weight,  // [2 * inter, hidden]
                                    Tensor& out);                    // [T, inter]

  // The attention block's whole input side: qkv = AddRmsNormLinear(x, residual, ...,
  // qkv_weight) (qkv is scratch; its contents afterwards are unspecified), then
  // QkvRopeAppend(qkv, q, ...). Default: exactly those two ops; backends may fuse them.
  virtual void AddRmsNormQkvRopeAppend(const Tensor* x,             // [T, hidden] or nullptr
                                       const Tensor& residual,      // [T, hidden]
                                       Tensor* residual_out,        // [T, hidden] or nullptr
                                       const Tensor& norm_weight,   // [hidden]
                                       float eps, const Tensor& qkv_weight,  // [(Hq + 2 Hkv) * head_dim, hidden]
                                       Tensor& qkv,                 // [T, (Hq + 2 Hkv) * head_dim] scratch
                                       Tensor& q,                   // [T, Hq, head_dim]
                                       const Tensor* q_norm, const Tensor* k_norm,  // [head_dim] or nullptr
                                       const Tensor& positions,     // [T] int32
                                       const RopeParams& rope,
                                       const Tensor& slot_mapping,  // [T, Hkv] int64
                                       LayerKvPool& pool);

  // Copies the given rows: out[i, :] = x[rows[i], :].
  virtual void GatherRows(const Tensor& x,     // [T, n]
                          const Tensor& rows,  // [R] int32
                          Tensor& out) = 0;    // [R, n]
};

}  // namespace oasis

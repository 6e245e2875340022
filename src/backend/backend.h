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

#include <climits>
#include <cstdint>
#include <vector>

#include "oasis/model_config.h"
#include "oasis/sampling.h"
#include "oasis/status.h"
#include "oasis/tensor.h"

namespace oasis {

// Number of tokens in one KV block (one head-block holds kBlockSize × head_dim values).
inline constexpr int kBlockSize = 16;
// Blocks that hold `tokens` tokens.
inline constexpr int64_t BlocksFor(int64_t tokens) {
  return (tokens + kBlockSize - 1) / kBlockSize;
}

// The paged KV cache of one layer: pools of head-blocks. Slot s holds kBlockSize tokens of
// one KV head: k[s, i, :] is the key of the i-th token of that head-block.
//
// Element type: the activation dtype, or F8E4M3 (`--kv-cache-dtype fp8`, docs/fp8.md). In an
// FP8 pool a stored e4m3 value x of KV head h stands for x · k_scale[h] (keys) or
// x · v_scale[h] (values). Ops that write K/V (KvAppend, QkvRopeAppend,
// AddRmsNormQkvRopeAppend) store FloatToFp8E4M3(value / scale[h]) (round to nearest even,
// saturating at ±448) and raise k_amax[h] / v_amax[h] to the largest |value| they were given
// (before quantization: start-up calibration and the saturation metric read it). Attention
// reads x · scale[h]. A slot does not know its head: ops that read stored values as numbers
// take h from their slot mapping or block tables. BlockSummaries of an FP8 pool are in stored
// units (min/max of x, unscaled): a head's scores are then its bounds divided by k_scale[h],
// which orders that head's blocks exactly as the scaled bounds do (TopK is per KV head and a
// GQA group shares its KV head's scale). Copies of blocks and tokens move stored bytes.
struct LayerKvPool {
  Tensor k;  // [num_slots, kBlockSize, head_dim]
  Tensor v;  // [num_slots, kBlockSize, head_dim]
  // FP8 pools only (empty otherwise): [num_kv_heads] F32 on the pool's device. Host-store
  // pools (EmptyHost) carry none: nothing reads their values as numbers.
  Tensor k_scale, v_scale;
  Tensor k_amax, v_amax;
  bool fp8() const { return k.dtype() == DType::kF8E4M3; }
};

// Where the tokens of a batch attend, with head-level block tables. Sequence s owns query
// rows [query_start[s], query_start[s+1]) of the batch; for each of its KV heads h the
// visible keys are the first kv_lens[s, h] tokens listed by block_tables[s, h, :], and its
// queries are the last (query_start[s+1] - query_start[s]) of those tokens (causal among
// themselves). Dense sequences have identical lengths for all heads; sparse ones need not.
struct AttentionMetadata {
  Tensor query_start;         // [num_seqs + 1] int32
  Tensor kv_lens;             // [num_seqs, num_kv_heads] int32
  Tensor block_tables;        // [num_seqs, num_kv_heads, max_blocks_per_seq] int32 slot ids
  int32_t max_query_len = 0;  // host-known bound of the query tokens per sequence
  int32_t max_kv_len = 0;     // host-known bound of kv_lens (0 = table width × kBlockSize)
  // Set (on a copy, never on a step's shared metadata) by a caller whose launch right before
  // Attention is the append of the query tokens' K/V, with nothing launched since the tables,
  // lengths and older tokens' K/V were written: the CUDA decode kernel then reads those before
  // it waits on the append (PDL). Hooks that launch work before attention return metadata
  // without it.
  bool after_append = false;
};

// The routing weights MoeRoute returns for the k chosen experts: their softmax probabilities
// as they are (Qwen3-MoE norm_topk_prob = false), or divided by their sum (true).
enum class MoeTopKWeights : uint8_t { kSoftmax, kRenormalized };

// How ScoreBlocks combines the scores of the query heads that share a KV head (GQA group).
// kSum: Σ over the group (the group's summed upper bound; the default). kMax: max over the
// group (a block matters if any query head of the group wants it).
enum class GroupReduce : uint8_t { kSum, kMax };

// Hook points a model's forward pass offers around each layer's attention (the sparse-KV
// pipeline, docs/sparse.md §4). Called in layer order by the thread running Forward().
class AttentionLayerHook {
 public:
  virtual ~AttentionLayerHook() = default;
  // After layer `layer`'s QKV projection, q/k-norm, RoPE and KV append (the step's K/V are in
  // `pool`), before its attention. Returns the metadata the attention of this layer uses:
  // `step` itself, or per-layer tables (the returned reference must stay valid until
  // AfterAttention of the same layer).
  virtual const AttentionMetadata& BeforeAttention(
      int layer,
      const Tensor& q,  // [T, num_q_heads, head_dim] post-RoPE
      LayerKvPool& pool, const AttentionMetadata& step) = 0;
  // After layer `layer`'s attention wrote its output: q (unchanged) holds every query of the
  // step, the draft tokens' included. The KV pool slots attention read may be overwritten
  // from now on.
  virtual void AfterAttention(int layer,
                              const Tensor& q,  // [T, num_q_heads, head_dim] post-RoPE
                              LayerKvPool& pool) = 0;
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
  // Activations and (unless the KV cache is FP8) KV dtype: F32 on the CPU reference, BF16 on
  // CUDA.
  virtual DType activation_dtype() const = 0;
  // Whether this backend's kernels compute a model (or draft head) of `config`'s shapes on one
  // of `tp_size` tensor-parallel ranks; an error naming the value and the limit if not. Models
  // call it before uploading any weight. The CPU reference computes every shape.
  virtual Status CheckModelShapes(const ModelConfig& config, int tp_size) const {
    (void)config;
    (void)tp_size;
    return Status::Ok();
  }

  // A new uninitialised tensor on this backend's device.
  virtual Tensor Empty(std::vector<int64_t> shape, DType dtype) = 0;
  // Makes the device copy of a RoPE table ahead of the first step (models call it as they
  // load): a copy first made by a step inside a decode graph's activation arena would live
  // in the arena and be overwritten by the next graph (the CPU backend reads the host table).
  virtual void PrepareRope(const RopeParams& rope) { (void)rope; }
  // Copies a host tensor to this device (a no-op view on the CPU backend) and back.
  virtual Tensor Upload(const Tensor& host) = 0;
  // Like Upload, but the copy is only ordered on the backend's current stream: ops enqueued
  // after it there see the data; other streams must be ordered after it by the caller. The
  // host tensor may be reused on return. For per-step inputs (the CPU backend: Upload).
  virtual Tensor UploadAsync(const Tensor& host) { return Upload(host); }
  // The same into an existing device tensor of host.nbytes() bytes (a persistent buffer).
  virtual void UploadAsyncInto(Tensor& dst, const Tensor& host) {
    UploadBytes(dst, 0, host.raw(), host.nbytes());
  }
  virtual Tensor Download(const Tensor& device_tensor) = 0;
  // Copies `bytes` host bytes into `dst` (a tensor of this device) at byte `offset`; returns
  // once `src` may be reused. For weights straight from a mapped checkpoint.
  virtual void UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) = 0;

  // ---- Background copies (a request's KV moving between homes; docs/sparse.md §12). Ops
  // enqueued between BeginBackground() and EndBackground() run on the backend's background
  // stream: after everything given to its main stream so far, beside the main stream's later
  // work. Tensors allocated or uploaded (UploadAsync) in between belong to that stream.
  // JoinBackground(): the main stream's later work waits for every background op so far (call
  // it before anything a background op reads or writes may be reused). TakeBackgroundSeconds():
  // device seconds the background ops took, of the batches finished since the last call. The
  // CPU backend runs everything in order: none of these do anything there.
  virtual void BeginBackground() {}
  virtual void EndBackground() {}
  virtual void JoinBackground() {}
  virtual double TakeBackgroundSeconds() { return 0.0; }

  // Fills a float tensor (F32/BF16) with N(0, stddev) values, deterministic in `seed`. An
  // F8E4M3 tensor gets FloatToFp8E4M3 of those values (saturating): dummy FP8 weights.
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

  // Whether Linear and the ops that take a linear weight (SiluMulLinear, AddRmsNormLinear,
  // AddRmsNormGateUpSilu, AddRmsNormQkvRopeAppend) compute with a weight [out, in] of dtype
  // F8E4M3 carrying block scales of block_out × block_in (Tensor::block_scales: an FP8
  // checkpoint's weight kept in e4m3 on the device, docs/fp8.md "FP8 weights"). The model
  // keeps a weight in e4m3 when this is true for its (per-rank) shape and dequantizes it at
  // load otherwise. Such a weight computes as its dequantized value w · scale up to the
  // backend's stated tolerance (the CPU reference: exactly). Default: false.
  virtual bool Fp8WeightSupported(int64_t out, int64_t in, int block_out, int block_in) const {
    (void)out;
    (void)in;
    (void)block_out;
    (void)block_in;
    return false;
  }

  // out = x · weightᵀ
  virtual void Linear(const Tensor& x,       // [T, in]
                      const Tensor& weight,  // [out, in]
                      Tensor& out) = 0;      // [T, out]

  // In place on q and k: optional per-head RMSNorm (Qwen3 q_norm / k_norm, nullptr = none),
  // then RoPE (rotate_half layout) at each token's position.
  virtual void QkNormRope(Tensor& q,             // [T, num_q_heads, head_dim]
                          Tensor& k,             // [T, num_kv_heads, head_dim]
                          const Tensor* q_norm,  // [head_dim] or nullptr
                          const Tensor* k_norm,  // [head_dim] or nullptr
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
  virtual void QkvRopeAppend(const Tensor& qkv,  // [T, (Hq + 2 Hkv) * head_dim]
                             Tensor& q,          // [T, Hq, head_dim]
                             const Tensor* q_norm, const Tensor* k_norm, float eps,
                             const Tensor& positions,  // [T] int32
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
  virtual void AddRmsNormLinear(const Tensor* x,                  // [T, hidden] or nullptr
                                const Tensor& residual,           // [T, hidden]
                                Tensor* residual_out,             // [T, hidden] or nullptr
                                const Tensor& norm_weight,        // [hidden]
                                float eps, const Tensor& weight,  // [out, hidden]
                                Tensor& out);                     // [T, out]

  // The MLP's input side with SiLU·mul folded in: out = SiluMul(n · gate_upᵀ) where n is the
  // pre-norm of AddRmsNormLinear (same x / residual / residual_out contract) and gate_up is
  // the fused [gate | up] weight. Default: AddRmsNormLinear + SiluMul; backends may fuse it.
  virtual void AddRmsNormGateUpSilu(const Tensor* x,            // [T, hidden] or nullptr
                                    const Tensor& residual,     // [T, hidden]
                                    Tensor* residual_out,       // [T, hidden] or nullptr
                                    const Tensor& norm_weight,  // [hidden]
                                    float eps, const Tensor& gate_up_weight,  // [2 * inter, hidden]
                                    Tensor& out);                             // [T, inter]

  // The attention block's whole input side: qkv = AddRmsNormLinear(x, residual, ...,
  // qkv_weight) (qkv is scratch; its contents afterwards are unspecified), then
  // QkvRopeAppend(qkv, q, ...). Default: exactly those two ops; backends may fuse them.
  virtual void AddRmsNormQkvRopeAppend(
      const Tensor* x,                             // [T, hidden] or nullptr
      const Tensor& residual,                      // [T, hidden]
      Tensor* residual_out,                        // [T, hidden] or nullptr
      const Tensor& norm_weight,                   // [hidden]
      float eps, const Tensor& qkv_weight,         // [(Hq + 2 Hkv) * head_dim, hidden]
      Tensor& qkv,                                 // [T, (Hq + 2 Hkv) * head_dim] scratch
      Tensor& q,                                   // [T, Hq, head_dim]
      const Tensor* q_norm, const Tensor* k_norm,  // [head_dim] or nullptr
      const Tensor& positions,                     // [T] int32
      const RopeParams& rope,
      const Tensor& slot_mapping,  // [T, Hkv] int64
      LayerKvPool& pool);

  // dst = src (same dtype and element count; both on this backend's device).
  virtual void Copy(const Tensor& src, Tensor& dst) = 0;

  // Copies the given rows: out[i, :] = x[rows[i], :].
  virtual void GatherRows(const Tensor& x,     // [T, n]
                          const Tensor& rows,  // [R] int32
                          Tensor& out) = 0;    // [R, n]
  // The inverse: out[rows[i], :] = x[i, :] (rows distinct; other rows of out unchanged).
  // Imports summaries and draft-head KV into the rows a request was given (disaggregation).
  virtual void ScatterRows(const Tensor& x,     // [R, n]
                           const Tensor& rows,  // [R] int32
                           Tensor& out) = 0;    // [M, n]

  // out.flat[index[i]] = values[i] for each i with index[i] >= 0 (int32 tensors of N
  // elements; indices distinct and < out.numel()). The sparse step's in-place table entries
  // (docs/sparse.md §12).
  virtual void WriteIndexed(const Tensor& values,  // [N] int32
                            const Tensor& index,   // [N] int32, < 0 = skip
                            Tensor& out) = 0;      // int32, any shape

  // ---- Mixture of experts (Qwen3-MoE, docs/moe.md). Routing and the experts are separate
  // ops so that a device backend can route on the device, then permute the tokens by expert
  // and run grouped GEMMs. E = num_experts, k = experts per token, I = an expert's
  // intermediate size (this rank's slice under tensor parallelism).

  // Top-k routing of every token: p = softmax(x · routerᵀ) in float32; expert_ids[t] = the k
  // experts of largest p in descending order of p, ties broken toward the lower expert index
  // (what torch.topk returns in practice; transformers relies on it); expert_weights[t] = their
  // p, divided by the sum of the k when `weights` is kRenormalized (Qwen3-MoE
  // norm_topk_prob). expert_ids are exact: a backend must match the CPU reference's ids
  // given the same router logits.
  virtual void MoeRoute(const Tensor& x,       // [T, hidden]
                        const Tensor& router,  // [E, hidden]
                        int64_t k, MoeTopKWeights weights,
                        Tensor& expert_ids,           // [T, k] int32
                        Tensor& expert_weights) = 0;  // [T, k] f32

  // A Qwen3-MoE layer's post-attention norm and routing: residual_out = residual + x and
  // normed = RmsNorm(residual_out) with AddRmsNorm's roundings, then MoeRoute(normed, ...).
  // residual_out must not alias residual (a device backend may fold the norm into the router's
  // GEMV, whose CTAs all read residual); `normed` is what the experts read. The default runs
  // Add, RmsNorm and MoeRoute.
  virtual void AddRmsNormMoeRoute(const Tensor& x,                  // [T, hidden]
                                  const Tensor& residual,           // [T, hidden]
                                  Tensor& residual_out,             // [T, hidden]
                                  const Tensor& norm_weight,        // [hidden]
                                  float eps, const Tensor& router,  // [E, hidden]
                                  int64_t k, MoeTopKWeights weights,
                                  Tensor& normed,           // [T, hidden]
                                  Tensor& expert_ids,       // [T, k] int32
                                  Tensor& expert_weights);  // [T, k] f32

  // The experts of every token, weighted:
  //   out[t] = Σ_j expert_weights[t, j] · down[e] · (SiLU(g) ⊙ u), e = expert_ids[t, j],
  //   [g | u] = gate_up[e] · x[t]
  // (each expert's fused [gate | up] rows as in the dense MLP). Under tensor parallelism
  // gate_up and down hold this rank's slice of I, so `out` is a partial sum to all-reduce.
  virtual void MoeExperts(const Tensor& x,               // [T, hidden]
                          const Tensor& expert_ids,      // [T, k] int32 in [0, E)
                          const Tensor& expert_weights,  // [T, k] f32
                          const Tensor& gate_up,         // [E, 2 * I, hidden]
                          const Tensor& down,            // [E, hidden, I]
                          Tensor& out) = 0;              // [T, hidden]

  // ---- Sparse KV (docs/sparse.md). Integer outputs of these ops are exact: a backend must
  // produce bit-identical int32 tensors to the CPU reference given the same inputs (for
  // TopKBlocks: the same float scores). ScoreBlocks' float scores match within the usual
  // dtype tolerance. Notation: R = sparse rows (fixed capacity of concurrently sparse
  // sequences), Hkv = KV heads, Hq = query heads, D = head_dim, K = top-K blocks per KV head,
  // C = max blocks fetched per KV head per step, MB = logical blocks per sequence (capacity),
  // S = sequences in the batch, T = tokens in the batch. A "summary row" / "host slot" is a
  // head-block of the host KV store; kmin/kmax are indexed by it.

  // A new uninitialised HOST tensor the device can read and write directly: page-locked and
  // mapped into the device address space (CUDA: cudaHostAlloc Mapped|Portable; with UVA the
  // host pointer is valid in kernels). device() is Device::kCpu. CPU backend: plain memory.
  // The host KV store's pools are made of these; the sparse ops below accept them as pools.
  virtual Tensor EmptyHost(std::vector<int64_t> shape, DType dtype) = 0;

  // Block summaries (Quest): for each entry i with dst_rows[i] >= 0 and n = num_tokens[i] in
  // [1, kBlockSize]: kmin[dst_rows[i], d] = min over tokens j < n of pool.k[src_slots[i], j, d]
  // and kmax likewise with max (exact: min/max of stored values, no rounding). Entries with
  // n <= 0 or dst < 0 are skipped. Destination rows must be distinct within one call. `pool`
  // may be a device pool or a host (EmptyHost) pool. Used at the dense->sparse switch (every
  // block) and every step (the block the step's real token was appended to).
  // Summary dtype: the activation dtype, or for an FP8 pool also F8E4M3 (the min and max of
  // stored e4m3 values are e4m3 values: still exact, half the bytes; what the sparse KV
  // manager allocates for FP8 pools).
  virtual void BlockSummaries(const LayerKvPool& pool,   // k: [num_slots, kBlockSize, D]
                              const Tensor& src_slots,   // [N] int32 slot in pool
                              const Tensor& num_tokens,  // [N] int32 valid leading tokens
                              const Tensor& dst_rows,    // [N] int32 summary row, < 0 = skip
                              Tensor& kmin,              // [num_rows, D] summary dtype
                              Tensor& kmax) = 0;         // [num_rows, D] summary dtype

  // Block scores of a query against every candidate block's summary. For each active row r
  // (query_rows[r] >= 0), KV head h and block b < num_blocks[r]: with m = host_tables[r, h, b]
  // and each query head j of h's group (j in [h*G, (h+1)*G), G = Hq / Hkv),
  //   s_j = Σ_{d ascending} max(q[query_rows[r], j, d] * kmax[m, d], q[..] * kmin[m, d])
  // in float32 (products of the values converted to float), then
  //   scores[r, h, b] = Σ_j s_j (j ascending, kSum) or max_j s_j (kMax).
  // Entries of inactive rows and b >= num_blocks[r] are left unchanged.
  virtual void ScoreBlocks(const Tensor& q,            // [T, Hq, D] post-RoPE queries
                           const Tensor& query_rows,   // [R] int32 batch row, -1 = inactive
                           const Tensor& num_blocks,   // [R] int32 candidate blocks, <= MB
                           const Tensor& host_tables,  // [R, Hkv, MB] int32 summary row per block
                           const Tensor& kmin,         // [num_rows, D] summary dtype
                           const Tensor& kmax,         // [num_rows, D] summary dtype
                           GroupReduce reduce,
                           Tensor& scores) = 0;  // [R, Hkv, MB] f32

  // Per-KV-head top-K. For each active row r (rows[r] >= 0) and head h: topk[r, h, :] lists
  // the min(K, num_blocks[r]) blocks b < num_blocks[r] with the highest scores[r, h, b], in
  // descending score; equal scores -> lower block id first (a total order, so the set and
  // its order are unique; scores must not be NaN). Remaining entries are -1. Inactive rows
  // are left unchanged.
  virtual void TopKBlocks(const Tensor& scores,      // [R, Hkv, MB] f32
                          const Tensor& rows,        // [R] int32, -1 = inactive
                          const Tensor& num_blocks,  // [R] int32
                          Tensor& topk) = 0;         // [R, Hkv, K] int32

  // Select with a hard cap (DESIGN.md §1). Per active row r and head h, over its K working
  // slots j (GPU slot ws_slots[r, h, j], resident logical block ws_blocks[r, h, j] or -1 =
  // empty, age ws_age[r, h, j] = select calls since the block was last predicted/fetched):
  //  1. predicted P = the non-negative entries of topk[r, h, :] (their order = score order);
  //  2. hits: j with ws_blocks[j] in P -> ws_age[j] = 0; every other non-empty slot:
  //     ws_age[j] = min(ws_age[j] + 1, INT32_MAX);
  //  3. misses: blocks of P not resident, in topk order (best score first);
  //  4. victims: empty slots (ascending j), then resident slots not in P by descending age
  //     (least recently selected first), equal ages -> ascending j;
  //  5. n = min(#misses, C, #victims); for i < n, with j = victim i and b = miss i:
  //     fetch_src[r, h, i] = host_tables[r, h, b], fetch_dst[r, h, i] = ws_slots[r, h, j],
  //     ws_blocks[j] = b, ws_age[j] = 0; fetch entries i >= n are -1;
  //  6. resident_slots[r, h, :] = ws_slots of the non-empty slots ordered by ascending logical
  //     block, then -1; num_resident[r, h] = their count;
  //  7. stats[r, h, :] += {#hits, #misses, n}.
  // Inactive rows (rows[r] < 0): fetch_src/fetch_dst rows are set to -1, nothing else changes.
  // Remote blocks (disaggregation, docs/disaggregation.md §5), when `remote` is given: a miss
  // b with remote[r, h, b] != 0 has no K/V in the host store yet. It is counted as a miss but
  // is not admissible: step 3 leaves it out of the misses to fetch, and it is listed instead in
  // remote_out[r, h, :] (the first CR such misses in topk order, then -1; the row is all -1 for
  // inactive rows). `remote` and `remote_out` may be host (EmptyHost) tensors.
  // In-place blocks (a sparse request whose KV lives in the GPU pool, docs/sparse.md §12): a
  // block b with m = host_tables[r, h, b] >= in_place_base has its K/V in GPU slot
  // m - in_place_base. Before step 1 a working slot holding an in-place block is emptied. A
  // predicted in-place block is a hit (it neither misses nor takes a working slot). Step 6 then
  // lists the in-place predicted blocks' GPU slots together with the working slots' — the
  // predicted and fetched ones all, the others (stale) in ascending j while fewer than K are
  // listed — by ascending logical block. in_place_base = INT32_MAX: no block is in place.
  // Adaptive budget (docs/sparse.md §13), when `fetch_cap` is given: step 5 admits
  // n = min(#misses, clamp(fetch_cap[h], 0, C), #victims) for head h; null = C (bit-identical
  // to passing C everywhere).
  virtual void SelectBlocks(const Tensor& topk,         // [R, Hkv, K] int32
                            const Tensor& rows,         // [R] int32, -1 = inactive
                            const Tensor& host_tables,  // [R, Hkv, MB] int32
                            const Tensor& ws_slots,  // [R, Hkv, K] int32 GPU slot per working slot
                            Tensor& ws_blocks,       // [R, Hkv, K] int32 in/out
                            Tensor& ws_age,          // [R, Hkv, K] int32 in/out
                            Tensor& fetch_src,       // [R, Hkv, C] int32 host slot, -1 = none
                            Tensor& fetch_dst,       // [R, Hkv, C] int32 GPU slot, -1 = none
                            Tensor& resident_slots,  // [R, Hkv, K] int32
                            Tensor& num_resident,    // [R, Hkv] int32
                            Tensor& stats,           // [R, Hkv, 3] int32, accumulated
                            const Tensor* remote = nullptr,  // [R, Hkv, MB] u8 or null
                            Tensor* remote_out = nullptr,    // [R, Hkv, CR] int32 (with remote)
                            int32_t in_place_base = INT32_MAX,
                            const Tensor* fetch_cap = nullptr) = 0;  // [Hkv] int32 or null

  // Copies whole head-blocks (K and V, kBlockSize x D each): dst[dst_slots[i]] =
  // src[src_slots[i]] for every i where both are >= 0. Either pool may be a device pool or a
  // host (EmptyHost) pool: host -> device is the sparse transfer (CUDA: a UVA gather kernel),
  // device -> host the dense->sparse switch. Destinations must be distinct within one call.
  virtual void CopyBlocks(const LayerKvPool& src,
                          const Tensor& src_slots,  // [N] int32
                          LayerKvPool& dst,
                          const Tensor& dst_slots) = 0;  // [N] int32

  // Copies single token rows (K and V): dst row dst_index[i] = src row src_index[i] where
  // both are >= 0; an index is slot * kBlockSize + offset. The write-through of a step's new
  // tokens from the device pool to the host store (src_index = the step's slot_mapping).
  virtual void CopyTokens(const LayerKvPool& src,
                          const Tensor& src_index,  // [N] int64 (any shape, N elements)
                          LayerKvPool& dst,
                          const Tensor& dst_index) = 0;  // [N] int64, same shape

  // Writes the attention rows of the sparse sequences of a batch for one layer, in place: for
  // each s with r = seq_rows[s] >= 0 and each head h, with n = num_resident[r, h] and
  // nt = ceil(tail_lens[s] / kBlockSize) (1 or 2):
  //   block_tables[s, h, 0:n] = resident_slots[r, h, 0:n],
  //   block_tables[s, h, n:n+nt] = tail_slots[s, h, 0:nt],
  //   kv_lens[s, h] = n * kBlockSize + tail_lens[s].
  // Other entries are unchanged. Requires n + nt <= block_tables.dim(2).
  virtual void AssembleSparseTables(const Tensor& seq_rows,        // [S] int32, -1 = dense
                                    const Tensor& resident_slots,  // [R, Hkv, K] int32
                                    const Tensor& num_resident,    // [R, Hkv] int32
                                    const Tensor& tail_slots,      // [S, Hkv, 2] int32
                                    const Tensor& tail_lens,       // [S] int32 in [1, 2*kBlockSize]
                                    AttentionMetadata& meta) = 0;  // block_tables, kv_lens updated

  // Measurement of a predictor: for each active row r (rows[r] >= 0) and head h,
  // counts[r, h, 0] += |{non-negative entries of predicted[r, h]} ∩ {those of actual[r, h]}|,
  // counts[r, h, 1] += |{non-negative entries of actual[r, h]}|.
  virtual void TopKOverlap(const Tensor& predicted,  // [R, Hkv, K] int32
                           const Tensor& actual,     // [R, Hkv, K] int32
                           const Tensor& rows,       // [R] int32, -1 = inactive
                           Tensor& counts) = 0;      // [R, Hkv, 2] int32, accumulated

  // Measurement of the fetches (the adaptive budget's "fetched block used" signal, docs/sparse.md
  // §13): for each active row r and head h, the blocks the last SelectBlocks fetched — working
  // slot j with ws_slots[r, h, j] == fetch_dst[r, h, i] >= 0 holds block ws_blocks[r, h, j] —
  // counts[r, h, 0] += |{those blocks} ∩ {non-negative entries of actual[r, h]}|,
  // counts[r, h, 1] += |{i : fetch_dst[r, h, i] >= 0}|.
  virtual void FetchOverlap(const Tensor& fetch_dst,  // [R, Hkv, C] int32, -1 = none
                            const Tensor& ws_slots,   // [R, Hkv, K] int32
                            const Tensor& ws_blocks,  // [R, Hkv, K] int32
                            const Tensor& actual,     // [R, Hkv, K] int32
                            const Tensor& rows,       // [R] int32, -1 = inactive
                            Tensor& counts) = 0;      // [R, Hkv, 2] int32, accumulated
};

// The element type of a model's KV pools on `backend`: F8E4M3 for an FP8 KV cache
// (ModelConfig::kv_cache_fp8), else the activation dtype.
inline DType KvCacheDtype(const Backend& backend, bool fp8) {
  return fp8 ? DType::kF8E4M3 : backend.activation_dtype();
}

}  // namespace oasis

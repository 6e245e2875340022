// CudaBackend: the Backend op set on one NVIDIA GPU, bf16 activations and KV, float
// accumulation. Kernels live in kernels/ (one file per op family); GEMMs go through cuBLAS.
//
// Owns a CUDA stream, a cuBLAS handle and the device copies of RoPE tables it caches.
// Tensors it returns are allocated stream-ordered (cudaMallocAsync) and freed on the same
// stream when their last view goes away, so the backend must outlive them. All work is
// queued on the backend's stream; Download() synchronises it. Used by one thread at a time.
#pragma once

#include <cublas_v2.h>

#include <map>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_fp8_linear.h"
#include "backend/cuda/kernel_shapes.h"
#include "common/cuda_rt.h"
#include "kernels/rope.h"
#include "kernels/sparse_kv.h"

namespace oasis {

class CudaBackend final : public Backend {
 public:
  // Uses the current CUDA device. Fails when no device is present.
  static StatusOr<std::unique_ptr<CudaBackend>> Create();
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }
  // CheckCudaKernelShapes (kernel_shapes.h): refuses what the kernels cannot compute.
  Status CheckModelShapes(const ModelConfig& config, int tp_size) const override {
    return CheckCudaKernelShapes(config, tp_size);
  }
  // The stream ops are enqueued on: the backend's own, or the one UseStream selected.
  cudaStream_t stream() const { return override_ != nullptr ? override_ : stream_.get(); }
  // Enqueues the following ops (and cuBLAS calls) on `s` until UseStream(nullptr) returns to
  // the backend's own stream (the sparse pipeline's side streams; the caller orders them
  // with events).
  void UseStream(cudaStream_t s);
  void Synchronize() const { stream_.Synchronize(); }

  // Background copies: a stream of the device's least priority; one batch (Begin..End) at a
  // time. Uploads inside a batch go through a pinned buffer of their own (no synchronisation:
  // Begin waits, on the host, for the previous batch, which a join per engine step has
  // normally let finish long before).
  void BeginBackground() override;
  void EndBackground() override;
  void JoinBackground() override;
  double TakeBackgroundSeconds() override;

  Tensor Empty(std::vector<int64_t> shape, DType dtype) override;
  // Frees the device allocations released while their stream was capturing a graph (they wait
  // for the capture to end); Empty() calls it, and so does the end of a capture.
  void FreeDeferred();

  // While an arena is active, Empty() hands out successive 256-byte-aligned pieces of
  // [base, base + bytes) instead of allocating (nothing is freed): the same sequence of
  // calls yields the same addresses, which CUDA graph capture and replay rely on.
  // Running out of arena is a CHECK failure.
  void BeginArena(void* base, size_t bytes);
  // Ends the arena; returns the bytes it handed out.
  size_t EndArena();
  // Large tensors go through two pinned staging buffers (host copy of chunk i+1 overlaps the
  // DMA of chunk i); returns once the data is on the device.
  Tensor Upload(const Tensor& host) override;
  Tensor Download(const Tensor& device_tensor) override;
  // Small tensors (up to 2 MiB, on the backend's own stream) go through a pinned ring: a host
  // memcpy and an asynchronous DMA, no synchronisation; others as Upload.
  Tensor UploadAsync(const Tensor& host) override;
  void UploadAsyncInto(Tensor& dst, const Tensor& host) override;
  void UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) override;

  // F32, BF16, or F8E4M3 (the F32 values converted, RNE saturating).
  void FillNormal(Tensor& t, uint64_t seed, float stddev) override;
  void Fill(Tensor& t, float value) override;
  void Embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void AddRmsNorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                  Tensor& out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override;
  // bf16 inputs; `out` may be BF16 or F32 (float logits). An F8E4M3 weight with 128×128 block
  // scales (Fp8WeightSupported) goes to CudaFp8Linear (cuda_fp8_linear.h): the FP8 GEMV for
  // decode rows, cuBLASLt's block-scaled FP8 GEMM with per-token activation quantization beyond.
  void Linear(const Tensor& x, const Tensor& weight, Tensor& out) override;
  // Block 128×128, out % 128 == 0, in % 512 == 0 and cuBLASLt's block-scaled FP8 GEMM available
  // for the shape on this GPU (CudaFp8Linear::Supported; probed once per shape). The fused ops
  // run their unfused composition (norm kernels + Linear) with such weights.
  bool Fp8WeightSupported(int64_t out, int64_t in, int block_out, int block_in) const override {
    return fp8_linear_->Supported(out, in, block_out, block_in, stream());
  }
  // The FP8-weight Linear's implementation (tests and benchmarks force its paths).
  CudaFp8Linear& fp8_linear() { return *fp8_linear_; }
  void QkNormRope(Tensor& q, Tensor& k, const Tensor* q_norm, const Tensor* k_norm, float eps,
                  const Tensor& positions, const RopeParams& rope) override;
  void SiluMul(const Tensor& gate_up, Tensor& out) override;
  void KvAppend(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                LayerKvPool& pool) override;
  void Attention(const Tensor& q, const LayerKvPool& pool, const AttentionMetadata& meta,
                 float scale, Tensor& out) override;
  void SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) override;
  void QkvRopeAppend(const Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                     float eps, const Tensor& positions, const RopeParams& rope,
                     const Tensor& slot_mapping, LayerKvPool& pool) override;
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void ScatterRows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void Copy(const Tensor& src, Tensor& dst) override;
  // Mixture of experts (cuda_moe.cpp, kernels/moe.h): the router GEMM into float logits and
  // the top-k kernel; the experts by
  // the grouped GEMV (batches of at most kernels::kMoeGemvAutoPairs token-expert pairs) or the
  // permuted grouped GEMM (larger), then the combine in slot order. Graph-capturable; scratch from
  // Empty() (the arena while capturing).
  void MoeRoute(const Tensor& x, const Tensor& router, int64_t k, MoeTopKWeights weights,
                Tensor& expert_ids, Tensor& expert_weights) override;
  // Decode batches (up to kGemvMaxRows tokens): the add + norm inside the router's GEMV (it
  // writes `normed` too), then the top-k; larger ones the add + norm kernel, then MoeRoute.
  void AddRmsNormMoeRoute(const Tensor& x, const Tensor& residual, Tensor& residual_out,
                          const Tensor& norm_weight, float eps, const Tensor& router, int64_t k,
                          MoeTopKWeights weights, Tensor& normed, Tensor& expert_ids,
                          Tensor& expert_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                  const Tensor& gate_up, const Tensor& down, Tensor& out) override;
  // Which expert path MoeExperts takes: by the batch size (kAuto), or forced (tests, benchmarks;
  // kGemv needs tokens · k <= kernels::kMoeGemvMaxPairs). The GEMV path fuses the down
  // projection with the combine up to kernels::kMoeFusedDownPairs pairs. kUnfused chooses the
  // path as kAuto but without the fused decode kernels — MoeRoute's router GEMM and top-k, the
  // GEMV's gate/up, grouped down and combine, each its own launch — for comparisons.
  enum class MoePath : uint8_t { kAuto, kGemv, kGemm, kUnfused };
  void set_moe_path(MoePath path) { moe_path_ = path; }
  // Device scratch one MoE layer takes from Empty() for a batch of `tokens` tokens of a model of
  // `config` (its local sizes): the router logits and the larger path's buffers. The CUDA graph
  // runner adds it per layer to its activation arena. 0 for a model without MoE layers.
  static size_t MoeScratchBytes(const ModelConfig& config, int64_t tokens);

  // Decode batches (1..4 rows) run one fused kernel (kernels/gemv.h LaunchGemvRmsNorm).
  void AddRmsNormLinear(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                        const Tensor& norm_weight, float eps, const Tensor& weight,
                        Tensor& out) override;
  // Decode batches: the gate/up GEMV writes SiLU(gate)·up directly (LaunchGemvRmsNormSiluMul).
  void AddRmsNormGateUpSilu(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                            const Tensor& norm_weight, float eps, const Tensor& gate_up_weight,
                            Tensor& out) override;
  // Decode batches: one launch for the QKV GEMV and the heads' norm/RoPE/append
  // (LaunchGemvRmsNormQkvRope).
  void AddRmsNormQkvRopeAppend(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                               const Tensor& norm_weight, float eps, const Tensor& qkv_weight,
                               Tensor& qkv, Tensor& q, const Tensor* q_norm, const Tensor* k_norm,
                               const Tensor& positions, const RopeParams& rope,
                               const Tensor& slot_mapping, LayerKvPool& pool) override;

  // Sparse KV ops (cuda_sparse.cpp, kernels/sparse_kv.h): the semantics of backend.h; pools,
  // summaries and queries are bf16; EmptyHost is mapped pinned memory kernels read over PCIe.
  Tensor EmptyHost(std::vector<int64_t> shape, DType dtype) override;
  void BlockSummaries(const LayerKvPool& pool, const Tensor& src_slots, const Tensor& num_tokens,
                      const Tensor& dst_rows, Tensor& kmin, Tensor& kmax) override;
  void ScoreBlocks(const Tensor& q, const Tensor& query_rows, const Tensor& num_blocks,
                   const Tensor& host_tables, const Tensor& kmin, const Tensor& kmax,
                   GroupReduce reduce, Tensor& scores) override;
  void TopKBlocks(const Tensor& scores, const Tensor& rows, const Tensor& num_blocks,
                  Tensor& topk) override;
  void WriteIndexed(const Tensor& values, const Tensor& index, Tensor& out) override;
  void SelectBlocks(const Tensor& topk, const Tensor& rows, const Tensor& host_tables,
                    const Tensor& ws_slots, Tensor& ws_blocks, Tensor& ws_age, Tensor& fetch_src,
                    Tensor& fetch_dst, Tensor& resident_slots, Tensor& num_resident, Tensor& stats,
                    const Tensor* remote = nullptr, Tensor* remote_out = nullptr,
                    int32_t in_place_base = INT32_MAX, const Tensor* fetch_cap = nullptr) override;
  // CTAs of the UVA gather (CopyBlocks): OASIS_GATHER_CTAS, else kDefaultGatherCtas (GetTuning()).
  static constexpr int kDefaultGatherCtas = oasis::kDefaultGatherCtas;
  static int GatherCtas();
  // The gather's kernel (CopyBlocks): OASIS_GATHER_KERNEL=tma (default) or registers (GetTuning()).
  static kernels::GatherKernel GatherKernelChoice();
  void CopyBlocks(const LayerKvPool& src, const Tensor& src_slots, LayerKvPool& dst,
                  const Tensor& dst_slots) override;
  void CopyTokens(const LayerKvPool& src, const Tensor& src_index, LayerKvPool& dst,
                  const Tensor& dst_index) override;
  void AssembleSparseTables(const Tensor& seq_rows, const Tensor& resident_slots,
                            const Tensor& num_resident, const Tensor& tail_slots,
                            const Tensor& tail_lens, AttentionMetadata& meta) override;
  void TopKOverlap(const Tensor& predicted, const Tensor& actual, const Tensor& rows,
                   Tensor& counts) override;
  void FetchOverlap(const Tensor& fetch_dst, const Tensor& ws_slots, const Tensor& ws_blocks,
                    const Tensor& actual, const Tensor& rows, Tensor& counts) override;
  void PrepareRope(const RopeParams& rope) override;

 private:
  CudaBackend() = default;
  const float* DeviceInvFreq(const RopeParams& rope);
  // The top-k of float router logits [tokens, experts] into the routing tensors (MoeRoute's
  // second launch, shared by AddRmsNormMoeRoute's fused path).
  void MoeTopKFromLogits(const Tensor& logits, int64_t k, MoeTopKWeights weights,
                         Tensor& expert_ids, Tensor& expert_weights);
  // Whether the norm-fused GEMV kernels take these operands (bf16, aligned, 1..4 rows).
  bool NormGemvFusable(const Tensor* x, const Tensor& residual, const Tensor* residual_out,
                       const Tensor& norm_weight, const Tensor& weight) const;
  kernels::QkvRopeAppendParams QkvParams(const Tensor& qkv, Tensor& q, const Tensor* q_norm,
                                         const Tensor* k_norm, float eps, const Tensor& positions,
                                         const RopeParams& rope, const Tensor& slot_mapping,
                                         LayerKvPool& pool);

  cuda::Stream stream_;
  cudaStream_t override_ = nullptr;  // UseStream
  MoePath moe_path_ = MoePath::kAuto;
  // Background copies (BeginBackground): created at the first batch.
  struct Background {
    cuda::Stream stream;  // the default priority: the device's least
    cuda::Event main_ready;
    cuda::Event start{cuda::EventTiming::kEnabled}, done{cuda::EventTiming::kEnabled};
    cuda::PinnedBuffer uploads;  // this batch's index uploads
    size_t uploads_used = 0;
    bool active = false;    // between Begin and End
    bool unjoined = false;  // a batch the main stream has not waited for
    bool untimed = false;   // a finished batch whose time is not counted yet
    double seconds = 0.0;
  };
  std::unique_ptr<Background> background_;
  void BackgroundUpload(Tensor& dst, const Tensor& host);
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaFp8Linear> fp8_linear_;  // FP8-weight Linear (cuBLASLt handle, scratch)
  cuda::DeviceBuffer cublas_workspace_;        // fixed, so cuBLAS never allocates inside a graph
  cuda::DeviceBuffer qkv_counters_;  // [kGemvQkvMaxHeads] int32, zero between fused QKV launches
  // Double-buffered pinned staging for large uploads (weights): allocated on first use.
  cuda::PinnedBuffer staging_[2];
  cuda::Event staging_free_[2];
  // UploadAsync's pinned ring: two halves filled in turn; a half is reused after the event
  // recorded when it was left (every DMA out of it enqueued before) has completed.
  cuda::PinnedBuffer async_staging_;
  cuda::Event async_free_[2];
  int async_half_ = 0;
  size_t async_used_ = 0;
  char* arena_base_ = nullptr;
  size_t arena_size_ = 0;
  size_t arena_used_ = 0;
  std::map<std::vector<float>, Tensor> inv_freq_;  // device copies of RoPE tables, by content
};

}  // namespace oasis

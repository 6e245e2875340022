// CpuBackend: the reference implementation of the Backend op set, plain float32 C++.
// It is the ground truth the CUDA backend is tested against and the CI path. Clarity
// first; loops are ordered for contiguous access and Linear is split over a few threads.
// Owns nothing but its settings; used by one thread at a time.
#pragma once

#include "backend/backend.h"

namespace oasis {

// Whether the CPU backend computes with e4m3 weights (Fp8WeightSupported): kCompute (the
// default) for every shape and block size; kDequantizeAtLoad answers false, so models
// dequantize FP8 checkpoints when loading, as for a backend without e4m3 GEMMs (tests compare
// the two; they give bit-identical results).
enum class CpuFp8Weights { kCompute, kDequantizeAtLoad };

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0: use the hardware concurrency (at most 8).
  explicit CpuBackend(int num_threads = 0, CpuFp8Weights fp8_weights = CpuFp8Weights::kCompute);

  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }
  Tensor Empty(std::vector<int64_t> shape, DType dtype) override;
  Tensor Upload(const Tensor& host) override { return host; }
  Tensor Download(const Tensor& t) override { return t; }
  void UploadBytes(Tensor& dst, size_t offset, const void* src, size_t bytes) override;

  void FillNormal(Tensor& t, uint64_t seed, float stddev) override;
  void Fill(Tensor& t, float value) override;
  void Embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void AddRmsNorm(const Tensor& x, Tensor& residual, const Tensor& weight, float eps,
                  Tensor& out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override;
  // Linear takes F32 weights, or F8E4M3 weights with block scales (an FP8 checkpoint's weights
  // kept in e4m3): those compute exactly as their dequantized F32 copy (float(e4m3) * scale).
  bool Fp8WeightSupported(int64_t out, int64_t in, int block_out, int block_in) const override;
  void Linear(const Tensor& x, const Tensor& weight, Tensor& out) override;
  void QkNormRope(Tensor& q, Tensor& k, const Tensor* q_norm, const Tensor* k_norm, float eps,
                  const Tensor& positions, const RopeParams& rope) override;
  void SiluMul(const Tensor& gate_up, Tensor& out) override;
  void KvAppend(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                LayerKvPool& pool) override;
  void Attention(const Tensor& q, const LayerKvPool& pool, const AttentionMetadata& meta,
                 float scale, Tensor& out) override;
  void SplitQkv(const Tensor& qkv, Tensor& q, Tensor& k, Tensor& v) override;
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void ScatterRows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void Copy(const Tensor& src, Tensor& dst) override;

  // Mixture-of-experts ops (cpu_moe.cpp): a per-expert loop over the tokens routed to it.
  void MoeRoute(const Tensor& x, const Tensor& router, int64_t k, MoeTopKWeights weights,
                Tensor& expert_ids, Tensor& expert_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                  const Tensor& gate_up, const Tensor& down, Tensor& out) override;

  // Sparse KV ops (cpu_sparse.cpp): the reference semantics documented in backend.h.
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

 private:
  // Linear with an F8E4M3 weight: dequantizes a tile of weight rows at a time.
  void LinearFp8(const Tensor& x, const Tensor& weight, Tensor& out);

  int num_threads_;
  CpuFp8Weights fp8_weights_;
};

}  // namespace oasis

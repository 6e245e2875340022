// CpuBackend: the reference implementation of the Backend op set, plain float32 C++.
// It is the ground truth the CUDA backend is tested against and the CI path. Clarity
// first; loops are ordered for contiguous access and Linear is split over a few threads.
// Owns nothing but its thread count; used by one thread at a time.
#pragma once

#include "backend/backend.h"

namespace oasis {

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0: use the hardware concurrency (at most 8).
  explicit CpuBackend(int num_threads = 0);

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

 private:
  int num_threads_;
};

}  // namespace oasis

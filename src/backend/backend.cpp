#include <cmath>

#include "backend/backend.h"

#include "common/check.h"

namespace oasis {

float HashNormal(uint64_t seed, uint64_t index) {
  auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  const uint64_t r = mix(seed ^ mix(index));
  const float u1 = (static_cast<float>(r >> 40) + 0.5f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

void Backend::QkvRopeAppend(const Tensor& qkv, Tensor& q, const Tensor* q_norm,
                            const Tensor* k_norm, float eps, const Tensor& positions,
                            const RopeParams& rope, const Tensor& slot_mapping, LayerKvPool& pool) {
  const int64_t T = q.dim(0), hkv = slot_mapping.dim(1), d = q.dim(2);
  Tensor k = Empty({T, hkv, d}, q.dtype()), v = Empty({T, hkv, d}, q.dtype());
  SplitQkv(qkv, q, k, v);
  QkNormRope(q, k, q_norm, k_norm, eps, positions, rope);
  KvAppend(k, v, slot_mapping, pool);
}

void Backend::SiluMulLinear(const Tensor& gate_up, const Tensor& weight, Tensor& out) {
  Tensor act = Empty({gate_up.dim(0), gate_up.dim(1) / 2}, gate_up.dtype());
  SiluMul(gate_up, act);
  Linear(act, weight, out);
}

void Backend::AddRmsNormLinear(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                               const Tensor& norm_weight, float eps, const Tensor& weight,
                               Tensor& out) {
  OASIS_CHECK((x == nullptr) == (residual_out == nullptr))
      << "AddRmsNormLinear: residual_out goes with x";
  Tensor normed = Empty(residual.shape(), residual.dtype());
  if (x != nullptr) {
    OASIS_CHECK(residual_out->raw() != residual.raw())
        << "AddRmsNormLinear: residual_out aliases residual";
    Add(residual, *x, *residual_out);
    RmsNorm(*residual_out, norm_weight, eps, normed);
  } else {
    RmsNorm(residual, norm_weight, eps, normed);
  }
  Linear(normed, weight, out);
}

void Backend::AddRmsNormGateUpSilu(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                                   const Tensor& norm_weight, float eps,
                                   const Tensor& gate_up_weight, Tensor& out) {
  const int64_t rows = residual.numel() / gate_up_weight.dim(1);
  Tensor gate_up = Empty({rows, gate_up_weight.dim(0)}, out.dtype());
  AddRmsNormLinear(x, residual, residual_out, norm_weight, eps, gate_up_weight, gate_up);
  SiluMul(gate_up, out);
}

void Backend::AddRmsNormQkvRopeAppend(const Tensor* x, const Tensor& residual, Tensor* residual_out,
                                      const Tensor& norm_weight, float eps,
                                      const Tensor& qkv_weight, Tensor& qkv, Tensor& q,
                                      const Tensor* q_norm, const Tensor* k_norm,
                                      const Tensor& positions, const RopeParams& rope,
                                      const Tensor& slot_mapping, LayerKvPool& pool) {
  AddRmsNormLinear(x, residual, residual_out, norm_weight, eps, qkv_weight, qkv);
  QkvRopeAppend(qkv, q, q_norm, k_norm, eps, positions, rope, slot_mapping, pool);
}

void Backend::AddRmsNormMoeRoute(const Tensor& x, const Tensor& residual, Tensor& residual_out,
                                 const Tensor& norm_weight, float eps, const Tensor& router,
                                 int64_t k, MoeTopKWeights weights, Tensor& normed,
                                 Tensor& expert_ids, Tensor& expert_weights) {
  OASIS_CHECK(residual_out.raw() != residual.raw())
      << "AddRmsNormMoeRoute: residual_out aliases residual";
  Add(residual, x, residual_out);
  RmsNorm(residual_out, norm_weight, eps, normed);
  MoeRoute(normed, router, k, weights, expert_ids, expert_weights);
}

}  // namespace oasis

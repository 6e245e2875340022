// CpuBackend: the mixture-of-experts reference ops (routing, weighted experts), float32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"

namespace oasis {
namespace {

void CheckF32(const Tensor& t, const char* what) {
  OASIS_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu)
      << what << " must be a host F32 tensor, got " << t.ToString();
}

}  // namespace

void CpuBackend::MoeRoute(const Tensor& x, const Tensor& router, int64_t k, MoeTopKWeights weights,
                          Tensor& expert_ids, Tensor& expert_weights) {
  CheckF32(x, "MoeRoute x");
  CheckF32(router, "MoeRoute router");
  CheckF32(expert_weights, "MoeRoute expert_weights");
  OASIS_CHECK(expert_ids.dtype() == DType::kI32) << "MoeRoute expert_ids " << expert_ids.ToString();
  OASIS_CHECK_EQ(router.ndim(), 2) << "MoeRoute router " << router.ToString();
  const int64_t num_experts = router.dim(0), hidden = router.dim(1);
  OASIS_CHECK(k >= 1 && k <= num_experts) << "MoeRoute k " << k << " of " << num_experts;
  OASIS_CHECK_EQ(x.dim(-1), hidden) << "MoeRoute x " << x.ToString();
  const int64_t tokens = x.numel() / hidden;
  OASIS_CHECK(expert_ids.numel() == tokens * k && expert_weights.numel() == tokens * k)
      << "MoeRoute outputs " << expert_ids.ToString() << ", " << expert_weights.ToString()
      << " for " << tokens << " tokens, k " << k;
  Tensor logits = Tensor::Empty({tokens, num_experts}, DType::kF32);
  Linear(x.Reshape({tokens, hidden}), router, logits);
  std::vector<float> p(static_cast<size_t>(num_experts));
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits.data<float>() + t * num_experts;
    const float max = *std::max_element(l, l + num_experts);
    float sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) sum += (p[e] = std::exp(l[e] - max));
    for (int64_t e = 0; e < num_experts; ++e) p[e] /= sum;
    // Descending probability; equal ones keep the lower expert index first.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    int32_t* ids = expert_ids.data<int32_t>() + t * k;
    float* w = expert_weights.data<float>() + t * k;
    float chosen = 0;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = order[j];
      w[j] = p[order[j]];
      chosen += w[j];
    }
    if (weights == MoeTopKWeights::kRenormalized) {
      for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
    }
  }
}

void CpuBackend::MoeExperts(const Tensor& x, const Tensor& expert_ids, const Tensor& expert_weights,
                            const Tensor& gate_up, const Tensor& down, Tensor& out) {
  CheckF32(x, "MoeExperts x");
  CheckF32(expert_weights, "MoeExperts expert_weights");
  CheckF32(gate_up, "MoeExperts gate_up");
  CheckF32(down, "MoeExperts down");
  CheckF32(out, "MoeExperts out");
  OASIS_CHECK(expert_ids.dtype() == DType::kI32) << "MoeExperts expert_ids";
  OASIS_CHECK(gate_up.ndim() == 3 && down.ndim() == 3)
      << "MoeExperts weights " << gate_up.ToString() << ", " << down.ToString();
  const int64_t num_experts = gate_up.dim(0), inter = gate_up.dim(1) / 2, hidden = gate_up.dim(2);
  OASIS_CHECK(down.shape() == (std::vector<int64_t>{num_experts, hidden, inter}))
      << "MoeExperts down " << down.ToString() << " vs gate_up " << gate_up.ToString();
  const int64_t tokens = x.numel() / hidden;
  OASIS_CHECK(x.dim(-1) == hidden && out.numel() == tokens * hidden)
      << "MoeExperts x " << x.ToString() << " out " << out.ToString();
  const int64_t k = tokens > 0 ? expert_ids.numel() / tokens : 0;
  OASIS_CHECK(expert_ids.numel() == tokens * k && expert_weights.numel() == tokens * k)
      << "MoeExperts routing " << expert_ids.ToString() << " for " << tokens << " tokens";

  // Permute: the (token, slot) pairs of each expert, in token order.
  std::vector<std::vector<int64_t>> assigned(static_cast<size_t>(num_experts));
  for (int64_t i = 0; i < tokens * k; ++i) {
    const int32_t e = expert_ids.data<int32_t>()[i];
    OASIS_CHECK(e >= 0 && e < num_experts) << "MoeExperts expert id " << e << " of " << num_experts;
    assigned[static_cast<size_t>(e)].push_back(i);
  }
  // Each pair's expert output (unweighted), then the weighted sum per token in slot order, so
  // a token's result does not depend on the other tokens of the batch.
  Tensor y = Tensor::Empty({tokens * k, hidden}, DType::kF32);
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::vector<int64_t>& pairs = assigned[static_cast<size_t>(e)];
    if (pairs.empty()) continue;
    const int64_t n = static_cast<int64_t>(pairs.size());
    Tensor rows = Tensor::Empty({n, hidden}, DType::kF32);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(rows.data<float>() + r * hidden, x.data<float>() + (pairs[r] / k) * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
    }
    Tensor h = Tensor::Empty({n, 2 * inter}, DType::kF32);
    Linear(rows, gate_up.Slice(e, e + 1).Reshape({2 * inter, hidden}), h);
    Tensor act = Tensor::Empty({n, inter}, DType::kF32);
    SiluMul(h, act);
    Tensor expert_out = Tensor::Empty({n, hidden}, DType::kF32);
    Linear(act, down.Slice(e, e + 1).Reshape({hidden, inter}), expert_out);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(y.data<float>() + pairs[r] * hidden, expert_out.data<float>() + r * hidden,
                  static_cast<size_t>(hidden) * sizeof(float));
    }
  }
  float* o = out.data<float>();
  std::fill(o, o + tokens * hidden, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const float w = expert_weights.data<float>()[t * k + j];
      const float* src = y.data<float>() + (t * k + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[t * hidden + i] += w * src[i];
    }
  }
}

}  // namespace oasis

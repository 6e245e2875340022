// CudaBackend: the mixture-of-experts ops (docs/moe.md) on kernels/moe.h. Routing: the router
// GEMM through Linear into float logits, then the top-k kernel (one fused kernel for a few
// tokens). Experts: the grouped GEMV for small batches (gate/up per pair and down + combine fused
// for the smallest), the permutation plan + grouped GEMMs for large ones, then the slot-order
// combine.
// Every launch is on stream() with device-side sizes only: graph-capturable. Scratch comes from
// Empty(), so inside a graph capture from the runner's arena (MoeScratchBytes sizes it).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "common/check.h"
#include "kernels/gemv.h"
#include "kernels/moe.h"
#include "kernels/norm.h"

namespace oasis {
namespace {

void CheckDevice(const Tensor& t, DType dtype, const char* what) {
  OASIS_CHECK(t.device() == Device::kCuda && t.dtype() == dtype)
      << what << ": expected a device " << DTypeName(dtype) << " tensor, got " << t.ToString()
      << (t.device() == Device::kCpu ? " on the host" : "");
}

template <typename T = __nv_bfloat16>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

static_assert(kCudaMoeMaxExperts == kernels::kMoeMaxExperts &&
                  kCudaMoeDimMultiple == kernels::kMoeDimMultiple,
              "kernel_shapes.h states the MoE kernels' limits");

size_t Aligned(size_t bytes) { return (std::max<size_t>(bytes, 16) + 255) / 256 * 256; }

}  // namespace

size_t CudaBackend::MoeScratchBytes(const ModelConfig& c, int64_t tokens) {
  if (!c.HasMoeLayers() || tokens <= 0) return 0;
  const int64_t e = c.num_experts, k = c.num_experts_per_tok, pairs = tokens * k, h = c.hidden_size,
                mi = c.moe_intermediate_size;
  const size_t route = Aligned(tokens * e * 4);  // float logits
  const size_t gemv = Aligned(pairs * mi * 2) + Aligned(pairs * h * 4);
  const size_t gemm = Aligned(kernels::MoePlanInts(pairs, static_cast<int>(e)) * 4) +
                      Aligned(pairs * mi * 2) + Aligned(pairs * h * 2);
  return route + std::max(gemv, gemm);
}

void CudaBackend::MoeRoute(const Tensor& x, const Tensor& router, int64_t k, MoeTopKWeights weights,
                           Tensor& expert_ids, Tensor& expert_weights) {
  CheckDevice(x, DType::kBF16, "MoeRoute x");
  CheckDevice(router, DType::kBF16, "MoeRoute router");
  OASIS_CHECK_EQ(router.ndim(), 2) << "MoeRoute router " << router.ToString();
  const int64_t experts = router.dim(0), hidden = router.dim(1);
  OASIS_CHECK(k >= 1 && k <= experts && experts <= kernels::kMoeMaxExperts)
      << "MoeRoute k " << k << " of " << experts << " experts (at most " << kernels::kMoeMaxExperts
      << ")";
  OASIS_CHECK_EQ(x.dim(-1), hidden) << "MoeRoute x " << x.ToString();
  const int64_t tokens = x.numel() / hidden;
  OASIS_CHECK(expert_ids.numel() == tokens * k && expert_weights.numel() == tokens * k)
      << "MoeRoute outputs " << expert_ids.ToString() << ", " << expert_weights.ToString()
      << " for " << tokens << " tokens, k " << k;
  if (tokens == 0) return;
  Tensor logits = Empty({tokens, experts}, DType::kF32);
  // A one-launch router GEMV + top-k (the last CTA routing) measured slower on the H200 than
  // these two launches at every decode size (1 token 12.1 vs 7.7 us, 8 tokens 27.6 vs 17.4 us):
  // its one-warp-per-expert GEMV and serial tail lose more than the launch saves (removed).
  // The plain GEMV whose sums equal the norm-fused router GEMV's (AddRmsNormMoeRoute), where
  // a tuning knob makes them differ from Linear's choice.
  if (const kernels::GemvConfig config = kernels::GemvConfigMatchingNorm(tokens, hidden);
      config != kernels::GemvConfig::kAuto &&
      kernels::GemvSupported(tokens, hidden, x.raw(), router.raw())) {
    OASIS_CUDA_CHECK(kernels::LaunchGemvWith(config, Ptr(x), Ptr(router), nullptr,
                                             Ptr<float>(logits), tokens, hidden, experts,
                                             stream()));
  } else {
    Linear(x.Reshape({tokens, hidden}), router, logits);
  }
  MoeTopKFromLogits(logits, k, weights, expert_ids, expert_weights);
}

void CudaBackend::MoeTopKFromLogits(const Tensor& logits, int64_t k, MoeTopKWeights weights,
                                    Tensor& expert_ids, Tensor& expert_weights) {
  CheckDevice(expert_ids, DType::kI32, "MoeRoute expert_ids");
  CheckDevice(expert_weights, DType::kF32, "MoeRoute expert_weights");
  OASIS_CUDA_CHECK(
      kernels::LaunchMoeTopK(Ptr<float>(logits), logits.dim(0), static_cast<int>(logits.dim(1)),
                             static_cast<int>(k), weights == MoeTopKWeights::kRenormalized,
                             Ptr<int32_t>(expert_ids), Ptr<float>(expert_weights), stream()));
}

void CudaBackend::AddRmsNormMoeRoute(const Tensor& x, const Tensor& residual, Tensor& residual_out,
                                     const Tensor& norm_weight, float eps, const Tensor& router,
                                     int64_t k, MoeTopKWeights weights, Tensor& normed,
                                     Tensor& expert_ids, Tensor& expert_weights) {
  CheckDevice(x, DType::kBF16, "AddRmsNormMoeRoute x");
  CheckDevice(residual, DType::kBF16, "AddRmsNormMoeRoute residual");
  CheckDevice(residual_out, DType::kBF16, "AddRmsNormMoeRoute residual_out");
  CheckDevice(norm_weight, DType::kBF16, "AddRmsNormMoeRoute norm_weight");
  CheckDevice(normed, DType::kBF16, "AddRmsNormMoeRoute normed");
  CheckDevice(router, DType::kBF16, "AddRmsNormMoeRoute router");
  OASIS_CHECK_EQ(router.ndim(), 2) << "AddRmsNormMoeRoute router " << router.ToString();
  const int64_t experts = router.dim(0), hidden = router.dim(1);
  const int64_t tokens = residual.numel() / hidden;
  OASIS_CHECK(x.numel() == residual.numel() && residual_out.numel() == residual.numel() &&
              normed.numel() == residual.numel() && residual.dim(-1) == hidden)
      << "AddRmsNormMoeRoute x " << x.ToString() << ", residual " << residual.ToString()
      << ", residual_out " << residual_out.ToString() << ", normed " << normed.ToString();
  OASIS_CHECK(residual_out.raw() != residual.raw() && residual_out.raw() != x.raw())
      << "AddRmsNormMoeRoute: residual_out aliases an input";
  OASIS_CHECK(k >= 1 && k <= experts && experts <= kernels::kMoeMaxExperts)
      << "AddRmsNormMoeRoute k " << k << " of " << experts << " experts";
  OASIS_CHECK(expert_ids.numel() == tokens * k && expert_weights.numel() == tokens * k)
      << "AddRmsNormMoeRoute outputs " << expert_ids.ToString() << ", "
      << expert_weights.ToString();
  if (tokens == 0) return;
  if (moe_path_ != MoePath::kUnfused && reinterpret_cast<uintptr_t>(normed.raw()) % 16 == 0 &&
      NormGemvFusable(&x, residual, &residual_out, norm_weight, router)) {
    Tensor logits = Empty({tokens, experts}, DType::kF32);
    OASIS_CUDA_CHECK(kernels::LaunchGemvRmsNorm(
        Ptr(x), Ptr(residual), Ptr(residual_out), Ptr(norm_weight), eps, Ptr(router), nullptr,
        Ptr<float>(logits), tokens, hidden, experts, stream(), Ptr(normed)));
    MoeTopKFromLogits(logits, k, weights, expert_ids, expert_weights);
    return;
  }
  OASIS_CUDA_CHECK(kernels::LaunchAddRmsNorm(Ptr(x), Ptr(residual), Ptr(residual_out),
                                             Ptr(norm_weight), Ptr(normed), tokens, hidden, eps,
                                             stream()));
  MoeRoute(normed, router, k, weights, expert_ids, expert_weights);
}

void CudaBackend::MoeExperts(const Tensor& x, const Tensor& expert_ids,
                             const Tensor& expert_weights, const Tensor& gate_up,
                             const Tensor& down, Tensor& out) {
  CheckDevice(x, DType::kBF16, "MoeExperts x");
  CheckDevice(expert_ids, DType::kI32, "MoeExperts expert_ids");
  CheckDevice(expert_weights, DType::kF32, "MoeExperts expert_weights");
  CheckDevice(gate_up, DType::kBF16, "MoeExperts gate_up");
  CheckDevice(down, DType::kBF16, "MoeExperts down");
  CheckDevice(out, DType::kBF16, "MoeExperts out");
  OASIS_CHECK(gate_up.ndim() == 3 && down.ndim() == 3)
      << "MoeExperts weights " << gate_up.ToString() << ", " << down.ToString();
  const int64_t experts = gate_up.dim(0), inter = gate_up.dim(1) / 2, hidden = gate_up.dim(2);
  OASIS_CHECK(down.shape() == (std::vector<int64_t>{experts, hidden, inter}))
      << "MoeExperts down " << down.ToString() << " vs gate_up " << gate_up.ToString();
  const int64_t tokens = x.numel() / hidden;
  OASIS_CHECK(x.dim(-1) == hidden && out.numel() == tokens * hidden)
      << "MoeExperts x " << x.ToString() << " out " << out.ToString();
  if (tokens == 0) return;
  const int64_t k = expert_ids.numel() / tokens;
  OASIS_CHECK(expert_ids.numel() == tokens * k && expert_weights.numel() == tokens * k)
      << "MoeExperts routing " << expert_ids.ToString() << " for " << tokens << " tokens";
  OASIS_CHECK(kernels::MoeSupported(hidden, inter, experts, k))
      << "MoeExperts: hidden " << hidden << ", I " << inter << ", " << experts << " experts, k "
      << k << " are not computed by the CUDA kernels (CheckCudaKernelShapes refuses them)";
  const int e = static_cast<int>(experts), kk = static_cast<int>(k);
  const int64_t pairs = tokens * k;
  const bool gemv = moe_path_ == MoePath::kGemv ||
                    ((moe_path_ == MoePath::kAuto || moe_path_ == MoePath::kUnfused) &&
                     kernels::MoeUseGemv(tokens, k));
  OASIS_CHECK(!gemv || pairs <= kernels::kMoeGemvMaxPairs)
      << "MoeExperts: the grouped GEMV takes at most " << kernels::kMoeGemvMaxPairs << " pairs";
  if (gemv) {
    Tensor h = Empty({pairs, inter}, DType::kBF16);
    if (moe_path_ != MoePath::kUnfused && kernels::MoeUsePairGateUp(tokens, k)) {
      OASIS_CUDA_CHECK(kernels::LaunchMoeGemvGateUpPairs(Ptr(x), Ptr<int32_t>(expert_ids),
                                                         Ptr(gate_up), Ptr(h), tokens, kk, e,
                                                         hidden, inter, stream()));
    } else {
      OASIS_CUDA_CHECK(kernels::LaunchMoeGemvGateUp(Ptr(x), Ptr<int32_t>(expert_ids), Ptr(gate_up),
                                                    Ptr(h), tokens, kk, e, hidden, inter,
                                                    stream()));
    }
    if (moe_path_ != MoePath::kUnfused && kernels::MoeUseFusedDown(tokens, k)) {
      OASIS_CUDA_CHECK(kernels::LaunchMoeGemvDownCombine(
          Ptr(h), Ptr<int32_t>(expert_ids), Ptr<float>(expert_weights), Ptr(down), Ptr(out), tokens,
          kk, e, hidden, inter, stream()));
      return;
    }
    Tensor y = Empty({pairs, hidden}, DType::kF32);
    OASIS_CUDA_CHECK(kernels::LaunchMoeGemvDown(Ptr(h), Ptr<int32_t>(expert_ids), Ptr(down),
                                                Ptr<float>(y), tokens, kk, e, hidden, inter,
                                                stream()));
    OASIS_CUDA_CHECK(kernels::LaunchMoeCombineF32(Ptr<float>(y), nullptr,
                                                  Ptr<float>(expert_weights), Ptr(out), tokens, kk,
                                                  hidden, stream()));
    return;
  }
  Tensor plan_buf = Empty({kernels::MoePlanInts(pairs, e)}, DType::kI32);
  const kernels::MoePlan plan =
      kernels::MoePlanIn(Ptr<int32_t>(plan_buf), pairs, e, kernels::MoeGemmTileRowsFor(pairs, e));
  OASIS_CUDA_CHECK(kernels::LaunchMoePlan(Ptr<int32_t>(expert_ids), pairs, e, plan, stream()));
  Tensor hp = Empty({pairs, inter}, DType::kBF16);
  OASIS_CUDA_CHECK(kernels::LaunchMoeGemmGateUp(Ptr(x), plan, kk, Ptr(gate_up), Ptr(hp), pairs, e,
                                                hidden, inter, stream()));
  Tensor yp = Empty({pairs, hidden}, DType::kBF16);
  OASIS_CUDA_CHECK(kernels::LaunchMoeGemmDown(Ptr(hp), plan, Ptr(down), Ptr(yp), pairs, e, hidden,
                                              inter, stream()));
  OASIS_CUDA_CHECK(kernels::LaunchMoeCombineBf16(Ptr(yp), plan.pos, Ptr<float>(expert_weights),
                                                 Ptr(out), tokens, kk, hidden, stream()));
}

}  // namespace oasis

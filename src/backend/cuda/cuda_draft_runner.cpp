#include "backend/cuda/cuda_draft_runner.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/check.h"
#include "engine/batch_builder.h"

namespace oasis {

CudaDraftRunner::CudaDraftRunner(Eagle3Head& head, CudaBackend& backend, int64_t num_kv_slots)
    : DraftRunner(head, backend, num_kv_slots), cuda_(backend), profile_(std::getenv("OASIS_PROFILE_DRAFT") != nullptr) {}

CudaDraftRunner::~CudaDraftRunner() {
  if (profile_ && profile_calls_ > 0) {
    const double n = static_cast<double>(profile_calls_);
    std::fprintf(stderr, "draft head profile over %lld steps (ms/step): upload %.3f, forward %.3f, sample %.3f\n",
                 static_cast<long long>(profile_calls_), profile_s_[0] / n * 1e3, profile_s_[1] / n * 1e3,
                 profile_s_[2] / n * 1e3);
  }
}

std::vector<int32_t> CudaDraftRunner::Propose(const ForwardInput& host_input, const Tensor& aux,
                                              std::span<const int32_t> aux_rows) {
  const int64_t R = host_input.logit_rows.numel();
  ForwardInput host = host_input;
  if (R == 0) host.logit_rows = Tensor::Zeros({1}, DType::kI32);  // no empty GEMMs: row 0's logits, dropped
  // OASIS_PROFILE_DRAFT: synchronise between the phases and report their mean times at exit.
  // Only decode steps (at most two rows per draft) are profiled; prefill chunks would swamp them.
  const bool profile = profile_ && host.token_ids.numel() <= 2 * host.logit_rows.numel();
  using Clock = std::chrono::steady_clock;
  if (profile) cuda_.Synchronize();
  auto mark = Clock::now();
  const auto phase = [&](int i) {
    if (!profile) return;
    cuda_.Synchronize();
    const auto now = Clock::now();
    profile_s_[i] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  const ForwardInput input = UploadForwardInput(cuda_, host, /*async=*/true);  // the head runs on one stream
  phase(0);
  const Tensor logits = head_.Forward(input, aux, kv_, aux_rows);
  phase(1);
  if (R == 0) return {};
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  const std::vector<SampleResult> drafts = sampler_.Sample(logits, std::vector<SampleRow>(R, greedy), cuda_.stream());
  phase(2);
  if (profile) ++profile_calls_;
  std::vector<int32_t> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) out[static_cast<size_t>(r)] = head_.DraftToTarget(drafts[static_cast<size_t>(r)].token);
  return out;
}

bool CudaDraftRunner::ProposeChained(const ForwardInput& host_input, const Tensor& aux,
                                     std::span<const int32_t> aux_rows, const ModelRunner::DeviceSamples& samples,
                                     std::span<const int32_t> pairs) {
  OASIS_CHECK_LT(chained_rows_, 0) << "a chained head step is still queued";
  if (samples.stream != static_cast<void*>(cuda_.stream()) ||
      samples.stride != static_cast<int64_t>(sizeof(kernels::SampleOutputDevice)) || pairs.size() % 2 != 0) {
    return false;
  }
  const int64_t R = host_input.logit_rows.numel();
  ForwardInput host = host_input;
  if (R == 0) host.logit_rows = Tensor::Zeros({1}, DType::kI32);  // as in Propose
  const ForwardInput input = UploadForwardInput(cuda_, host, /*async=*/true);
  if (!pairs.empty()) {
    Tensor p = Tensor::Empty({static_cast<int64_t>(pairs.size())}, DType::kI32);
    std::copy(pairs.begin(), pairs.end(), p.data<int32_t>());
    const Tensor dp = cuda_.UploadAsync(p);
    OASIS_CUDA_CHECK(kernels::LaunchScatterSampledTokens(
        static_cast<const kernels::SampleOutputDevice*>(samples.base), dp.data<int32_t>(),
        static_cast<int64_t>(pairs.size() / 2), input.token_ids.data<int32_t>(), cuda_.stream()));
  }
  const Tensor logits = head_.Forward(input, aux, kv_, aux_rows);
  chained_rows_ = R;
  if (R == 0) return true;
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  sampler_.Enqueue(logits, std::vector<SampleRow>(R, greedy), cuda_.stream());
  chained_vocab_ = logits.dim(1);
  return true;
}

std::vector<int32_t> CudaDraftRunner::CollectChained() {
  OASIS_CHECK_GE(chained_rows_, 0) << "no chained head step queued";
  const int64_t R = std::exchange(chained_rows_, -1);
  if (R == 0) return {};
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  const std::vector<SampleResult> drafts =
      sampler_.Finish(std::vector<SampleRow>(R, greedy), chained_vocab_, cuda_.stream());
  std::vector<int32_t> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) out[static_cast<size_t>(r)] = head_.DraftToTarget(drafts[static_cast<size_t>(r)].token);
  return out;
}

}  // namespace oasis

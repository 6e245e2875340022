#include "runner/cuda/cuda_draft_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "common/check.h"
#include "common/tuning.h"
#include "runner/batch_builder.h"

namespace oasis {

CudaDraftRunner::CudaDraftRunner(Eagle3Head& head, CudaBackend& backend, int64_t num_kv_slots)
    : DraftRunner(head, backend, num_kv_slots),
      cuda_(backend),
      profile_(GetTuning().profile_draft) {}

CudaDraftRunner::~CudaDraftRunner() {
  if (profile_ && profile_calls_ > 0) {
    const double n = static_cast<double>(profile_calls_);
    std::fprintf(
        stderr,
        "draft head profile over %lld steps (ms/step): upload %.3f, forward %.3f, sample %.3f\n",
        static_cast<long long>(profile_calls_), profile_s_[0] / n * 1e3, profile_s_[1] / n * 1e3,
        profile_s_[2] / n * 1e3);
  }
}

namespace {

// The greedy rows of R drafts (an argmax over the draft vocabulary).
std::vector<SampleRow> GreedyRows(int64_t R) {
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  return std::vector<SampleRow>(static_cast<size_t>(R), greedy);
}

}  // namespace

ForwardInput CudaDraftRunner::UploadInput(const ForwardInput& host_input) {
  // (No logit rows: Forward stops after the K/V append.)
  return UploadForwardInput(cuda_, host_input, /*async=*/true);  // the head runs on one stream
}

std::vector<int32_t> CudaDraftRunner::ToTarget(const std::vector<SampleResult>& drafts) const {
  std::vector<int32_t> out(drafts.size());
  for (size_t r = 0; r < drafts.size(); ++r) out[r] = head_.DraftToTarget(drafts[r].token);
  return out;
}

std::vector<int32_t> CudaDraftRunner::Propose(const ForwardInput& host_input, const Tensor& aux,
                                              std::span<const int32_t> aux_rows) {
  const int64_t R = host_input.logit_rows.numel();
  // OASIS_PROFILE_DRAFT: synchronise between the phases and report their mean times at exit.
  // Only decode steps (at most two rows per draft) are profiled; prefill chunks would swamp them.
  const bool profile = profile_ && host_input.token_ids.numel() <= 2 * std::max<int64_t>(R, 1);
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
  const ForwardInput input = UploadInput(host_input);
  phase(0);
  const Tensor logits = head_.Forward(input, aux, kv_, aux_rows);
  phase(1);
  if (R == 0) return {};
  const std::vector<SampleResult> drafts = sampler_.Sample(logits, GreedyRows(R), cuda_.stream());
  phase(2);
  if (profile) ++profile_calls_;
  return ToTarget(drafts);
}

bool CudaDraftRunner::ProposeChained(const ForwardInput& host_input, const Tensor& aux,
                                     std::span<const int32_t> aux_rows,
                                     const DeviceSamples& samples, std::span<const int32_t> pairs) {
  OASIS_CHECK_LT(chained_rows_, 0) << "a chained head step is still queued";
  if (samples.stream != static_cast<void*>(cuda_.stream()) ||
      samples.stride != static_cast<int64_t>(sizeof(kernels::SampleOutputDevice)) ||
      pairs.size() % 2 != 0) {
    return false;
  }
  const ForwardInput input = UploadInput(host_input);
  if (!pairs.empty()) {
    Tensor p = Tensor::Empty({static_cast<int64_t>(pairs.size())}, DType::kI32);
    std::copy(pairs.begin(), pairs.end(), p.data<int32_t>());
    const Tensor dp = cuda_.UploadAsync(p);
    OASIS_CUDA_CHECK(kernels::LaunchScatterSampledTokens(
        static_cast<const kernels::SampleOutputDevice*>(samples.base), dp.data<int32_t>(),
        static_cast<int64_t>(pairs.size() / 2), input.token_ids.data<int32_t>(), cuda_.stream()));
  }
  const Tensor logits = head_.Forward(input, aux, kv_, aux_rows);
  chained_rows_ = host_input.logit_rows.numel();
  if (chained_rows_ > 0) sampler_.Enqueue(logits, GreedyRows(chained_rows_), cuda_.stream());
  return true;
}

std::vector<int32_t> CudaDraftRunner::CollectChained() {
  OASIS_CHECK_GE(chained_rows_, 0) << "no chained head step queued";
  const int64_t R = std::exchange(chained_rows_, -1);
  if (R == 0) return {};
  return ToTarget(sampler_.Finish(GreedyRows(R), cuda_.stream()));
}

DraftRunner::ChainStep CudaDraftRunner::ProposeWithFeatures(const ForwardInput& host_input,
                                                            const Tensor& aux,
                                                            std::span<const int32_t> aux_rows) {
  const int64_t T = host_input.token_ids.numel(), R = host_input.logit_rows.numel();
  const int64_t h = head_.config().hidden_size;
  const ForwardInput input = UploadInput(host_input);
  Tensor hidden = cuda_.Empty({T, h}, cuda_.activation_dtype());
  const Tensor logits = head_.Forward(input, aux, kv_, aux_rows, &hidden);
  ChainStep out;
  if (R == 0) return out;
  out.features = cuda_.Empty({R, h}, cuda_.activation_dtype());
  cuda_.GatherRows(hidden, input.logit_rows, out.features);
  out.drafts = ToTarget(sampler_.Sample(logits, GreedyRows(R), cuda_.stream()));
  return out;
}

DraftRunner::ChainStep CudaDraftRunner::ProposeFromFeatures(const ForwardInput& host_input,
                                                            const Tensor& features,
                                                            std::span<const int32_t> feature_rows) {
  const int64_t T = host_input.token_ids.numel(), h = head_.config().hidden_size;
  OASIS_CHECK_EQ(static_cast<int64_t>(feature_rows.size()), T) << "one feature row per head row";
  OASIS_CHECK_EQ(host_input.logit_rows.numel(), T) << "every chained row is a logits row";
  const ForwardInput input = UploadInput(host_input);
  Tensor g = cuda_.Empty({T, h}, cuda_.activation_dtype());
  cuda_.GatherRows(features,
                   cuda_.UploadAsync(Tensor::FromInts(
                       std::vector<int32_t>(feature_rows.begin(), feature_rows.end()))),
                   g);
  ChainStep out;
  out.features = cuda_.Empty({T, h}, cuda_.activation_dtype());
  const Tensor logits = head_.ForwardFromFeatures(input, g, kv_, &out.features);
  out.drafts = ToTarget(sampler_.Sample(logits, GreedyRows(T), cuda_.stream()));
  return out;
}

}  // namespace oasis

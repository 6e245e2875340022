#include "runner/cuda/cuda_sampler.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/sampling.h"

namespace oasis {

void CudaSampler::Reserve(size_t rows) {
  if (rows <= capacity_) return;
  const size_t n = std::max<size_t>(rows, 64);
  host_params_ = cuda::PinnedBuffer::Allocate(n * sizeof(kernels::SampleParamsDevice)).value();
  host_out_ = cuda::PinnedBuffer::Allocate(n * sizeof(kernels::SampleOutputDevice)).value();
  params_ = cuda::DeviceBuffer::Allocate(n * sizeof(kernels::SampleParamsDevice)).value();
  out_ = cuda::DeviceBuffer::Allocate(n * sizeof(kernels::SampleOutputDevice)).value();
  workspace_ =
      cuda::DeviceBuffer::Allocate(kernels::SampleWorkspaceBytes(static_cast<int64_t>(n))).value();
  capacity_ = n;
}

std::vector<SampleResult> CudaSampler::Sample(const Tensor& logits,
                                              const std::vector<SampleRow>& rows,
                                              cudaStream_t stream) {
  Enqueue(logits, rows, stream);
  return Finish(rows, stream);
}

void CudaSampler::Enqueue(const Tensor& logits, const std::vector<SampleRow>& rows,
                          cudaStream_t stream) {
  OASIS_CHECK(logits.device() == Device::kCuda && logits.dtype() == DType::kF32)
      << "device f32 logits";
  OASIS_CHECK_GE(logits.dim(0), static_cast<int64_t>(rows.size()))
      << "one logits row per SampleRow";
  vocab_ = logits.dim(1);
  if (rows.empty()) return;
  Reserve(rows.size());
  auto* hp = static_cast<kernels::SampleParamsDevice*>(host_params_.data());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRow& row = rows[r];
    OASIS_CHECK_LE(row.num_top_logprobs, kernels::kSampleMaxTop) << "num_top_logprobs";
    hp[r] = kernels::SampleParamsDevice{row.params.temperature,
                                        row.params.top_p,
                                        row.params.min_p,
                                        row.params.top_k,
                                        row.seed,
                                        row.counter,
                                        row.num_top_logprobs,
                                        row.needed ? 1 : 0,
                                        row.forced_token,
                                        -1};
  }
  const size_t n = rows.size();
  // Penalties, biases, masks: the rows that have any get processed logits (hp[r].processed).
  const bool processed =
      processor_.Enqueue(logits.data<float>(), vocab_, logits.dim(1), rows, hp, stream);
  OASIS_CUDA_CHECK(cudaMemcpyAsync(params_.data(), hp, n * sizeof(kernels::SampleParamsDevice),
                                   cudaMemcpyHostToDevice, stream));
  auto* dout = static_cast<kernels::SampleOutputDevice*>(out_.data());
  const uint32_t stages = kernels::SampleStagesFor(hp, static_cast<int64_t>(n), logits.dim(1));
  OASIS_CUDA_CHECK(kernels::LaunchSample(
      logits.data<float>(), static_cast<int64_t>(n), logits.dim(1), logits.dim(1),
      static_cast<const kernels::SampleParamsDevice*>(params_.data()), dout, stages,
      workspace_.data(), workspace_.size(), stream, processed ? processor_.processed() : nullptr,
      vocab_));
  OASIS_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), dout, n * sizeof(kernels::SampleOutputDevice),
                                   cudaMemcpyDeviceToHost, stream));
}

std::vector<SampleResult> CudaSampler::Finish(const std::vector<SampleRow>& rows,
                                              cudaStream_t stream) {
  std::vector<SampleResult> results(rows.size());
  if (rows.empty()) return results;
  OASIS_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto* ho = static_cast<const kernels::SampleOutputDevice*>(host_out_.data());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].needed) continue;
    SampleResult& out = results[r];
    out.token = ho[r].token;
    out.logprob = ho[r].logprob;
    const int k = static_cast<int>(std::min<int64_t>(rows[r].num_top_logprobs, vocab_));
    for (int i = 0; i < k; ++i)
      out.top_logprobs.push_back({ho[r].top_tokens[i], ho[r].top_logprobs[i]});
  }
  return results;
}

}  // namespace oasis

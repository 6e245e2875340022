// CudaSampler: samples tokens from logits that are already in device memory
// (kernels/sampling.h) and brings back only the tokens and log-probabilities, instead of
// copying [rows, vocab] float logits to the host. Same rule and draws as the CPU sampler,
// logits processing included (penalties, logit_bias, masks: CudaLogitsProcessor, whose
// per-request device state lives as long as the requests' rows come back).
//
// Owns pinned and device buffers for up to `max_rows` rows (grown on demand) and the logits
// processor. Work is queued on the given stream; Sample() synchronises it. Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "common/cuda_rt.h"
#include "kernels/sampling.h"
#include "oasis/tensor.h"
#include "runner/cuda/cuda_logits_processor.h"
#include "runner/sampler.h"

namespace oasis {

class CudaSampler {
 public:
  // `logits`: device F32 [R, vocab] (R >= rows.size(); the first rows.size() rows are used).
  // Enqueue + Finish.
  std::vector<SampleResult> Sample(const Tensor& logits, const std::vector<SampleRow>& rows,
                                   cudaStream_t stream);
  // Queues the sampling of `rows` and the copy of its results to the host on `stream`; until
  // Finish, device_out() holds the rows' results on the device (row r at device_out()[r]).
  void Enqueue(const Tensor& logits, const std::vector<SampleRow>& rows, cudaStream_t stream);
  // Waits for the stream (and so for anything queued behind the sampling) and returns the
  // results of the last Enqueue; `rows` as given to it.
  std::vector<SampleResult> Finish(const std::vector<SampleRow>& rows, cudaStream_t stream);
  const kernels::SampleOutputDevice* device_out() const {
    return static_cast<const kernels::SampleOutputDevice*>(out_.data());
  }
  const CudaLogitsProcessor& logits_processor() const { return processor_; }

 private:
  void Reserve(size_t rows);

  size_t capacity_ = 0;
  int64_t vocab_ = 0;  // of the last Enqueue
  cuda::PinnedBuffer host_params_, host_out_;
  cuda::DeviceBuffer params_, out_, workspace_;
  CudaLogitsProcessor processor_;
};

}  // namespace oasis

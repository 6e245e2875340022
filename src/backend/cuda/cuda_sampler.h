// CudaSampler: samples tokens from logits that are already in device memory
// (kernels/sampling.h) and brings back only the tokens and log-probabilities, instead of
// copying [rows, vocab] float logits to the host. Same rule and draws as the CPU sampler.
//
// Owns pinned and device buffers for up to `max_rows` rows (grown on demand). Work is
// queued on the given stream; Sample() synchronises it. Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "common/cuda_rt.h"
#include "engine/sampler.h"
#include "oasis/tensor.h"

namespace oasis {

class CudaSampler {
 public:
  // `logits`: device F32 [R, vocab] (R >= rows.size(); the first rows.size() rows are used).
  std::vector<SampleResult> Sample(const Tensor& logits, const std::vector<SampleRow>& rows, cudaStream_t stream);

 private:
  void Reserve(size_t rows);

  size_t capacity_ = 0;
  cuda::PinnedBuffer host_params_, host_out_;
  cuda::DeviceBuffer params_, out_, workspace_;
};

}  // namespace oasis

// CudaDraftRunner: the DraftRunner of the CUDA backend. The head's step runs on the device
// and its greedy draft is taken there (CudaSampler at temperature 0: an argmax over the
// draft vocabulary, lowest id on ties), so only one token per draft comes back instead of
// [rows, draft_vocab] float logits; the d2t map is applied on the host.
//
// Owns the head's KV pool (through DraftRunner) and the sampler's buffers. Not thread-safe:
// the engine loop owns it.
#pragma once

#include "backend/cuda/cuda_backend.h"
#include "runner/cuda/cuda_sampler.h"
#include "runner/draft_runner.h"

namespace oasis {

class CudaDraftRunner final : public DraftRunner {
 public:
  CudaDraftRunner(Eagle3Head& head, CudaBackend& backend, int64_t num_kv_slots);
  ~CudaDraftRunner() override;

  std::vector<int32_t> Propose(const ForwardInput& host_input, const Tensor& aux,
                               std::span<const int32_t> aux_rows) override;
  // Queued on the backend's stream, which must be the target's (`samples.stream`; else false).
  bool ProposeChained(const ForwardInput& host_input, const Tensor& aux,
                      std::span<const int32_t> aux_rows, const DeviceSamples& samples,
                      std::span<const int32_t> pairs) override;
  std::vector<int32_t> CollectChained() override;
  // Draft chains: the same head steps as DraftRunner's, with the argmax on the device.
  ChainStep ProposeWithFeatures(const ForwardInput& host_input, const Tensor& aux,
                                std::span<const int32_t> aux_rows) override;
  ChainStep ProposeFromFeatures(const ForwardInput& host_input, const Tensor& features,
                                std::span<const int32_t> feature_rows) override;

 private:
  CudaBackend& cuda_;
  CudaSampler sampler_;
  // The head's batch on the device (an empty logit_rows asks for row 0's logits, dropped).
  ForwardInput UploadInput(const ForwardInput& host_input);
  // Greedy draft ids (draft vocabulary) as target ids.
  std::vector<int32_t> ToTarget(const std::vector<SampleResult>& drafts) const;

  int64_t chained_rows_ = -1;  // logits rows of the queued chained step (-1: none)
  bool profile_ = false;       // OASIS_PROFILE_DRAFT set: time the phases (with synchronisations)
  int64_t profile_calls_ = 0;
  double profile_s_[3] = {0, 0, 0};
};

}  // namespace oasis

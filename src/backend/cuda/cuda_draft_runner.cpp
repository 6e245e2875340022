#include "backend/cuda/cuda_draft_runner.h"

#include "common/check.h"
#include "engine/batch_builder.h"

namespace oasis {

CudaDraftRunner::CudaDraftRunner(Eagle3Head& head, CudaBackend& backend, int64_t num_kv_slots)
    : DraftRunner(head, backend, num_kv_slots), cuda_(backend) {}

std::vector<int32_t> CudaDraftRunner::Propose(const ForwardInput& host_input, const Tensor& aux,
                                              std::span<const int32_t> aux_rows) {
  const int64_t R = host_input.logit_rows.numel();
  ForwardInput host = host_input;
  if (R == 0) host.logit_rows = Tensor::Zeros({1}, DType::kI32);  // no empty GEMMs: row 0's logits, dropped
  const Tensor logits = head_.Forward(UploadForwardInput(cuda_, host), aux, kv_, aux_rows);
  if (R == 0) return {};
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  const std::vector<SampleResult> drafts = sampler_.Sample(logits, std::vector<SampleRow>(R, greedy), cuda_.stream());
  std::vector<int32_t> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) out[static_cast<size_t>(r)] = head_.DraftToTarget(drafts[static_cast<size_t>(r)].token);
  return out;
}

}  // namespace oasis

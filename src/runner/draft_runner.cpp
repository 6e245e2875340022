#include "runner/draft_runner.h"

#include "common/check.h"
#include "runner/batch_builder.h"

namespace oasis {

DraftRunner::DraftRunner(Eagle3Head& head, Backend& backend, int64_t num_kv_slots)
    : head_(head),
      backend_(backend),
      num_kv_slots_(num_kv_slots),
      kv_(head.AllocateKvCache(num_kv_slots)) {
  OASIS_CHECK_GT(num_kv_slots, 0) << "draft head KV pool";
}

std::vector<int32_t> DraftRunner::Propose(const ForwardInput& host_input, const Tensor& aux,
                                          std::span<const int32_t> aux_rows) {
  const int64_t R = host_input.logit_rows.numel();
  ForwardInput host = host_input;
  if (R == 0)
    host.logit_rows = Tensor::Zeros({1}, DType::kI32);  // no empty GEMMs: row 0's logits, dropped
  ForwardInput in = UploadForwardInput(backend_, host);
  Tensor logits = backend_.Download(head_.Forward(in, aux, kv_, aux_rows));
  if (R == 0) return {};
  return head_.GreedyTargetTokens(logits);
}

}  // namespace oasis

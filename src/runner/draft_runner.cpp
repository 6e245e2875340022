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
  // No logit rows: Forward only appends K/V (an empty upload of logit_rows is fine there).
  ForwardInput in = UploadForwardInput(backend_, host_input);
  Tensor logits = head_.Forward(in, aux, kv_, aux_rows);
  if (host_input.logit_rows.numel() == 0) return {};
  return head_.GreedyTargetTokens(backend_.Download(logits));
}

}  // namespace oasis

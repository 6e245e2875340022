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

DraftRunner::ChainStep DraftRunner::ProposeWithFeatures(const ForwardInput& host_input,
                                                        const Tensor& aux,
                                                        std::span<const int32_t> aux_rows) {
  ForwardInput in = UploadForwardInput(backend_, host_input);
  const int64_t T = host_input.token_ids.numel(), R = host_input.logit_rows.numel();
  Tensor hidden = backend_.Empty({T, head_.config().hidden_size}, backend_.activation_dtype());
  Tensor logits = head_.Forward(in, aux, kv_, aux_rows, &hidden);
  ChainStep out;
  if (R == 0) return out;
  out.features = backend_.Empty({R, head_.config().hidden_size}, backend_.activation_dtype());
  backend_.GatherRows(hidden, in.logit_rows, out.features);
  out.drafts = head_.GreedyTargetTokens(backend_.Download(logits));
  return out;
}

DraftRunner::ChainStep DraftRunner::ProposeFromFeatures(const ForwardInput& host_input,
                                                        const Tensor& features,
                                                        std::span<const int32_t> feature_rows) {
  const int64_t T = host_input.token_ids.numel();
  OASIS_CHECK_EQ(static_cast<int64_t>(feature_rows.size()), T) << "one feature row per head row";
  OASIS_CHECK_EQ(host_input.logit_rows.numel(), T) << "every chained row is a logits row";
  ForwardInput in = UploadForwardInput(backend_, host_input);
  const int64_t h = head_.config().hidden_size;
  Tensor g = backend_.Empty({T, h}, backend_.activation_dtype());
  backend_.GatherRows(features,
                      backend_.UploadAsync(Tensor::FromInts(
                          std::vector<int32_t>(feature_rows.begin(), feature_rows.end()))),
                      g);
  ChainStep out;
  out.features = backend_.Empty({T, h}, backend_.activation_dtype());
  Tensor logits = head_.ForwardFromFeatures(in, g, kv_, &out.features);
  out.drafts = head_.GreedyTargetTokens(backend_.Download(logits));
  return out;
}

}  // namespace oasis

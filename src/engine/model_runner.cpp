#include "engine/model_runner.h"

#include "common/check.h"
#include "engine/batch_builder.h"

namespace oasis {

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots)
    : model_(model), backend_(backend), num_kv_slots_(num_kv_slots), kv_(model.AllocateKvCache(num_kv_slots)) {}

Tensor ModelRunner::Execute(const ForwardInput& h) { return backend_.Download(ForwardLogits(h)); }

Tensor ModelRunner::ForwardLogits(const ForwardInput& h) { return model_.Forward(UploadForwardInput(backend_, h), kv_); }

std::vector<SampleResult> ModelRunner::ExecuteAndSample(const ForwardInput& host_input,
                                                        const std::vector<SampleRow>& rows) {
  Tensor logits = Execute(host_input);
  OASIS_CHECK_EQ(logits.shape()[0], static_cast<int64_t>(rows.size())) << "one SampleRow per logits row";
  const int64_t vocab = logits.shape()[1];
  std::vector<SampleResult> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].needed) out[r] = SampleToken(logits.data<float>() + static_cast<int64_t>(r) * vocab, vocab, rows[r]);
  }
  return out;
}

}  // namespace oasis

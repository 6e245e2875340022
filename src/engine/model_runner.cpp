#include "engine/model_runner.h"

#include "common/check.h"

namespace oasis {

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots)
    : model_(model), backend_(backend), num_kv_slots_(num_kv_slots), kv_(model.AllocateKvCache(num_kv_slots)) {}

Tensor ModelRunner::Execute(const ForwardInput& h) { return backend_.Download(ForwardLogits(h)); }

Tensor ModelRunner::ForwardLogits(const ForwardInput& h) {
  ForwardInput in;
  in.token_ids = backend_.Upload(h.token_ids);
  in.positions = backend_.Upload(h.positions);
  in.slot_mapping = backend_.Upload(h.slot_mapping);
  in.attention.query_start = backend_.Upload(h.attention.query_start);
  in.attention.kv_lens = backend_.Upload(h.attention.kv_lens);
  in.attention.block_tables = backend_.Upload(h.attention.block_tables);
  in.attention.max_query_len = h.attention.max_query_len;
  in.attention.max_kv_len = h.attention.max_kv_len;
  in.logit_rows = backend_.Upload(h.logit_rows);
  return model_.Forward(in, kv_);
}

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

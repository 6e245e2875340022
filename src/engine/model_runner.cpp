#include "engine/model_runner.h"

#include "common/check.h"
#include "engine/batch_builder.h"

namespace oasis {

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots)
    : model_(model), backend_(backend), num_kv_slots_(num_kv_slots), kv_(model.AllocateKvCache(num_kv_slots)) {}

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots, ExternalKvPools)
    : model_(model), backend_(backend), num_kv_slots_(num_kv_slots) {}

Tensor ModelRunner::Execute(const ForwardInput& h) { return backend_.Download(ForwardLogits(h)); }

Tensor ModelRunner::ForwardLogits(const ForwardInput& h) { return model_.Forward(UploadForwardInput(backend_, h), kv_); }

std::vector<SampleResult> ModelRunner::ExecuteAndSample(const ForwardInput& host_input,
                                                        const std::vector<SampleRow>& rows) {
  return SampleLogits(ForwardLogits(host_input), rows);
}

void ModelRunner::AllocateCapture(ResidualCapture& capture, int64_t tokens) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(capture.layer_ids.size()), tokens,
                                      model_.config().hidden_size};
  if (capture.out.shape() != shape || capture.out.device() != backend_.device()) {
    capture.out = backend_.Empty(shape, backend_.activation_dtype());
  }
}

std::vector<SampleResult> ModelRunner::ExecuteSampleAndCapture(const ForwardInput& host_input,
                                                               const std::vector<SampleRow>& rows,
                                                               ResidualCapture& capture,
                                                               const std::function<void()>& while_running) {
  TakeAfterSampling();  // the host samples after the step: nothing can queue behind it
  AllocateCapture(capture, host_input.token_ids.numel());
  const Tensor logits = model_.Forward(UploadForwardInput(backend_, host_input), kv_, &capture);
  if (while_running) while_running();
  return SampleLogits(logits, rows);
}

std::vector<SampleResult> ModelRunner::ExecuteSparseStep(const ForwardInput& host_input,
                                                         const std::vector<SampleRow>& rows, ResidualCapture* capture,
                                                         SparseAttentionPipeline& pipeline, const SparseStepPlan& plan,
                                                         const std::function<void()>& while_running) {
  if (capture != nullptr) AllocateCapture(*capture, host_input.token_ids.numel());
  const ForwardInput in = UploadForwardInput(backend_, host_input);
  pipeline.BeginStep(plan, in.attention, in.slot_mapping);
  Tensor logits;
  try {
    logits = model_.Forward(in, kv_, capture, &pipeline);
  } catch (...) {
    pipeline.EndStep();
    throw;
  }
  pipeline.EndStep();  // device backends: the pipeline's side streams rejoin here
  if (while_running) while_running();
  return SampleLogits(logits, rows);
}

std::vector<SampleResult> ModelRunner::ExecuteSparseStepRanks(const ForwardInput& host_input,
                                                              const std::vector<SampleRow>& rows,
                                                              ResidualCapture* capture,
                                                              const std::vector<SparseAttentionPipeline*>& pipelines,
                                                              const SparseStepPlan& plan,
                                                              const std::function<void()>& while_running) {
  OASIS_CHECK(!pipelines.empty() && pipelines[0] != nullptr) << "a sparse step needs its pipeline";
  return ExecuteSparseStep(host_input, rows, capture, *pipelines[0], plan, while_running);
}

void ModelRunner::ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn, bool) { fn(0, *this); }

std::vector<SampleResult> ModelRunner::SampleLogits(const Tensor& logits, const std::vector<SampleRow>& rows) {
  return SampleOnHost(backend_.Download(logits), rows);
}

std::vector<SampleResult> ModelRunner::SampleOnHost(const Tensor& logits, const std::vector<SampleRow>& rows) {
  OASIS_CHECK_EQ(logits.shape()[0], static_cast<int64_t>(rows.size())) << "one SampleRow per logits row";
  const int64_t vocab = logits.shape()[1];
  std::vector<SampleResult> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].needed) out[r] = SampleToken(logits.data<float>() + static_cast<int64_t>(r) * vocab, vocab, rows[r]);
  }
  return out;
}

}  // namespace oasis

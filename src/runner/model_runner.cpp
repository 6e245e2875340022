#include "runner/model_runner.h"

#include "common/check.h"
#include "runner/batch_builder.h"

namespace oasis {

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots)
    : model_(model),
      backend_(backend),
      num_kv_slots_(num_kv_slots),
      kv_(model.AllocateKvCache(num_kv_slots)) {}

ModelRunner::ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots, ExternalKvPools)
    : model_(model), backend_(backend), num_kv_slots_(num_kv_slots) {}

Tensor ModelRunner::Execute(const ForwardInput& h) {
  return backend_.Download(model_.Forward(UploadForwardInput(backend_, h), kv_));
}

void ModelRunner::AllocateCapture(ResidualCapture& capture, int64_t tokens) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(capture.layer_ids.size()), tokens,
                                      model_.config().hidden_size};
  if (capture.out.shape() != shape || capture.out.device() != backend_.device()) {
    capture.out = backend_.Empty(shape, backend_.activation_dtype());
  }
}

std::vector<SampleResult> ModelRunner::Run(const StepInputs& step) {
  // The host samples after the step: nothing can queue behind it (after_sampling unused).
  if (step.capture != nullptr) AllocateCapture(*step.capture, step.input.token_ids.numel());
  const ForwardInput in = UploadForwardInput(backend_, step.input);
  Tensor logits;
  if (step.sparse) {
    OASIS_CHECK(step.sparse->plan != nullptr) << "a sparse step needs its plan";
    SparseAttentionPipeline& pipeline = sparse_pipeline();
    pipeline.BeginStep(*step.sparse->plan, in.attention, in.slot_mapping);
    try {
      logits = model_.Forward(in, kv_, step.capture, &pipeline);
    } catch (...) {
      pipeline.EndStep();
      throw;
    }
    pipeline.EndStep();  // device backends: the pipeline's side streams rejoin here
  } else {
    logits = model_.Forward(in, kv_, step.capture);
  }
  if (step.while_running) step.while_running();
  return SampleLogits(logits, step.rows);
}

void ModelRunner::AttachSparse(SparseKvManager& manager) {
  ForEachRank([&](int r, ModelRunner& rank) {
    OASIS_CHECK(rank.sparse_pipeline_ == nullptr)
        << "rank " << r << " already has a sparse pipeline";
    rank.sparse_pipeline_ = std::make_unique<SparseAttentionPipeline>(
        manager, rank.backend(), rank.model().config().num_attention_heads,
        rank.sparse_stage_sync(), r);
  });
}

void ModelRunner::DetachSparse(bool teardown) {
  ForEachRank([](int, ModelRunner& rank) { rank.sparse_pipeline_.reset(); }, teardown);
}

SparseAttentionPipeline& ModelRunner::sparse_pipeline() {
  OASIS_CHECK(sparse_pipeline_ != nullptr)
      << "a sparse step on a runner without sparse KV (AttachSparse)";
  return *sparse_pipeline_;
}

std::vector<SparseMetrics> ModelRunner::CollectSparseMetricsEach() {
  std::vector<SparseMetrics> per_rank(static_cast<size_t>(num_ranks()));
  ForEachRank([&](int r, ModelRunner& rank) {
    per_rank.at(static_cast<size_t>(r)) = rank.sparse_pipeline().CollectMetrics();
  });
  return per_rank;
}

SparseMetrics ModelRunner::CollectSparseMetrics() {
  std::vector<SparseMetrics> per_rank = CollectSparseMetricsEach();
  for (size_t r = 1; r < per_rank.size(); ++r) per_rank[0].MergeRank(per_rank[r]);
  return per_rank[0];
}

void ModelRunner::ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn, bool) {
  fn(0, *this);
}

std::vector<SampleResult> ModelRunner::SampleLogits(const Tensor& logits,
                                                    const std::vector<SampleRow>& rows) {
  return SampleOnHost(backend_.Download(logits), rows);
}

std::vector<SampleResult> ModelRunner::SampleOnHost(const Tensor& logits,
                                                    const std::vector<SampleRow>& rows) {
  OASIS_CHECK_EQ(logits.shape()[0], static_cast<int64_t>(rows.size()))
      << "one SampleRow per logits row";
  const int64_t vocab = logits.shape()[1];
  std::vector<SampleResult> out(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].needed)
      out[r] = SampleToken(logits.data<float>() + static_cast<int64_t>(r) * vocab, vocab, rows[r]);
  }
  return out;
}

}  // namespace oasis

#include "runner/model_runner.h"

#include <algorithm>

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
  std::vector<SampleResult> results = SampleLogits(logits, step.rows);
  if (WantsRanks(step.rows)) FillRanks(logits, step.rows, results);
  return results;
}

bool ModelRunner::WantsRanks(const std::vector<SampleRow>& rows) {
  return std::any_of(rows.begin(), rows.end(),
                     [](const SampleRow& r) { return r.want_rank && r.needed; });
}

void ModelRunner::FillRanks(const Tensor& logits, const std::vector<SampleRow>& rows,
                            std::vector<SampleResult>& results) {
  OASIS_CHECK(logits.dtype() == DType::kF32) << "f32 logits";
  OASIS_CHECK_GE(logits.dim(0), static_cast<int64_t>(rows.size())) << "one logits row per row";
  const int64_t vocab = logits.dim(1);
  const bool on_host = logits.device() == Device::kCpu;
  constexpr int64_t kBlockRows = 64;  // host copies of at most 64 rows at a time
  Tensor block;
  int64_t block_first = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].want_rank || !rows[r].needed) continue;
    const int32_t token = results[r].token;
    if (token < 0 || token >= vocab) continue;
    const float* row = nullptr;
    const int64_t i = static_cast<int64_t>(r);
    if (on_host) {
      row = logits.data<float>() + i * vocab;
    } else {
      if (block_first < 0 || i >= block_first + block.dim(0)) {
        const int64_t n = std::min<int64_t>(kBlockRows, static_cast<int64_t>(rows.size()) - i);
        block = backend_.Download(logits.Slice(i, i + n));
        block_first = i;
      }
      row = block.data<float>() + (i - block_first) * vocab;
    }
    const float mine = row[token];
    int64_t rank = 0;
    for (int64_t v = 0; v < vocab; ++v) rank += row[v] >= mine ? 1 : 0;
    results[r].rank = rank;
  }
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

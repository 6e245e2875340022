#include "runner/tp/tp_model_runner.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/check.h"
#include "common/logging.h"

namespace oasis {
namespace {

// A communicator that only has a rank and a size (for CheckTensorParallel before any real one
// exists).
class ShapeOnlyCommunicator final : public Communicator {
 public:
  explicit ShapeOnlyCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void AllReduceSum(Tensor&) override {
    OASIS_CHECK(false) << "ShapeOnlyCommunicator has no collectives";
  }
  void AllGather(const Tensor&, Tensor&) override {
    OASIS_CHECK(false) << "ShapeOnlyCommunicator has no collectives";
  }
  void Barrier() override { OASIS_CHECK(false) << "ShapeOnlyCommunicator has no collectives"; }

 private:
  int size_;
};

}  // namespace

Status CheckTensorParallelSize(const ModelConfig& config, int size) {
  if (size < 1)
    return InvalidArgument("--tensor-parallel-size must be >= 1, got " + std::to_string(size));
  ShapeOnlyCommunicator comm(size);
  return CheckTensorParallel(config, TensorParallel{0, size, &comm});
}

ForwardInput SliceKvHeads(const ForwardInput& in, int64_t first, int64_t count) {
  const Tensor& tables = in.attention.block_tables;
  OASIS_CHECK(tables.ndim() == 3 && in.slot_mapping.ndim() == 2 && in.attention.kv_lens.ndim() == 2)
      << "SliceKvHeads needs tables [S, H, W], slot_mapping [T, H], kv_lens [S, H]";
  const int64_t S = tables.dim(0), H = tables.dim(1), W = tables.dim(2), T = in.slot_mapping.dim(0);
  OASIS_CHECK(in.slot_mapping.dim(1) == H && in.attention.kv_lens.dim(0) == S &&
              in.attention.kv_lens.dim(1) == H)
      << "slot_mapping " << in.slot_mapping.ToString() << " and kv_lens "
      << in.attention.kv_lens.ToString() << " disagree with block_tables " << tables.ToString();
  OASIS_CHECK(first >= 0 && count >= 1 && first + count <= H)
      << "KV heads [" << first << ", " << first + count << ") outside " << H;
  OASIS_CHECK(tables.device() == Device::kCpu && tables.dtype() == DType::kI32 &&
              in.slot_mapping.dtype() == DType::kI64 && in.attention.kv_lens.dtype() == DType::kI32)
      << "SliceKvHeads takes the host batch (BuildHostForwardInput)";
  ForwardInput out = in;
  out.slot_mapping = Tensor::Empty({T, count}, DType::kI64);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out.slot_mapping.data<int64_t>() + t * count,
                in.slot_mapping.data<int64_t>() + t * H + first,
                static_cast<size_t>(count) * sizeof(int64_t));
  }
  out.attention.kv_lens = Tensor::Empty({S, count}, DType::kI32);
  out.attention.block_tables = Tensor::Empty({S, count, W}, DType::kI32);
  for (int64_t s = 0; s < S; ++s) {
    std::memcpy(out.attention.kv_lens.data<int32_t>() + s * count,
                in.attention.kv_lens.data<int32_t>() + s * H + first,
                static_cast<size_t>(count) * sizeof(int32_t));
    std::memcpy(out.attention.block_tables.data<int32_t>() + s * count * W,
                tables.data<int32_t>() + (s * H + first) * W,
                static_cast<size_t>(count * W) * sizeof(int32_t));
  }
  return out;
}

StatusOr<std::unique_ptr<TpModelRunner>> TpModelRunner::Create(
    std::unique_ptr<LockstepGroup> group, std::vector<std::unique_ptr<TpRank>> ranks) {
  if (group == nullptr) return InvalidArgument("TpModelRunner needs a worker group");
  const int n = group->size();
  Status st = Status::Ok();
  if (static_cast<int>(ranks.size()) != n) {
    st = InvalidArgument("TpModelRunner: " + std::to_string(ranks.size()) + " ranks for " +
                         std::to_string(n) + " workers");
  }
  for (int r = 0; r < static_cast<int>(ranks.size()) && st.ok(); ++r) {
    if (ranks[static_cast<size_t>(r)] == nullptr) {
      st = InvalidArgument("TpModelRunner: rank " + std::to_string(r) + " is missing");
      break;
    }
    TpRank& k = *ranks[static_cast<size_t>(r)];
    TpRank& first = *ranks[0];
    const ModelConfig& c = k.model().config();
    const ModelConfig& c0 = first.model().config();
    if (k.model().tensor_parallel().rank != r || k.model().tensor_parallel().size != n) {
      st = InvalidArgument("TpModelRunner: rank " + std::to_string(r) + " holds shard " +
                           std::to_string(k.model().tensor_parallel().rank) + " of " +
                           std::to_string(k.model().tensor_parallel().size));
    } else if (c.num_key_value_heads != c0.num_key_value_heads ||
               c.num_attention_heads != c0.num_attention_heads ||
               c.num_hidden_layers != c0.num_hidden_layers || c.vocab_size != c0.vocab_size) {
      st = InvalidArgument("TpModelRunner: rank " + std::to_string(r) +
                           "'s shard differs from rank 0's");
    } else if (k.runner().num_kv_slots() != first.runner().num_kv_slots()) {
      st = InvalidArgument("TpModelRunner: rank " + std::to_string(r) + " has " +
                           std::to_string(k.runner().num_kv_slots()) + " KV slots, rank 0 " +
                           std::to_string(first.runner().num_kv_slots()) +
                           " (the block allocator is shared)");
    } else if (&k.runner().model() != &k.model()) {
      st = InvalidArgument("TpModelRunner: rank " + std::to_string(r) +
                           "'s runner runs another model");
    }
  }
  if (!st.ok()) {
    group->RunTeardown([&](int r) {
      if (r < static_cast<int>(ranks.size())) ranks[static_cast<size_t>(r)].reset();
    });
    return st;
  }
  return std::unique_ptr<TpModelRunner>(new TpModelRunner(std::move(group), std::move(ranks)));
}

TpModelRunner::TpModelRunner(std::unique_ptr<LockstepGroup> group,
                             std::vector<std::unique_ptr<TpRank>> ranks)
    : ModelRunner(ranks[0]->model(), ranks[0]->backend(), ranks[0]->runner().num_kv_slots(),
                  ExternalKvPools{}),
      group_(std::move(group)),
      ranks_(std::move(ranks)),
      captures_(ranks_.size()) {
  for (auto& r : ranks_) aborts_.push_back(r->AbortFunction());
  group_->set_abort([this](int r) {
    if (aborts_[static_cast<size_t>(r)]) aborts_[static_cast<size_t>(r)]();
  });
}

TpModelRunner::~TpModelRunner() {
  // Each rank's objects go on its own thread (its device current); graphs before
  // communicators (TpRank implementations order their members so).
  group_->RunTeardown([this](int r) {
    captures_[static_cast<size_t>(r)] = ResidualCapture();
    ranks_[static_cast<size_t>(r)].reset();
  });
  group_.reset();  // joins the workers and any abort helpers
}

bool TpModelRunner::NeedsSlicing(const ForwardInput& in) const {
  const int64_t heads = in.slot_mapping.ndim() == 2 ? in.slot_mapping.dim(1) : -1;
  const int64_t local = model_.config().num_key_value_heads,
                full = model_.full_config().num_key_value_heads;
  if (heads == local) return false;
  if (heads == full) return true;
  throw std::invalid_argument("tensor-parallel step: the batch lists " + std::to_string(heads) +
                              " KV heads per token; rank-local tables list " +
                              std::to_string(local) + " and whole-model tables " +
                              std::to_string(full));
}

void TpModelRunner::RunStep(const ForwardInput& in,
                            const std::function<void(int, const ForwardInput&)>& step,
                            const std::function<void()>& while_running) {
  const bool slice = NeedsSlicing(in);
  const int64_t local = model_.config().num_key_value_heads;
  group_->Run(
      [&](int r) {
        if (!slice) {
          step(r, in);  // every rank reads the same host tensors (read-only)
        } else {
          step(r, SliceKvHeads(in, r * local, local));
        }
      },
      while_running);
}

void TpModelRunner::CompareSamples(const std::vector<std::vector<SampleResult>>& per_rank) {
  bool same = true;
  for (size_t r = 1; r < per_rank.size() && same; ++r) {
    same = per_rank[r].size() == per_rank[0].size();
    for (size_t i = 0; i < per_rank[0].size() && same; ++i)
      same = per_rank[r][i].token == per_rank[0][i].token;
  }
  if (same) return;
  if (sample_mismatches_++ == 0) {
    spdlog::warn(
        "tensor parallelism: a rank sampled other tokens than rank 0 (rank 0's are used); the "
        "ranks' "
        "logits differ, which they should not");
  }
}

Tensor TpModelRunner::Execute(const ForwardInput& in) {
  std::vector<Tensor> logits(ranks_.size());
  RunStep(in, [&](int r, const ForwardInput& local) {
    logits[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)]->runner().Execute(local);
  });
  return logits[0];
}

std::vector<SampleResult> TpModelRunner::Run(const StepInputs& step) {
  if (step.sparse && NeedsSlicing(step.input)) {
    throw std::invalid_argument(
        "tensor-parallel sparse step: the batch must list the ranks' local KV heads");
  }
  if (step.capture != nullptr) {
    for (size_t r = 1; r < captures_.size(); ++r) captures_[r].layer_ids = step.capture->layer_ids;
  }
  std::vector<std::vector<SampleResult>> out(ranks_.size());
  RunStep(
      step.input,
      [&](int r, const ForwardInput& local) {
        const auto i = static_cast<size_t>(r);
        StepInputs mine{
            .input = local,
            .rows = step.rows,
            .capture = step.capture == nullptr ? nullptr : (r == 0 ? step.capture : &captures_[i]),
            .sparse = step.sparse};
        if (step.while_running) mine.while_running = [this, r] { group_->MarkEnqueued(r); };
        out[i] = ranks_[i]->runner().Run(mine);
      },
      step.while_running);
  CompareSamples(out);
  return std::move(out[0]);
}

void TpModelRunner::ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn,
                                bool teardown) {
  const auto job = [&](int r) { fn(r, ranks_[static_cast<size_t>(r)]->runner()); };
  if (teardown) {
    group_->RunTeardown(job);
  } else {
    group_->Run(job);
  }
}

std::vector<SampleResult> TpModelRunner::SampleLogits(const Tensor&,
                                                      const std::vector<SampleRow>&) {
  throw std::logic_error("TpModelRunner::SampleLogits is not used: the ranks' runners sample");
}

}  // namespace oasis

#include "runner/tp/cpu_tp_runner.h"

#include "backend/cpu/cpu_backend.h"
#include "parallel/thread_communicator.h"

namespace oasis {
namespace {

class CpuTpRank final : public TpRank {
 public:
  ~CpuTpRank() override {
    runner_.reset();
    model_.reset();
    backend_.reset();
  }
  Backend& backend() override { return *backend_; }
  DecoderLM& model() override { return *model_; }
  ModelRunner& runner() override { return *runner_; }

  std::shared_ptr<ThreadCommGroup> comms_;  // shared by the ranks; outlives their models
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<DecoderLM> model_;
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace

StatusOr<std::unique_ptr<TpModelRunner>> CreateCpuTpRunner(
    const ModelConfig& config, const CpuTpOptions& options,
    const std::function<StatusOr<std::unique_ptr<DecoderLM>>(Backend&, const TensorParallel&)>&
        load_shard) {
  OASIS_RETURN_IF_ERROR(CheckTensorParallelSize(config, options.size));
  if (options.num_kv_slots < 1)
    return InvalidArgument("CPU tensor parallelism needs num_kv_slots >= 1");
  const int n = options.size;
  auto comms = std::make_shared<ThreadCommGroup>(n);
  auto group = std::make_unique<LockstepGroup>(n, nullptr, nullptr);
  std::vector<std::unique_ptr<CpuTpRank>> ranks(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n), Status::Ok());
  try {
    group->Run([&](int r) {
      auto k = std::make_unique<CpuTpRank>();
      k->comms_ = comms;
      k->backend_ = std::make_unique<CpuBackend>(options.threads_per_rank);
      auto model =
          load_shard(*k->backend_, TensorParallel{r, n, n > 1 ? &comms->rank(r) : nullptr});
      if (!model.ok()) {
        status[static_cast<size_t>(r)] =
            model.status().WithContext("tensor-parallel rank " + std::to_string(r));
      } else {
        k->model_ = std::move(*model);
        k->runner_ = std::make_unique<ModelRunner>(*k->model_, *k->backend_, options.num_kv_slots);
      }
      ranks[static_cast<size_t>(r)] = std::move(k);
    });
  } catch (const std::exception& e) {
    status[0] = Internal(std::string("CPU tensor parallelism: ") + e.what());
  }
  for (const Status& st : status) {
    if (st.ok()) continue;
    group->RunTeardown([&](int r) { ranks[static_cast<size_t>(r)].reset(); });
    return st;
  }
  std::vector<std::unique_ptr<TpRank>> generic;
  for (auto& k : ranks) generic.push_back(std::move(k));
  return TpModelRunner::Create(std::move(group), std::move(generic));
}

}  // namespace oasis

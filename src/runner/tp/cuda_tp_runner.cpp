#include "runner/tp/cuda_tp_runner.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "common/check.h"
#include "common/cuda_rt.h"
#include "common/logging.h"

#if OASIS_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace oasis {
namespace {

// One GPU rank. Members are created in declaration order and destroyed explicitly in
// reverse: the graph runner (its graphs captured the communicator: NCCL >= 2.26 waits for
// them in ncclCommDestroy/ncclCommAbort) before the model, the model before the
// communicator, everything before the backend whose stream and memory they use.
class CudaTpRank final : public TpRank {
 public:
  ~CudaTpRank() override {
    runner_.reset();
    model_.reset();
#if OASIS_HAVE_NCCL
    comm_.reset();
#endif
    backend_.reset();
  }
  Backend& backend() override { return *backend_; }
  DecoderLM& model() override { return *model_; }
  ModelRunner& runner() override { return *runner_; }
  std::function<void()> AbortFunction() override {
#if OASIS_HAVE_NCCL
    if (comm_) return comm_->AbortFunction();
#endif
    return {};
  }

  std::unique_ptr<CudaBackend> backend_;
#if OASIS_HAVE_NCCL
  std::unique_ptr<NcclCommunicator> comm_;
#endif
  Communicator* comm() {
#if OASIS_HAVE_NCCL
    return comm_.get();
#else
    return nullptr;
#endif
  }
  std::unique_ptr<DecoderLM> model_;
  std::unique_ptr<CudaGraphRunner> runner_;
};

std::vector<int> DevicesOf(const CudaTpOptions& o) {
  if (!o.devices.empty()) return o.devices;
  std::vector<int> d(static_cast<size_t>(std::max(o.size, 0)));
  std::iota(d.begin(), d.end(), 0);
  return d;
}

std::string List(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

Status CheckCudaTensorParallel(const ModelConfig& config, const CudaTpOptions& o) {
  OASIS_RETURN_IF_ERROR(CheckTensorParallelSize(config, o.size));
  const std::vector<int> devices = DevicesOf(o);
  if (static_cast<int>(devices.size()) != o.size) {
    return InvalidArgument(std::to_string(devices.size()) +
                           " devices listed for --tensor-parallel-size " + std::to_string(o.size));
  }
#if !OASIS_HAVE_NCCL
  if (o.size > 1) {
    return Unimplemented(
        "--tensor-parallel-size " + std::to_string(o.size) +
        " on GPUs needs NCCL, and this build has none (libnccl.so and nccl.h were not found)");
  }
#endif
  const int count = cuda::DeviceCount();
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return FailedPrecondition("--tensor-parallel-size " + std::to_string(o.size) + " needs " +
                                std::to_string(std::max(o.size, d + 1)) + " GPUs, this host has " +
                                std::to_string(count));
    }
  }
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return InvalidArgument("tensor-parallel ranks must run on distinct GPUs");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<TpModelRunner>> CreateCudaTpRunner(const ModelConfig& config,
                                                            const CudaTpOptions& options,
                                                            const CudaTpHooks& hooks) {
  OASIS_RETURN_IF_ERROR(CheckCudaTensorParallel(config, options));
  if (!hooks.load_shard || !hooks.kv_slots)
    return InvalidArgument("CreateCudaTpRunner needs both hooks");
  const int n = options.size;
  const std::vector<int> devices = DevicesOf(options);
  // Declared before the group: the group's abort helpers (joined by its destructor) use them.
  std::vector<std::function<void()>> build_aborts(static_cast<size_t>(n));
  auto group = std::make_unique<LockstepGroup>(
      n,
      [devices](int r) {
        const cudaError_t e = cudaSetDevice(devices[static_cast<size_t>(r)]);
        if (e != cudaSuccess) {
          throw std::runtime_error("cudaSetDevice(" +
                                   std::to_string(devices[static_cast<size_t>(r)]) +
                                   "): " + cudaGetErrorString(e));
        }
      },
      [&build_aborts](int r) {
        if (build_aborts[static_cast<size_t>(r)]) build_aborts[static_cast<size_t>(r)]();
      });
  std::vector<std::unique_ptr<CudaTpRank>> ranks(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n), Status::Ok());
  const auto teardown = [&](Status st) {
    group->RunTeardown([&](int r) { ranks[static_cast<size_t>(r)].reset(); });
    return st;
  };
  // Runs `fn` on every rank's thread; the first failure, naming the rank and the stage.
  const auto phase = [&](const std::string& what,
                         const std::function<Status(int, CudaTpRank&)>& fn) -> Status {
    std::fill(status.begin(), status.end(), Status::Ok());
    try {
      group->Run([&](int r) {
        if (!ranks[static_cast<size_t>(r)])
          ranks[static_cast<size_t>(r)] = std::make_unique<CudaTpRank>();
        status[static_cast<size_t>(r)] = fn(r, *ranks[static_cast<size_t>(r)]);
      });
    } catch (const std::exception& e) {
      return Internal("tensor parallelism, " + what + ": " + e.what());
    }
    for (int r = 0; r < n; ++r) {
      if (!status[static_cast<size_t>(r)].ok()) {
        return status[static_cast<size_t>(r)].WithContext(
            "tensor-parallel rank " + std::to_string(r) + " (GPU " +
            std::to_string(devices[static_cast<size_t>(r)]) + "), " + what);
      }
    }
    return Status::Ok();
  };

  Status st = phase("creating its CUDA backend", [](int, CudaTpRank& k) -> Status {
    OASIS_ASSIGN_OR_RETURN(k.backend_, CudaBackend::Create());
    return Status::Ok();
  });
  if (!st.ok()) return teardown(st);
#if OASIS_HAVE_NCCL
  if (n > 1) {
    std::vector<StreamSource> streams;
    for (auto& k : ranks) streams.push_back([b = k->backend_.get()] { return b->stream(); });
    auto comms = NcclCommunicator::CreateGroup(devices, std::move(streams));
    if (!comms.ok())
      return teardown(
          comms.status().WithContext("tensor parallelism over " + std::to_string(n) + " GPUs"));
    for (int r = 0; r < n; ++r) {
      ranks[static_cast<size_t>(r)]->comm_ = std::move((*comms)[static_cast<size_t>(r)]);
      build_aborts[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->comm_->AbortFunction();
    }
    st = phase("NCCL barrier", [](int, CudaTpRank& k) -> Status {
      k.comm_->Barrier();  // throws NcclError
      return Status::Ok();
    });
    if (!st.ok()) return teardown(st);
  }
#endif
  st = phase("loading its model shard", [&](int r, CudaTpRank& k) -> Status {
    OASIS_ASSIGN_OR_RETURN(
        k.model_, hooks.load_shard(*k.backend_, TensorParallel{r, n, n > 1 ? k.comm() : nullptr}));
    if (k.model_ == nullptr) return Internal("the shard loader returned no model");
    k.backend_->Synchronize();
    return Status::Ok();
  });
  if (!st.ok()) return teardown(st);
  std::vector<int64_t> slots(static_cast<size_t>(n), 0);
  st = phase("planning its KV cache", [&](int r, CudaTpRank& k) -> Status {
    OASIS_ASSIGN_OR_RETURN(slots[static_cast<size_t>(r)],
                           hooks.kv_slots(r, *k.backend_, *k.model_));
    return Status::Ok();
  });
  if (!st.ok()) return teardown(st);
  const int64_t num_slots = *std::min_element(slots.begin(), slots.end());
  if (num_slots < 1)
    return teardown(
        ResourceExhausted("tensor parallelism: no KV cache fits (per rank: " + List(slots) + ")"));
  CudaGraphOptions go = options.graph;
  go.num_kv_slots = num_slots;
  st = phase("creating its graph runner", [&](int, CudaTpRank& k) -> Status {
    OASIS_ASSIGN_OR_RETURN(k.runner_, CudaGraphRunner::Create(*k.model_, *k.backend_, go));
    k.backend_->Synchronize();
    return Status::Ok();
  });
  if (!st.ok()) return teardown(st);
  std::string gpus;
  for (int d : devices) gpus += (gpus.empty() ? "" : ", ") + std::to_string(d);
  spdlog::info(
      "tensor parallelism: {} ranks on GPUs [{}], {} KV heads and {} KV head-blocks per layer per "
      "rank "
      "(the minimum of [{}])",
      n, gpus, ranks[0]->model_->config().num_key_value_heads, num_slots, List(slots));
  std::vector<std::unique_ptr<TpRank>> generic;
  for (auto& k : ranks) generic.push_back(std::move(k));
  return TpModelRunner::Create(std::move(group), std::move(generic));
}

}  // namespace oasis

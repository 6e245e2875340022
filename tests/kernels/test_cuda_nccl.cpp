// GPU: NcclCommunicator (src/parallel/nccl_communicator.h) — all-reduce against host sums on
// fresh random data (bf16, f32; sizes from 1 element to 1M), all-gather, barrier, the same
// all-reduce captured in a CUDA graph (after a kernel) and replayed on new data, and abort releasing a rank
// whose peer never joins a collective. The group uses 2 GPUs; with one GPU only the
// one-rank group runs (a warning says the two-rank cases were skipped).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "common/cuda_rt.h"
#include "gpu_test_util.h"
#include "parallel/nccl_communicator.h"

using namespace oasis;
using testing::ExpectClose;

namespace {

// Ranks for the group: 2 when the host has them, else 1 (with a warning).
int GroupSize() {
  const int n = cuda::DeviceCount();
  if (n < 2) WARN("fewer than 2 GPUs (" << n << "): the two-rank NCCL cases are skipped; one rank runs");
  return n >= 2 ? 2 : 1;
}

// One rank's backend and communicator, made on its own thread.
struct Rank {
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<NcclCommunicator> comm;
};

// Backends on devices 0..n-1 (made on per-rank threads) and one communicator group.
std::vector<Rank> MakeGroup(int n) {
  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      OASIS_CUDA_CHECK(cudaSetDevice(r));
      auto b = CudaBackend::Create();
      OASIS_CHECK(b.ok()) << b.status().ToString();
      ranks[static_cast<size_t>(r)].backend = std::move(*b);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<int> devices;
  std::vector<StreamSource> streams;
  for (int r = 0; r < n; ++r) {
    devices.push_back(r);
    streams.push_back([b = ranks[static_cast<size_t>(r)].backend.get()] { return b->stream(); });
  }
  auto comms = NcclCommunicator::CreateGroup(devices, std::move(streams));
  REQUIRE(comms.ok());
  for (int r = 0; r < n; ++r) {
    ranks[static_cast<size_t>(r)].comm = std::move((*comms)[static_cast<size_t>(r)]);
    CHECK(ranks[static_cast<size_t>(r)].comm->rank() == r);
    CHECK(ranks[static_cast<size_t>(r)].comm->size() == n);
  }
  return ranks;
}

// Runs fn(r) on one thread per rank with device r current; joins them.
void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      OASIS_CUDA_CHECK(cudaSetDevice(r));
      fn(r);
    });
  }
  for (auto& t : threads) t.join();
}

// Destroys communicators and backends on their own devices' threads.
void Destroy(std::vector<Rank>& ranks) {
  OnEveryRank(static_cast<int>(ranks.size()), [&](int r) {
    ranks[static_cast<size_t>(r)].comm.reset();
    ranks[static_cast<size_t>(r)].backend.reset();
  });
}

// Host F32 data of rank r: normal values rounded to bf16 (exact in both dtypes).
Tensor RankData(int64_t n, uint32_t seed, int r) {
  std::mt19937 rng(seed * 977u + static_cast<uint32_t>(r));
  return testing::RandomBf16Exact({n}, rng);
}

Tensor AsDtype(const Tensor& f32, DType d) { return d == DType::kF32 ? f32 : testing::ToBf16Host(f32); }

}  // namespace

TEST_CASE("NcclCommunicator: NCCL_NVLS_ENABLE is forced to 0", "[gpu][nccl]") {
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  NcclCommunicator::DisableNvlsMulticast();
  REQUIRE(std::getenv("NCCL_NVLS_ENABLE") != nullptr);
  CHECK(std::string(std::getenv("NCCL_NVLS_ENABLE")) == "0");
}

TEST_CASE("NcclCommunicator all-reduce equals host sums; all-gather; barrier", "[gpu][nccl]") {
  const int n = GroupSize();
  std::vector<Rank> ranks = MakeGroup(n);
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t size : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1} << 20}) {
      INFO(DTypeName(dtype) << " x " << size);
      std::vector<Tensor> got(static_cast<size_t>(n));
      OnEveryRank(n, [&](int r) {
        Rank& k = ranks[static_cast<size_t>(r)];
        Tensor x = k.backend->Upload(AsDtype(RankData(size, seed, r), dtype));
        k.comm->AllReduceSum(x);
        got[static_cast<size_t>(r)] = k.backend->Download(x);
      });
      Tensor want = Tensor::Zeros({size}, DType::kF32);
      for (int r = 0; r < n; ++r) {
        const Tensor d = RankData(size, seed, r);
        for (int64_t i = 0; i < size; ++i) want.data<float>()[i] += d.data<float>()[i];
      }
      const Tensor g0 = got[0].dtype() == DType::kF32 ? got[0] : got[0].ToFloat();
      // Two addends: f32 sums are exact up to the order; bf16 rounds the sum once.
      if (dtype == DType::kF32) {
        ExpectClose(g0, want, 1e-6, 1e-6);
      } else {
        ExpectClose(g0, want, 1e-2, 8e-3);
      }
      for (int r = 1; r < n; ++r) {  // every rank holds the same bytes
        CHECK(std::memcmp(got[static_cast<size_t>(r)].raw(), got[0].raw(), got[0].nbytes()) == 0);
      }
    }
  }
  // All-gather: rank r contributes [2, 3] rows of value 100 r + i; everyone gets them in rank order.
  std::vector<Tensor> gathered(static_cast<size_t>(n));
  OnEveryRank(n, [&](int r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    std::vector<float> mine(6);
    for (int i = 0; i < 6; ++i) mine[static_cast<size_t>(i)] = 100.0f * r + i;
    Tensor in = k.backend->Upload(Tensor::FromFloats(mine, {2, 3}));
    Tensor out = k.backend->Empty({2 * n, 3}, DType::kF32);
    k.comm->AllGather(in, out);
    gathered[static_cast<size_t>(r)] = k.backend->Download(out);
    k.comm->Barrier();
  });
  for (int r = 0; r < n; ++r) {
    for (int src = 0; src < n; ++src) {
      for (int i = 0; i < 6; ++i) CHECK(gathered[static_cast<size_t>(r)].data<float>()[src * 6 + i] == 100.0f * src + i);
    }
  }
  Destroy(ranks);
}

TEST_CASE("NcclCommunicator all-reduce inside a captured CUDA graph", "[gpu][nccl][graphs]") {
  const int n = GroupSize();
  std::vector<Rank> ranks = MakeGroup(n);
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  constexpr int64_t kSize = 12288;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    INFO(DTypeName(dtype));
    std::vector<std::vector<Tensor>> results(static_cast<size_t>(n));
    OnEveryRank(n, [&](int r) {
      Rank& k = ranks[static_cast<size_t>(r)];
      CudaBackend& b = *k.backend;
      Tensor x = b.Empty({kSize}, dtype), y = b.Empty({kSize}, dtype);
      // y = x + x (bf16: a kernel before the collective) or a copy of x (f32), then all-reduce(y):
      // warmed up outside the capture (NCCL connects lazily), then captured.
      const auto step = [&] {
        if (dtype == DType::kBF16) {
          b.Add(x, x, y);
        } else {
          b.Copy(x, y);
        }
        k.comm->AllReduceSum(y);
      };
      step();
      b.Synchronize();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      OASIS_CUDA_CHECK(cudaStreamBeginCapture(b.stream(), cudaStreamCaptureModeThreadLocal));
      step();
      OASIS_CUDA_CHECK(cudaStreamEndCapture(b.stream(), &graph));
      OASIS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      OASIS_CUDA_CHECK(cudaGraphDestroy(graph));
      for (int rep = 0; rep < 3; ++rep) {  // new inputs each replay, same addresses
        const Tensor host = AsDtype(RankData(kSize, seed + static_cast<uint32_t>(rep), r), dtype);
        OASIS_CUDA_CHECK(cudaMemcpyAsync(x.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, b.stream()));
        OASIS_CUDA_CHECK(cudaGraphLaunch(exec, b.stream()));
        results[static_cast<size_t>(r)].push_back(b.Download(y));
      }
      OASIS_CUDA_CHECK(cudaGraphExecDestroy(exec));  // graphs go before their communicator
    });
    for (int rep = 0; rep < 3; ++rep) {
      Tensor want = Tensor::Zeros({kSize}, DType::kF32);
      for (int r = 0; r < n; ++r) {
        const Tensor d = RankData(kSize, seed + static_cast<uint32_t>(rep), r);
        const float factor = dtype == DType::kBF16 ? 2.0f : 1.0f;
        for (int64_t i = 0; i < kSize; ++i) want.data<float>()[i] += factor * d.data<float>()[i];
      }
      const Tensor& g = results[0][static_cast<size_t>(rep)];
      ExpectClose(g.dtype() == DType::kF32 ? g : g.ToFloat(), want, dtype == DType::kF32 ? 1e-5 : 2e-2,
                  dtype == DType::kF32 ? 1e-6 : 8e-3);
      for (int r = 1; r < n; ++r) {
        CHECK(std::memcmp(results[static_cast<size_t>(r)][static_cast<size_t>(rep)].raw(), g.raw(), g.nbytes()) == 0);
      }
    }
  }
  Destroy(ranks);
}

TEST_CASE("NcclCommunicator::Abort releases a rank whose peer never joins", "[gpu][nccl]") {
  if (cuda::DeviceCount() < 2) {
    WARN("fewer than 2 GPUs: the abort case is skipped");
    return;
  }
  std::vector<Rank> ranks = MakeGroup(2);
  // Warm the communicators up together first (connections are set up lazily).
  OnEveryRank(2, [&](int r) { ranks[static_cast<size_t>(r)].comm->Barrier(); });
  std::atomic<bool> done{false};
  std::thread watchdog([&] {  // a hang here would stall the whole suite: fail loudly instead
    for (int i = 0; i < 600 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      std::fprintf(stderr, "FATAL: NcclCommunicator::Abort did not release the waiting rank within 60 s\n");
      std::_Exit(1);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    OASIS_CUDA_CHECK(cudaSetDevice(0));
    Rank& k = ranks[0];
    Tensor x = k.backend->Upload(Tensor::FromFloats({1.0f, 2.0f}, {2}));
    k.comm->AllReduceSum(x);  // rank 1 never joins
    cudaStreamSynchronize(k.backend->stream());  // returns once the abort stops the kernel
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread a0(ranks[0].comm->AbortFunction()), a1(ranks[1].comm->AbortFunction());
  waiter.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  a0.join();
  a1.join();
  done = true;
  watchdog.join();
  INFO("released after " << secs << " s");
  CHECK(ranks[0].comm->aborted());
  CHECK(ranks[1].comm->aborted());
  OnEveryRank(2, [&](int r) {  // collectives of an aborted communicator return at once
    Rank& k = ranks[static_cast<size_t>(r)];
    Tensor x = k.backend->Upload(Tensor::FromFloats({1.0f}, {1}));
    k.comm->AllReduceSum(x);
    k.comm->Barrier();
  });
  // The stream that held the aborted kernel may report an error; the backends are dropped.
  cudaGetLastError();
  Destroy(ranks);
}

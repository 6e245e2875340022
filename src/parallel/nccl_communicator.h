// NcclCommunicator: the Communicator of one rank of a tensor-parallel group of GPUs, over
// NCCL (docs/parallel.md §2). Only built with CUDA.
//
// Collectives are enqueued on the stream `stream()` returns at the time of the call (the
// rank's CudaBackend::stream(), so UseStream is honoured) and return without any host
// synchronisation: AllReduceSum and AllGather can be captured in CUDA graphs (the graphs
// must then be captured and replayed in lock-step on every rank, and destroyed before the
// communicator: NCCL >= 2.26 waits for them in ncclCommDestroy/ncclCommAbort).
//
// NVLink multicast stays off: every constructor sets NCCL_NVLS_ENABLE=0 in the process
// environment (overwriting any value) before NCCL reads it. The GPU hosts are shared and
// NVLS multicast objects can take them out of service; nothing here needs NVLS.
//
// Errors: creation returns a Status naming the NCCL call, ncclGetErrorString and
// ncclGetLastError. A collective that NCCL rejects throws NcclError (an environment
// failure, e.g. a peer gone); mismatched shapes or dtypes are broken invariants (CHECK).
//
// Owns its ncclComm_t (ncclCommDestroy in the destructor, unless aborted) and a one-float
// device buffer for Barrier. Used by its rank's thread only, except Abort(), which any
// thread may call.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cuda_rt.h"
#include "oasis/status.h"
#include "parallel/communicator.h"

namespace oasis {

// A collective or barrier NCCL failed on (the message names the call, the rank and NCCL's
// error strings).
class NcclError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The stream a rank's collectives are enqueued on, asked at every call.
using StreamSource = std::function<cudaStream_t()>;

class NcclCommunicator final : public Communicator {
 public:
  // Sets NCCL_NVLS_ENABLE=0 (overwriting) in the process environment. Called by every
  // factory below; call it yourself before any other NCCL use in the process.
  static void DisableNvlsMulticast();

  // A new group id (ncclGetUniqueId). Rank 0 makes it; the other ranks receive its bytes
  // (in one process: a copy; across nodes: a rendezvous, docs/parallel.md §4).
  static StatusOr<ncclUniqueId> NewUniqueId();

  // One rank of a group (one thread or process per rank): makes `device` current on the
  // calling thread (it stays current) and joins the group with ncclCommInitRank, which
  // blocks until all `size` ranks have joined with the same id.
  static StatusOr<std::unique_ptr<NcclCommunicator>> Create(int rank, int size,
                                                            const ncclUniqueId& id, int device,
                                                            StreamSource stream);

  // Every rank of a group held by this process, created from the calling thread in one
  // NCCL group call (ncclGroupStart / ncclCommInitRank per rank / ncclGroupEnd): rank r
  // uses devices[r] and streams[r]. Cannot wait for a rank that never arrives. The calling
  // thread's current device is restored. The communicators may then be moved to the ranks'
  // threads.
  static StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateGroup(
      const std::vector<int>& devices, std::vector<StreamSource> streams);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_(); }

  // In place, ncclSum; F32, BF16 or F16 device tensors.
  void AllReduceSum(Tensor& t) override;
  // Any dtype; `in` and `out` on this rank's device.
  void AllGather(const Tensor& in, Tensor& out) override;
  // A one-element all-reduce on stream(), then a host sync of that stream, then a check of
  // NCCL's asynchronous error state. Setup and teardown only (never during a graph capture).
  void Barrier() override;

  // From any thread: makes this rank's pending collectives return (NCCL's abort flag stops
  // its kernels, also those of replayed graphs) so that a group where another rank failed
  // cannot hang, then releases the communicator (ncclCommAbort, which may wait until the
  // graphs that captured this communicator are destroyed). Afterwards every collective of
  // this object returns at once without communicating (results are garbage). The
  // communicator cannot be used again. Idempotent.
  void Abort();
  // Abort() as a callable that stays valid after this object is destroyed (it then does
  // nothing): for a helper thread that may race with the rank's teardown.
  std::function<void()> AbortFunction() const;
  bool aborted() const;

 private:
  // The communicator handle, shared with AbortFunction()'s callables.
  struct Handle {
    std::timed_mutex mu;  // held around every NCCL call that uses comm, and by aborts
    std::atomic<ncclComm_t> comm{nullptr};  // nullptr once aborted or destroyed
    std::atomic<bool> aborted{false};
    int rank = 0, device = 0;
  };
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, StreamSource stream);
  static void AbortHandle(Handle& h);
  // Throws NcclError for a failed NCCL result of `what`.
  void Check(ncclResult_t r, const char* what, ncclComm_t comm) const;

  std::shared_ptr<Handle> handle_;
  const int rank_, size_, device_;
  StreamSource stream_;
  cuda::DeviceBuffer barrier_buf_;  // [1] float, allocated by the first Barrier
};

}  // namespace oasis

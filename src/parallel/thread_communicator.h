// ThreadCommunicator: a tensor-parallel group of N ranks run by N threads of one process,
// exchanging host-memory tensors (the CPU backend's). For the CPU reference of tensor
// parallelism and its tests; GPUs use NCCL (docs/parallel.md).
//
// ThreadCommGroup owns the shared state of the group and one ThreadCommunicator per rank;
// it must outlive every use of them. Each ThreadCommunicator is used by its rank's thread
// only; the group's methods are thread-safe. Collectives block until all ranks arrive
// (a rank that never calls hangs the others, as with NCCL).
//
// Determinism: AllReduceSum adds the ranks' values in rank order 0..N-1 in float32 on
// every rank, so all ranks get bit-identical results and repeated runs are reproducible.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/communicator.h"

namespace oasis {

class ThreadCommGroup;

class ThreadCommunicator final : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override;
  // Host tensors (Device::kCpu) of dtype F32 or BF16 (BF16 sums in float, rounded once).
  void AllReduceSum(Tensor& t) override;
  void AllGather(const Tensor& in, Tensor& out) override;
  void Barrier() override;

 private:
  friend class ThreadCommGroup;
  ThreadCommunicator(ThreadCommGroup& group, int rank) : group_(group), rank_(rank) {}
  ThreadCommGroup& group_;
  int rank_;
};

class ThreadCommGroup {
 public:
  explicit ThreadCommGroup(int size);  // size >= 1 (CHECK)
  ThreadCommGroup(const ThreadCommGroup&) = delete;
  ThreadCommGroup& operator=(const ThreadCommGroup&) = delete;

  int size() const { return size_; }
  ThreadCommunicator& rank(int r);  // r in [0, size) (CHECK)

 private:
  friend class ThreadCommunicator;
  // What each rank contributes to the collective in progress.
  struct Slot {
    const void* data = nullptr;
    std::vector<int64_t> shape;
    DType dtype = DType::kF32;
  };
  // Blocks until all ranks have called it (a reusable generation barrier).
  void Wait();
  // Publishes rank r's tensor and waits for all; CHECKs that shapes and dtypes agree.
  void Publish(int r, const Tensor& t);

  const int size_;
  std::vector<std::unique_ptr<ThreadCommunicator>> ranks_;
  std::vector<Slot> slots_;  // [size]; written by its rank before a Wait, read after it
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;          // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_
};

}  // namespace oasis

// Communicator: the collective operations of one rank of a tensor-parallel group
// (docs/parallel.md). Implementations: ThreadCommunicator (N ranks as N threads of one
// process over host memory: the CPU reference and its tests); an NCCL one per GPU later.
//
// The interface is shaped for NCCL: every collective works in place on a tensor of this
// rank's backend and is *stream-ordered*: it is ordered after the backend work this rank
// issued before it and before the work issued after it, and it requires no host sync (a
// GPU implementation enqueues it on the backend's stream and returns). Every rank of the
// group must call the same collectives in the same order with tensors of the same shape
// and dtype (a mismatch is a broken invariant: CHECK failure where detectable).
//
// A Communicator object belongs to one rank and is used by that rank's thread only.
#pragma once

#include "oasis/tensor.h"

namespace oasis {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // in [0, size)
  virtual int size() const = 0;  // ranks in the group

  // t = Σ over ranks of t, in place, on every rank.
  virtual void AllReduceSum(Tensor& t) = 0;  // any shape, the backend's float dtype

  // out = the ranks' `in` concatenated along dimension 0 in rank order.
  virtual void AllGather(const Tensor& in,  // [n, ...]
                         Tensor& out) = 0;  // [size * n, ...]

  // Returns once every rank has reached the barrier (host-side; for setup and teardown,
  // never inside a forward pass).
  virtual void Barrier() = 0;
};

}  // namespace oasis

// Tensor parallelism on the GPUs of one host (docs/parallel.md §3): builds a TpModelRunner
// whose rank r runs on GPU devices[r] in its own worker thread, which owns (created there,
// with the device current) the rank's CudaBackend, its NcclCommunicator, its DecoderLM shard
// (TensorParallel{r, N, comm}), and its CudaGraphRunner (KV pools of the local heads, decode
// graphs that capture the NCCL all-reduces). One process: the NCCL unique id is made in
// process and the communicators are created together (NcclCommunicator::CreateGroup).
//
// Building, in order: every rank's backend (on its thread); the communicators (one NCCL
// group call, so a missing rank cannot hang it) and a barrier; every rank's shard
// (hooks.load_shard); every rank's KV budget (hooks.kv_slots, e.g. from cudaMemGetInfo after
// loading); the group's num_kv_slots = the minimum over ranks (the block allocator is shared
// logically: TpModelRunner); every rank's CudaGraphRunner with it. Any failure destroys what
// was built (on the ranks' threads) and returns a Status naming the rank.
//
// Plain functions; the runner they return owns everything.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "models/decoder_lm.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "runner/tp/tp_model_runner.h"

namespace oasis {

struct CudaTpOptions {
  int size = 2;              // ranks (GPUs)
  std::vector<int> devices;  // rank r on devices[r]; empty: 0 .. size-1
  // Each rank's graph runner; num_kv_slots is ignored (hooks.kv_slots decides it).
  CudaGraphOptions graph;
};

struct CudaTpHooks {
  // Rank tp.rank's shard on `backend` (called on that rank's thread, its device current),
  // e.g. DecoderLM::Create(config, weights, backend, tp) or CreateDummy(..., tp).
  std::function<StatusOr<std::unique_ptr<DecoderLM>>(CudaBackend& backend,
                                                     const TensorParallel& tp)>
      load_shard;
  // KV head-blocks per layer rank `rank` can hold once its shard is loaded (on its thread):
  // e.g. PlanKvCache over cudaMemGetInfo. The group uses the minimum over ranks. Rank 0 may
  // load more on its device first (the server loads an EAGLE-3 head there).
  std::function<StatusOr<int64_t>(int rank, CudaBackend& backend, DecoderLM& shard)> kv_slots;
};

// InvalidArgument unless 1 <= size and the config's head counts and intermediate size divide
// by it (CheckTensorParallel); FailedPrecondition naming both numbers when the host has
// fewer than `size` GPUs (or a device in `devices` does not exist); Unimplemented when the
// build has no NCCL and size > 1.
Status CheckCudaTensorParallel(const ModelConfig& config, const CudaTpOptions& options);

StatusOr<std::unique_ptr<TpModelRunner>> CreateCudaTpRunner(const ModelConfig& config,
                                                            const CudaTpOptions& options,
                                                            const CudaTpHooks& hooks);

}  // namespace oasis

// Tensor parallelism on the CPU reference backend: N ranks as N worker threads of this
// process, each with its own CpuBackend, model shard and plain ModelRunner (KV pools of its
// local heads), joined by a ThreadCommunicator. For tests and CI (the same TpModelRunner the
// GPUs use, on machines without them) and `oasis-server --backend cpu
// --tensor-parallel-size N`; not for speed.
//
// Unlike NCCL, a ThreadCommunicator cannot be aborted: a rank that fails between two
// collectives leaves the others waiting (the CPU ranks fail only on broken invariants,
// which abort the process anyway).
//
// Plain function; the runner it returns owns everything.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"
#include "models/decoder_lm.h"
#include "runner/tp/tp_model_runner.h"

namespace oasis {

struct CpuTpOptions {
  int size = 2;
  int threads_per_rank = 0;  // CpuBackend threads (0 = its default)
  int64_t num_kv_slots = 0;  // head-blocks per layer in every rank's pools (>= 1)
};

// `load_shard` builds rank tp.rank's shard on `backend` (called on that rank's thread).
StatusOr<std::unique_ptr<TpModelRunner>> CreateCpuTpRunner(
    const ModelConfig& config, const CpuTpOptions& options,
    const std::function<StatusOr<std::unique_ptr<DecoderLM>>(
        Backend& backend, const TensorParallel& tp)>& load_shard);

}  // namespace oasis

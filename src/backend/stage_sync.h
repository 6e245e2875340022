// SparseStageSync: how a device backend orders the stages of the sparse-KV pipeline
// (attention, predict, select, transfer; docs/sparse.md §4) on its streams. It lives with the
// backend, not with the KV policy that drives it (kvcache/sparse_pipeline.h): ordering work
// on streams and events is the op set's concern, and a CUDA implementation
// (backend/cuda/cuda_sparse_sync.h) then needs no KV-cache type, so the backend includes no
// kvcache header. The pipeline calls it; the runner that owns the streams owns the sync.
#pragma once

#include <cstdint>

namespace oasis {

enum class SparseStage : uint8_t { kAttention, kPredict, kSelect, kTransfer };

// Enter(stage, l): the ops that follow run on `stage`'s stream after its dependencies
// (kAttention: transfer_done[l] of the previous step; kPredict: attn_done[l]; kSelect:
// predict_done[l]; kTransfer: select_done[l] and attn_done[l]). Exit(stage, l): record the
// stage's event for layer l and return to the main stream. The CPU runs everything in order
// and needs none (nullptr). Implementations are not thread-safe: the thread running the
// forward pass.
class SparseStageSync {
 public:
  virtual ~SparseStageSync() = default;
  virtual void Enter(SparseStage stage, int64_t layer) = 0;
  virtual void Exit(SparseStage stage, int64_t layer) = 0;
  // End of a step (EndStep): the main stream waits for every side-stream operation of the
  // step, so the step's uploads may be freed and a captured graph rejoins. CPU: nothing.
  virtual void Join() {}
  // Seconds the main stream waited for transfers since the last call (0 if not measured).
  virtual double TakeTransferWaitSeconds() { return 0.0; }
};

}  // namespace oasis

// CudaSparseStageSync: the CUDA streams and events of the sparse-KV pipeline (DESIGN.md §1.1,
// docs/sparse.md §4). The attention stage runs on the backend's own stream; predict, select
// and transfer each have their own stream. Per layer l: attention waits transfer_done[l] of
// the previous step; predict waits attn_done[l]; select waits predict_done[l]; transfer
// waits select_done[l] and attn_done[l] (victim slots are not overwritten while attention
// still reads them). Join() makes the backend's stream wait for the last operation of each
// side stream in the step, so a step ends with every side stream joined (needed by graph
// capture, and it keeps per-step uploads alive while side streams read them; with transfers
// off the predict and select streams still have work to join). While capturing a graph
// (SetCapturing), attention does not wait for the previous step's transfer: that event was
// recorded outside the capture, and one stream's graph launches run one after the other, each
// ending joined; after it (AfterCapture) every event is recorded again outside the capture.
// No host synchronisation anywhere.
//
// Owns the three streams (the transfer stream at the device's greatest priority) and
// 4 × num_layers events. Not thread-safe: the thread running the forward pass.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/stage_sync.h"
#include "common/cuda_rt.h"

namespace oasis {

class CudaSparseStageSync final : public SparseStageSync {
 public:
  CudaSparseStageSync(CudaBackend& backend, int64_t num_layers);

  void Enter(SparseStage stage, int64_t layer) override;
  void Exit(SparseStage stage, int64_t layer) override;
  // The backend's stream waits for everything the side streams were given so far. Timing
  // events around the wait (recorded by graph replays too: cudaEventRecordExternal) measure
  // how long the step's end waited for the side streams — the transfers, predict and select
  // the main stream's work did not hide (attention itself never waits within a step: the
  // previous step's join covered its transfers).
  void Join() override;
  // Seconds the step ends waited (above), summed over the steps measured since the last call.
  double TakeTransferWaitSeconds() override;
  // After a graph replay has completed: counts its wait (eager steps are counted at the next
  // Join or Take).
  void StepDone();
  // Inside a stream capture of one step (CudaGraphRunner's sparse graphs).
  void SetCapturing(bool capturing) { capturing_ = capturing; }
  // After the capture has ended: an event last recorded inside a capture cannot be waited on
  // outside it (cudaErrorInvalidValue), so every event is recorded again on the backend's
  // stream, which the captured step leaves joined; an eager step after graph steps then
  // waits for nothing more than stream order already gives.
  void AfterCapture();

  // Measurement (bench_sparse_decode --timeline): while on, eager steps also record timing
  // events when each stage starts work on a layer (after its waits) and when it ends.
  // TakeTimeline, after the step has been synchronised, returns them in ms from the earliest
  // start and forgets them. Nothing is recorded while capturing.
  struct TimelineEntry {
    SparseStage stage;
    int64_t layer;
    float start_ms, end_ms;
  };
  void EnableTimeline(bool on);
  std::vector<TimelineEntry> TakeTimeline();

 private:
  cudaStream_t StreamOf(SparseStage stage) const;
  cudaEvent_t EventOf(SparseStage stage, int64_t layer) const;

  CudaBackend& backend_;
  int64_t num_layers_;
  cuda::Stream predict_, select_;
  // The gather (UVA reads from pinned host memory: few CTAs, PCIe-bound) runs at the greatest
  // priority, so its CTAs are not queued behind a many-CTA grid of the same step (attention,
  // GEMMs): at equal priority it fell from ~48 to 13–14 GB/s beside an HBM-bound grid on the
  // H200 (tools/bench/bench_sparse_kv --only gather).
  cuda::Stream transfer_{cuda::StreamPriority::kGreatest};
  std::vector<cuda::Event>
      events_;  // [4][num_layers]: attn_done, predict_done, select_done, transfer_done
  // Per side stage (predict, select, transfer): the last layer given to it since the last
  // Join, -1 = none.
  int64_t last_layer_[3] = {-1, -1, -1};
  bool capturing_ = false;
  bool timeline_ = false;
  cuda::Event wait_begin_{cuda::EventTiming::kEnabled}, wait_end_{cuda::EventTiming::kEnabled};
  bool wait_pending_ = false;  // wait_begin_/wait_end_ hold a step not yet counted
  double wait_seconds_ = 0;
  void CountWait();
  std::vector<cuda::Event> timeline_start_, timeline_end_;  // [4][num_layers], timing enabled
  std::vector<char> timeline_recorded_;
  int64_t TimelineIndex(SparseStage stage, int64_t layer) const {
    return static_cast<int64_t>(stage) * num_layers_ + layer;
  }
};

}  // namespace oasis

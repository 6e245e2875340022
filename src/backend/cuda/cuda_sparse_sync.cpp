#include "backend/cuda/cuda_sparse_sync.h"

#include "common/check.h"

namespace oasis {

CudaSparseStageSync::CudaSparseStageSync(CudaBackend& backend, int64_t num_layers)
    : backend_(backend), num_layers_(num_layers) {
  OASIS_CHECK_GT(num_layers, 0) << "sparse stage sync";
  events_.reserve(static_cast<size_t>(4 * num_layers));
  for (int64_t i = 0; i < 4 * num_layers; ++i) events_.emplace_back(cuda::EventTiming::kDisabled);
}

cudaStream_t CudaSparseStageSync::StreamOf(SparseStage stage) const {
  switch (stage) {
    case SparseStage::kAttention:
      return nullptr;  // the backend's own stream
    case SparseStage::kPredict:
      return predict_.get();
    case SparseStage::kSelect:
      return select_.get();
    case SparseStage::kTransfer:
      return transfer_.get();
  }
  return nullptr;
}

cudaEvent_t CudaSparseStageSync::EventOf(SparseStage stage, int64_t layer) const {
  OASIS_CHECK(layer >= 0 && layer < num_layers_) << "sparse stage layer " << layer;
  return events_[static_cast<size_t>(static_cast<int64_t>(stage) * num_layers_ + layer)].get();
}

void CudaSparseStageSync::Enter(SparseStage stage, int64_t layer) {
  backend_.UseStream(StreamOf(stage));
  const cudaStream_t s = backend_.stream();
  // An event never recorded is complete: the first step waits for nothing.
  switch (stage) {
    case SparseStage::kAttention:
      if (!capturing_)
        OASIS_CUDA_CHECK(cudaStreamWaitEvent(s, EventOf(SparseStage::kTransfer, layer), 0));
      if (timeline_ && !capturing_)
        timeline_start_[static_cast<size_t>(TimelineIndex(stage, layer))].Record(s);
      return;
    case SparseStage::kPredict:
      OASIS_CUDA_CHECK(cudaStreamWaitEvent(s, EventOf(SparseStage::kAttention, layer), 0));
      break;
    case SparseStage::kSelect:
      OASIS_CUDA_CHECK(cudaStreamWaitEvent(s, EventOf(SparseStage::kPredict, layer), 0));
      break;
    case SparseStage::kTransfer:
      OASIS_CUDA_CHECK(cudaStreamWaitEvent(s, EventOf(SparseStage::kSelect, layer), 0));
      OASIS_CUDA_CHECK(cudaStreamWaitEvent(s, EventOf(SparseStage::kAttention, layer), 0));
      break;
  }
  last_layer_[static_cast<int>(stage) - static_cast<int>(SparseStage::kPredict)] = layer;
  if (timeline_ && !capturing_)
    timeline_start_[static_cast<size_t>(TimelineIndex(stage, layer))].Record(s);
}

void CudaSparseStageSync::Exit(SparseStage stage, int64_t layer) {
  if (timeline_ && !capturing_) {
    const auto i = static_cast<size_t>(TimelineIndex(stage, layer));
    timeline_end_[i].Record(backend_.stream());
    timeline_recorded_[i] = 1;
  }
  OASIS_CUDA_CHECK(cudaEventRecord(EventOf(stage, layer), backend_.stream()));
  backend_.UseStream(nullptr);
}

void CudaSparseStageSync::AfterCapture() {
  OASIS_CHECK(!capturing_) << "AfterCapture while capturing";
  for (cuda::Event& e : events_) OASIS_CUDA_CHECK(cudaEventRecord(e.get(), backend_.stream()));
  last_layer_[0] = last_layer_[1] = last_layer_[2] = -1;
}

void CudaSparseStageSync::EnableTimeline(bool on) {
  timeline_ = on;
  if (on && timeline_start_.empty()) {
    for (int64_t i = 0; i < 4 * num_layers_; ++i) {
      timeline_start_.emplace_back(cuda::EventTiming::kEnabled);
      timeline_end_.emplace_back(cuda::EventTiming::kEnabled);
    }
    timeline_recorded_.assign(static_cast<size_t>(4 * num_layers_), 0);
  }
}

std::vector<CudaSparseStageSync::TimelineEntry> CudaSparseStageSync::TakeTimeline() {
  std::vector<TimelineEntry> out;
  const cuda::Event* first = nullptr;
  float earliest = 0.0f;
  for (size_t i = 0; i < timeline_recorded_.size(); ++i) {
    if (!timeline_recorded_[i]) continue;
    timeline_end_[i].Synchronize();
    if (first == nullptr) {
      first = &timeline_start_[i];
      continue;
    }
    const float t = timeline_start_[i].ElapsedMsSince(*first);
    if (t < earliest) earliest = t;
  }
  for (size_t i = 0; i < timeline_recorded_.size(); ++i) {
    if (!timeline_recorded_[i]) continue;
    const auto stage = static_cast<SparseStage>(static_cast<int64_t>(i) / num_layers_);
    out.push_back({stage, static_cast<int64_t>(i) % num_layers_,
                   timeline_start_[i].ElapsedMsSince(*first) - earliest,
                   timeline_end_[i].ElapsedMsSince(*first) - earliest});
    timeline_recorded_[i] = 0;
  }
  return out;
}

void CudaSparseStageSync::Join() {
  CountWait();  // the previous eager step's, before its events are recorded again
  const cudaStream_t main = backend_.stream();
  const unsigned flags = capturing_ ? cudaEventRecordExternal : cudaEventRecordDefault;
  OASIS_CUDA_CHECK(cudaEventRecordWithFlags(wait_begin_.get(), main, flags));
  // Each side stream runs its stage's layers in order, so its last event covers the step.
  for (SparseStage stage : {SparseStage::kPredict, SparseStage::kSelect, SparseStage::kTransfer}) {
    int64_t& last = last_layer_[static_cast<int>(stage) - static_cast<int>(SparseStage::kPredict)];
    if (last < 0) continue;
    OASIS_CUDA_CHECK(cudaStreamWaitEvent(main, EventOf(stage, last), 0));
    last = -1;
  }
  OASIS_CUDA_CHECK(cudaEventRecordWithFlags(wait_end_.get(), main, flags));
  if (!capturing_) wait_pending_ = true;  // a capture's are the replays' (StepDone)
}

void CudaSparseStageSync::CountWait() {
  // Never while capturing: querying an event is not allowed in a capture (and the previous
  // replay's timing events are read after this capture's end instead).
  if (!wait_pending_ || capturing_) return;
  const cudaError_t done = cudaEventQuery(wait_end_.get());
  if (done == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return;  // still running: counted later
  }
  OASIS_CUDA_CHECK(done);
  wait_seconds_ += wait_end_.ElapsedMsSince(wait_begin_) * 1e-3;
  wait_pending_ = false;
}

void CudaSparseStageSync::StepDone() {
  wait_pending_ = true;
  CountWait();
}

double CudaSparseStageSync::TakeTransferWaitSeconds() {
  CountWait();
  const double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

}  // namespace oasis

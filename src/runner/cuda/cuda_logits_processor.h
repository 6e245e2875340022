// CudaLogitsProcessor: the device side of logits processing (runner/logits_processing.h) for
// the CudaSampler. Per request with penalties or allowed_token_ids, a slot of device memory
// holds its generated tokens' counts and its prompt / allowed masks; each step the tokens the
// request committed since the last step (its SampleRow::output_tokens past what the slot has
// counted) travel with the step's parameters — one host-to-device copy for the whole step,
// no synchronisation — and a kernel adds them on the device before the rows are processed.
// A new request's slot is cleared and filled (prompt, allowed ids, output so far) the same
// way. Slots are keyed by the request's LogitsProcessing and freed once no SampleRow holds it
// any more (the request finished), found at the next Enqueue. Rows without processing cost
// nothing; a batch without any launches nothing.
//
// Owns the slots, a pinned staging buffer and the device buffers of a step's parameters and
// processed logits. Not thread-safe (the runner's thread). Work is queued on the caller's
// stream; the caller synchronises it before the next Enqueue (CudaSampler::Finish does).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "common/cuda_rt.h"
#include "kernels/logits_processing.h"
#include "kernels/sampling.h"
#include "runner/sampler.h"

namespace oasis {

class CudaLogitsProcessor {
 public:
  // Queues the processing of the needed rows of `rows` that have any, reading the raw
  // `logits` (device F32 [R, vocab], R >= rows.size()); sets host_params[r].processed to the
  // row's index in processed() for them (the others keep -1). Returns whether any row is
  // processed.
  bool Enqueue(const float* logits, int64_t vocab, int64_t stride,
               const std::vector<SampleRow>& rows, kernels::SampleParamsDevice* host_params,
               cudaStream_t stream);
  // [rows processed by the last Enqueue, vocab] device F32; row r of that Enqueue's rows is
  // processed()[processed_index(r)] (-1: not processed).
  const float* processed() const { return static_cast<const float*>(processed_.data()); }
  int32_t processed_index(size_t r) const {
    return r < processed_index_.size() ? processed_index_[r] : -1;
  }
  // Live per-request slots (tests).
  size_t num_slots() const { return by_owner_.size(); }

 private:
  struct Slot {
    std::weak_ptr<const LogitsProcessing> owner;
    cuda::DeviceBuffer state;  // counts [vocab] int32, then prompt [vocab] u8, allowed [vocab] u8
    int64_t vocab = 0;
    size_t counted = 0;  // output tokens already added to the counts
    int32_t* counts() const { return static_cast<int32_t*>(state.data()); }
    uint8_t* prompt() const { return reinterpret_cast<uint8_t*>(counts() + vocab); }
    uint8_t* allowed() const { return prompt() + vocab; }
  };
  // The slot of a row's request, made (and its clearing queued) on first use.
  Slot& SlotFor(const SampleRow& row, int64_t vocab, cudaStream_t stream);
  void ReleaseFinished();
  template <typename T>
  static void Grow(cuda::DeviceBuffer& buf, size_t count);

  std::unordered_map<const LogitsProcessing*, size_t> by_owner_;  // → slots_ index
  std::vector<Slot> slots_;
  std::vector<size_t> free_;              // unused slots_ entries (their memory kept for reuse)
  std::vector<int32_t> processed_index_;  // per row of the last Enqueue
  std::vector<kernels::LogitsRowDevice> rows_;
  std::vector<kernels::LogitsEntryDevice> entries_;
  std::vector<kernels::TokenUpdateDevice> updates_;
  cuda::PinnedBuffer staging_;
  cuda::DeviceBuffer device_params_, processed_;
};

}  // namespace oasis

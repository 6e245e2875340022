#include "runner/cuda/cuda_logits_processor.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kernels/logits_processing.h"

namespace oasis {
namespace {

constexpr size_t kKeepFreeSlots = 16;  // released slots whose device memory is kept for reuse

size_t AlignUp(size_t x) { return (x + 255) / 256 * 256; }

// Threads that build structured rows' masks at once (RowEntriesOf).
constexpr size_t kMaxMaskThreads = 8;

}  // namespace

void CudaLogitsProcessor::ReleaseFinished() {
  for (auto it = by_owner_.begin(); it != by_owner_.end();) {
    if (!slots_[it->second].owner.expired()) {
      ++it;
      continue;
    }
    Slot& slot = slots_[it->second];
    slot.owner.reset();
    if (free_.size() >= kKeepFreeSlots) slot.state = cuda::DeviceBuffer();
    free_.push_back(it->second);
    it = by_owner_.erase(it);
  }
}

CudaLogitsProcessor::Slot& CudaLogitsProcessor::SlotFor(const SampleRow& row, int64_t vocab,
                                                        cudaStream_t stream) {
  const LogitsProcessing& p = *row.processing;
  auto it = by_owner_.find(&p);
  if (it != by_owner_.end()) {
    Slot& slot = slots_[it->second];
    if (slot.vocab == vocab && slot.counted <= row.output_tokens.size()) return slot;
    // (Not expected: a request's committed output only grows.) Rebuilt from scratch below.
    free_.push_back(it->second);
    by_owner_.erase(it);
  }
  size_t index = slots_.size();
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    slots_.emplace_back();
  }
  Slot& slot = slots_[index];
  const size_t bytes = static_cast<size_t>(vocab) * (sizeof(int32_t) + 2);
  if (slot.state.data() == nullptr || slot.state.size() < bytes) {
    slot.state = cuda::DeviceBuffer::Allocate(bytes).value();
  }
  slot.owner = row.processing;
  slot.vocab = vocab;
  slot.counted = 0;
  by_owner_[&p] = index;
  OASIS_CUDA_CHECK(cudaMemsetAsync(slot.state.data(), 0, bytes, stream));
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : row.prompt_tokens) {
      if (t >= 0 && t < vocab) updates_.push_back({slot.prompt(), t, 1});
    }
  }
  for (int32_t t : p.allowed_token_ids) {
    if (t >= 0 && t < vocab) updates_.push_back({slot.allowed(), t, 1});
  }
  return slot;
}

template <typename T>
void CudaLogitsProcessor::Grow(cuda::DeviceBuffer& buf, size_t count) {
  const size_t bytes = count * sizeof(T);
  if (buf.data() != nullptr && buf.size() >= bytes) return;
  buf = cuda::DeviceBuffer::Allocate(std::max<size_t>(bytes + bytes / 2, 1 << 16)).value();
}

bool CudaLogitsProcessor::Enqueue(const float* logits, int64_t vocab, int64_t stride,
                                  const std::vector<SampleRow>& rows,
                                  kernels::SampleParamsDevice* host_params, cudaStream_t stream) {
  processed_index_.assign(rows.size(), -1);
  if (by_owner_.empty() &&
      std::none_of(rows.begin(), rows.end(), [](const SampleRow& r) { return r.processing; })) {
    return false;  // the common case: nothing to process, nothing kept
  }
  ReleaseFinished();
  rows_.clear();
  entries_.clear();
  updates_.clear();
  const std::vector<std::vector<LogitsEntry>> all_entries = RowEntriesOf(rows, kMaxMaskThreads);
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRow& row = rows[r];
    if (!row.needed || row.processing == nullptr) continue;
    const LogitsProcessing& p = *row.processing;
    const std::vector<LogitsEntry>& entries = all_entries[r];
    const bool stateful = p.has_penalties() || !p.allowed_token_ids.empty();
    if (!stateful && entries.empty()) continue;  // nothing this step (min_tokens reached, say)
    kernels::LogitsRowDevice d{};
    d.logits_row = static_cast<int32_t>(r);
    d.out_row = static_cast<int32_t>(rows_.size());
    d.presence = p.presence_penalty;
    d.frequency = p.frequency_penalty;
    d.repetition = p.repetition_penalty;
    if (stateful) {
      Slot& slot = SlotFor(row, vocab, stream);
      // The tokens the request committed since its counts were last brought up to date (a
      // speculative row of the same request finds them counted already).
      if (p.has_penalties()) {
        for (size_t k = slot.counted; k < row.output_tokens.size(); ++k) {
          const int32_t t = row.output_tokens[k];
          if (t >= 0 && t < vocab) updates_.push_back({slot.counts(), t, 0});
        }
        slot.counted = row.output_tokens.size();
        d.counts = slot.counts();
      }
      if (p.repetition_penalty != 1.0f) d.prompt = slot.prompt();
      if (!p.allowed_token_ids.empty()) d.allowed = slot.allowed();
    }
    OASIS_CHECK_LE(row.draft_tokens.size(), static_cast<size_t>(kernels::kLogitsMaxDraft))
        << "draft tokens before a processed row";
    d.num_draft = static_cast<int32_t>(row.draft_tokens.size());
    for (size_t k = 0; k < row.draft_tokens.size(); ++k) d.draft[k] = row.draft_tokens[k];
    d.entries_begin = static_cast<int32_t>(entries_.size());
    for (const LogitsEntry& e : entries) entries_.push_back({e.token, e.bias, e.masked ? 1 : 0});
    d.entries_end = static_cast<int32_t>(entries_.size());
    host_params[r].processed = d.out_row;
    processed_index_[r] = d.out_row;
    rows_.push_back(d);
  }
  if (rows_.empty() && updates_.empty()) return false;
  // One staging copy: rows, entries, updates.
  const size_t rows_off = 0;
  const size_t entries_off = AlignUp(rows_off + rows_.size() * sizeof(rows_[0]));
  const size_t updates_off = AlignUp(entries_off + entries_.size() * sizeof(entries_[0]));
  const size_t total = AlignUp(updates_off + updates_.size() * sizeof(updates_[0]));
  if (staging_.data() == nullptr || staging_.size() < total) {
    staging_ = cuda::PinnedBuffer::Allocate(std::max<size_t>(total + total / 2, 1 << 16)).value();
  }
  Grow<char>(device_params_, total);
  char* h = static_cast<char*>(staging_.data());
  std::memcpy(h + rows_off, rows_.data(), rows_.size() * sizeof(rows_[0]));
  std::memcpy(h + entries_off, entries_.data(), entries_.size() * sizeof(entries_[0]));
  std::memcpy(h + updates_off, updates_.data(), updates_.size() * sizeof(updates_[0]));
  OASIS_CUDA_CHECK(
      cudaMemcpyAsync(device_params_.data(), h, total, cudaMemcpyHostToDevice, stream));
  char* dev = static_cast<char*>(device_params_.data());
  OASIS_CUDA_CHECK(kernels::LaunchTokenUpdates(
      reinterpret_cast<const kernels::TokenUpdateDevice*>(dev + updates_off),
      static_cast<int64_t>(updates_.size()), stream));
  if (rows_.empty()) return false;
  Grow<float>(processed_, rows_.size() * static_cast<size_t>(vocab));
  OASIS_CUDA_CHECK(kernels::LaunchProcessLogits(
      logits, vocab, stride, reinterpret_cast<const kernels::LogitsRowDevice*>(dev + rows_off),
      static_cast<int64_t>(rows_.size()),
      reinterpret_cast<const kernels::LogitsEntryDevice*>(dev + entries_off),
      static_cast<float*>(processed_.data()), vocab, stream));
  return true;
}

}  // namespace oasis

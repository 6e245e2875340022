#include "parallel/thread_communicator.h"

#include <cstring>

#include "common/check.h"

namespace oasis {

ThreadCommGroup::ThreadCommGroup(int size)
    : size_(size), slots_(static_cast<size_t>(size > 0 ? size : 0)) {
  OASIS_CHECK(size >= 1) << "a communicator group needs at least one rank, got " << size;
  for (int r = 0; r < size; ++r) ranks_.emplace_back(new ThreadCommunicator(*this, r));
}

ThreadCommunicator& ThreadCommGroup::rank(int r) {
  OASIS_CHECK(r >= 0 && r < size_) << "rank " << r << " outside [0, " << size_ << ")";
  return *ranks_[static_cast<size_t>(r)];
}

void ThreadCommGroup::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

void ThreadCommGroup::Publish(int r, const Tensor& t) {
  OASIS_CHECK(t.device() == Device::kCpu)
      << "ThreadCommunicator exchanges host tensors, got " << t.ToString();
  slots_[static_cast<size_t>(r)] = Slot{t.raw(), t.shape(), t.dtype()};
  Wait();
  const Slot& first = slots_[0];
  for (const Slot& s : slots_) {
    OASIS_CHECK(s.shape == first.shape && s.dtype == first.dtype)
        << "rank " << r << ": collective on " << t.ToString() << " while another rank passed shape "
        << ShapeToString(s.shape)
        << " (every rank must call the same collectives in the same order)";
  }
}

int ThreadCommunicator::size() const { return group_.size(); }

void ThreadCommunicator::AllReduceSum(Tensor& t) {
  OASIS_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16)
      << "AllReduceSum needs an F32 or BF16 tensor, got " << t.ToString();
  group_.Publish(rank_, t);
  // Every rank computes the whole sum in rank order (identical on all ranks), then waits
  // until all have read every input before overwriting its own.
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> sum(n, 0.0f);
  for (const ThreadCommGroup::Slot& s : group_.slots_) {
    if (t.dtype() == DType::kF32) {
      const float* src = static_cast<const float*>(s.data);
      for (size_t i = 0; i < n; ++i) sum[i] += src[i];
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(s.data);
      for (size_t i = 0; i < n; ++i) sum[i] += Bf16BitsToFloat(src[i]);
    }
  }
  group_.Wait();
  if (t.dtype() == DType::kF32) {
    std::memcpy(t.raw(), sum.data(), n * sizeof(float));
  } else {
    uint16_t* dst = t.data<uint16_t>();
    for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16Bits(sum[i]);
  }
  group_.Wait();  // no rank starts the next collective (re-publishing) before all wrote
}

void ThreadCommunicator::AllGather(const Tensor& in, Tensor& out) {
  OASIS_CHECK(in.ndim() >= 1 && out.ndim() == in.ndim() && out.dtype() == in.dtype() &&
              out.dim(0) == in.dim(0) * size() && out.numel() == in.numel() * size())
      << "AllGather " << in.ToString() << " into " << out.ToString() << " over " << size()
      << " ranks";
  OASIS_CHECK(out.device() == Device::kCpu) << "ThreadCommunicator exchanges host tensors";
  group_.Publish(rank_, in);
  uint8_t* dst = static_cast<uint8_t*>(out.raw());
  for (const ThreadCommGroup::Slot& s : group_.slots_) {
    std::memcpy(dst, s.data, in.nbytes());
    dst += in.nbytes();
  }
  group_.Wait();  // inputs stay valid until every rank has copied them
}

void ThreadCommunicator::Barrier() { group_.Wait(); }

}  // namespace oasis

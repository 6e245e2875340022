#include "engine/output_delivery.h"

namespace oasis {

OutputDelivery::OutputDelivery() : thread_([this] { Run(); }) {}

OutputDelivery::~OutputDelivery() {
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OutputDelivery::Flush() {
  if (pending_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& item : pending_) queue_.push_back(std::move(item));
    ++flushed_;
  }
  pending_.clear();
  cv_.notify_one();
}

void OutputDelivery::Drain() {
  Flush();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return delivered_ == flushed_; });
}

void OutputDelivery::Run() {
  Batch batch;
  while (true) {
    uint64_t upto;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      batch.swap(queue_);
      upto = flushed_;
    }
    for (auto& [stream, out] : batch) stream->Push(std::move(out));
    batch.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      delivered_ = upto;
    }
    done_cv_.notify_all();
  }
}

}  // namespace oasis

#include "parallel/lockstep_group.h"

#include <algorithm>
#include <stdexcept>

#include "common/check.h"
#include "common/logging.h"

namespace oasis {
namespace {

std::string Describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

LockstepGroup::LockstepGroup(int size, std::function<void(int)> on_start,
                             std::function<void(int)> abort)
    : size_(size),
      on_start_(std::move(on_start)),
      abort_(std::move(abort)),
      enqueued_(static_cast<size_t>(std::max(size, 0)), false),
      errors_(static_cast<size_t>(std::max(size, 0))) {
  OASIS_CHECK(size >= 1) << "a lock-step group needs at least one rank, got " << size;
  for (int r = 0; r < size; ++r) workers_.emplace_back([this, r] { WorkerLoop(r); });
}

LockstepGroup::~LockstepGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  for (std::thread& t : aborters_) t.join();
}

void LockstepGroup::set_abort(std::function<void(int)> abort) { abort_ = std::move(abort); }

bool LockstepGroup::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string LockstepGroup::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void LockstepGroup::WorkerLoop(int rank) {
  std::exception_ptr start_error;
  if (on_start_) {
    try {
      on_start_(rank);
    } catch (...) {
      start_error = std::current_exception();  // every job of this rank fails with it
    }
  }
  uint64_t seen = 0;
  for (;;) {
    std::function<void(int)> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error = start_error;
    if (!error) {
      try {
        job(rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error) {
        errors_[static_cast<size_t>(rank)] = error;
        if (first_failed_ < 0) first_failed_ = rank;
      }
      --running_;
    }
    cv_.notify_all();
  }
}

void LockstepGroup::Start(const std::function<void(int)>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    running_ = size_;
    std::fill(enqueued_.begin(), enqueued_.end(), false);
    num_enqueued_ = 0;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    first_failed_ = -1;
    ++generation_;
  }
  cv_.notify_all();
}

void LockstepGroup::MarkEnqueued(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank < 0 || rank >= size_ || enqueued_[static_cast<size_t>(rank)]) return;
    enqueued_[static_cast<size_t>(rank)] = true;
    ++num_enqueued_;
  }
  cv_.notify_all();
}

void LockstepGroup::AbortAll() {
  if (!abort_) return;
  // One helper per rank: an abort may block (ncclCommAbort waits for the graphs that captured
  // its communicator), and every rank's abort flag must be raised at once.
  for (int r = 0; r < size_; ++r) {
    aborters_.emplace_back([this, r] {
      try {
        abort_(r);
      } catch (const std::exception& e) {
        spdlog::error("tensor-parallel rank {}: abort failed: {}", r, e.what());
      }
    });
  }
}

void LockstepGroup::Run(const std::function<void(int)>& job,
                        const std::function<void()>& while_running) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_)
      throw std::runtime_error("the tensor-parallel group is unusable after a failure (" +
                               failure_ + ")");
  }
  Start(job);
  bool aborted = false, hook_done = !while_running;
  std::exception_ptr hook_error;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] {
      return running_ == 0 || (first_failed_ >= 0 && !aborted) ||
             (!hook_done && first_failed_ < 0 && num_enqueued_ == size_);
    });
    if (first_failed_ >= 0 && !aborted) {
      aborted = true;
      failed_ = true;
      failure_ = "rank " + std::to_string(first_failed_) +
                 " failed: " + Describe(errors_[static_cast<size_t>(first_failed_)]);
      spdlog::error("tensor-parallel {}; aborting the group", failure_);
      lock.unlock();
      AbortAll();
      lock.lock();
      continue;
    }
    if (!hook_done && first_failed_ < 0 && num_enqueued_ == size_) {
      hook_done = true;
      lock.unlock();
      try {
        while_running();
      } catch (...) {
        hook_error = std::current_exception();
      }
      lock.lock();
      continue;
    }
    if (running_ == 0) break;
  }
  if (first_failed_ >= 0) {
    for (int r = 0; r < size_; ++r) {
      if (r != first_failed_ && errors_[static_cast<size_t>(r)]) {
        spdlog::warn("tensor-parallel rank {} also failed: {}", r,
                     Describe(errors_[static_cast<size_t>(r)]));
      }
    }
    throw std::runtime_error("tensor-parallel " + failure_);
  }
  lock.unlock();
  if (!hook_done) {  // some rank never marked its work enqueued: run the host work now
    hook_done = true;
    while_running();
  }
  if (hook_error) std::rethrow_exception(hook_error);
}

void LockstepGroup::RunTeardown(const std::function<void(int)>& job) {
  Start(job);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
  for (int r = 0; r < size_; ++r) {
    if (errors_[static_cast<size_t>(r)]) {
      spdlog::warn("tensor-parallel rank {}: teardown failed: {}", r,
                   Describe(errors_[static_cast<size_t>(r)]));
    }
  }
}

}  // namespace oasis

// RunBenchmark: see runner.h.
#include "tools/loadgen/runner.h"

#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

namespace oasis::loadgen {

std::vector<double> ArrivalTimes(int64_t n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> times(static_cast<size_t>(n), 0.0);
  if (!std::isfinite(request_rate) || request_rate <= 0) return times;
  std::mt19937_64 rng(seed);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    times[i] = t;
    double gap;
    if (burstiness == 1.0) {
      gap = -std::log(1.0 - UniformUnit(rng)) / request_rate;  // exponential: Poisson arrivals
    } else {
      std::gamma_distribution<double> gamma(burstiness, 1.0 / (request_rate * burstiness));
      gap = gamma(rng);
    }
    t += gap;
  }
  return times;
}

namespace {

// The prompts released so far, taken by the workers. Thread-safe.
class WorkQueue {
 public:
  void Push(size_t index) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(index);
    }
    cv_.notify_one();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // False when closed and drained.
  bool Pop(size_t* index) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    *index = items_.front();
    items_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> items_;
  bool closed_ = false;
};

}  // namespace

RunResult RunBenchmark(const RunOptions& options, const std::vector<Prompt>& prompts,
                       Progress* progress) {
  RunResult result;
  result.records.resize(prompts.size());
  if (prompts.empty()) return result;
  const std::vector<double> arrivals = ArrivalTimes(
      static_cast<int64_t>(prompts.size()), options.request_rate, options.burstiness, options.seed);
  int64_t workers = static_cast<int64_t>(prompts.size());
  if (options.max_concurrency > 0) workers = std::min(workers, options.max_concurrency);

  WorkQueue queue;
  std::mutex end_mu;
  double last_end_s = 0;
  const BenchClock::time_point epoch = BenchClock::now();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      BenchClient client(options.address, options.api_key, options.timeout_s);
      size_t i;
      while (queue.Pop(&i)) {
        RequestRecord record =
            client.Send(options.path, options.request, prompts[i], epoch, options.save_text);
        record.index = static_cast<int64_t>(i);
        const double end = record.start_s + record.e2el_s;
        const bool success = record.success;
        result.records[i] = std::move(record);
        {
          std::lock_guard<std::mutex> lock(end_mu);
          last_end_s = std::max(last_end_s, end);
        }
        if (progress != nullptr) progress->Completed(success);
      }
    });
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto due = epoch + std::chrono::duration_cast<BenchClock::duration>(
                                 std::chrono::duration<double>(arrivals[i]));
    std::this_thread::sleep_until(due);
    queue.Push(i);
  }
  queue.Close();
  for (std::thread& t : threads) t.join();
  if (progress != nullptr) progress->Finish();
  result.duration_s = last_end_s;
  return result;
}

}  // namespace oasis::loadgen

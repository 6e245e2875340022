// RunBenchmark: see runner.h.
#include "tools/loadgen/runner.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
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

BenchClock::duration SecondsToDuration(double seconds) {
  // Saturates (at kMaxBenchSeconds): a duration_cast of more seconds than int64 nanoseconds
  // hold overflowed into the past, and a run of --request-rate 1e-30 finished at once.
  if (!(seconds > 0)) return BenchClock::duration::zero();
  return std::chrono::duration_cast<BenchClock::duration>(
      std::chrono::duration<double>(std::min(seconds, kMaxBenchSeconds)));
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

// Releases units 0..num_units-1 at their arrival times into a queue that `workers` threads
// (max_concurrency, or one per unit when unlimited) drain, each with its own BenchClient;
// `run_unit(unit, client)` does a unit's requests. Returns when every unit is done.
void RunUnits(const RunOptions& options, size_t num_units, BenchClock::time_point epoch,
              const std::function<void(size_t, BenchClient&)>& run_unit) {
  const std::vector<double> arrivals = ArrivalTimes(
      static_cast<int64_t>(num_units), options.request_rate, options.burstiness, options.seed);
  int64_t workers = static_cast<int64_t>(num_units);
  if (options.max_concurrency > 0) workers = std::min(workers, options.max_concurrency);

  WorkQueue queue;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      BenchClient client(options.address, options.api_key, options.timeout_s);
      size_t i;
      while (queue.Pop(&i)) run_unit(i, client);
    });
  }
  for (size_t i = 0; i < num_units; ++i) {
    const auto due = epoch + SecondsToDuration(arrivals[i]);
    std::this_thread::sleep_until(due);
    queue.Push(i);
  }
  queue.Close();
  for (std::thread& t : threads) t.join();
}

// The latest completion time of the run so far. Thread-safe.
class LastEnd {
 public:
  void Update(const RequestRecord& r) {
    std::lock_guard<std::mutex> lock(mu_);
    last_end_s_ = std::max(last_end_s_, r.start_s + r.e2el_s);
  }
  double get() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_end_s_;
  }

 private:
  std::mutex mu_;
  double last_end_s_ = 0;
};

}  // namespace

RunResult RunBenchmark(const RunOptions& options, const std::vector<Prompt>& prompts,
                       Progress* progress) {
  RunResult result;
  result.records.resize(prompts.size());
  if (prompts.empty()) return result;
  LastEnd last_end;
  const BenchClock::time_point epoch = BenchClock::now();
  RunUnits(options, prompts.size(), epoch, [&](size_t i, BenchClient& client) {
    RequestRecord record =
        client.Send(options.path, options.request, prompts[i], epoch, options.save_text);
    record.index = static_cast<int64_t>(i);
    last_end.Update(record);
    const bool success = record.success;
    result.records[i] = std::move(record);
    if (progress != nullptr) progress->Completed(success);
  });
  if (progress != nullptr) progress->Finish();
  result.duration_s = last_end.get();
  return result;
}

RunResult RunConversations(const RunOptions& options,
                           const std::vector<MultiTurnConversation>& conversations,
                           Progress* progress) {
  RunResult result;
  std::vector<size_t> first_record(conversations.size());
  size_t total = 0;
  for (size_t c = 0; c < conversations.size(); ++c) {
    first_record[c] = total;
    total += static_cast<size_t>(conversations[c].num_turns());
  }
  result.records.resize(total);
  if (total == 0) return result;
  LastEnd last_end;
  const BenchClock::time_point epoch = BenchClock::now();
  const auto think = SecondsToDuration(options.think_time_s);
  RunUnits(options, conversations.size(), epoch, [&](size_t c, BenchClient& client) {
    const MultiTurnConversation& conversation = conversations[c];
    for (int64_t t = 0; t < conversation.num_turns(); ++t) {
      if (t > 0 && think.count() > 0) std::this_thread::sleep_for(think);
      RequestRecord record = client.Send(options.path, options.request, TurnPrompt(conversation, t),
                                         epoch, options.save_text);
      const size_t i = first_record[c] + static_cast<size_t>(t);
      record.index = static_cast<int64_t>(i);
      record.conversation = static_cast<int64_t>(c);
      record.turn = t + 1;
      last_end.Update(record);
      const bool success = record.success;
      result.records[i] = std::move(record);
      if (progress != nullptr) progress->Completed(success);
    }
  });
  if (progress != nullptr) progress->Finish();
  result.duration_s = last_end.get();
  return result;
}

}  // namespace oasis::loadgen

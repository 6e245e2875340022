// LockstepGroup: one worker thread per rank of a tensor-parallel group, running the same job
// on every rank at once (docs/parallel.md §3). The caller hands a job to all workers and
// waits for all of them; it is the only way work reaches the workers, so every rank sees
// the same sequence of jobs (and issues the same collectives in the same order).
//
// Failures: when a job throws on some rank, the group calls `abort(r)` for every rank r,
// each on its own helper thread (joined by the destructor), so that ranks blocked in a
// collective the failed rank will never join can return (NcclCommunicator::Abort); waits
// until every rank's job has returned; and rethrows the first failure as a
// std::runtime_error naming the rank. The group is then failed: Run throws at once from
// then on (RunTeardown still runs, for destroying the ranks' objects on their threads).
//
// Owns the threads. Run, RunTeardown and the destructor are called by one thread at a time
// (the engine loop, or the thread that builds the group); MarkEnqueued by the workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace oasis {

class LockstepGroup {
 public:
  // `on_start(rank)` runs first on each worker thread (e.g. cudaSetDevice); `abort(rank)`
  // unblocks rank's pending collectives from another thread (may be empty: nothing to do).
  LockstepGroup(int size, std::function<void(int rank)> on_start,
                std::function<void(int rank)> abort);
  // Joins the workers, then the abort helpers (which may wait for the ranks' objects to be
  // gone: destroy them with RunTeardown first).
  ~LockstepGroup();
  LockstepGroup(const LockstepGroup&) = delete;
  LockstepGroup& operator=(const LockstepGroup&) = delete;

  int size() const { return size_; }
  // Replaces the abort callback (before the next Run).
  void set_abort(std::function<void(int rank)> abort);

  // Runs job(r) on worker r for every rank; returns when all have returned. With
  // `while_running`, calls it on the calling thread once every rank has called
  // MarkEnqueued(r) during this job (host work overlapping the ranks' device work), or after
  // all jobs returned when some rank did not mark (not at all when a rank failed). Throws
  // as described above; an exception from while_running is rethrown after the jobs return
  // (it does not fail the group).
  void Run(const std::function<void(int rank)>& job,
           const std::function<void()>& while_running = {});
  // Like Run, also on a failed group; failures are logged, not thrown, and abort nothing.
  void RunTeardown(const std::function<void(int rank)>& job);
  // Called by rank `rank`'s job once its device work for the job is enqueued.
  void MarkEnqueued(int rank);

  bool failed() const;
  // The failure that failed the group ("" while not failed).
  std::string failure() const;

 private:
  void WorkerLoop(int rank);
  // Starts job on every worker; returns its generation.
  void Start(const std::function<void(int rank)>& job);
  void AbortAll();

  const int size_;
  std::function<void(int)> on_start_;
  std::function<void(int)> abort_;
  std::vector<std::thread> workers_;
  std::vector<std::thread> aborters_;  // one per rank once aborted

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;                 // guarded by mu_: one per job
  std::function<void(int)> job_;            // guarded by mu_
  int running_ = 0;                         // guarded by mu_: ranks still in the job
  std::vector<bool> enqueued_;              // guarded by mu_: per rank, this job
  int num_enqueued_ = 0;                    // guarded by mu_
  std::vector<std::exception_ptr> errors_;  // guarded by mu_: per rank, this job
  int first_failed_ = -1;                   // guarded by mu_: first rank that failed this job
  bool stop_ = false;                       // guarded by mu_
  bool failed_ = false;                     // guarded by mu_: the group is unusable
  std::string failure_;                     // guarded by mu_
};

}  // namespace oasis

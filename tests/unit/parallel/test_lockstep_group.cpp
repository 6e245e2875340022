// LockstepGroup: every job runs once on every rank's own thread; the caller's host work runs
// once all ranks marked their work enqueued; a failing rank aborts the others (a rank
// blocked in a "collective" is released by its abort), the caller gets the failure naming
// the rank, and the group refuses further jobs but still tears down.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "parallel/lockstep_group.h"

using namespace oasis;

TEST_CASE("LockstepGroup runs each job on every rank's own thread", "[parallel]") {
  constexpr int kRanks = 3;
  std::vector<std::thread::id> started(kRanks);
  LockstepGroup group(kRanks, [&](int r) { started[r] = std::this_thread::get_id(); }, nullptr);
  REQUIRE(group.size() == kRanks);
  for (int job = 0; job < 20; ++job) {
    std::vector<int> seen(kRanks, -1);
    std::vector<std::thread::id> ids(kRanks);
    group.Run([&](int r) {
      seen[r] = job;
      ids[r] = std::this_thread::get_id();
    });
    for (int r = 0; r < kRanks; ++r) {
      CHECK(seen[r] == job);
      CHECK(ids[r] == started[r]);  // the thread on_start ran on, every time
      CHECK(ids[r] != std::this_thread::get_id());
    }
  }
  std::set<std::thread::id> distinct(started.begin(), started.end());
  CHECK(distinct.size() == kRanks);
  CHECK_FALSE(group.failed());
}

TEST_CASE("LockstepGroup calls while_running once every rank has enqueued", "[parallel]") {
  LockstepGroup group(2, nullptr, nullptr);
  std::atomic<int> marked{0};
  std::atomic<bool> released{false};
  int calls = 0;
  int marked_when_called = -1;
  group.Run(
      [&](int r) {
        ++marked;
        group.MarkEnqueued(r);
        while (!released) std::this_thread::yield();  // "device work" still running
      },
      [&] {
        ++calls;
        marked_when_called = marked;
        released = true;  // the ranks finish only after the host work ran
      });
  CHECK(calls == 1);
  CHECK(marked_when_called == 2);

  // A rank that never marks: the host work still runs, after the jobs.
  calls = 0;
  group.Run([&](int r) { if (r == 0) group.MarkEnqueued(r); }, [&] { ++calls; });
  CHECK(calls == 1);
}

TEST_CASE("LockstepGroup: a failing rank aborts the others and fails the call", "[parallel]") {
  constexpr int kRanks = 3;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> aborted(kRanks, false);
  auto group = std::make_unique<LockstepGroup>(kRanks, nullptr, [&](int r) {
    std::lock_guard<std::mutex> lock(mu);
    aborted[r] = true;
    cv.notify_all();
  });
  int host_work = 0;
  try {
    group->Run(
        [&](int r) {
          if (r == 1) throw std::runtime_error("out of memory on purpose");
          // The others wait for a peer that never comes, like an all-reduce, until aborted.
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return aborted[r]; });
        },
        [&] { ++host_work; });
    FAIL("the failure was not propagated");
  } catch (const std::runtime_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 1") && Catch::Contains("out of memory on purpose"));
  }
  CHECK(host_work == 0);
  CHECK(group->failed());
  CHECK_THAT(group->failure(), Catch::Contains("rank 1"));
  CHECK_THROWS_WITH(group->Run([](int) {}), Catch::Contains("unusable"));
  int torn_down = 0;
  std::mutex td;
  group->RunTeardown([&](int) {
    std::lock_guard<std::mutex> lock(td);
    ++torn_down;
  });
  CHECK(torn_down == kRanks);
  group.reset();  // joins the workers and the abort helpers (they run asynchronously)
  std::lock_guard<std::mutex> lock(mu);
  for (int r = 0; r < kRanks; ++r) CHECK(aborted[r]);  // every rank's abort ran, once
}

TEST_CASE("LockstepGroup: a failing on_start fails the first job", "[parallel]") {
  LockstepGroup group(2, [](int r) { if (r == 0) throw std::runtime_error("no such device"); }, nullptr);
  CHECK_THROWS_WITH(group.Run([](int) {}), Catch::Contains("rank 0") && Catch::Contains("no such device"));
}

TEST_CASE("LockstepGroup: an exception from while_running reaches the caller", "[parallel]") {
  LockstepGroup group(2, nullptr, nullptr);
  CHECK_THROWS_WITH(group.Run([&](int r) { group.MarkEnqueued(r); }, [] { throw std::runtime_error("host side"); }),
                    Catch::Contains("host side"));
  CHECK_FALSE(group.failed());  // the ranks did nothing wrong
  group.Run([](int) {});
}

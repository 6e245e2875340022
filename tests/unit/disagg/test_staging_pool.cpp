// StagingPool: slot hand-out, the three ways a lease ends, expiry driven by an explicit clock,
// statistics, exhaustion and concurrent use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <thread>

#include "disagg/staging_pool.h"

using namespace oasis;
using namespace oasis::disagg;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<StagingPool> MakePool(uint64_t blocks, uint64_t block_bytes,
                                      std::chrono::milliseconds ttl = 1000ms) {
  auto ctx = UcxContext::Create();
  REQUIRE(ctx.ok());
  StagingPoolOptions o;
  o.num_blocks = blocks;
  o.block_bytes = block_bytes;
  o.default_lease_ttl = ttl;
  auto pool = StagingPool::Create(*ctx, o);
  REQUIRE(pool.ok());
  return std::move(pool).value();
}
}  // namespace

TEST_CASE("staging pool validates its options", "[disagg][pool]") {
  auto ctx = UcxContext::Create();
  REQUIRE(ctx.ok());
  StagingPoolOptions o;
  o.num_blocks = 4;
  o.block_bytes = 0;
  CHECK(StagingPool::Create(*ctx, o).status().code() == StatusCode::kInvalidArgument);
  o.block_bytes = 64;
  o.num_blocks = 0;
  CHECK(StagingPool::Create(*ctx, o).status().code() == StatusCode::kInvalidArgument);
  o.num_blocks = 4;
  o.default_lease_ttl = 0ms;
  CHECK(StagingPool::Create(*ctx, o).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("staging pool hands out disjoint blocks and takes them back", "[disagg][pool]") {
  auto pool = MakePool(10, 256);
  const auto& d = pool->descriptor();
  CHECK(d.num_blocks == 10);
  CHECK(d.block_bytes == 256);
  CHECK_FALSE(d.rkey.empty());
  CHECK(reinterpret_cast<uint64_t>(pool->BlockData(3)) == d.BlockAddress(3));
  CHECK(pool->base() == pool->BlockData(0));
  CHECK(pool->bytes() == 10 * 256);

  const auto t0 = Clock::now();
  auto a = pool->Acquire(4, t0);
  auto b = pool->Acquire(6, t0);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->id != b->id);
  std::set<uint32_t> all(a->blocks.begin(), a->blocks.end());
  all.insert(b->blocks.begin(), b->blocks.end());
  CHECK(all.size() == 10);
  CHECK(*all.rbegin() == 9);

  auto c = pool->Acquire(1, t0);
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK(pool->Acquire(0, t0).status().code() == StatusCode::kInvalidArgument);

  StagingPoolStats s = pool->Stats();
  CHECK(s.blocks_held == 10);
  CHECK(s.bytes_held == 2560);
  CHECK(s.requests_held == 2);
  CHECK(s.acquire_failures == 1);

  REQUIRE(pool->Release(a->id, LeaseEnd::kCompleted).ok());
  CHECK(pool->Release(a->id, LeaseEnd::kCompleted).code() == StatusCode::kNotFound);
  REQUIRE(pool->Release(b->id, LeaseEnd::kAborted).ok());
  s = pool->Stats();
  CHECK(s.blocks_held == 0);
  CHECK(s.bytes_held == 0);
  CHECK(s.requests_held == 0);
  CHECK(s.leases_granted == 2);
  CHECK(s.leases_completed == 1);
  CHECK(s.leases_aborted == 1);
  CHECK(s.leases_expired == 0);
  // All ten slots are free again.
  auto full = pool->Acquire(10, t0);
  REQUIRE(full.ok());
  CHECK(std::set<uint32_t>(full->blocks.begin(), full->blocks.end()).size() == 10);
}

TEST_CASE("staging pool hands out lowest slots as extents and coalesces freed runs",
          "[disagg][pool]") {
  auto pool = MakePool(16, 64);
  auto a = pool->Acquire(4);
  auto b = pool->Acquire(6);
  REQUIRE((a.ok() && b.ok()));
  CHECK(a->extents == std::vector<SlotExtent>{{0, 4}});
  CHECK(a->blocks == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(b->extents == std::vector<SlotExtent>{{4, 6}});
  CHECK(pool->Stats().free_runs == 1);  // [10, 16)
  REQUIRE(pool->Release(a->id, LeaseEnd::kCompleted).ok());
  CHECK(pool->Stats().free_runs == 2);  // [0, 4) and [10, 16)
  auto c = pool->Acquire(5);            // the hole first, then the tail
  REQUIRE(c.ok());
  CHECK(c->extents == (std::vector<SlotExtent>{{0, 4}, {10, 1}}));
  CHECK(c->blocks == std::vector<uint32_t>{0, 1, 2, 3, 10});
  CHECK(ToExtents(c->blocks) == c->extents);
  REQUIRE(pool->Release(b->id, LeaseEnd::kAborted).ok());    // [4, 10) between two held runs
  CHECK(pool->Stats().free_runs == 2);                       // [4, 10) and [11, 16)
  REQUIRE(pool->Release(c->id, LeaseEnd::kCompleted).ok());  // fills both gaps
  CHECK(pool->Stats().free_runs == 1);
  auto all = pool->Acquire(16);
  REQUIRE(all.ok());
  CHECK(all->extents == std::vector<SlotExtent>{{0, 16}});
}

TEST_CASE("staging pool leases expire unless renewed", "[disagg][pool]") {
  auto pool = MakePool(8, 64, 100ms);
  const auto t0 = Clock::now();
  auto a = pool->Acquire(2, t0);         // TTL 100 ms (the default)
  auto b = pool->Acquire(3, t0, 500ms);  // its own TTL
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(pool->NextExpiry() == t0 + 100ms);
  CHECK(pool->ReleaseExpired(t0 + 99ms) == 0);
  REQUIRE(pool->Renew(a->id, t0 + 90ms).ok());  // now expires at 190 ms
  CHECK(pool->ReleaseExpired(t0 + 150ms) == 0);
  CHECK(pool->HoldsLease(a->id));
  CHECK(pool->ReleaseExpired(t0 + 190ms) == 1);
  CHECK_FALSE(pool->HoldsLease(a->id));
  CHECK(pool->Renew(a->id, t0 + 200ms).code() == StatusCode::kNotFound);
  CHECK(pool->Stats().blocks_held == 3);
  CHECK(pool->ReleaseExpired(t0 + 500ms) == 1);
  const StagingPoolStats s = pool->Stats();
  CHECK(s.blocks_held == 0);
  CHECK(s.requests_held == 0);
  CHECK(s.leases_expired == 2);
  CHECK(s.renewals == 1);
  CHECK_FALSE(pool->NextExpiry().has_value());
}

TEST_CASE("staging pool is safe under concurrent acquire, renew and release", "[disagg][pool]") {
  auto pool = MakePool(64, 64);
  std::vector<std::thread> threads;
  std::atomic<int> exhausted{0};
  std::atomic<int> errors{0};  // Catch2's assertions are not thread-safe: count, check after
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto lease = pool->Acquire(1 + (i + t) % 7);
        if (!lease.ok()) {
          ++exhausted;
          continue;
        }
        for (uint32_t b : lease->blocks) *pool->BlockData(b) = std::byte(t);
        if (!pool->Renew(lease->id).ok()) ++errors;
        if (!pool->Release(lease->id, i % 2 ? LeaseEnd::kCompleted : LeaseEnd::kAborted).ok()) {
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  const StagingPoolStats s = pool->Stats();
  CHECK(s.blocks_held == 0);
  CHECK(s.requests_held == 0);
  CHECK(s.leases_granted + s.acquire_failures == 8000);
  CHECK(s.leases_completed + s.leases_aborted == s.leases_granted);
  CHECK(static_cast<int>(s.acquire_failures) == exhausted.load());
  auto all = pool->Acquire(64);
  REQUIRE(all.ok());
  CHECK(std::set<uint32_t>(all->blocks.begin(), all->blocks.end()).size() == 64);
  CHECK(all->extents == std::vector<SlotExtent>{{0, 64}});  // freed runs all coalesced
}

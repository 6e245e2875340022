// Prefill and decode sides in two processes over loopback TCP sockets (UCX_TLS=tcp forced,
// and UCX's default selection): byte-exact random fetches from a pool in another process;
// a killed reader process whose lease expires instead of leaking; a killed pool process
// that gives the reader an error within its deadline.
#include <catch2/catch.hpp>

#include <random>
#include <thread>

#include "disagg/remote_reader.h"
#include "disagg/staging_pool.h"
#include "disagg/staging_server.h"
#include "disagg_test_util.h"

using namespace oasis;
using namespace oasis::disagg;
using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::SplitWords;

namespace {
constexpr uint64_t kSeed = 777;

// The peer's "READY <address>" line, or a test failure.
std::string AwaitReady(ChildProcess& child) {
  auto line = testing::ReadPeerLine(child, 10s);
  REQUIRE(line.has_value());
  auto words = SplitWords(*line);
  INFO("peer said: " << *line);
  REQUIRE(words.size() == 2);
  REQUIRE(words[0] == "READY");
  return words[1];
}

std::string TlsArg(const std::string& tls) { return tls.empty() ? "default" : tls; }
using namespace std::chrono_literals;
}  // namespace

TEST_CASE("two processes: random blocks fetched byte-exact from a remote pool",
          "[disagg][ucx][process]") {
  const std::string tls = GENERATE(as<std::string>{}, "tcp", "");
  INFO("UCX_TLS=" << TlsArg(tls));
  const uint64_t kBlocks = 2048;
  const uint64_t kBytes = 2048;
  ChildProcess peer({OASIS_DISAGG_PEER, "serve", "--tls", TlsArg(tls), "--blocks",
                     std::to_string(kBlocks), "--block-bytes", std::to_string(kBytes), "--seed",
                     std::to_string(kSeed)});
  const std::string address = AwaitReady(peer);

  auto ctx = UcxContext::Create({tls});
  REQUIRE(ctx.ok());
  auto reader = RemoteReader::Connect(*ctx, address);
  REQUIRE(reader.ok());
  REQUIRE((*reader)->descriptor().num_blocks == kBlocks);
  if (std::getenv("OASIS_DISAGG_PRINT_LANES")) WARN((*reader)->TransportInfo());

  std::mt19937_64 rng(5);
  for (int round = 0; round < 4; ++round) {
    const size_t n = 500;
    std::vector<unsigned char> local(n * kBytes, 0);
    std::vector<FetchItem> items(n);
    for (size_t i = 0; i < n; ++i) items[i] = {rng() % kBlocks, local.data() + i * kBytes};
    // Some adjacent runs as well (they merge into fewer gets).
    for (size_t i = 0; i + 1 < n; i += 50)
      items[i + 1].remote_block = (items[i].remote_block + 1) % kBlocks;
    REQUIRE((*reader)->Fetch(items, Clock::now() + 10s).ok());
    size_t exact = 0;
    for (const FetchItem& it : items) {
      exact += testing::MatchesPattern(it.local, kBytes, kSeed, it.remote_block);
    }
    CHECK(exact == n);
  }
  CHECK((*reader)->stats().gets_issued < 4 * 500);
  reader->reset();
  peer.CloseStdin();
  CHECK(peer.Wait(10s) == std::optional<int>(0));
}

TEST_CASE("two processes: a killed pool process gives the reader an error by its deadline",
          "[disagg][ucx][process]") {
  // "default+mm": UCX's default selection with shared-memory error handling on
  // (UCX_MM_ERROR_HANDLING=y, inherited by the peer): AM then goes over shared memory, and
  // UCX 1.13 does not complete a forced close once the peer died; the reader abandons its
  // worker instead of hanging.
  const std::string variant = GENERATE(as<std::string>{}, "tcp", "", "default+mm");
  INFO("UCX_TLS=" << TlsArg(variant));
  const std::string tls = variant == "default+mm" ? "" : variant;
  if (variant == "default+mm") setenv("UCX_MM_ERROR_HANDLING", "y", 1);
  ChildProcess peer({OASIS_DISAGG_PEER, "serve", "--tls", TlsArg(tls), "--blocks", "256",
                     "--block-bytes", "4096", "--seed", std::to_string(kSeed)});
  const std::string address = AwaitReady(peer);
  auto ctx = UcxContext::Create({tls});
  REQUIRE(ctx.ok());
  auto reader = RemoteReader::Connect(*ctx, address);
  unsetenv("UCX_MM_ERROR_HANDLING");
  REQUIRE(reader.ok());
  std::vector<unsigned char> buf(64 * 4096);
  std::vector<FetchItem> items;
  for (uint64_t i = 0; i < 64; ++i) items.push_back({(i * 37) % 256, buf.data() + i * 4096});
  REQUIRE((*reader)->Fetch(items, Clock::now() + 5s).ok());

  peer.Kill();
  const auto t0 = Clock::now();
  Status s = (*reader)->Fetch(items, Clock::now() + 2s);
  const auto took = Clock::now() - t0;
  INFO(s.ToString());
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kUnavailable);
  if (variant == "default+mm") {
    // The deadline, plus at most the 1 s a forced close may take before the worker is abandoned.
    CHECK(took < 3500ms);
  } else {
    CHECK(took < 1s);  // the closed TCP connection is an error at once, well before the deadline
  }
  CHECK_FALSE((*reader)->healthy());
  const auto t1 = Clock::now();
  CHECK_FALSE((*reader)->Fetch(items, Clock::now() + 2s).ok());
  CHECK(Clock::now() - t1 < 100ms);
}

TEST_CASE("two processes: a killed reader's lease expires, a finished reader's completes",
          "[disagg][ucx][process]") {
  const std::string tls = GENERATE(as<std::string>{}, "tcp", "");
  INFO("UCX_TLS=" << TlsArg(tls));
  // The pool in this process: TTL 300 ms, swept every 25 ms; readers renew every 50 ms.
  UcxOptions uo;
  uo.transports = tls;
  auto ctx = UcxContext::Create(uo);
  REQUIRE(ctx.ok());
  StagingPoolOptions po;
  po.num_blocks = 256;
  po.block_bytes = 1024;
  po.default_lease_ttl = 300ms;
  auto pool = StagingPool::Create(*ctx, po);
  REQUIRE(pool.ok());
  StagingPool& p = **pool;
  for (uint32_t b = 0; b < 256; ++b) testing::FillPattern(p.BlockData(b), 1024, kSeed, b);
  StagingServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.sweep_interval = 25ms;
  auto server = StagingServer::Start(*ctx, &p, so);
  REQUIRE(server.ok());

  auto killed = p.Acquire(100);
  auto finished = p.Acquire(50);
  REQUIRE((killed.ok() && finished.ok()));
  auto spawn_reader = [&](uint64_t lease) {
    return std::make_unique<ChildProcess>(std::vector<std::string>{
        OASIS_DISAGG_PEER, "read", "--tls", TlsArg(tls), "--peer", (*server)->address(), "--seed",
        std::to_string(kSeed), "--lease", std::to_string(lease), "--blocks", "256", "--count",
        "200", "--renew-ms", "50"});
  };
  auto reader_a = spawn_reader(killed->id);
  auto reader_b = spawn_reader(finished->id);
  for (ChildProcess* c : {reader_a.get(), reader_b.get()}) {
    auto line = testing::ReadPeerLine(*c, 10s);
    REQUIRE(line.has_value());
    CHECK(*line == "FETCHED 200 OK");
  }
  // Renewals from the other processes keep both leases past twice their TTL.
  std::this_thread::sleep_for(700ms);
  CHECK(p.HoldsLease(killed->id));
  CHECK(p.HoldsLease(finished->id));
  CHECK(p.Stats().leases_expired == 0);

  reader_a->Kill();        // a decode node dies: nobody renews its lease
  reader_b->CloseStdin();  // a decode node finishes: it completes its lease
  CHECK(reader_b->Wait(5s) == std::optional<int>(0));
  const auto deadline = Clock::now() + 3s;
  while (Clock::now() < deadline && p.Stats().requests_held > 0) std::this_thread::sleep_for(10ms);
  const StagingPoolStats s = p.Stats();
  CHECK(s.requests_held == 0);
  CHECK(s.blocks_held == 0);
  CHECK(s.bytes_held == 0);
  CHECK(s.leases_expired == 1);
  CHECK(s.leases_completed == 1);
  CHECK_FALSE(p.HoldsLease(killed->id));
  // The server notices both peers are gone.
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < 3s && (*server)->Stats().connections_open > 0) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK((*server)->Stats().connections_open == 0);
}

// The prefill and decode sides as two "hosts": one process in a network namespace of its
// own, joined to ours by a veth pair, so every byte crosses a real (virtual) link and no
// loopback address is shared. UCX_TLS=tcp and UCX's default selection.
#include <catch2/catch.hpp>

#include <random>
#include <thread>

#include "disagg/remote_reader.h"
#include "disagg/staging_pool.h"
#include "disagg/staging_server.h"
#include "disagg_test_util.h"
#include "netns_pair.h"

using namespace oasis;
using namespace oasis::disagg;
using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::NetnsPair;

namespace {
constexpr uint64_t kSeed = 4242;
// The listeners here are not on loopback: they need a secret (StagingServer::Start).
const std::string kSecret = "netns-test-secret";

std::unique_ptr<NetnsPair> MakePair() {
  std::string why;
  auto pair = NetnsPair::Create(&why);
  INFO(why);
  REQUIRE(pair != nullptr);
  return pair;
}

std::string TlsArg(const std::string& tls) { return tls.empty() ? "default" : tls; }
}  // namespace

TEST_CASE("two namespaces: a remote pool's blocks byte-exact over veth, and its death is an error",
          "[disagg][ucx][netns]") {
  const std::string tls = GENERATE(as<std::string>{}, "tcp", "");
  INFO("UCX_TLS=" << TlsArg(tls));
  auto pair = MakePair();
  const uint64_t kBlocks = 1024;
  const uint64_t kBytes = 4096;
  ChildProcess peer(
      pair->Inside({OASIS_DISAGG_PEER, "serve", "--tls", TlsArg(tls), "--blocks",
                    std::to_string(kBlocks), "--block-bytes", std::to_string(kBytes), "--seed",
                    std::to_string(kSeed), "--listen", pair->ns_address() + ":0", "--secret",
                    kSecret}));
  auto line = testing::ReadPeerLine(peer, 10s);
  REQUIRE(line.has_value());
  auto words = testing::SplitWords(*line);
  INFO("peer said: " << *line);
  REQUIRE((words.size() == 2 && words[0] == "READY"));
  CHECK(words[1].rfind(pair->ns_address() + ":", 0) == 0);

  auto ctx = UcxContext::Create({tls});
  REQUIRE(ctx.ok());
  RemoteReaderOptions ro;
  ro.secret = kSecret;
  // Connect retries a transport failure itself (a reset while sending the hello was seen with
  // UCX's default transports on a loaded 2-core CI machine).
  auto reader = RemoteReader::Connect(*ctx, words[1], ro);
  INFO((reader.ok() ? std::string("connected") : reader.status().ToString()));
  REQUIRE(reader.ok());
  std::mt19937_64 rng(11);
  const size_t n = 1000;
  std::vector<unsigned char> local(n * kBytes);
  std::vector<FetchItem> items(n);
  for (size_t i = 0; i < n; ++i) items[i] = {rng() % kBlocks, local.data() + i * kBytes};
  REQUIRE((*reader)->Fetch(items, Clock::now() + 10s).ok());
  size_t exact = 0;
  for (const FetchItem& it : items) {
    exact += testing::MatchesPattern(it.local, kBytes, kSeed, it.remote_block);
  }
  CHECK(exact == n);

  peer.Kill();
  const auto t0 = Clock::now();
  Status s = (*reader)->Fetch(items, Clock::now() + 2s);
  INFO(s.ToString());
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(Clock::now() - t0 < 3500ms);
  CHECK_FALSE((*reader)->healthy());
}

TEST_CASE("two namespaces: a reader in the other namespace renews, then its lease expires",
          "[disagg][ucx][netns]") {
  auto pair = MakePair();
  auto ctx = UcxContext::Create({"tcp"});
  REQUIRE(ctx.ok());
  StagingPoolOptions po;
  po.num_blocks = 128;
  po.block_bytes = 2048;
  po.default_lease_ttl = 300ms;
  auto pool = StagingPool::Create(*ctx, po);
  REQUIRE(pool.ok());
  for (uint32_t b = 0; b < 128; ++b) testing::FillPattern((*pool)->BlockData(b), 2048, kSeed, b);
  StagingServerOptions so;
  so.listen_address = pair->host_address() + ":0";
  so.sweep_interval = 25ms;
  CHECK(StagingServer::Start(*ctx, pool->get(), so).status().code() ==
        StatusCode::kInvalidArgument);  // not loopback: no listener without a secret
  so.secret = kSecret;
  auto server = StagingServer::Start(*ctx, pool->get(), so);
  REQUIRE(server.ok());
  auto lease = (*pool)->Acquire(64);
  REQUIRE(lease.ok());

  ChildProcess reader(
      pair->Inside({OASIS_DISAGG_PEER, "read", "--tls", "tcp", "--peer", (*server)->address(),
                    "--seed", std::to_string(kSeed), "--lease", std::to_string(lease->id),
                    "--blocks", "128", "--count", "300", "--renew-ms", "50", "--secret",
                    kSecret}));
  auto line = testing::ReadPeerLine(reader, 10s);
  REQUIRE(line.has_value());
  CHECK(*line == "FETCHED 300 OK");
  std::this_thread::sleep_for(700ms);  // > 2 TTLs: alive only through renewals over the veth
  CHECK((*pool)->HoldsLease(lease->id));
  reader.Kill();
  const auto deadline = Clock::now() + 3s;
  while (Clock::now() < deadline && (*pool)->HoldsLease(lease->id)) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK_FALSE((*pool)->HoldsLease(lease->id));
  const StagingPoolStats s = (*pool)->Stats();
  CHECK(s.leases_expired == 1);
  CHECK(s.blocks_held == 0);
}

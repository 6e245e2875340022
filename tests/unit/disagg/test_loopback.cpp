// StagingServer + RemoteReader in one process over loopback: byte-exact fetches (merged and
// scattered), argument errors, lease messages reaching the pool, expiry through the server's
// sweep, and the errors a reader gets when there is no server or the server goes away.
#include <catch2/catch.hpp>

#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "disagg/remote_reader.h"
#include "disagg/staging_pool.h"
#include "disagg/staging_server.h"
#include "disagg_test_util.h"

using namespace oasis;
using namespace oasis::disagg;
using namespace std::chrono_literals;
using testing::FillPattern;
using testing::MatchesPattern;

namespace {
constexpr uint64_t kSeed = 1234;

struct Prefill {
  std::shared_ptr<UcxContext> context;
  std::unique_ptr<StagingPool> pool;
  std::unique_ptr<StagingServer> server;
};

Prefill StartPrefill(const std::string& tls, uint64_t blocks, uint64_t block_bytes,
                     std::chrono::milliseconds ttl = 10s, std::chrono::milliseconds sweep = 100ms) {
  Prefill p;
  UcxOptions uo;
  uo.transports = tls;
  auto ctx = UcxContext::Create(uo);
  REQUIRE(ctx.ok());
  p.context = *ctx;
  StagingPoolOptions po;
  po.num_blocks = blocks;
  po.block_bytes = block_bytes;
  po.default_lease_ttl = ttl;
  auto pool = StagingPool::Create(p.context, po);
  REQUIRE(pool.ok());
  p.pool = std::move(pool).value();
  for (uint64_t b = 0; b < blocks; ++b) {
    FillPattern(p.pool->BlockData(static_cast<uint32_t>(b)), block_bytes, kSeed, b);
  }
  StagingServerOptions so;
  so.listen_address = "127.0.0.1:0";
  so.sweep_interval = sweep;
  auto server = StagingServer::Start(p.context, p.pool.get(), so);
  REQUIRE(server.ok());
  p.server = std::move(server).value();
  return p;
}

template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}
}  // namespace

TEST_CASE("loopback: the reader fetches staged blocks byte-exact", "[disagg][ucx]") {
  const std::string tls = GENERATE(as<std::string>{}, "tcp", "");
  INFO("UCX_TLS=" << (tls.empty() ? "default" : tls));
  const uint64_t kBlocks = 512;
  const uint64_t kBytes = 4096;
  Prefill p = StartPrefill(tls, kBlocks, kBytes);
  CHECK(p.server->port() != 0);
  CHECK(p.server->address() == "127.0.0.1:" + std::to_string(p.server->port()));

  RemoteReaderOptions ro;
  ro.spin = std::chrono::microseconds(GENERATE(0, 200000));  // sleeping, or polling
  INFO("spin " << ro.spin.count() << " us");
  auto reader = RemoteReader::Connect(p.context, p.server->address(), ro);
  REQUIRE(reader.ok());
  RemoteReader& r = **reader;
  CHECK(r.descriptor() == p.pool->descriptor());

  // A run of adjacent blocks into adjacent memory: merged into one get.
  std::vector<unsigned char> run(16 * kBytes);
  std::vector<FetchItem> items;
  for (uint64_t i = 0; i < 16; ++i) items.push_back({100 + i, run.data() + i * kBytes});
  REQUIRE(r.Fetch(items, Clock::now() + 5s).ok());
  CHECK(r.stats().gets_issued == 1);
  for (uint64_t i = 0; i < 16; ++i)
    CHECK(MatchesPattern(run.data() + i * kBytes, kBytes, kSeed, 100 + i));

  // Random blocks (repeats allowed) into shuffled slots.
  std::mt19937_64 rng(99);
  const size_t n = 300;
  std::vector<unsigned char> local(n * kBytes, 0);
  std::vector<size_t> slot(n);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  items.clear();
  for (size_t i = 0; i < n; ++i)
    items.push_back({rng() % kBlocks, local.data() + slot[i] * kBytes});
  REQUIRE(r.Fetch(items, Clock::now() + 5s).ok());
  size_t exact = 0;
  for (const FetchItem& it : items)
    exact += MatchesPattern(it.local, kBytes, kSeed, it.remote_block);
  CHECK(exact == n);
  CHECK(r.stats().blocks_fetched == 16 + n);
  CHECK(r.stats().bytes_fetched == (16 + n) * kBytes);
  CHECK(r.healthy());
  CHECK(p.server->Stats().hellos == 1);
}

TEST_CASE("loopback: readers on four threads share one server", "[disagg][ucx]") {
  const uint64_t kBlocks = 256;
  const uint64_t kBytes = 2048;
  Prefill p = StartPrefill("tcp", kBlocks, kBytes);
  std::atomic<int> connected{0};
  std::atomic<int> fetched{0};
  std::atomic<int> wrong{0};  // Catch2's assertions are not thread-safe: count, check after
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto reader = RemoteReader::Connect(p.context, p.server->address());
      if (!reader.ok()) return;
      ++connected;
      std::mt19937_64 rng(t);
      std::vector<unsigned char> local(200 * kBytes);
      for (int round = 0; round < 3; ++round) {
        std::vector<FetchItem> items(200);
        for (size_t i = 0; i < items.size(); ++i) {
          items[i] = {rng() % kBlocks, local.data() + i * kBytes};
        }
        if (!(*reader)->Fetch(items, Clock::now() + 10s).ok()) return;
        for (const FetchItem& it : items) {
          if (!MatchesPattern(it.local, kBytes, kSeed, it.remote_block)) ++wrong;
        }
        ++fetched;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(connected == 4);
  CHECK(fetched == 12);
  CHECK(wrong == 0);
  CHECK(p.server->Stats().connections_accepted == 4);
  CHECK(p.server->Stats().hellos == 4);
  // The readers are gone: the server closes their endpoints.
  CHECK(Eventually([&] { return p.server->Stats().connections_open == 0; }, 3s));
}

TEST_CASE("loopback: bad fetch arguments are errors and leave the reader usable", "[disagg][ucx]") {
  Prefill p = StartPrefill("tcp", 8, 64);
  auto reader = RemoteReader::Connect(p.context, p.server->address());
  REQUIRE(reader.ok());
  std::vector<unsigned char> buf(64);
  FetchItem past{8, buf.data()};
  Status s = (*reader)->Fetch({&past, 1}, Clock::now() + 1s);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  FetchItem null_buffer{0, nullptr};
  CHECK((*reader)->Fetch({&null_buffer, 1}, Clock::now() + 1s).code() ==
        StatusCode::kInvalidArgument);
  CHECK((*reader)->Fetch({}, Clock::now() + 1s).ok());
  FetchItem good{7, buf.data()};
  REQUIRE((*reader)->Fetch({&good, 1}, Clock::now() + 1s).ok());
  CHECK(MatchesPattern(buf.data(), 64, kSeed, 7));
}

TEST_CASE("loopback: lease messages renew, complete and abort leases", "[disagg][ucx]") {
  // TTL 400 ms, swept every 20 ms.
  Prefill p = StartPrefill("tcp", 32, 64, 400ms, 20ms);
  auto a = p.pool->Acquire(4);
  auto b = p.pool->Acquire(4);
  auto c = p.pool->Acquire(4);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  auto reader = RemoteReader::Connect(p.context, p.server->address());
  REQUIRE(reader.ok());
  RemoteReader& r = **reader;

  // Renew `a` every 50 ms for 800 ms (twice its TTL); `c` is never renewed and expires.
  const uint64_t unknown = 999;
  const auto until = Clock::now() + 800ms;
  while (Clock::now() < until) {
    const uint64_t ids[] = {a->id, unknown};
    REQUIRE(r.Renew(ids, Clock::now() + 1s).ok());
    std::this_thread::sleep_for(50ms);
  }
  CHECK(p.pool->HoldsLease(a->id));
  CHECK_FALSE(p.pool->HoldsLease(b->id));  // not renewed either
  CHECK_FALSE(p.pool->HoldsLease(c->id));
  CHECK(p.pool->Stats().leases_expired == 2);

  auto d = p.pool->Acquire(4);
  REQUIRE(d.ok());
  const uint64_t complete_ids[] = {a->id};
  const uint64_t abort_ids[] = {d->id};
  REQUIRE(r.Complete(complete_ids, Clock::now() + 1s).ok());
  REQUIRE(r.Abort(abort_ids, Clock::now() + 1s).ok());
  REQUIRE(Eventually([&] { return p.pool->Stats().requests_held == 0; }, 2s));
  const StagingPoolStats s = p.pool->Stats();
  CHECK(s.leases_completed == 1);
  CHECK(s.leases_aborted == 1);
  CHECK(s.leases_expired == 2);
  CHECK(s.blocks_held == 0);
  const StagingServerStats ss = p.server->Stats();
  CHECK(ss.unknown_leases >= 1);
  CHECK(ss.bad_messages == 0);
}

TEST_CASE("loopback: connecting to nothing fails within the connect timeout", "[disagg][ucx]") {
  auto ctx = UcxContext::Create({"tcp"});
  REQUIRE(ctx.ok());
  // A port nobody listens on: bind a listener, note its port, then stop it.
  uint16_t port = 0;
  {
    Prefill p = StartPrefill("tcp", 1, 64);
    port = p.server->port();
  }
  RemoteReaderOptions o;
  o.connect_timeout = 2s;
  const auto t0 = Clock::now();
  auto reader = RemoteReader::Connect(*ctx, "127.0.0.1:" + std::to_string(port), o);
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(reader.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
  CHECK(took < 2500ms);
  CHECK(RemoteReader::Connect(*ctx, "not-an-address").status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("loopback: a staging server cannot take a port in use", "[disagg][ucx]") {
  Prefill p = StartPrefill("tcp", 4, 64);
  StagingServerOptions so;
  so.listen_address = p.server->address();
  auto second = StagingServer::Start(p.context, p.pool.get(), so);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(second.status().message(), Catch::Contains(p.server->address()));
  so.listen_address = "127.0.0.1";  // no port
  CHECK(StagingServer::Start(p.context, p.pool.get(), so).status().code() ==
        StatusCode::kInvalidArgument);
  so.listen_address = "127.0.0.1:70000";
  CHECK(StagingServer::Start(p.context, p.pool.get(), so).status().code() ==
        StatusCode::kInvalidArgument);
  // The first server still serves.
  auto reader = RemoteReader::Connect(p.context, p.server->address());
  REQUIRE(reader.ok());
}

TEST_CASE("loopback: a reader whose server went away gets an error by its deadline",
          "[disagg][ucx]") {
  Prefill p = StartPrefill("tcp", 64, 4096);
  auto reader = RemoteReader::Connect(p.context, p.server->address());
  REQUIRE(reader.ok());
  std::vector<unsigned char> buf(4096);
  FetchItem item{5, buf.data()};
  REQUIRE((*reader)->Fetch({&item, 1}, Clock::now() + 2s).ok());
  p.server.reset();  // closes every endpoint
  const auto t0 = Clock::now();
  Status s = (*reader)->Fetch({&item, 1}, Clock::now() + 2s);
  const auto took = Clock::now() - t0;
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(took < 2500ms);
  CHECK_FALSE((*reader)->healthy());
  // Later calls fail fast with the same error.
  const auto t1 = Clock::now();
  CHECK((*reader)->Fetch({&item, 1}, Clock::now() + 2s).code() == StatusCode::kUnavailable);
  CHECK((*reader)->Renew({}, Clock::now() + 2s).code() == StatusCode::kUnavailable);
  CHECK(Clock::now() - t1 < 100ms);
}

namespace {
// A hostile or outdated peer: a bare UCX endpoint that sends whatever control messages it
// likes (with UCP_AM_SEND_FLAG_REPLY, as readers do) and records what the server answers.
class RawPeer {
 public:
  RawPeer(std::shared_ptr<UcxContext> context, const std::string& address) {
    auto worker = UcxWorker::Create(std::move(context));
    REQUIRE(worker.ok());
    worker_ = std::move(worker).value();
    for (ControlMessage m : {ControlMessage::kHelloReply, ControlMessage::kHelloRefused,
                             ControlMessage::kLeaseGone}) {
      ucp_am_handler_param_t am{};
      am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      am.id = static_cast<unsigned>(m);
      am.cb = &RawPeer::OnMessage;
      am.arg = &received_[static_cast<int>(m)];
      REQUIRE(ucp_worker_set_am_recv_handler(worker_->get(), &am) == UCS_OK);
    }
    auto addr = ResolveHostPort(address);
    REQUIRE(addr.ok());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = addr->get();
    ep.sockaddr.addrlen = addr->length;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) { *static_cast<bool*>(arg) = true; };
    ep.err_handler.arg = &failed_;
    REQUIRE(ucp_ep_create(worker_->get(), &ep, &ep_) == UCS_OK);
  }
  ~RawPeer() {
    RequestBatch close;
    const ucp_request_param_t param = close.Param(UCP_EP_CLOSE_FLAG_FORCE);
    close.Track(ucp_ep_close_nbx(ep_, &param));
    close.Wait(*worker_, Clock::now() + 2s);
  }
  // Sends `payload` as `message`; true once handed to the transport.
  bool Send(ControlMessage message, const std::string& payload) {
    RequestBatch batch;
    const ucp_request_param_t param = batch.Param(UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    batch.Track(ucp_am_send_nbx(ep_, static_cast<unsigned>(message), nullptr, 0, payload.data(),
                                payload.size(), &param));
    return batch.Wait(*worker_, Clock::now() + 2s) && batch.first_error() == UCS_OK;
  }
  // Progresses for `how_long` (or until the server closed the connection).
  void Progress(std::chrono::milliseconds how_long) {
    const auto until = Clock::now() + how_long;
    while (Clock::now() < until && !failed_) worker_->ProgressAndWait(5ms);
  }
  const std::vector<std::string>& Received(ControlMessage m) {
    return received_[static_cast<int>(m)];
  }
  bool closed_by_server() const { return failed_; }

 private:
  static ucs_status_t OnMessage(void* arg, const void*, size_t, void* data, size_t length,
                                const ucp_am_recv_param_t*) {
    static_cast<std::vector<std::string>*>(arg)->emplace_back(static_cast<const char*>(data),
                                                              length);
    return UCS_OK;
  }
  std::unique_ptr<UcxWorker> worker_;
  ucp_ep_h ep_ = nullptr;
  bool failed_ = false;
  std::vector<std::string> received_[8];
};

Prefill StartSecretPrefill(const std::string& secret, StagingServerOptions so = {}) {
  Prefill p = StartPrefill("tcp", 64, 256, 10s, 20ms);
  p.server.reset();  // the same pool behind a server that asks a secret
  so.listen_address = "127.0.0.1:0";
  so.sweep_interval = 20ms;
  so.secret = secret;
  auto server = StagingServer::Start(p.context, p.pool.get(), so);
  REQUIRE(server.ok());
  p.server = std::move(server).value();
  return p;
}
}  // namespace

TEST_CASE("loopback: a server with a secret serves only readers that present it",
          "[disagg][ucx][secret]") {
  Prefill p = StartSecretPrefill("the right secret");
  RemoteReaderOptions ro;
  ro.connect_timeout = 5s;
  // Missing and wrong secrets: refused at once (not a timeout), saying why.
  for (const std::string& wrong : {std::string(), std::string("the wrong secret"),
                                   std::string("the right secre"), std::string("the right secret!")}) {
    INFO("secret \"" << wrong << "\"");
    ro.secret = wrong;
    const auto t0 = Clock::now();
    auto reader = RemoteReader::Connect(p.context, p.server->address(), ro);
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(reader.status().message(), Catch::Contains("wrong or missing staging secret"));
    CHECK_THAT(reader.status().message(), Catch::Contains(p.server->address()));
    CHECK(Clock::now() - t0 < 3s);
  }
  CHECK(p.server->Stats().hellos_refused == 4);
  CHECK(p.server->Stats().hellos == 0);
  // The refused connections are closed.
  CHECK(Eventually([&] { return p.server->Stats().connections_open == 0; }, 3s));

  // The right secret: the descriptor, then byte-exact fetches and lease messages.
  ro.secret = "the right secret";
  auto reader = RemoteReader::Connect(p.context, p.server->address(), ro);
  REQUIRE(reader.ok());
  CHECK((*reader)->descriptor() == p.pool->descriptor());
  std::vector<unsigned char> buf(2 * 256);
  const FetchItem items[] = {{3, buf.data()}, {60, buf.data() + 256}};
  REQUIRE((*reader)->Fetch(items, Clock::now() + 2s).ok());
  CHECK(MatchesPattern(buf.data(), 256, kSeed, 3));
  CHECK(MatchesPattern(buf.data() + 256, 256, kSeed, 60));
  auto lease = p.pool->Acquire(2);
  REQUIRE(lease.ok());
  const uint64_t ids[] = {lease->id};
  REQUIRE((*reader)->Complete(ids, Clock::now() + 1s).ok());
  CHECK(Eventually([&] { return !p.pool->HoldsLease(lease->id); }, 2s));
  const StagingServerStats s = p.server->Stats();
  CHECK(s.hellos == 1);
  CHECK(s.hellos_refused == 4);
  CHECK(s.unauthenticated == 0);
  CHECK(s.connections_open == 1);
  CHECK(s.connections_failed == 0);  // refused peers closing their end are no failures
}

TEST_CASE("loopback: refused and silent peers get nothing and are disconnected",
          "[disagg][ucx][secret]") {
  StagingServerOptions so;
  so.hello_timeout = 400ms;
  so.refusal_grace = 200ms;
  Prefill p = StartSecretPrefill("k3y", so);
  auto lease = p.pool->Acquire(4);
  REQUIRE(lease.ok());
  const uint64_t ids[] = {lease->id};

  SECTION("lease messages without a hello are ignored; the silent peer is closed") {
    RawPeer peer(p.context, p.server->address());
    REQUIRE(peer.Send(ControlMessage::kAbort, EncodeLeaseIds(ids)));
    REQUIRE(peer.Send(ControlMessage::kComplete, EncodeLeaseIds(ids)));
    peer.Progress(200ms);
    CHECK(p.pool->HoldsLease(lease->id));
    CHECK(p.server->Stats().unauthenticated == 2);
    CHECK(Eventually([&] { return p.server->Stats().hello_timeouts == 1; }, 3s));
    peer.Progress(1s);
    CHECK(peer.closed_by_server());
    CHECK(p.server->Stats().connections_open == 0);
    CHECK(peer.Received(ControlMessage::kHelloReply).empty());
  }
  SECTION("a wrong secret: a refusal, never the descriptor; lease messages after it are ignored") {
    RawPeer peer(p.context, p.server->address());
    REQUIRE(peer.Send(ControlMessage::kHello, EncodeHello("not the key")));
    REQUIRE(peer.Send(ControlMessage::kAbort, EncodeLeaseIds(ids)));
    peer.Progress(2s);  // until the server closes it (after the 200 ms grace)
    CHECK(peer.closed_by_server());
    CHECK(peer.Received(ControlMessage::kHelloReply).empty());
    REQUIRE(peer.Received(ControlMessage::kHelloRefused).size() == 1);
    auto refusal = ParseHelloRefusal(peer.Received(ControlMessage::kHelloRefused)[0]);
    REQUIRE(refusal.ok());
    CHECK(refusal->reason == HelloRefusal::kSecret);
    CHECK(p.pool->HoldsLease(lease->id));
    const StagingServerStats s = p.server->Stats();
    CHECK(s.hellos_refused == 1);
    CHECK(s.hellos == 0);
    CHECK(s.unauthenticated == 1);
    CHECK(s.connections_open == 0);
  }
  SECTION("a version-1 hello (no secret field) is refused as another version") {
    RawPeer peer(p.context, p.server->address());
    std::string v1;
    AppendU32(v1, 1);
    REQUIRE(peer.Send(ControlMessage::kHello, v1));
    peer.Progress(2s);
    CHECK(peer.Received(ControlMessage::kHelloReply).empty());
    REQUIRE(peer.Received(ControlMessage::kHelloRefused).size() == 1);
    CHECK(ParseHelloRefusal(peer.Received(ControlMessage::kHelloRefused)[0])->reason ==
          HelloRefusal::kVersion);
    CHECK(p.server->Stats().hellos_refused == 1);
  }
  SECTION("the right secret, then lease messages count") {
    RawPeer peer(p.context, p.server->address());
    REQUIRE(peer.Send(ControlMessage::kHello, EncodeHello("k3y")));
    peer.Progress(200ms);
    REQUIRE(peer.Received(ControlMessage::kHelloReply).size() == 1);
    CHECK(ParseDescriptor(peer.Received(ControlMessage::kHelloReply)[0]).value() ==
          p.pool->descriptor());
    REQUIRE(peer.Send(ControlMessage::kAbort, EncodeLeaseIds(ids)));
    CHECK(Eventually([&] { return !p.pool->HoldsLease(lease->id); }, 2s));
    peer.Progress(600ms);  // past the hello timeout: an accepted peer stays connected
    CHECK_FALSE(peer.closed_by_server());
    CHECK(p.server->Stats().connections_open == 1);
    CHECK(p.server->Stats().hello_timeouts == 0);
  }
}

TEST_CASE("loopback: a listener beyond loopback needs a secret", "[disagg][ucx][secret]") {
  Prefill p = StartPrefill("tcp", 4, 64);
  StagingServerOptions so;
  for (const char* wildcard : {"0.0.0.0:0"}) {
    so.listen_address = wildcard;
    auto refused = StagingServer::Start(p.context, p.pool.get(), so);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(refused.status().message(), Catch::Contains("a shared secret is required"));
    CHECK_THAT(refused.status().message(), Catch::Contains(wildcard));
  }
  so.secret = "s";
  auto with_secret = StagingServer::Start(p.context, p.pool.get(), so);
  REQUIRE(with_secret.ok());
  // Any loopback address goes without one (127.0.0.0/8).
  so.secret.clear();
  so.listen_address = "127.0.0.2:0";
  CHECK(StagingServer::Start(p.context, p.pool.get(), so).ok());
  // Secrets are bounded on both sides.
  so.secret = std::string(kMaxSecretBytes + 1, 'x');
  CHECK(StagingServer::Start(p.context, p.pool.get(), so).status().code() ==
        StatusCode::kInvalidArgument);
  RemoteReaderOptions ro;
  ro.secret = so.secret;
  CHECK(RemoteReader::Connect(p.context, p.server->address(), ro).status().code() ==
        StatusCode::kInvalidArgument);
  so.secret = "s";
  so.hello_timeout = 0ms;
  CHECK(StagingServer::Start(p.context, p.pool.get(), so).status().code() ==
        StatusCode::kInvalidArgument);
}

// The engine's disaggregation interfaces (engine/kv_handoff.h) over UCX (docs/disaggregation.md
// §3, §4):
//   - StagingExporter (prefill instance): a handoff's lease is a lease of the instance's
//     StagingPool; the ticket names the instance's StagingServer (its advertised address).
//   - RemoteKvImporter (decode instance): one RemoteReader per prefill peer, shared by every
//     request from that peer; a control thread renews the live leases every TTL/3 in one
//     message per peer and sends completions and aborts, so neither the engine loop nor a
//     fetch ever waits on lease traffic. A peer whose reader fails is reconnected on its next
//     request; the requests that were using it fail (their leases expire on the prefill side).
//     A lease is *lost* once the prefill side says it no longer holds it (kLeaseGone), or
//     when no renewal was handed to the transport for its TTL (the prefill side may have
//     freed it): every fetch of a lost lease fails, and one that was reading when the lease
//     was lost fails after the fact (its bytes may be another request's).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "disagg/remote_reader.h"
#include "disagg/staging_pool.h"
#include "engine/kv_handoff.h"

namespace oasis::disagg {

class StagingExporter final : public KvHandoffExporter {
 public:
  // `address`: host:port written into tickets (the StagingServer's, as decode instances
  // reach it). The pool must outlive the exporter.
  StagingExporter(StagingPool& pool, std::string address, std::chrono::milliseconds lease_ttl);
  StatusOr<std::unique_ptr<KvHandoffLease>> Acquire(const StagedKvLayout& layout) override;

 private:
  StagingPool& pool_;
  std::string address_;
  std::chrono::milliseconds ttl_;
};

struct RemoteKvImporterOptions {
  // The fetches run on the engine's own fetch threads: poll while one is in flight (2-3x the
  // throughput of sleeping on the event fd, docs/benchmarks.md, seventh session).
  // A prefill instance busy serving other reads answers a new connection late: 30 s to connect.
  RemoteReaderOptions reader{.connect_timeout = std::chrono::milliseconds(30000),
                             .spin = std::chrono::milliseconds(100)};
  std::chrono::milliseconds fetch_timeout{60000};   // one request's admission fetch
  std::chrono::milliseconds control_timeout{2000};  // a lease message
  // Fetch connections per prefill peer: that many fetches from one peer run at once (a reader
  // is single-threaded); lease messages have one more connection of their own.
  int readers_per_peer = 4;
};

struct RemoteKvImporterStats {
  uint64_t peers_connected = 0;  // readers made (reconnects included)
  uint64_t fetches = 0, fetch_failures = 0;
  uint64_t bytes_fetched = 0, blocks_fetched = 0, gets_issued = 0;
  double fetch_seconds_total = 0;
  uint64_t leases_live = 0;  // imported requests still holding their prefill lease
  uint64_t leases_completed = 0, leases_aborted = 0;
  uint64_t renewals_sent = 0;  // lease ids renewed
  uint64_t leases_lost = 0;    // expired or gone on the prefill side while still needed
};

class RemoteKvImporter : public std::enable_shared_from_this<RemoteKvImporter> {
 public:
  static std::shared_ptr<RemoteKvImporter> Create(std::shared_ptr<UcxContext> context,
                                                  RemoteKvImporterOptions options = {});
  ~RemoteKvImporter();

  // A source for a parsed ticket: fetches from the ticket's staging address (connecting on
  // first use); full_transfer: every KV block at admission (the baseline).
  std::shared_ptr<KvImportSource> Source(HandoffTicket ticket, bool full_transfer);
  RemoteKvImporterStats Stats() const;

 private:
  struct Peer {
    std::mutex mu;  // the reader is single-threaded
    std::unique_ptr<RemoteReader> reader;
  };
  // With peer->mu held: a healthy reader for `address`, connecting when there is none.
  Status EnsureReader(Peer& peer, const std::string& address);
  class Source_;
  explicit RemoteKvImporter(std::shared_ptr<UcxContext> context, RemoteKvImporterOptions options);
  // Connection `index` to `address` (made empty on first use; connected by EnsureReader).
  std::shared_ptr<Peer> PeerFor(const std::string& address, int index);
  // A connection to `address` for a fetch, locked: a free one if any, else the next in turn.
  std::pair<std::shared_ptr<Peer>, std::unique_lock<std::mutex>> AnyPeer(
      const std::string& address);
  Status Fetch(const HandoffTicket& ticket, const std::vector<KvFetchItem>& items);
  void Track(const std::string& address, uint64_t lease_id, uint32_t ttl_ms);
  void End(const std::string& address, uint64_t lease_id, bool completed);
  // Ok while the lease can be trusted; Unavailable, saying why, once it is lost.
  Status CheckLease(const std::string& address, uint64_t lease_id);
  // With `peer`'s lock held: the lease ids its reader heard are gone become lost.
  void CollectGone(Peer& peer, const std::string& address);
  void ControlLoop();

  std::shared_ptr<UcxContext> context_;
  RemoteKvImporterOptions options_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::shared_ptr<Peer>>> peers_;
  uint64_t next_peer_ = 0;
  struct Lease {
    Clock::time_point renewed;  // last renewal handed to the transport (or Track)
    std::chrono::milliseconds ttl;
    bool lost = false;
  };
  std::map<std::string, std::map<uint64_t, Lease>> live_;   // peer → leases to renew
  std::map<std::string, std::vector<uint64_t>> completes_;  // peer → leases to end
  std::map<std::string, std::vector<uint64_t>> aborts_;
  std::chrono::milliseconds renew_interval_{10000};
  bool stop_ = false;
  RemoteKvImporterStats stats_;
  std::thread control_;
};

}  // namespace oasis::disagg

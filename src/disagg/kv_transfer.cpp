#include "disagg/kv_transfer.h"

#include <algorithm>

#include "common/check.h"
#include "common/logging.h"

namespace oasis::disagg {

// ---------------------------------------------------------------- prefill side

namespace {

class StagingLease final : public KvHandoffLease {
 public:
  StagingLease(StagingPool& pool, Lease lease, std::string address, std::chrono::milliseconds ttl)
      : pool_(pool), lease_(std::move(lease)), address_(std::move(address)), ttl_(ttl) {}
  ~StagingLease() override {
    if (!committed_) (void)pool_.Release(lease_.id, LeaseEnd::kAborted);
  }
  void* Slot(uint64_t ordinal) override {
    OASIS_CHECK_LT(ordinal, lease_.blocks.size()) << "staging slot ordinal";
    return pool_.BlockData(lease_.blocks[static_cast<size_t>(ordinal)]);
  }
  StatusOr<std::string> Commit(HandoffTicket t) override {
    t.staging_address = address_;
    t.pool_id = pool_.descriptor().pool_id;
    t.lease_id = lease_.id;
    t.lease_ttl_ms = static_cast<uint32_t>(ttl_.count());
    t.extents = lease_.extents;
    // The ticket must parse on the other side: check it here, where a bug can be named.
    std::string bytes = EncodeHandoffTicket(t);
    auto parsed = ParseHandoffTicket(bytes);
    if (!parsed.ok())
      return Internal("handoff ticket did not parse back: " + parsed.status().ToString());
    // From now on the lease lives until the decode side ends it or it expires.
    OASIS_RETURN_IF_ERROR(pool_.Renew(lease_.id));
    committed_ = true;
    return bytes;
  }

 private:
  StagingPool& pool_;
  Lease lease_;
  std::string address_;
  std::chrono::milliseconds ttl_;
  bool committed_ = false;
};

}  // namespace

StagingExporter::StagingExporter(StagingPool& pool, std::string address,
                                 std::chrono::milliseconds lease_ttl)
    : pool_(pool), address_(std::move(address)), ttl_(lease_ttl) {}

StatusOr<std::unique_ptr<KvHandoffLease>> StagingExporter::Acquire(const StagedKvLayout& layout) {
  if (layout.slot_bytes() != pool_.options().block_bytes) {
    return FailedPrecondition(
        "staging pool slots of " + std::to_string(pool_.options().block_bytes) +
        " bytes, the model's head-blocks are " + std::to_string(layout.slot_bytes()));
  }
  auto lease = pool_.Acquire(layout.num_slots(), Clock::now(), ttl_);
  if (!lease.ok()) return lease.status();
  return std::unique_ptr<KvHandoffLease>(
      new StagingLease(pool_, std::move(*lease), address_, ttl_));
}

// ---------------------------------------------------------------- decode side

class RemoteKvImporter::Source_ final : public KvImportSource {
 public:
  Source_(std::shared_ptr<RemoteKvImporter> owner, HandoffTicket ticket, bool full)
      : owner_(std::move(owner)), ticket_(std::move(ticket)), full_(full) {
    owner_->Track(ticket_.staging_address, ticket_.lease_id, ticket_.lease_ttl_ms);
  }
  ~Source_() override { Release(false); }
  const HandoffTicket& ticket() const override { return ticket_; }
  bool full_transfer() const override { return full_; }
  Status Fetch(const std::vector<KvFetchItem>& items) override {
    OASIS_RETURN_IF_ERROR(owner_->CheckLease(ticket_.staging_address, ticket_.lease_id));
    OASIS_RETURN_IF_ERROR(owner_->Fetch(ticket_, items));
    // Lost while reading: the slots may have been reused meanwhile, so the bytes are suspect.
    OASIS_RETURN_IF_ERROR(owner_->CheckLease(ticket_.staging_address, ticket_.lease_id));
    // The baseline: the prefill instance's copy is not needed once everything is here.
    if (full_) Release(true);
    return Status::Ok();
  }
  void Release(bool completed) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return;
    released_ = true;
    owner_->End(ticket_.staging_address, ticket_.lease_id, completed);
  }

 private:
  std::shared_ptr<RemoteKvImporter> owner_;
  HandoffTicket ticket_;
  bool full_;
  std::mutex mu_;
  bool released_ = false;
};

std::shared_ptr<RemoteKvImporter> RemoteKvImporter::Create(std::shared_ptr<UcxContext> context,
                                                           RemoteKvImporterOptions options) {
  std::shared_ptr<RemoteKvImporter> p(new RemoteKvImporter(std::move(context), options));
  p->control_ = std::thread([raw = p.get()] { raw->ControlLoop(); });
  return p;
}

RemoteKvImporter::RemoteKvImporter(std::shared_ptr<UcxContext> context,
                                   RemoteKvImporterOptions options)
    : context_(std::move(context)), options_(options) {}

RemoteKvImporter::~RemoteKvImporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (control_.joinable()) control_.join();
}

std::shared_ptr<KvImportSource> RemoteKvImporter::Source(HandoffTicket ticket, bool full_transfer) {
  return std::make_shared<Source_>(shared_from_this(), std::move(ticket), full_transfer);
}

RemoteKvImporterStats RemoteKvImporter::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RemoteKvImporterStats s = stats_;
  s.leases_live = 0;
  for (const auto& [peer, leases] : live_) s.leases_live += leases.size();
  return s;
}

std::shared_ptr<RemoteKvImporter::Peer> RemoteKvImporter::PeerFor(const std::string& address,
                                                                  int index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& conns = peers_[address];
  if (conns.empty()) {  // the fetch connections, then the lease connection
    for (int i = 0; i <= std::max(1, options_.readers_per_peer); ++i)
      conns.push_back(std::make_shared<Peer>());
  }
  return conns.at(static_cast<size_t>(index) % conns.size());
}

std::pair<std::shared_ptr<RemoteKvImporter::Peer>, std::unique_lock<std::mutex>>
RemoteKvImporter::AnyPeer(const std::string& address) {
  const int n = std::max(1, options_.readers_per_peer);
  uint64_t start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = next_peer_++;
  }
  for (int i = 0; i < n; ++i) {
    std::shared_ptr<Peer> p = PeerFor(address, static_cast<int>((start + i) % n));
    std::unique_lock<std::mutex> l(p->mu, std::try_to_lock);
    if (l.owns_lock()) return {std::move(p), std::move(l)};
  }
  std::shared_ptr<Peer> p = PeerFor(address, static_cast<int>(start % n));
  std::unique_lock<std::mutex> l(p->mu);
  return {std::move(p), std::move(l)};
}

Status RemoteKvImporter::Fetch(const HandoffTicket& ticket, const std::vector<KvFetchItem>& items) {
  auto [peer, lock] = AnyPeer(ticket.staging_address);
  if (Status st = EnsureReader(*peer, ticket.staging_address); !st.ok()) {
    // A busy prefill instance may not answer a new connection's hello in time while it serves
    // other reads: wait for a connection that is up instead of failing the request.
    lock.unlock();
    bool found = false;
    for (int i = 0; i < std::max(1, options_.readers_per_peer) && !found; ++i) {
      std::shared_ptr<Peer> other = PeerFor(ticket.staging_address, i);
      std::unique_lock<std::mutex> l(other->mu);
      if (other->reader && other->reader->healthy()) {
        peer = std::move(other);
        lock = std::move(l);
        found = true;
      }
    }
    if (!found) {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.fetch_failures;
      return st;
    }
  }
  RemoteReader& reader = *peer->reader;
  if (reader.descriptor().pool_id != ticket.pool_id) {
    return FailedPrecondition("handoff ticket for staging pool " + std::to_string(ticket.pool_id) +
                              ", " + ticket.staging_address + " serves pool " +
                              std::to_string(reader.descriptor().pool_id) +
                              " (the prefill instance restarted)");
  }
  // The pool's slots must be the ticket's head-blocks (its KV dtype): a get moves a whole slot
  // into a destination of the layout's slot size.
  auto layout = StagedKvLayout::Create(ticket.geometry);
  if (!layout.ok()) return layout.status();
  if (reader.descriptor().block_bytes != layout->slot_bytes()) {
    return FailedPrecondition("staging pool " + ticket.staging_address + " has slots of " +
                              std::to_string(reader.descriptor().block_bytes) +
                              " bytes, the ticket's " +
                              StagedKvDtypeName(ticket.geometry.kv_dtype) + " head-blocks are " +
                              std::to_string(layout->slot_bytes()) +
                              " (the prefill instance runs another --kv-cache-dtype?)");
  }
  // Ordinal -> pool slot through the extents' running totals (a lease has a few extents but
  // up to millions of slots: a drift read of a few hundred must not expand them all).
  std::vector<uint64_t> ends;  // ordinal just past each extent
  ends.reserve(ticket.extents.size());
  uint64_t total = 0;
  for (const SlotExtent& e : ticket.extents) ends.push_back(total += e.count);
  std::vector<FetchItem> fetch;
  fetch.reserve(items.size());
  for (const KvFetchItem& it : items) {
    if (it.ordinal >= total) {
      return InvalidArgument("slot ordinal " + std::to_string(it.ordinal) + " beyond the lease's " +
                             std::to_string(total) + " slots");
    }
    const auto x =
        static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), it.ordinal) - ends.begin());
    const SlotExtent& e = ticket.extents[x];
    fetch.push_back({e.start + (it.ordinal - (ends[x] - e.count)), it.dst});
  }
  const RemoteReaderStats before = reader.stats();
  const Status st = reader.Fetch(fetch, Clock::now() + options_.fetch_timeout);
  const RemoteReaderStats& after = reader.stats();
  CollectGone(*peer, ticket.staging_address);
  std::lock_guard<std::mutex> l(mu_);
  ++stats_.fetches;
  if (!st.ok()) ++stats_.fetch_failures;
  stats_.bytes_fetched += after.bytes_fetched - before.bytes_fetched;
  stats_.blocks_fetched += after.blocks_fetched - before.blocks_fetched;
  stats_.gets_issued += after.gets_issued - before.gets_issued;
  stats_.fetch_seconds_total += after.fetch_seconds_total - before.fetch_seconds_total;
  return st;
}

Status RemoteKvImporter::EnsureReader(Peer& peer, const std::string& address) {
  if (peer.reader && peer.reader->healthy()) return Status::Ok();
  auto r = RemoteReader::Connect(context_, address, options_.reader);
  if (!r.ok()) return r.status();
  peer.reader = std::move(*r);
  std::lock_guard<std::mutex> l(mu_);
  ++stats_.peers_connected;
  return Status::Ok();
}

void RemoteKvImporter::Track(const std::string& address, uint64_t lease_id, uint32_t ttl_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_[address][lease_id] = Lease{Clock::now(), std::chrono::milliseconds(ttl_ms)};
    renew_interval_ =
        std::min(renew_interval_, std::chrono::milliseconds(std::max<uint32_t>(3, ttl_ms) / 3));
  }
  cv_.notify_all();
}

void RemoteKvImporter::End(const std::string& address, uint64_t lease_id, bool completed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_[address].erase(lease_id);
    (completed ? completes_ : aborts_)[address].push_back(lease_id);
    ++(completed ? stats_.leases_completed : stats_.leases_aborted);
  }
  cv_.notify_all();
}

Status RemoteKvImporter::CheckLease(const std::string& address, uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto peer = live_.find(address);
  if (peer == live_.end())
    return FailedPrecondition("lease " + std::to_string(lease_id) + " is not tracked");
  auto it = peer->second.find(lease_id);
  if (it == peer->second.end())
    return FailedPrecondition("lease " + std::to_string(lease_id) + " has ended");
  Lease& l = it->second;
  if (!l.lost && Clock::now() > l.renewed + l.ttl) {
    l.lost = true;
    ++stats_.leases_lost;
    spdlog::warn("lease {} at {}: not renewed for its TTL of {} ms", lease_id, address,
                 l.ttl.count());
  }
  if (l.lost) {
    return Unavailable("the prefill instance at " + address +
                       " may no longer hold this request's KV (lease " + std::to_string(lease_id) +
                       " expired or was released there)");
  }
  return Status::Ok();
}

void RemoteKvImporter::CollectGone(Peer& peer, const std::string& address) {
  if (!peer.reader) return;
  const std::vector<uint64_t> gone = peer.reader->TakeGoneLeases();
  if (gone.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& leases = live_[address];
  for (uint64_t id : gone) {
    auto it = leases.find(id);
    if (it == leases.end() || it->second.lost) continue;
    it->second.lost = true;
    ++stats_.leases_lost;
    spdlog::warn("lease {} at {}: the prefill instance no longer holds it", id, address);
  }
}

void RemoteKvImporter::ControlLoop() {
  auto next_renewal = Clock::now() + renew_interval_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    next_renewal = std::min(next_renewal, Clock::now() + renew_interval_);
    cv_.wait_until(lock, next_renewal, [&] {
      return stop_ || !completes_.empty() || !aborts_.empty() ||
             Clock::now() + renew_interval_ < next_renewal;
    });
    if (stop_) break;
    const bool renew = Clock::now() >= next_renewal;
    if (renew) next_renewal = Clock::now() + renew_interval_;
    // Per peer: its ends, and (when due) its renewals; sent without holding mu_.
    struct Work {
      std::string address;
      std::vector<uint64_t> complete, abort, renew;
    };
    std::vector<Work> work;
    std::map<std::string, Work> by_peer;
    for (auto& [a, ids] : completes_) by_peer[a].complete = std::move(ids);
    for (auto& [a, ids] : aborts_) by_peer[a].abort = std::move(ids);
    completes_.clear();
    aborts_.clear();
    if (renew) {
      for (auto& [a, leases] : live_) {
        for (const auto& [id, l] : leases) {
          if (!l.lost) by_peer[a].renew.push_back(id);
        }
      }
    }
    for (auto& [a, w] : by_peer) {
      w.address = a;
      work.push_back(std::move(w));
    }
    lock.unlock();
    uint64_t renewed = 0;
    std::vector<std::pair<const Work*, Clock::time_point>> renewals;  // sent at
    for (const Work& w : work) {
      // A connection of their own: an admission fetch holds a fetch connection for seconds,
      // and renewals must never wait behind one.
      std::shared_ptr<Peer> peer = PeerFor(w.address, std::max(1, options_.readers_per_peer));
      std::unique_lock<std::mutex> pl(peer->mu);
      // A request still queued renews before its first fetch: connect for it.
      Status st = EnsureReader(*peer, w.address);
      if (!st.ok()) {
        spdlog::warn("lease messages to {}: {}", w.address, st.ToString());
        continue;
      }
      const auto deadline = Clock::now() + options_.control_timeout;
      if (!w.complete.empty()) st = peer->reader->Complete(w.complete, deadline);
      if (st.ok() && !w.abort.empty()) st = peer->reader->Abort(w.abort, deadline);
      if (st.ok() && !w.renew.empty()) {
        const auto sent = Clock::now();
        st = peer->reader->Renew(w.renew, deadline);
        if (st.ok()) {
          renewed += w.renew.size();
          renewals.emplace_back(&w, sent);
        }
      }
      if (!st.ok()) spdlog::warn("lease messages to {}: {}", w.address, st.ToString());
      // Answers to earlier renewals (kLeaseGone) arrive on this connection.
      if (peer->reader && peer->reader->healthy()) peer->reader->Poll();
      CollectGone(*peer, w.address);
    }
    lock.lock();
    stats_.renewals_sent += renewed;
    for (const auto& [w, sent] : renewals) {
      auto& leases = live_[w->address];
      for (uint64_t id : w->renew) {
        auto it = leases.find(id);
        if (it != leases.end()) it->second.renewed = std::max(it->second.renewed, sent);
      }
    }
  }
}

}  // namespace oasis::disagg

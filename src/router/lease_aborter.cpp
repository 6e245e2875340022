#include "router/lease_aborter.h"

#include "disagg/remote_reader.h"
#include "disagg/ucx.h"

namespace oasis::router {

LeaseAborter::LeaseAborter(std::string secret, std::chrono::milliseconds connect_timeout)
    : secret_(std::move(secret)), connect_timeout_(connect_timeout) {}

LeaseAborter::~LeaseAborter() {
  std::lock_guard<std::mutex> lock(mu_);
  readers_.clear();  // before the context
  context_.reset();
}

Status LeaseAborter::Abort(const std::string& staging_address, uint64_t lease_id) {
  Status st = [&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (context_ == nullptr) {
      auto ctx = disagg::UcxContext::Create(disagg::UcxOptions{.transports = "", .name = "router"});
      if (!ctx.ok()) return ctx.status().WithContext("UCX context");
      context_ = std::move(*ctx);
    }
    std::unique_ptr<disagg::RemoteReader>& reader = readers_[staging_address];
    if (reader == nullptr || !reader->healthy()) {
      reader.reset();
      disagg::RemoteReaderOptions o;
      o.connect_timeout = connect_timeout_;
      o.secret = secret_;
      auto r = disagg::RemoteReader::Connect(context_, staging_address, o);
      if (!r.ok()) return r.status();
      reader = std::move(*r);
    }
    const uint64_t ids[1] = {lease_id};
    Status s = reader->Abort(ids, disagg::Clock::now() + connect_timeout_);
    if (!s.ok()) reader.reset();
    return s;
  }();
  (st.ok() ? aborted_ : failed_).fetch_add(1);
  return st;
}

}  // namespace oasis::router

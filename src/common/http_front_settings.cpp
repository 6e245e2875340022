#include "common/http_front_settings.h"

#include <cmath>
#include <string>

namespace oasis {

Status HttpFrontSettings::CheckHttpFront() const {
  if (max_connections < 1 || max_connections > 1'000'000) {
    return InvalidArgument("--max-connections must be in [1, 1000000], got " +
                           std::to_string(max_connections));
  }
  auto seconds = [](const char* name, double v, bool zero_ok) {
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok) || v > 86400) {
      return InvalidArgument(std::string("--") + name + " must be in " + (zero_ok ? "[0" : "(0") +
                             ", 86400] seconds, got " + std::to_string(v));
    }
    return Status::Ok();
  };
  OASIS_RETURN_IF_ERROR(seconds("keep-alive-timeout-s", keep_alive_timeout_s, false));
  OASIS_RETURN_IF_ERROR(seconds("header-timeout-s", header_timeout_s, false));
  OASIS_RETURN_IF_ERROR(seconds("body-timeout-s", body_timeout_s, false));
  OASIS_RETURN_IF_ERROR(seconds("write-timeout-s", write_timeout_s, false));
  return seconds("shutdown-timeout-s", shutdown_timeout_s, true);
}

std::chrono::milliseconds SecondsToMs(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

void HttpFrontSettings::ApplyTo(HttpFrontOptions* o) const {
  o->max_connections = static_cast<size_t>(max_connections);
  o->idle_timeout = SecondsToMs(keep_alive_timeout_s);
  o->header_timeout = SecondsToMs(header_timeout_s);
  o->body_timeout = SecondsToMs(body_timeout_s);
  o->write_timeout = SecondsToMs(write_timeout_s);
}

std::chrono::milliseconds HttpFrontSettings::shutdown_deadline() const {
  return SecondsToMs(shutdown_timeout_s);
}

}  // namespace oasis

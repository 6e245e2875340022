#include "server/connection_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace oasis::server {
namespace {

// The numeric host and port of an address, formatted as httplib formats them.
bool Describe(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = h;
  *port = std::atoi(p);
  return true;
}

}  // namespace

int ConnectionProbe::FindSocket() const {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
      continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
      continue;
    std::string lh, ph;
    int lp = 0, pp = 0;
    if (!Describe(local, local_len, &lh, &lp) || !Describe(peer, peer_len, &ph, &pp)) continue;
    if (lp == local_port_ && pp == remote_port_ && lh == local_addr_ && ph == remote_addr_) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool ConnectionProbe::PeerClosed() {
  if (!searched_) {
    fd_ = FindSocket();
    searched_ = true;
  }
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace oasis::server

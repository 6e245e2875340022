#include "common/program.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

namespace oasis {

ShutdownSignals::ShutdownSignals() {
  signal(SIGPIPE, SIG_IGN);
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int ShutdownSignals::Wait() const {
  int sig = 0;
  sigwait(&set_, &sig);
  spdlog::info("signal {}: shutting down", sig);
  return sig;
}

void ShutdownSignals::Raise() { kill(getpid(), SIGTERM); }

int ExitWithError(const char* program, const Status& status, int exit_code) {
  std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
  return exit_code;
}

}  // namespace oasis

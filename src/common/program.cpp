#include "common/program.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

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

ExitOnShutdownSignal::ExitOnShutdownSignal(const ShutdownSignals& signals, std::string what)
    : thread_([this, set = signals.set(), what = std::move(what)] {
        const timespec poll{0, 100'000'000};  // 100 ms
        while (!done_.load(std::memory_order_acquire)) {
          const int sig = sigtimedwait(&set, nullptr, &poll);
          if (sig > 0) {
            std::fprintf(stderr, "signal %d while %s: exiting\n", sig, what.c_str());
            std::fflush(stdout);
            std::_Exit(128 + sig);
          }
        }
      }) {}

ExitOnShutdownSignal::~ExitOnShutdownSignal() {
  done_.store(true, std::memory_order_release);
  thread_.join();
}

uint64_t RaiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return static_cast<uint64_t>(lim.rlim_cur);
}

int ExitWithError(const char* program, const Status& status, int exit_code) {
  std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
  return exit_code;
}

}  // namespace oasis

// Start-up and shut-down steps shared by the project's long-running programs (oasis-server,
// oasis-router): signal set-up, the command line's outcome (an error, --help, the log level)
// and waiting for SIGINT/SIGTERM. Used once, from main(); not thread-safe except Raise().
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "common/logging.h"
#include "oasis/status.h"

namespace oasis {

// Construct first in main(), before any thread starts: ignores SIGPIPE (writes to closed
// sockets fail with EPIPE instead) and blocks SIGINT/SIGTERM in this thread and every thread
// started later, so that only Wait() takes them.
class ShutdownSignals {
 public:
  ShutdownSignals();
  // Blocks until SIGINT or SIGTERM arrives; logs it and returns its number.
  int Wait() const;
  // Sends SIGTERM to this process (wakes Wait() from another thread). Thread-safe.
  static void Raise();
  const sigset_t& set() const { return set_; }

 private:
  sigset_t set_;
};

// While it lives, SIGINT or SIGTERM ends the process at once (exit status 128 + the signal),
// for the phase before a program can shut down in order: loading a model takes minutes, and
// Ctrl-C or `timeout` must work then too. Its watcher thread polls, so a signal after it is
// gone waits for ShutdownSignals::Wait().
class ExitOnShutdownSignal {
 public:
  explicit ExitOnShutdownSignal(const ShutdownSignals& signals, std::string what);
  ~ExitOnShutdownSignal();
  ExitOnShutdownSignal(const ExitOnShutdownSignal&) = delete;
  ExitOnShutdownSignal& operator=(const ExitOnShutdownSignal&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Raises this process's soft limit of open files to its hard limit (as vLLM does): every
// connection is a descriptor, and the common soft limit of 1,024 let a few thousand idle
// connections to one port take the ones /health needed. Returns the limit now in force.
uint64_t RaiseOpenFileLimit();

// Prints "PROGRAM: STATUS" to stderr and returns `exit_code`.
int ExitWithError(const char* program, const Status& status, int exit_code);

// The first steps after parsing the command line: an error (exit code 2), --help (prints the
// usage, exit code 0), or the logging set-up from the log level (exit code 2 when it is
// unknown). Returns the exit code when main() ends here, nullopt to go on. `CommandLine` has
// `help` and `usage`; `log_level_of(command_line)` gives its log level.
template <class CommandLine, class LogLevelOf>
std::optional<int> StartProgram(const char* program, const StatusOr<CommandLine>& command_line,
                                LogLevelOf log_level_of) {
  if (!command_line.ok()) return ExitWithError(program, command_line.status(), 2);
  if (command_line->help) {
    std::printf("%s", command_line->usage.c_str());
    return 0;
  }
  if (Status st = InitLogging(log_level_of(*command_line)); !st.ok())
    return ExitWithError(program, st, 2);
  return std::nullopt;
}

}  // namespace oasis

// Shared by the disaggregation tests and their helper process (disagg_peer): a reproducible
// byte pattern per staging block, and a child process with pipes to its stdin and stdout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oasis::disagg::testing {

// Fills / checks `bytes` (a multiple of 8) with the pattern of block `block` under `seed`.
void FillPattern(void* data, size_t bytes, uint64_t seed, uint64_t block);
bool MatchesPattern(const void* data, size_t bytes, uint64_t seed, uint64_t block);

// A child process running `argv[0]` with `argv[1..]`; its stdin and stdout are pipes to us,
// its stderr is ours. The destructor SIGKILLs it if it still runs and reaps it. Not
// thread-safe.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next line of stdout (without '\n'), or nullopt at EOF or after `timeout`.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout);
  void CloseStdin();
  void Kill();  // SIGKILL and reap
  // Waits for the exit; the exit code, or nullopt after `timeout` (or when killed by a signal).
  std::optional<int> Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  bool reaped_ = false;
};

// The next line of the child's protocol (READY / FETCHED / FAIL ...), skipping UCX's own log
// lines ("[timestamp] ... UCX  WARN ..."), which UCX writes to stdout.
std::optional<std::string> ReadPeerLine(ChildProcess& child, std::chrono::milliseconds timeout);

// Splits "A B C" at spaces.
std::vector<std::string> SplitWords(const std::string& line);

}  // namespace oasis::disagg::testing

// Progress: a progress display on stderr for a benchmark run. On a terminal a one-line bar
// redrawn in place (at most ten times a second); otherwise (CI logs, pipes) a plain line at
// every 10% of the requests and at least every 10 seconds. Thread-safe: workers call
// Completed() concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace oasis::loadgen {

enum class ProgressStyle { kBar, kLines, kOff };

// kBar when `stream` is a terminal, else kLines.
ProgressStyle DefaultProgressStyle(std::FILE* stream);

class Progress {
 public:
  Progress(std::string label, int64_t total, ProgressStyle style, std::FILE* out = stderr);
  void Completed(bool success);
  // Draws the final state and ends the line.
  void Finish();

  // The one-line text for a state (exposed for tests).
  static std::string Render(const std::string& label, int64_t done, int64_t total, int64_t failed,
                            double elapsed_s, int bar_width);

 private:
  void DrawLocked(bool final_draw);

  const std::string label_;
  const int64_t total_;
  const ProgressStyle style_;
  std::FILE* const out_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  int64_t done_ = 0;
  int64_t failed_ = 0;
  int64_t last_line_decile_ = 0;
  std::chrono::steady_clock::time_point last_draw_;
  bool finished_ = false;
};

}  // namespace oasis::loadgen

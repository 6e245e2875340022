// Progress: see progress.h.
#include "tools/loadgen/progress.h"

#include <unistd.h>

#include <cstdio>

namespace oasis::loadgen {

ProgressStyle DefaultProgressStyle(std::FILE* stream) {
  return isatty(fileno(stream)) ? ProgressStyle::kBar : ProgressStyle::kLines;
}

Progress::Progress(std::string label, int64_t total, ProgressStyle style, std::FILE* out)
    : label_(std::move(label)),
      total_(total),
      style_(style),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string Progress::Render(const std::string& label, int64_t done, int64_t total, int64_t failed,
                             double elapsed_s, int bar_width) {
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  std::string text = label + " ";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%3d%% ", static_cast<int>(fraction * 100.0));
  text += buf;
  if (bar_width > 0) {
    const int filled = static_cast<int>(fraction * bar_width);
    text += "|" + std::string(filled, '#') + std::string(bar_width - filled, ' ') + "| ";
  }
  std::snprintf(buf, sizeof(buf), "%lld/%lld [%.1fs, %.2f req/s]", static_cast<long long>(done),
                static_cast<long long>(total), elapsed_s,
                elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0);
  text += buf;
  if (failed > 0) text += " " + std::to_string(failed) + " failed";
  return text;
}

void Progress::Completed(bool success) {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  if (!success) ++failed_;
  DrawLocked(/*final_draw=*/false);
}

void Progress::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  DrawLocked(/*final_draw=*/true);
}

void Progress::DrawLocked(bool final_draw) {
  if (style_ == ProgressStyle::kOff) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  if (style_ == ProgressStyle::kBar) {
    if (!final_draw && since_draw < 0.1 && done_ != total_) return;
    std::fprintf(out_, "\r%s\033[K", Render(label_, done_, total_, failed_, elapsed, 40).c_str());
    if (final_draw) std::fputc('\n', out_);
  } else {
    const int64_t decile = total_ > 0 ? done_ * 10 / total_ : 10;
    if (final_draw) {
      if (done_ == total_ && last_line_decile_ == 10) return;  // 100% already printed
    } else if (decile == last_line_decile_ && since_draw < 10.0) {
      return;
    }
    last_line_decile_ = decile;
    std::fprintf(out_, "%s\n", Render(label_, done_, total_, failed_, elapsed, 0).c_str());
  }
  std::fflush(out_);
  last_draw_ = now;
}

}  // namespace oasis::loadgen

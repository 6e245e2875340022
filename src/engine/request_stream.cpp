// RequestStream, FinishReasonName and EngineStats::Sparse's top-K agreement (engine/engine.h).
#include <algorithm>

#include "common/check.h"
#include "engine/engine.h"

namespace oasis {

const char* FinishReasonName(FinishReasonKind kind) {
  switch (kind) {
    case FinishReasonKind::kNone:
      return "";
    case FinishReasonKind::kStop:
      return "stop";
    case FinishReasonKind::kLength:
      return "length";
    case FinishReasonKind::kAbort:
      return "abort";
    case FinishReasonKind::kError:
      return "error";
    case FinishReasonKind::kHandoff:
      return "handoff";
  }
  return "";
}

std::optional<RequestOutput> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_popped_) return std::nullopt;
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  if (out.finished) finished_popped_ = true;
  return out;
}

void RequestStream::Push(RequestOutput out) {
  std::shared_ptr<const std::function<void()>> wakeup;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup = wakeup_;
    OASIS_CHECK(!finished_pushed_) << "event pushed to request " << id_ << " after it finished";
    if (out.finished) finished_pushed_ = true;
    if (!queue_.empty()) {
      // The reader is behind: merge into the pending event.
      RequestOutput& back = queue_.back();
      for (GeneratedToken& t : out.tokens) back.tokens.push_back(std::move(t));
      back.text += out.text;
      back.finished = out.finished;
      back.finish_reason = out.finish_reason;
      back.stop_reason = std::move(out.stop_reason);
      back.error = std::move(out.error);
      back.prompt_tokens = out.prompt_tokens;
      back.completion_tokens = out.completion_tokens;
      back.cached_tokens = out.cached_tokens;
      back.handoff_ticket = std::move(out.handoff_ticket);
      if (!out.prompt_logprobs.empty()) back.prompt_logprobs = std::move(out.prompt_logprobs);
    } else {
      queue_.push_back(std::move(out));
    }
  }
  cv_.notify_all();
  if (wakeup) (*wakeup)();
}

void RequestStream::SetWakeup(std::function<void()> wakeup) {
  std::shared_ptr<const std::function<void()>> fn;
  if (wakeup) fn = std::make_shared<const std::function<void()>>(std::move(wakeup));
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = fn;
    queued = !queue_.empty();
  }
  if (queued && fn) (*fn)();
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_pushed_;
}

double EngineStats::Sparse::topk_agreement() const {
  int64_t overlap = 0, total = 0;
  for (size_t l = 0; l < agree_total.size(); ++l) {
    overlap += agree_overlap[l];
    total += agree_total[l];
  }
  return total > 0 ? static_cast<double>(overlap) / static_cast<double>(total) : 0.0;
}

double EngineStats::Sparse::topk_agreement(size_t layer) const {
  if (layer >= agree_total.size() || agree_total[layer] == 0) return 0.0;
  return static_cast<double>(agree_overlap[layer]) / static_cast<double>(agree_total[layer]);
}

}  // namespace oasis

#include "engine/stop_checker.h"

#include <algorithm>

#include "common/check.h"

namespace oasis {
namespace {

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

StopChecker::StopChecker(StopConditions conditions, const tokenizer::Tokenizer* tok)
    : conditions_(std::move(conditions)) {
  OASIS_CHECK(tok != nullptr || conditions_.stop_strings.empty())
      << "stop strings need a tokenizer";
  for (const std::string& s : conditions_.stop_strings)
    OASIS_CHECK(!s.empty()) << "empty stop string";
  if (tok != nullptr) {
    detok_.emplace(*tok,
                   conditions_.skip_special_tokens ? tokenizer::SkipSpecialTokens::kYes
                                                   : tokenizer::SkipSpecialTokens::kNo,
                   conditions_.spaces_between_special_tokens
                       ? tokenizer::SpacesBetweenSpecialTokens::kYes
                       : tokenizer::SpacesBetweenSpecialTokens::kNo);
  }
}

std::string StopChecker::TakeHeld(size_t n) {
  std::string out = held_.substr(0, n);
  held_.erase(0, n);
  return out;
}

std::string StopChecker::Flush() {
  if (detok_) held_ += detok_->Finish();
  return TakeHeld(held_.size());
}

size_t StopChecker::StopPrefixSuffixLength() const {
  size_t best = 0;
  for (const std::string& s : conditions_.stop_strings) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > best; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
    }
  }
  return best;
}

std::optional<std::pair<size_t, size_t>> StopChecker::FindStopString() const {
  std::optional<std::pair<size_t, size_t>> best;
  for (size_t i = 0; i < conditions_.stop_strings.size(); ++i) {
    const size_t pos = held_.find(conditions_.stop_strings[i]);
    if (pos != std::string::npos && (!best || pos < best->first)) best = {pos, i};
  }
  return best;
}

StopDecision StopChecker::Append(int32_t token, int64_t num_generated, int64_t num_tokens) {
  StopDecision d;
  const bool checks_on = num_generated >= conditions_.min_tokens;
  const bool stop_id = Contains(conditions_.stop_token_ids, token);
  if (checks_on && (stop_id || Contains(conditions_.eos_token_ids, token))) {
    if (detok_ && conditions_.include_stop_str_in_output) held_ += detok_->Push(token);
    d.text = Flush();
    d.reason = FinishReasonKind::kStop;
    if (stop_id) d.stop_reason = std::to_string(token);
    return d;
  }
  if (detok_) held_ += detok_->Push(token);
  if (checks_on) {
    if (auto match = FindStopString()) {
      const std::string& s = conditions_.stop_strings[match->second];
      d.text = TakeHeld(match->first + (conditions_.include_stop_str_in_output ? s.size() : 0));
      held_.clear();
      if (detok_) detok_->Finish();  // drop whatever followed the stop string
      d.reason = FinishReasonKind::kStop;
      d.stop_reason = s;
      return d;
    }
  }
  if (num_generated >= conditions_.max_tokens || num_tokens >= conditions_.max_total_tokens) {
    d.text = Flush();
    d.reason = FinishReasonKind::kLength;
    return d;
  }
  d.text = TakeHeld(held_.size() - StopPrefixSuffixLength());
  return d;
}

}  // namespace oasis

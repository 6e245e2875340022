#include "tokenizer/incremental_detokenizer.h"

#include "tokenizer/utf8.h"

namespace oasis::tokenizer {

void IncrementalDetokenizer::Append(int32_t id) {
  if (!tokenizer_.Decodes(id, skip_)) return;
  const bool added = tokenizer_.IsAdded(id);
  const bool glued = spaces_ == SpacesBetweenSpecialTokens::kNo && added && last_added_;
  if (tokenizer_.joins_with_space() && any_token_ && !glued) pending_.push_back(' ');
  pending_ += tokenizer_.DecodedBytes(id);
  any_token_ = true;
  last_added_ = added;
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  Append(id);
  return TakeStable();
}

std::string IncrementalDetokenizer::Push(std::span<const int32_t> ids) {
  for (int32_t id : ids) Append(id);
  return TakeStable();
}

std::string IncrementalDetokenizer::Finish() {
  std::string text;
  AppendUtf8Lossy(pending_, &text);
  pending_.clear();
  any_token_ = false;
  last_added_ = false;
  return text;
}

std::string IncrementalDetokenizer::TakeStable() {
  const size_t stable = StableUtf8PrefixLength(pending_);
  std::string text;
  AppendUtf8Lossy(std::string_view(pending_).substr(0, stable), &text);
  pending_.erase(0, stable);
  return text;
}

}  // namespace oasis::tokenizer

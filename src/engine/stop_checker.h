// StopChecker: per-request stop conditions and streamed text. Fed each generated token, it
// detokenizes incrementally (tokenizer::IncrementalDetokenizer), decides whether the request
// finishes and why, and returns the text that may be shown now.
//
// Rules, checked in this order for every token:
//   - before `min_tokens` tokens have been generated, EOS, stop ids and stop strings are ignored
//     (the token is kept as ordinary output);
//   - EOS (unless the caller left eos_token_ids empty for ignore_eos) or a stop token id →
//     kStop; the token's text is dropped unless include_stop_str_in_output; stop_reason is the
//     token id as text for stop ids, empty for EOS;
//   - a stop string, matched in the text across token boundaries → kStop; the text is cut
//     before it (or after it with include_stop_str_in_output) and stop_reason is the string;
//     the earliest match in the text wins;
//   - max_tokens generated, or prompt + generated reaching max_total_tokens (the context) →
//     kLength.
// Text that could be the beginning of a stop string (the longest suffix of the unsent text
// that is a proper prefix of one) is held back until it is ruled out; a finished request's
// held text is flushed (Flush() does it for aborts and errors). Without a tokenizer no text
// is produced and stop strings must be empty.
//
// Holds a reference to the tokenizer (which must outlive it). One per request; not
// thread-safe (the engine loop owns it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace oasis {

// Why a request finished. kAbort: Abort() or client disconnect; kError: the engine failed it.
// kHandoff: a prefill instance handed the request to a decode instance (disaggregation).
enum class FinishReasonKind { kNone, kStop, kLength, kAbort, kError, kHandoff };

struct StopConditions {
  std::vector<int32_t> eos_token_ids;  // the model's EOS ids; empty with ignore_eos
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;  // non-empty strings
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // special tokens' text is left out of the output text
  // false: no space between consecutive added tokens (tokenizer::SpacesBetweenSpecialTokens)
  bool spaces_between_special_tokens = true;
  int64_t min_tokens = 0;
  int64_t max_tokens = 1;        // generated tokens at most (>= 1)
  int64_t max_total_tokens = 1;  // prompt + generated at most (the usable context)
};

struct StopDecision {
  std::string text;  // new text to emit now (valid UTF-8)
  FinishReasonKind reason = FinishReasonKind::kNone;
  std::string stop_reason;  // matched stop string, or the stop token id as text
  bool finished() const { return reason != FinishReasonKind::kNone; }
};

class StopChecker {
 public:
  // `tok` null: no text (then stop_strings must be empty).
  StopChecker(StopConditions conditions, const tokenizer::Tokenizer* tok);

  // `token` was just generated; `num_generated` counts it, `num_tokens` = prompt + generated.
  StopDecision Append(int32_t token, int64_t num_generated, int64_t num_tokens);
  // The text still held back (and pending in the detokenizer), for a request that ends for
  // another reason (abort, error). Afterwards nothing is held.
  std::string Flush();

  const StopConditions& conditions() const { return conditions_; }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of a stop string.
  size_t StopPrefixSuffixLength() const;
  // Earliest stop-string match in held_: (position, index into stop_strings).
  std::optional<std::pair<size_t, size_t>> FindStopString() const;
  std::string TakeHeld(size_t n);

  StopConditions conditions_;
  std::optional<tokenizer::IncrementalDetokenizer> detok_;
  std::string held_;  // detokenized text not yet emitted
};

}  // namespace oasis

// IncrementalDetokenizer: turns a stream of generated ids into text for streaming responses.
// Each Push returns only complete UTF-8 text — never a partial character, even when a character's
// bytes are spread over several byte-level tokens (common for CJK and emoji). The concatenation
// of every Push and the final Finish equals Tokenizer::Decode of all the ids (with
// SpacesBetweenSpecialTokens::kYes; kNo drops the space a joining decoder writes between two
// consecutive added tokens, as vLLM's incremental detokenizer does).
//
// Holds a reference to the Tokenizer (which must outlive it) and owns at most 3 pending bytes.
// One per stream; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace oasis::tokenizer {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, SkipSpecialTokens skip,
                         SpacesBetweenSpecialTokens spaces = SpacesBetweenSpecialTokens::kYes)
      : tokenizer_(tokenizer),
        skip_(skip),
        spaces_(skip == SkipSpecialTokens::kYes ? SpacesBetweenSpecialTokens::kYes : spaces) {}

  // The text that `id` completes (possibly empty).
  std::string Push(int32_t id);
  std::string Push(std::span<const int32_t> ids);
  // Flushes what is still pending (an unfinished character becomes U+FFFD, as Decode does) and
  // starts a new stream.
  std::string Finish();

  // Bytes held back because they may start a character the next token completes.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string TakeStable();
  // Appends id's bytes (and the joining space, if any) to pending_.
  void Append(int32_t id);

  const Tokenizer& tokenizer_;
  SkipSpecialTokens skip_;
  SpacesBetweenSpecialTokens spaces_;
  std::string pending_;
  bool any_token_ = false;   // a token has been decoded (for decoders that join with spaces)
  bool last_added_ = false;  // the last decoded token was an added token
};

}  // namespace oasis::tokenizer

// AddedVocabulary: tokenizer.json's "added_tokens" — tokens matched in the raw text before any
// splitting (HF tokenizers' AddedVocabulary). Matching is leftmost-longest over all contents
// (as HF's Aho-Corasick with MatchKind::LeftmostLongest), then the flags apply: single_word
// (no \w character may touch the match), lstrip/rstrip (swallow whitespace to the left/right),
// normalized (matched in normalized text instead of raw text), special (skipped by
// skip_special_tokens).
//
// Owns the tokens and two byte tries. Immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/function_ref.h"
#include "tokenizer/json_util.h"

namespace oasis::tokenizer {

class Normalizer;

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Which trie a split uses: tokens with normalized=false match raw text, the others match the
// normalized text.
enum class AddedTokenSet { kRaw, kNormalized };

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // Parses the "added_tokens" array (null or absent: none). `normalizer` (may be null) turns the
  // contents of normalized tokens into the form they are matched in.
  static StatusOr<AddedVocabulary> FromJson(const Json* json, const Normalizer* normalizer);

  // Cuts `text` into pieces: sink(piece, id) with id >= 0 for a matched token and -1 for text
  // between matches (never empty).
  void Split(std::string_view text, AddedTokenSet set,
             FunctionRef<void(std::string_view, int32_t)> sink) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* FindByContent(std::string_view content) const;
  const AddedToken* FindById(int32_t id) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    std::array<bool, 256> first_byte{};
    void Insert(std::string_view key, int32_t token);
    // Length and token of the longest key that prefixes `text`, or token -1.
    std::pair<size_t, int32_t> LongestPrefix(std::string_view text) const;
  };

  std::vector<AddedToken> tokens_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace oasis::tokenizer

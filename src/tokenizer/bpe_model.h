// BpeModel: the "BPE" model of an HF tokenizer.json — vocabulary, merge rules and the word ->
// ids algorithm of tokenizers' models/bpe (ignore_merges, byte_fallback, unk_token/fuse_unk).
//
// Two symbol modes:
//  - byte-level (the pre-tokenizer ends with ByteLevel, Qwen2/3 and Llama-3): words arrive as raw
//    bytes and each byte is a start symbol. The vocabulary is kept in raw-byte form ("Ġthe" is
//    stored as " the"), so the byte -> character mapping never runs at encode time.
//  - character: each UTF-8 character of the word is a start symbol (SentencePiece-style BPE).
//
// Owns the vocabulary, the merge table and two bounded word caches (a lock-free one for short
// words, a sharded mutex one for longer words). Immutable after loading except the internally
// synchronised caches: Tokenize is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/json_util.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/short_word_cache.h"
#include "tokenizer/word_cache.h"

namespace oasis::tokenizer {

enum class SymbolMode { kByteLevel, kCharacter };

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object.
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& model, SymbolMode mode);

  // Appends the ids of one pre-tokenized word (raw bytes in byte-level mode).
  void Tokenize(std::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The vocabulary string of `id` as written in tokenizer.json; nullptr when `id` has none.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id of the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t merge_count() const { return merges_.size(); }
  SymbolMode mode() const { return mode_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  BpeModel() : cache_(1 << 14) {}
  Status LoadVocab(const Json& vocab);
  Status LoadMerges(const Json& merges);
  std::optional<int32_t> SymbolId(std::string_view symbol) const;
  // HF's merge_word up to the merge loop: the start symbols of `word`.
  void StartSymbols(std::string_view word, std::vector<int32_t>* symbols) const;

  SymbolMode mode_ = SymbolMode::kByteLevel;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;

  VocabMap token_to_id_;   // strings as in tokenizer.json
  VocabMap symbol_to_id_;  // byte-level mode: raw-byte form of token_to_id_
  std::vector<std::string> id_to_token_;
  std::vector<char> has_token_;                // id_to_token_[id] is a real entry
  std::array<int32_t, 256> byte_to_id_;        // byte-level mode: start symbol of each byte, or -1
  std::array<int32_t, 256> byte_fallback_id_;  // "<0xAB>" tokens, or -1
  MergeTable merges_;
  mutable ShortWordCache short_cache_;  // words up to ShortWordCache::kMaxWordBytes
  mutable WordCache cache_;             // longer words
};

}  // namespace oasis::tokenizer

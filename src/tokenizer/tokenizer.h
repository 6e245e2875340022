// Tokenizer: text <-> token ids for HF tokenizer.json files with a byte-level BPE model
// (Qwen2/Qwen3, Llama-3, GPT-2 style), matching HF `tokenizers` id for id.
//
// Encode: invalid UTF-8 bytes -> U+FFFD (see docs/tokenizer.md) -> added tokens with
// normalized=false are cut out of the raw text -> the rest is normalized -> added tokens with
// normalized=true are cut out -> pre-tokenizer words -> BPE -> post-processor (only with
// AddSpecialTokens::kYes). Decode: per-id bytes (ByteLevel decoder), unknown ids dropped, special
// tokens optionally skipped, invalid UTF-8 -> U+FFFD (as HF's from_utf8_lossy).
//
// Owns all its components. Immutable after loading, except the BPE word cache which is
// internally synchronised: Encode and Decode may be called concurrently from any threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"

namespace oasis::tokenizer {

class AddedVocabulary;
class BpeModel;
class Normalizer;
class PostProcessor;
class PreTokenizer;

enum class AddSpecialTokens { kNo, kYes };   // apply the post-processor (e.g. Llama-3's BOS)
enum class SkipSpecialTokens { kNo, kYes };  // drop added tokens marked special when decoding
// vLLM's spaces_between_special_tokens, for decoders that join tokens with a space
// (joins_with_space()): kNo writes an added token that follows another added token without
// the joining space (vLLM's FastIncrementalDetokenizer; byte-level decoders never add spaces,
// so for them both values decode alike). Ignored with SkipSpecialTokens::kYes, as in vLLM.
enum class SpacesBetweenSpecialTokens { kNo, kYes };

class Tokenizer {
 public:
  // Reads and parses a tokenizer.json. NotFound when the file is missing; InvalidArgument when
  // it is malformed; Unimplemented (naming the component) when it uses an unsupported component.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::filesystem::path& path);
  // Parses tokenizer.json contents; `source` names them in error messages.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json, std::string source);
  ~Tokenizer();

  std::vector<int32_t> Encode(std::string_view text, AddSpecialTokens add) const;
  std::string Decode(std::span<const int32_t> ids, SkipSpecialTokens skip) const;

  // One past the largest id of the vocabulary and the added tokens (Qwen3: 151,669;
  // Llama-3: 128,256) — HF's get_vocab_size(with_added_tokens=True) for files without holes.
  int64_t vocab_size() const { return static_cast<int64_t>(decoded_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // An added token marked "special" (e.g. <|im_end|>; not Qwen3's <think>).
  bool IsSpecial(int32_t id) const;
  // An added token (special or not: <|im_end|>, Qwen3's <think>).
  bool IsAdded(int32_t id) const;
  // An id of the vocabulary or the added tokens.
  bool IsKnown(int32_t id) const { return id >= 0 && id < vocab_size() && known_[id]; }

  // The raw bytes `id` decodes to (possibly an incomplete UTF-8 sequence); empty when unknown.
  std::string_view DecodedBytes(int32_t id) const;
  // True when the decoder joins tokens with a space (no decoder in tokenizer.json).
  bool joins_with_space() const { return joins_with_space_; }
  // Whether DecodedBytes(id) is included in a decode with `skip`.
  bool Decodes(int32_t id, SkipSpecialTokens skip) const {
    return IsKnown(id) && !(skip == SkipSpecialTokens::kYes && special_[id]);
  }

  const std::string& source() const { return source_; }

 private:
  Tokenizer();
  Status Load(std::string_view json);
  void EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const;

  std::string source_;
  std::unique_ptr<Normalizer> normalizer_;  // null: none
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocabulary> added_;
  std::unique_ptr<PostProcessor> post_processor_;
  bool has_normalized_added_tokens_ = false;
  bool joins_with_space_ = false;
  std::vector<std::string> decoded_;  // per id: the bytes it decodes to
  std::vector<char> known_;           // per id
  std::vector<char> special_;         // per id
  std::vector<char> added_ids_;       // per id: an added token
};

}  // namespace oasis::tokenizer

// PreTokenizer: tokenizer.json's "pre_tokenizer" — splits normalized text into the words the BPE
// model sees. Supported: Split (Regex or String pattern; behaviours Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern) and Sequence; null means the whole text is one word. ByteLevel
// must come last: its byte -> character mapping is folded into the BPE vocabulary (bpe_model.h),
// so words are handed on as raw bytes. Anything else is an Unimplemented error naming the type.
//
// Owns its compiled regexes. Immutable after parsing; Split is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/function_ref.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"

namespace oasis::tokenizer {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // An empty pipeline (not nullptr) when `json` is null.
  static StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const Json& json);
  ~PreTokenizer();

  // True when the pipeline ends with ByteLevel (the BPE model then works on bytes).
  bool byte_level() const { return byte_level_; }

  // Calls `sink` with every non-empty word of `text` (well-formed UTF-8), in order.
  void Split(std::string_view text, FunctionRef<void(std::string_view)> sink) const;

 private:
  struct Stage {
    enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
    std::unique_ptr<Regex> regex;  // kSplit with a Regex pattern, or kByteLevel with use_regex
    std::string literal;           // kSplit with a String pattern
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
  };

  Status ParseInto(const Json& json, const std::string& path);
  void RunStage(size_t index, std::string_view text,
                FunctionRef<void(std::string_view)> sink) const;

  std::vector<Stage> stages_;
  bool byte_level_ = false;
};

}  // namespace oasis::tokenizer

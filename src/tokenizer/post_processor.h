// PostProcessor: tokenizer.json's "post_processor", applied when the caller asks for special
// tokens. Supported: TemplateProcessing (its "single" template, e.g. Llama-3's BOS before $A),
// ByteLevel (only trims offsets, which this tokenizer does not produce: no effect on ids) and
// Sequence of those; null means none. Anything else is an Unimplemented error naming the type.
// A value type; immutable after parsing; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/json_util.h"

namespace oasis::tokenizer {

class PostProcessor {
 public:
  static StatusOr<PostProcessor> FromJson(const Json& json);

  // Ids to put before and after the encoded sequence.
  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  Status ParseInto(const Json& json, const std::string& path);
  Status ParseTemplate(const Json& json, const std::string& path);

  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

}  // namespace oasis::tokenizer

// Normalizer: tokenizer.json's "normalizer" component. Supported: NFC, NFD, NFKC, NFKD (utf8proc)
// and Sequence of those; null means none. Anything else is an Unimplemented error naming the type.
// Immutable after parsing; Normalize is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"
#include "tokenizer/json_util.h"

namespace oasis::tokenizer {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

class Normalizer {
 public:
  // nullptr (and OK) when `json` is null.
  static StatusOr<std::unique_ptr<Normalizer>> FromJson(const Json& json);

  // Writes the normalized form of `text` (well-formed UTF-8) to `out` (replacing its contents).
  void Normalize(std::string_view text, std::string* out) const;

  // The stages in order (for tests).
  const std::vector<UnicodeForm>& forms() const { return forms_; }

 private:
  std::vector<UnicodeForm> forms_;
};

// `text` in the given Unicode normalization form (well-formed UTF-8 in and out).
void NormalizeUnicode(std::string_view text, UnicodeForm form, std::string* out);

}  // namespace oasis::tokenizer

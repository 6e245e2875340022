// Regex: one compiled PCRE2 pattern (UTF + UCP, JIT when available) that behaves like the
// Oniguruma patterns of HF tokenizers' Split pre-tokenizers. The pattern is first rewritten where
// the dialects differ: `\s`/`\S` become Oniguruma's whitespace set (PCRE2's also holds U+180E),
// `\h`/`\H` (hex digit in Oniguruma) become [0-9a-fA-F]; `^`/`$` are line anchors (MULTILINE),
// newline is LF only.
//
// Owns the compiled code. Immutable after Compile: FindAll is thread-safe (its match data and JIT
// stack are per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "oasis/status.h"

namespace oasis::tokenizer {

struct ByteRange {
  uint32_t begin;
  uint32_t end;
};

class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping match of `subject` (well-formed UTF-8, < 4 GiB), left to
  // right, with the Oniguruma crate's rule for empty matches (none right where the previous
  // match ended). A matching error (a PCRE2 resource limit on pathological input) ends the
  // search early: the rest of the subject is then left unmatched.
  void FindAll(std::string_view subject, std::vector<ByteRange>* matches) const;

  // The pattern after the dialect rewrite (for tests and error messages).
  const std::string& translated() const { return translated_; }

  // Exposed for tests: the Oniguruma -> PCRE2 rewrite.
  static std::string TranslateOnigurumaPattern(std::string_view pattern);

 private:
  explicit Regex(void* code, std::string translated)
      : code_(code), translated_(std::move(translated)) {}
  void* code_;  // pcre2_code_8*
  std::string translated_;
};

}  // namespace oasis::tokenizer

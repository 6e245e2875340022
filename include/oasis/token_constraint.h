// A constraint on the tokens a request may generate (structured output: a JSON schema, any
// JSON object, a choice of strings). The server builds one per request (tokenizer/structured);
// the logits processing (runner/logits_processing.h) masks, for every logits row, the tokens
// that may not follow the row's generated tokens. Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace oasis {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Appends to `masked`, ascending and without repeats, the ids in [0, vocab) that may not
  // follow the request's committed `output` then the `draft` tokens stacked before the row.
  // When the tokens themselves break the constraint (a draft token it refuses: the row's
  // result is discarded anyway) nothing is masked. Called from several threads at once for a
  // batch's rows (RowEntriesOf), the same constraint included (a request's speculative rows):
  // implementations are thread-safe.
  virtual void Masked(std::span<const int32_t> output, std::span<const int32_t> draft,
                      std::vector<int32_t>* masked) const = 0;
};

}  // namespace oasis

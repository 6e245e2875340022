// BatchBuilder: turns "sequence s runs tokens [start, start+n) this step" into the
// ForwardInput tensors (token ids, positions, slot mapping, head-level attention metadata).
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kvcache/head_block_table.h"
#include "models/decoder_lm.h"

namespace oasis {

enum class LogitsFor { kLastTokenOfEachSequence, kEveryToken };

struct StepSequence {
  const HeadBlockTable* table = nullptr;  // must already hold start + tokens.size() tokens
  int64_t start = 0;                      // position of the first new token
  std::vector<int32_t> tokens;            // this step's tokens
};

// Host tensors for one step (ModelRunner::Execute uploads them).
ForwardInput BuildHostForwardInput(const std::vector<StepSequence>& seqs, LogitsFor logits);

// The same input on `backend`'s device (every tensor uploaded, the bounds copied).
ForwardInput UploadForwardInput(Backend& backend, const ForwardInput& host);

}  // namespace oasis

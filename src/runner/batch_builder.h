// BatchBuilder: turns "sequence s runs tokens [start, start+n) this step" into the
// ForwardInput tensors (token ids, positions, slot mapping, head-level attention metadata).
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kvcache/head_block_table.h"
#include "kvcache/sparse_step_plan.h"
#include "models/decoder_lm.h"

namespace oasis {

enum class LogitsFor { kLastTokenOfEachSequence, kEveryToken };

struct StepSequence {
  const HeadBlockTable* table = nullptr;  // must already hold start + tokens.size() tokens
  int64_t start = 0;                      // position of the first new token
  std::vector<int32_t> tokens;            // this step's tokens
  // A sparse sequence (docs/sparse.md; SparseKvManager::BuildStepPlan): its K/V go to
  // sparse->slot_mapping and the table is made at least sparse->table_width wide for the
  // per-layer rows the sparse pipeline writes on the device. With `table` (dense_layers > 0)
  // the host rows are the dense table's (the dense layers read them); without, they list
  // the tail blocks only.
  const SparseStepSlots* sparse = nullptr;
};

// Host tensors for one step (ModelRunner::Execute uploads them).
ForwardInput BuildHostForwardInput(const std::vector<StepSequence>& seqs, LogitsFor logits);

// The same input on `backend`'s device (every tensor uploaded, the bounds copied).
// `async`: Backend::UploadAsync (ordered on the backend's current stream only).
ForwardInput UploadForwardInput(Backend& backend, const ForwardInput& host, bool async = false);

}  // namespace oasis

// Logits processing on the GPU (runner/logits_processing.h has the rule): per request, token
// counts of the generated tokens and masks of the prompt and allowed tokens live in device
// memory and are updated in place each step from the step's new tokens, so that a step needs
// no host copy of a request's history; per row, a short list of per-step edits (bias, bad
// words, min_tokens) comes with the step's parameters. Element by element the same float
// operations as the CPU (oasis/logits_penalty.h), so the processed logits are bit-identical.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace oasis::kernels {

inline constexpr int kLogitsMaxDraft = 4;  // draft tokens before a speculative row, at most

// One processed row.
struct LogitsRowDevice {
  int32_t logits_row;      // row of the raw logits
  int32_t out_row;         // row of the processed logits written
  const int32_t* counts;   // [vocab] occurrences in the generated tokens, or null (no penalties)
  const uint8_t* prompt;   // [vocab] 1: in the prompt, or null (no repetition penalty)
  const uint8_t* allowed;  // [vocab] 1: allowed, or null (every token)
  float presence, frequency, repetition;
  int32_t num_draft;  // draft tokens stacked before this row: counted as generated
  int32_t draft[kLogitsMaxDraft];
  int32_t entries_begin, entries_end;  // this row's edits in `entries`, sorted by token
};

// A per-step edit of one token (LogitsEntry).
struct LogitsEntryDevice {
  int32_t token;
  float bias;
  int32_t masked;
};

// A per-request state update: op 0 adds 1 to ((int32_t*)base)[token] (a generated token's
// count), op 1 sets ((uint8_t*)base)[token] = 1 (a prompt or allowed token's mask).
struct TokenUpdateDevice {
  void* base;
  int32_t token;
  int32_t op;
};

// Applies `n` updates (several may hit one token: the counts are atomic).
cudaError_t LaunchTokenUpdates(const TokenUpdateDevice* updates, int64_t n, cudaStream_t stream);

// processed[rows[r].out_row] = the processed logits[rows[r].logits_row], r < num_rows.
// logits: [*, vocab] f32 (row stride `stride`); processed: [*, vocab] (row stride
// `processed_stride`); rows, entries: device arrays.
cudaError_t LaunchProcessLogits(const float* logits, int64_t vocab, int64_t stride,
                                const LogitsRowDevice* rows, int64_t num_rows,
                                const LogitsEntryDevice* entries, float* processed,
                                int64_t processed_stride, cudaStream_t stream);

}  // namespace oasis::kernels

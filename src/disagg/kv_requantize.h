// FP8 KV across instances (docs/disaggregation.md, "FP8 KV cache"): staged e4m3 bytes mean
// x · scale of the prefill instance's (layer, KV head); the decode instance reads its host
// store with its own scales. KvRequantizer maps bytes of one set of scales to the other: the
// identity (nothing touched, the import is bit-exact) when every scale is bitwise equal — as
// when both instances calibrate the same model the same way — else, per (staged layer, KV
// head, K/V), a 256-entry table byte → FloatToFp8E4M3(Fp8E4M3ToFloat(byte) · from / to), the
// rounding the decode instance's own append would make of that value (one extra e4m3
// rounding; saturating at ±448). The table is monotone, so a block summary (the min/max of a
// block's stored keys) maps to the summary of the mapped block: summaries use the K table.
//
// Value type; thread-compatible (Apply is const: any number of threads at once).
#pragma once

#include <cstdint>
#include <vector>

#include "disagg/staged_kv.h"
#include "disagg/staged_layout.h"
#include "oasis/status.h"

namespace oasis::disagg {

// Scales of two instances that differ by more than this factor for any (layer, KV head) are
// not reconciled: they come from different models or checkpoints (both calibrate at start-up
// with a 2x margin, docs/fp8.md), and mapping would clip (ratio > 2) or flush values.
inline constexpr float kMaxImportScaleRatio = 2.0f;

class KvRequantizer {
 public:
  // The identity (no FP8, or nothing to map).
  KvRequantizer() = default;
  // From the ticket's scales to this instance's, [layers × heads] each (l-major). Identity
  // when all are bitwise equal; InvalidArgument naming the first (layer, KV head) whose
  // scales differ by more than kMaxImportScaleRatio, or sizes that differ.
  static StatusOr<KvRequantizer> Create(uint32_t num_kv_heads, const std::vector<float>& from_k,
                                        const std::vector<float>& from_v,
                                        const std::vector<float>& to_k,
                                        const std::vector<float>& to_v);

  bool identity() const { return tables_.empty(); }
  // The largest from / to (or to / from) ratio over every scale: 1 for the identity.
  double max_ratio() const { return max_ratio_; }
  // Maps n bytes of staged layer `layer`, head `head`, K (kv 0) or V (kv 1) in place.
  void Apply(uint32_t layer, uint32_t head, uint32_t kv, uint8_t* bytes, size_t n) const;
  // Maps the bytes of every item that landed from a lease of `layout` by its ordinal: KV
  // slots by their (layer, head, K/V), summary slots by their (layer, head) with the K table;
  // draft KV slots (activation dtype) are left as they are. A no-op for the identity.
  void ApplyLanded(const StagedKvLayout& layout, const std::vector<StagedSlotRef>& items) const;

 private:
  uint32_t num_kv_heads_ = 0;
  std::vector<uint8_t> tables_;  // [(layer · heads + head) · 2 + kv][256]
  double max_ratio_ = 1.0;
};

}  // namespace oasis::disagg

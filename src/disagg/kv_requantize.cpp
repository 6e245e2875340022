#include "disagg/kv_requantize.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "oasis/dtype.h"

namespace oasis::disagg {

StatusOr<KvRequantizer> KvRequantizer::Create(uint32_t num_kv_heads,
                                              const std::vector<float>& from_k,
                                              const std::vector<float>& from_v,
                                              const std::vector<float>& to_k,
                                              const std::vector<float>& to_v) {
  if (num_kv_heads == 0 || from_k.size() != to_k.size() || from_v.size() != to_v.size() ||
      from_k.size() != from_v.size() || from_k.size() % num_kv_heads != 0) {
    return InvalidArgument("FP8 KV scales: " + std::to_string(from_k.size()) + " and " +
                           std::to_string(from_v.size()) + " scales of the prefill instance, " +
                           std::to_string(to_k.size()) + " and " + std::to_string(to_v.size()) +
                           " of this instance (" + std::to_string(num_kv_heads) + " KV heads)");
  }
  KvRequantizer q;
  q.num_kv_heads_ = num_kv_heads;
  const size_t n = from_k.size();
  if (std::memcmp(from_k.data(), to_k.data(), n * sizeof(float)) == 0 &&
      std::memcmp(from_v.data(), to_v.data(), n * sizeof(float)) == 0) {
    return q;  // bit-exact: the bytes stay as they are
  }
  for (size_t i = 0; i < n; ++i) {
    for (int kv = 0; kv < 2; ++kv) {
      const float from = (kv == 0 ? from_k : from_v)[i], to = (kv == 0 ? to_k : to_v)[i];
      const double ratio = to > 0 && from > 0 ? std::max(from / double{to}, to / double{from}) : 0;
      if (!(ratio > 0) || ratio > kMaxImportScaleRatio) {
        return InvalidArgument(
            "FP8 KV scales of the prefill instance cannot be reconciled with this instance's: " +
            std::string(kv == 0 ? "K" : "V") + " scale of (layer " +
            std::to_string(i / num_kv_heads) + ", KV head " + std::to_string(i % num_kv_heads) +
            ") " + std::to_string(from) + " there, " + std::to_string(to) + " here (more than " +
            std::to_string(static_cast<int>(kMaxImportScaleRatio)) +
            "x apart: another model or checkpoint?)");
      }
      q.max_ratio_ = std::max(q.max_ratio_, ratio);
    }
  }
  q.tables_.resize(n * 2 * 256);
  for (size_t i = 0; i < n; ++i) {
    for (int kv = 0; kv < 2; ++kv) {
      const float from = (kv == 0 ? from_k : from_v)[i], to = (kv == 0 ? to_k : to_v)[i];
      uint8_t* table = q.tables_.data() + (i * 2 + static_cast<size_t>(kv)) * 256;
      for (int b = 0; b < 256; ++b) {
        // The value the byte stands for, stored as the decode side's append would store it.
        const float value = Fp8E4M3ToFloat(static_cast<uint8_t>(b)) * from;
        table[b] = FloatToFp8E4M3(value / to);
      }
    }
  }
  return q;
}

void KvRequantizer::Apply(uint32_t layer, uint32_t head, uint32_t kv, uint8_t* bytes,
                          size_t n) const {
  if (identity()) return;
  const size_t index = (size_t{layer} * num_kv_heads_ + head) * 2 + kv;
  OASIS_CHECK_LT(index * 256, tables_.size())
      << "requantize (" << layer << ", " << head << ", " << kv << ")";
  const uint8_t* table = tables_.data() + index * 256;
  for (size_t i = 0; i < n; ++i) bytes[i] = table[bytes[i]];
}

void KvRequantizer::ApplyLanded(const StagedKvLayout& layout,
                                const std::vector<StagedSlotRef>& items) const {
  if (identity()) return;
  const StagedKvGeometry& g = layout.geometry();
  OASIS_CHECK_EQ(g.num_kv_heads, num_kv_heads_) << "requantize: KV heads";
  const uint64_t nb = g.num_blocks, kv_slots = layout.num_kv_slots(),
                 summary_end = kv_slots + layout.num_summary_slots();
  const uint64_t per_head = (nb + layout.summaries_per_slot() - 1) / layout.summaries_per_slot();
  for (const StagedSlotRef& item : items) {
    auto* bytes = static_cast<uint8_t*>(item.dst);
    if (item.ordinal < kv_slots) {  // ((l · Hkv + h) · 2 + kv) · nb + b
      const uint64_t lhkv = item.ordinal / nb;
      const uint64_t lh = lhkv / 2;
      Apply(static_cast<uint32_t>(lh / g.num_kv_heads), static_cast<uint32_t>(lh % g.num_kv_heads),
            static_cast<uint32_t>(lhkv % 2), bytes, layout.slot_bytes());
    } else if (item.ordinal < summary_end) {  // (l · Hkv + h) · per_head + j: K min/max
      const uint64_t lh = (item.ordinal - kv_slots) / per_head;
      Apply(static_cast<uint32_t>(lh / g.num_kv_heads), static_cast<uint32_t>(lh % g.num_kv_heads),
            0, bytes, layout.slot_bytes());
    }
  }
}

}  // namespace oasis::disagg

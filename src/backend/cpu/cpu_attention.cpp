// CpuBackend: KV append and attention over head-level block tables.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"

namespace oasis {

void CpuBackend::KvAppend(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                          LayerKvPool& pool) {
  OASIS_CHECK(slot_mapping.dtype() == DType::kI64) << "slot_mapping must be int64";
  const int64_t tokens = k.dim(0), heads = k.dim(1), head_dim = k.dim(2);
  const int64_t capacity = pool.k.dim(0) * kBlockSize;
  OASIS_CHECK_EQ(pool.k.dim(2), head_dim) << "KV pool head_dim";
  OASIS_CHECK_EQ(slot_mapping.numel(), tokens * heads) << "slot_mapping shape";
  const size_t bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      int64_t dst = slot_mapping.data<int64_t>()[t * heads + h];
      if (dst < 0) continue;
      OASIS_CHECK_LT(dst, capacity) << "slot mapping outside the KV pool";
      std::memcpy(pool.k.data<float>() + dst * head_dim,
                  k.data<float>() + (t * heads + h) * head_dim, bytes);
      std::memcpy(pool.v.data<float>() + dst * head_dim,
                  v.data<float>() + (t * heads + h) * head_dim, bytes);
    }
  }
}

void CpuBackend::Attention(const Tensor& q, const LayerKvPool& pool, const AttentionMetadata& meta,
                           float scale, Tensor& out) {
  const int64_t num_q_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t num_seqs = meta.query_start.numel() - 1;
  const int64_t num_kv_heads = meta.kv_lens.dim(1);
  const int64_t max_blocks = meta.block_tables.dim(2);
  const int64_t num_slots = pool.k.dim(0);
  OASIS_CHECK_EQ(num_q_heads % num_kv_heads, 0) << "GQA group size";
  OASIS_CHECK_EQ(pool.k.dim(2), head_dim) << "KV pool head_dim";
  const int64_t group = num_q_heads / num_kv_heads;
  const int32_t* qs = meta.query_start.data<int32_t>();
  const int32_t* lens = meta.kv_lens.data<int32_t>();
  const int32_t* tables = meta.block_tables.data<int32_t>();
  const float* kp = pool.k.data<float>();
  const float* vp = pool.v.data<float>();
  std::vector<float> scores;
  std::vector<double> acc(static_cast<size_t>(head_dim));

  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_begin = qs[s], q_len = qs[s + 1] - qs[s];
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t kv_len = lens[s * num_kv_heads + h];
      OASIS_CHECK(kv_len >= q_len && kv_len <= max_blocks * kBlockSize)
          << "kv_len " << kv_len << " for seq " << s << " head " << h << " (q_len " << q_len << ")";
      const int32_t* table = tables + (s * num_kv_heads + h) * max_blocks;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t visible = kv_len - q_len + i + 1;  // causal among this step's tokens
        scores.resize(static_cast<size_t>(visible));
        for (int64_t j = h * group; j < (h + 1) * group; ++j) {
          const float* qv = q.data<float>() + ((q_begin + i) * num_q_heads + j) * head_dim;
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t p = 0; p < visible; ++p) {
            const int32_t slot = table[p / kBlockSize];
            OASIS_CHECK(slot >= 0 && slot < num_slots) << "block table slot " << slot;
            const float* kv =
                kp + (static_cast<int64_t>(slot) * kBlockSize + p % kBlockSize) * head_dim;
            float dot = 0;
            for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
            scores[p] = dot * scale;
            max_score = std::max(max_score, scores[p]);
          }
          double denom = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t p = 0; p < visible; ++p) {
            const double w = std::exp(static_cast<double>(scores[p]) - max_score);
            denom += w;
            const int32_t slot = table[p / kBlockSize];
            const float* vv =
                vp + (static_cast<int64_t>(slot) * kBlockSize + p % kBlockSize) * head_dim;
            for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * vv[d];
          }
          float* o = out.data<float>() + ((q_begin + i) * num_q_heads + j) * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<float>(acc[d] / denom);
        }
      }
    }
  }
}

}  // namespace oasis

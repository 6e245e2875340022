// CpuBackend: KV append and attention over head-level block tables.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"

namespace oasis {

namespace {

// An FP8 pool's per-KV-head scales and running maxima (backend.h, LayerKvPool).
void CheckFp8Pool(const LayerKvPool& pool, int64_t heads, const char* what) {
  OASIS_CHECK(pool.v.dtype() == DType::kF8E4M3) << what << ": K is FP8 and V is not";
  for (const Tensor* t : {&pool.k_scale, &pool.v_scale, &pool.k_amax, &pool.v_amax}) {
    OASIS_CHECK(t->defined() && t->dtype() == DType::kF32 && t->numel() >= heads)
        << what << ": an FP8 pool needs F32 k_scale, v_scale, k_amax, v_amax of " << heads
        << " KV heads, got " << (t->defined() ? t->ToString() : std::string("none"));
  }
}

// Stores `n` values of one KV head as e4m3 of value / scale; raises amax.
void QuantizeRow(const float* x, int64_t n, float scale, uint8_t* dst, float& amax) {
  for (int64_t d = 0; d < n; ++d) {
    if (!std::isnan(x[d])) amax = std::max(amax, std::fabs(x[d]));
    dst[d] = FloatToFp8E4M3(x[d] / scale);
  }
}

}  // namespace

void CpuBackend::KvAppend(const Tensor& k, const Tensor& v, const Tensor& slot_mapping,
                          LayerKvPool& pool) {
  OASIS_CHECK(slot_mapping.dtype() == DType::kI64) << "slot_mapping must be int64";
  const int64_t tokens = k.dim(0), heads = k.dim(1), head_dim = k.dim(2);
  const int64_t capacity = pool.k.dim(0) * kBlockSize;
  OASIS_CHECK_EQ(pool.k.dim(2), head_dim) << "KV pool head_dim";
  OASIS_CHECK_EQ(slot_mapping.numel(), tokens * heads) << "slot_mapping shape";
  const bool fp8 = pool.fp8();
  if (fp8) CheckFp8Pool(pool, heads, "KvAppend");
  const size_t bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      int64_t dst = slot_mapping.data<int64_t>()[t * heads + h];
      if (dst < 0) continue;
      OASIS_CHECK_LT(dst, capacity) << "slot mapping outside the KV pool";
      const float* kx = k.data<float>() + (t * heads + h) * head_dim;
      const float* vx = v.data<float>() + (t * heads + h) * head_dim;
      if (fp8) {
        QuantizeRow(kx, head_dim, pool.k_scale.data<float>()[h],
                    pool.k.data<uint8_t>() + dst * head_dim, pool.k_amax.data<float>()[h]);
        QuantizeRow(vx, head_dim, pool.v_scale.data<float>()[h],
                    pool.v.data<uint8_t>() + dst * head_dim, pool.v_amax.data<float>()[h]);
        continue;
      }
      std::memcpy(pool.k.data<float>() + dst * head_dim, kx, bytes);
      std::memcpy(pool.v.data<float>() + dst * head_dim, vx, bytes);
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
  const bool fp8 = pool.fp8();
  if (fp8) CheckFp8Pool(pool, num_kv_heads, "Attention");
  // FP8 pools: a (sequence, KV head)'s visible K and V dequantized once (stored value times the
  // head's scale), row p at p * head_dim.
  std::vector<float> kmat, vmat;
  std::vector<float> scores;
  std::vector<double> acc(static_cast<size_t>(head_dim));

  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_begin = qs[s], q_len = qs[s + 1] - qs[s];
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const int64_t kv_len = lens[s * num_kv_heads + h];
      OASIS_CHECK(kv_len >= q_len && kv_len <= max_blocks * kBlockSize)
          << "kv_len " << kv_len << " for seq " << s << " head " << h << " (q_len " << q_len << ")";
      const int32_t* table = tables + (s * num_kv_heads + h) * max_blocks;
      for (int64_t b = 0; b * kBlockSize < kv_len; ++b) {
        OASIS_CHECK(table[b] >= 0 && table[b] < num_slots) << "block table slot " << table[b];
      }
      // Row p (position p of this head's sequence) of K or V.
      auto pool_row = [&](const Tensor& t, int64_t p) {
        const int64_t at =
            static_cast<int64_t>(table[p / kBlockSize]) * kBlockSize + p % kBlockSize;
        return t.data<float>() + at * head_dim;
      };
      if (fp8) {
        kmat.resize(static_cast<size_t>(kv_len * head_dim));
        vmat.resize(kmat.size());
        const float ks = pool.k_scale.data<float>()[h], vs = pool.v_scale.data<float>()[h];
        for (int64_t p = 0; p < kv_len; ++p) {
          const int64_t at =
              (static_cast<int64_t>(table[p / kBlockSize]) * kBlockSize + p % kBlockSize) *
              head_dim;
          for (int64_t d = 0; d < head_dim; ++d) {
            kmat[p * head_dim + d] = Fp8E4M3ToFloat(pool.k.data<uint8_t>()[at + d]) * ks;
            vmat[p * head_dim + d] = Fp8E4M3ToFloat(pool.v.data<uint8_t>()[at + d]) * vs;
          }
        }
      }
      auto k_row = [&](int64_t p) {
        return fp8 ? static_cast<const float*>(kmat.data() + p * head_dim) : pool_row(pool.k, p);
      };
      auto v_row = [&](int64_t p) {
        return fp8 ? static_cast<const float*>(vmat.data() + p * head_dim) : pool_row(pool.v, p);
      };
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t visible = kv_len - q_len + i + 1;  // causal among this step's tokens
        scores.resize(static_cast<size_t>(visible));
        for (int64_t j = h * group; j < (h + 1) * group; ++j) {
          const float* qv = q.data<float>() + ((q_begin + i) * num_q_heads + j) * head_dim;
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t p = 0; p < visible; ++p) {
            const float* kv = k_row(p);
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
            const float* vv = v_row(p);
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

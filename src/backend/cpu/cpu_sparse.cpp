// CpuBackend: the sparse-KV ops (block summaries, scoring, top-K, select, block/token copies,
// per-layer table assembly), the reference semantics of backend.h in plain loops.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/check.h"

namespace oasis {
namespace {

void CheckInt(const Tensor& t, DType dtype, const char* what) {
  OASIS_CHECK(t.dtype() == dtype && t.device() == Device::kCpu)
      << what << " must be a host " << DTypeName(dtype) << " tensor, got " << t.ToString();
}

void CheckRank(const Tensor& t, int ndim, const char* what) {
  OASIS_CHECK_EQ(t.ndim(), ndim) << what << " " << t.ToString();
}

// The [R, Hkv, X] tensors of the sparse state: checks dtype and the leading dimensions.
void CheckState(const Tensor& t, int64_t rows, int64_t heads, const char* what) {
  CheckInt(t, DType::kI32, what);
  CheckRank(t, 3, what);
  OASIS_CHECK(t.dim(0) == rows && t.dim(1) == heads)
      << what << " " << t.ToString() << ", expected [" << rows << ", " << heads << ", *]";
}

// A pool's head-block slot as a pointer to its first K (or V) element's bytes.
uint8_t* BlockBytes(const Tensor& t, int64_t slot) {
  OASIS_CHECK(slot >= 0 && slot < t.dim(0)) << "slot " << slot << " outside pool " << t.ToString();
  return t.data<uint8_t>() +
         slot * kBlockSize * t.dim(2) * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// A pool's K or V values as numbers: F32 as stored, FP8 as stored e4m3 values (unscaled).
void CheckPoolDtype(const Tensor& t, const char* what) {
  OASIS_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF8E4M3)
      << what << ": a CPU KV pool is F32 or F8E4M3, got " << t.ToString();
}

}  // namespace

Tensor CpuBackend::EmptyHost(std::vector<int64_t> shape, DType dtype) {
  return Tensor::Empty(std::move(shape), dtype);
}

void CpuBackend::BlockSummaries(const LayerKvPool& pool, const Tensor& src_slots,
                                const Tensor& num_tokens, const Tensor& dst_rows, Tensor& kmin,
                                Tensor& kmax) {
  CheckInt(src_slots, DType::kI32, "BlockSummaries src_slots");
  CheckInt(num_tokens, DType::kI32, "BlockSummaries num_tokens");
  CheckInt(dst_rows, DType::kI32, "BlockSummaries dst_rows");
  const int64_t n = src_slots.numel(), d = pool.k.dim(2);
  OASIS_CHECK(num_tokens.numel() == n && dst_rows.numel() == n)
      << "BlockSummaries: entry counts differ";
  const bool fp8_rows = kmin.dtype() == DType::kF8E4M3;
  OASIS_CHECK(kmin.shape() == kmax.shape() && kmin.dim(1) == d && kmin.dtype() == kmax.dtype() &&
              (kmin.dtype() == DType::kF32 || (fp8_rows && pool.fp8())))
      << "BlockSummaries kmin " << kmin.ToString() << " kmax " << kmax.ToString()
      << " (F32, or F8E4M3 for an FP8 pool)";
  CheckPoolDtype(pool.k, "BlockSummaries");
  std::vector<float> lo_row(static_cast<size_t>(d)), hi_row(lo_row.size());
  std::vector<float> kbuf;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t count = num_tokens.data<int32_t>()[i], dst = dst_rows.data<int32_t>()[i];
    if (count <= 0 || dst < 0) continue;
    OASIS_CHECK_LE(count, kBlockSize) << "BlockSummaries num_tokens";
    OASIS_CHECK_LT(dst, kmin.dim(0)) << "BlockSummaries dst row";
    const uint8_t* bytes = BlockBytes(pool.k, src_slots.data<int32_t>()[i]);
    const int64_t values = static_cast<int64_t>(count) * d;
    kbuf.resize(static_cast<size_t>(values));
    ConvertToFloat(bytes, pool.k.dtype(), kbuf.data(), static_cast<size_t>(values));
    const float* k = kbuf.data();
    float* lo = fp8_rows ? lo_row.data() : kmin.data<float>() + dst * d;
    float* hi = fp8_rows ? hi_row.data() : kmax.data<float>() + dst * d;
    std::memcpy(lo, k, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(hi, k, static_cast<size_t>(d) * sizeof(float));
    for (int32_t j = 1; j < count; ++j) {
      for (int64_t x = 0; x < d; ++x) {
        lo[x] = std::min(lo[x], k[j * d + x]);
        hi[x] = std::max(hi[x], k[j * d + x]);
      }
    }
    if (fp8_rows) {  // e4m3 values: exact
      ConvertFromFloat(lo, kmin.data<uint8_t>() + dst * d, DType::kF8E4M3, static_cast<size_t>(d));
      ConvertFromFloat(hi, kmax.data<uint8_t>() + dst * d, DType::kF8E4M3, static_cast<size_t>(d));
    }
  }
}

void CpuBackend::ScoreBlocks(const Tensor& q, const Tensor& query_rows, const Tensor& num_blocks,
                             const Tensor& host_tables, const Tensor& kmin, const Tensor& kmax,
                             GroupReduce reduce, Tensor& scores) {
  OASIS_CHECK(q.dtype() == DType::kF32 && q.ndim() == 3) << "ScoreBlocks q " << q.ToString();
  CheckInt(query_rows, DType::kI32, "ScoreBlocks query_rows");
  CheckInt(num_blocks, DType::kI32, "ScoreBlocks num_blocks");
  const int64_t R = query_rows.numel(), hq = q.dim(1), d = q.dim(2);
  OASIS_CHECK_EQ(num_blocks.numel(), R) << "ScoreBlocks num_blocks";
  OASIS_CHECK(host_tables.ndim() == 3 && host_tables.dim(0) == R)
      << "ScoreBlocks host_tables " << host_tables.ToString();
  const int64_t hkv = host_tables.dim(1), mb = host_tables.dim(2);
  CheckState(host_tables, R, hkv, "ScoreBlocks host_tables");
  OASIS_CHECK(scores.dtype() == DType::kF32 && scores.shape() == host_tables.shape())
      << "ScoreBlocks scores " << scores.ToString();
  OASIS_CHECK(hq % hkv == 0) << "ScoreBlocks: " << hq << " query heads, " << hkv << " KV heads";
  OASIS_CHECK(kmin.dim(1) == d && kmax.shape() == kmin.shape() && kmin.dtype() == kmax.dtype() &&
              (kmin.dtype() == DType::kF32 || kmin.dtype() == DType::kF8E4M3))
      << "ScoreBlocks summaries " << kmin.ToString();
  const bool fp8_rows = kmin.dtype() == DType::kF8E4M3;
  std::vector<float> lo_row(static_cast<size_t>(d)), hi_row(lo_row.size());
  const int64_t group = hq / hkv;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t row = query_rows.data<int32_t>()[r];
    if (row < 0) continue;
    OASIS_CHECK_LT(row, q.dim(0)) << "ScoreBlocks query row";
    const int32_t nb = num_blocks.data<int32_t>()[r];
    OASIS_CHECK(nb >= 0 && nb <= mb)
        << "ScoreBlocks num_blocks " << nb << " (capacity " << mb << ")";
    for (int64_t h = 0; h < hkv; ++h) {
      const int32_t* table = host_tables.data<int32_t>() + (r * hkv + h) * mb;
      float* out = scores.data<float>() + (r * hkv + h) * mb;
      for (int32_t b = 0; b < nb; ++b) {
        const int32_t m = table[b];
        OASIS_CHECK(m >= 0 && m < kmin.dim(0)) << "ScoreBlocks: block " << b << " of row " << r
                                               << " head " << h << " has summary row " << m;
        if (fp8_rows) {
          ConvertToFloat(kmin.data<uint8_t>() + m * d, DType::kF8E4M3, lo_row.data(),
                         static_cast<size_t>(d));
          ConvertToFloat(kmax.data<uint8_t>() + m * d, DType::kF8E4M3, hi_row.data(),
                         static_cast<size_t>(d));
        }
        const float* lo = fp8_rows ? lo_row.data() : kmin.data<float>() + m * d;
        const float* hi = fp8_rows ? hi_row.data() : kmax.data<float>() + m * d;
        float acc = 0;
        for (int64_t j = h * group; j < (h + 1) * group; ++j) {
          const float* qv = q.data<float>() + (row * hq + j) * d;
          float s = 0;
          for (int64_t x = 0; x < d; ++x) s += std::max(qv[x] * hi[x], qv[x] * lo[x]);
          if (j == h * group) {
            acc = s;
          } else {
            acc = reduce == GroupReduce::kSum ? acc + s : std::max(acc, s);
          }
        }
        out[b] = acc;
      }
    }
  }
}

void CpuBackend::TopKBlocks(const Tensor& scores, const Tensor& rows, const Tensor& num_blocks,
                            Tensor& topk) {
  OASIS_CHECK(scores.dtype() == DType::kF32 && scores.ndim() == 3)
      << "TopKBlocks scores " << scores.ToString();
  CheckInt(rows, DType::kI32, "TopKBlocks rows");
  CheckInt(num_blocks, DType::kI32, "TopKBlocks num_blocks");
  const int64_t R = scores.dim(0), hkv = scores.dim(1), mb = scores.dim(2);
  OASIS_CHECK(rows.numel() == R && num_blocks.numel() == R) << "TopKBlocks: row counts";
  CheckState(topk, R, hkv, "TopKBlocks topk");
  const int64_t k = topk.dim(2);
  std::vector<int32_t> order;
  for (int64_t r = 0; r < R; ++r) {
    if (rows.data<int32_t>()[r] < 0) continue;
    const int32_t nb = num_blocks.data<int32_t>()[r];
    OASIS_CHECK(nb >= 0 && nb <= mb) << "TopKBlocks num_blocks " << nb;
    const int64_t take = std::min<int64_t>(k, nb);
    for (int64_t h = 0; h < hkv; ++h) {
      const float* s = scores.data<float>() + (r * hkv + h) * mb;
      order.resize(static_cast<size_t>(nb));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(
          order.begin(), order.begin() + take, order.end(),
          [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
      int32_t* out = topk.data<int32_t>() + (r * hkv + h) * k;
      for (int64_t i = 0; i < k; ++i) out[i] = i < take ? order[static_cast<size_t>(i)] : -1;
    }
  }
}

void CpuBackend::WriteIndexed(const Tensor& values, const Tensor& index, Tensor& out) {
  CheckInt(values, DType::kI32, "WriteIndexed values");
  CheckInt(index, DType::kI32, "WriteIndexed index");
  CheckInt(out, DType::kI32, "WriteIndexed out");
  OASIS_CHECK_EQ(values.numel(), index.numel()) << "WriteIndexed: one index per value";
  for (int64_t i = 0; i < index.numel(); ++i) {
    const int32_t at = index.data<int32_t>()[i];
    if (at < 0) continue;
    OASIS_CHECK_LT(at, out.numel()) << "WriteIndexed index";
    out.data<int32_t>()[at] = values.data<int32_t>()[i];
  }
}

void CpuBackend::SelectBlocks(const Tensor& topk, const Tensor& rows, const Tensor& host_tables,
                              const Tensor& ws_slots, Tensor& ws_blocks, Tensor& ws_age,
                              Tensor& fetch_src, Tensor& fetch_dst, Tensor& resident_slots,
                              Tensor& num_resident, Tensor& stats, const Tensor* remote,
                              Tensor* remote_out, int32_t in_place_base, const Tensor* fetch_cap) {
  CheckInt(rows, DType::kI32, "SelectBlocks rows");
  const int64_t R = rows.numel(), hkv = topk.dim(1), k = topk.dim(2);
  CheckState(topk, R, hkv, "SelectBlocks topk");
  CheckState(host_tables, R, hkv, "SelectBlocks host_tables");
  for (const Tensor* t :
       std::initializer_list<const Tensor*>{&ws_slots, &ws_blocks, &ws_age, &resident_slots}) {
    CheckState(*t, R, hkv, "SelectBlocks working-set state");
    OASIS_CHECK_EQ(t->dim(2), k) << "SelectBlocks: working-set width must equal K";
  }
  CheckState(fetch_src, R, hkv, "SelectBlocks fetch_src");
  OASIS_CHECK(fetch_dst.shape() == fetch_src.shape())
      << "SelectBlocks fetch_dst " << fetch_dst.ToString();
  CheckInt(fetch_dst, DType::kI32, "SelectBlocks fetch_dst");
  CheckInt(num_resident, DType::kI32, "SelectBlocks num_resident");
  OASIS_CHECK_EQ(num_resident.numel(), R * hkv) << "SelectBlocks num_resident";
  CheckState(stats, R, hkv, "SelectBlocks stats");
  OASIS_CHECK_EQ(stats.dim(2), 3) << "SelectBlocks stats";
  const int64_t c = fetch_src.dim(2), mb = host_tables.dim(2);
  int64_t cr = 0;
  if (remote != nullptr) {
    OASIS_CHECK(remote->dtype() == DType::kU8 && remote->ndim() == 3 && remote->dim(0) == R &&
                remote->dim(1) == hkv && remote->dim(2) == mb)
        << "SelectBlocks remote " << remote->ToString();
    OASIS_CHECK(remote_out != nullptr) << "SelectBlocks: remote without remote_out";
    CheckState(*remote_out, R, hkv, "SelectBlocks remote_out");
    cr = remote_out->dim(2);
  }
  if (fetch_cap != nullptr) {
    CheckInt(*fetch_cap, DType::kI32, "SelectBlocks fetch_cap");
    OASIS_CHECK_EQ(fetch_cap->numel(), hkv) << "SelectBlocks fetch_cap " << fetch_cap->ToString();
  }
  std::vector<char> predicted_slot(static_cast<size_t>(k));
  std::vector<int32_t> misses, victims, in_place;
  std::vector<std::pair<int32_t, int32_t>> listed;  // (logical block, GPU slot)
  int64_t remote_misses = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t base = r * hkv + h;
      int32_t* src = fetch_src.data<int32_t>() + base * c;
      int32_t* dst = fetch_dst.data<int32_t>() + base * c;
      std::fill(src, src + c, -1);
      std::fill(dst, dst + c, -1);
      int32_t* rout = remote != nullptr ? remote_out->data<int32_t>() + base * cr : nullptr;
      if (rout != nullptr) std::fill(rout, rout + cr, -1);
      const uint8_t* rmask = remote != nullptr ? remote->data<uint8_t>() + base * mb : nullptr;
      if (rows.data<int32_t>()[r] < 0) continue;
      const int32_t* pred = topk.data<int32_t>() + base * k;
      const int32_t* table = host_tables.data<int32_t>() + base * mb;
      const int32_t* slots = ws_slots.data<int32_t>() + base * k;
      int32_t* blocks = ws_blocks.data<int32_t>() + base * k;
      int32_t* age = ws_age.data<int32_t>() + base * k;
      const auto is_in_place = [&](int32_t b) {
        return b >= 0 && b < mb && table[b] >= in_place_base;
      };
      for (int64_t j = 0; j < k; ++j) {  // a working slot never shadows an in-place block
        if (is_in_place(blocks[j])) blocks[j] = -1;
      }
      // 1-3: hits and misses (linear scans: K is small; CUDA uses the same rules).
      int32_t hits = 0;
      misses.clear();
      in_place.clear();
      remote_misses = 0;
      std::fill(predicted_slot.begin(), predicted_slot.end(), 0);
      for (int64_t i = 0; i < k; ++i) {
        const int32_t b = pred[i];
        if (b < 0) continue;
        if (is_in_place(b)) {
          in_place.push_back(b);
          ++hits;
          continue;
        }
        int64_t at = -1;
        for (int64_t j = 0; j < k; ++j) {
          if (blocks[j] == b) at = j;
        }
        if (at >= 0) {
          predicted_slot[static_cast<size_t>(at)] = 1;
          ++hits;
        } else if (rmask != nullptr && b < mb && rmask[b] != 0) {
          if (remote_misses < cr) rout[remote_misses] = b;
          ++remote_misses;
        } else {
          misses.push_back(b);
        }
      }
      for (int64_t j = 0; j < k; ++j) {
        if (predicted_slot[static_cast<size_t>(j)]) {
          age[j] = 0;
        } else if (blocks[j] >= 0) {
          age[j] = age[j] == std::numeric_limits<int32_t>::max() ? age[j] : age[j] + 1;
        }
      }
      // 4: victims: empty slots first, then the least recently selected resident blocks.
      victims.clear();
      for (int32_t j = 0; j < k; ++j) {
        if (blocks[j] < 0) victims.push_back(j);
      }
      const size_t num_empty = victims.size();
      for (int32_t j = 0; j < k; ++j) {
        if (blocks[j] >= 0 && !predicted_slot[static_cast<size_t>(j)]) victims.push_back(j);
      }
      std::stable_sort(victims.begin() + static_cast<std::ptrdiff_t>(num_empty), victims.end(),
                       [age](int32_t a, int32_t b) { return age[a] > age[b]; });
      // 5: admit at most C misses (or the head's adaptive cap), best first.
      const int64_t cap =
          fetch_cap != nullptr ? std::clamp<int64_t>(fetch_cap->data<int32_t>()[h], 0, c) : c;
      const int64_t n = std::min<int64_t>(
          {static_cast<int64_t>(misses.size()), cap, static_cast<int64_t>(victims.size())});
      for (int64_t i = 0; i < n; ++i) {
        const int32_t j = victims[static_cast<size_t>(i)], b = misses[static_cast<size_t>(i)];
        OASIS_CHECK(b < mb && table[b] >= 0) << "SelectBlocks: block " << b << " has no host slot";
        src[i] = table[b];
        dst[i] = slots[j];
        blocks[j] = b;
        age[j] = 0;
        predicted_slot[static_cast<size_t>(j)] = 1;  // fetched: listed like a hit
      }
      // 6: the next step's resident table, ascending logical block: in-place predicted
      // blocks, predicted and fetched working slots, then stale ones while fewer than K.
      listed.clear();
      for (int32_t b : in_place) listed.push_back({b, table[b] - in_place_base});
      for (int32_t j = 0; j < k; ++j) {
        if (blocks[j] >= 0 && predicted_slot[static_cast<size_t>(j)])
          listed.push_back({blocks[j], slots[j]});
      }
      for (int32_t j = 0; j < k && static_cast<int64_t>(listed.size()) < k; ++j) {
        if (blocks[j] >= 0 && !predicted_slot[static_cast<size_t>(j)])
          listed.push_back({blocks[j], slots[j]});
      }
      std::sort(listed.begin(), listed.end());
      int32_t* res = resident_slots.data<int32_t>() + base * k;
      for (int64_t i = 0; i < k; ++i)
        res[i] =
            i < static_cast<int64_t>(listed.size()) ? listed[static_cast<size_t>(i)].second : -1;
      num_resident.data<int32_t>()[base] = static_cast<int32_t>(listed.size());
      int32_t* st = stats.data<int32_t>() + base * 3;
      st[0] += hits;
      st[1] += static_cast<int32_t>(misses.size() + remote_misses);
      st[2] += static_cast<int32_t>(n);
    }
  }
}

void CpuBackend::CopyBlocks(const LayerKvPool& src, const Tensor& src_slots, LayerKvPool& dst,
                            const Tensor& dst_slots) {
  CheckInt(src_slots, DType::kI32, "CopyBlocks src_slots");
  CheckInt(dst_slots, DType::kI32, "CopyBlocks dst_slots");
  OASIS_CHECK_EQ(src_slots.numel(), dst_slots.numel()) << "CopyBlocks entry counts";
  OASIS_CHECK_EQ(src.k.dim(2), dst.k.dim(2)) << "CopyBlocks head_dim";
  CheckPoolDtype(src.k, "CopyBlocks");
  OASIS_CHECK(src.k.dtype() == dst.k.dtype() && src.v.dtype() == dst.v.dtype())
      << "CopyBlocks between pools of different dtypes: " << src.k.ToString() << " -> "
      << dst.k.ToString();
  const size_t bytes = static_cast<size_t>(kBlockSize * src.k.dim(2)) * DTypeSize(src.k.dtype());
  for (int64_t i = 0; i < src_slots.numel(); ++i) {
    const int32_t s = src_slots.data<int32_t>()[i], d = dst_slots.data<int32_t>()[i];
    if (s < 0 || d < 0) continue;
    std::memcpy(BlockBytes(dst.k, d), BlockBytes(src.k, s), bytes);
    std::memcpy(BlockBytes(dst.v, d), BlockBytes(src.v, s), bytes);
  }
}

void CpuBackend::CopyTokens(const LayerKvPool& src, const Tensor& src_index, LayerKvPool& dst,
                            const Tensor& dst_index) {
  CheckInt(src_index, DType::kI64, "CopyTokens src_index");
  CheckInt(dst_index, DType::kI64, "CopyTokens dst_index");
  OASIS_CHECK_EQ(src_index.numel(), dst_index.numel()) << "CopyTokens entry counts";
  const int64_t d = src.k.dim(2);
  OASIS_CHECK_EQ(dst.k.dim(2), d) << "CopyTokens head_dim";
  CheckPoolDtype(src.k, "CopyTokens");
  OASIS_CHECK(src.k.dtype() == dst.k.dtype() && src.v.dtype() == dst.v.dtype())
      << "CopyTokens between pools of different dtypes: " << src.k.ToString() << " -> "
      << dst.k.ToString();
  const int64_t src_rows = src.k.dim(0) * kBlockSize, dst_rows = dst.k.dim(0) * kBlockSize;
  const int64_t bytes = d * static_cast<int64_t>(DTypeSize(src.k.dtype()));
  for (int64_t i = 0; i < src_index.numel(); ++i) {
    const int64_t s = src_index.data<int64_t>()[i], t = dst_index.data<int64_t>()[i];
    if (s < 0 || t < 0) continue;
    OASIS_CHECK(s < src_rows && t < dst_rows)
        << "CopyTokens index outside a pool: " << s << " -> " << t;
    std::memcpy(dst.k.data<uint8_t>() + t * bytes, src.k.data<uint8_t>() + s * bytes,
                static_cast<size_t>(bytes));
    std::memcpy(dst.v.data<uint8_t>() + t * bytes, src.v.data<uint8_t>() + s * bytes,
                static_cast<size_t>(bytes));
  }
}

void CpuBackend::AssembleSparseTables(const Tensor& seq_rows, const Tensor& resident_slots,
                                      const Tensor& num_resident, const Tensor& tail_slots,
                                      const Tensor& tail_lens, AttentionMetadata& meta) {
  CheckInt(seq_rows, DType::kI32, "AssembleSparseTables seq_rows");
  CheckInt(tail_lens, DType::kI32, "AssembleSparseTables tail_lens");
  const int64_t S = seq_rows.numel(), R = resident_slots.dim(0), hkv = resident_slots.dim(1);
  const int64_t k = resident_slots.dim(2), width = meta.block_tables.dim(2);
  CheckState(resident_slots, R, hkv, "AssembleSparseTables resident_slots");
  CheckInt(num_resident, DType::kI32, "AssembleSparseTables num_resident");
  CheckState(tail_slots, S, hkv, "AssembleSparseTables tail_slots");
  OASIS_CHECK_EQ(tail_slots.dim(2), 2) << "AssembleSparseTables tail_slots";
  OASIS_CHECK(meta.kv_lens.dim(0) == S && meta.kv_lens.dim(1) == hkv)
      << "AssembleSparseTables kv_lens " << meta.kv_lens.ToString();
  for (int64_t s = 0; s < S; ++s) {
    const int32_t r = seq_rows.data<int32_t>()[s];
    if (r < 0) continue;
    OASIS_CHECK_LT(r, R) << "AssembleSparseTables row";
    const int32_t tail = tail_lens.data<int32_t>()[s];
    OASIS_CHECK(tail >= 1 && tail <= 2 * kBlockSize) << "AssembleSparseTables tail_len " << tail;
    const int32_t nt = (tail + kBlockSize - 1) / kBlockSize;
    for (int64_t h = 0; h < hkv; ++h) {
      const int32_t n = num_resident.data<int32_t>()[r * hkv + h];
      OASIS_CHECK(n >= 0 && n <= k && n + nt <= width)
          << "AssembleSparseTables: " << n << " resident + " << nt << " tail blocks, table width "
          << width;
      int32_t* row = meta.block_tables.data<int32_t>() + (s * hkv + h) * width;
      std::copy_n(resident_slots.data<int32_t>() + (r * hkv + h) * k, n, row);
      std::copy_n(tail_slots.data<int32_t>() + (s * hkv + h) * 2, nt, row + n);
      meta.kv_lens.data<int32_t>()[s * hkv + h] = n * kBlockSize + tail;
    }
  }
}

void CpuBackend::FetchOverlap(const Tensor& fetch_dst, const Tensor& ws_slots,
                              const Tensor& ws_blocks, const Tensor& actual, const Tensor& rows,
                              Tensor& counts) {
  CheckInt(rows, DType::kI32, "FetchOverlap rows");
  const int64_t R = rows.numel(), hkv = ws_slots.dim(1), k = ws_slots.dim(2);
  CheckState(fetch_dst, R, hkv, "FetchOverlap fetch_dst");
  CheckState(ws_slots, R, hkv, "FetchOverlap ws_slots");
  CheckState(ws_blocks, R, hkv, "FetchOverlap ws_blocks");
  CheckState(actual, R, hkv, "FetchOverlap actual");
  OASIS_CHECK(ws_blocks.dim(2) == k && actual.dim(2) == k) << "FetchOverlap widths";
  CheckState(counts, R, hkv, "FetchOverlap counts");
  OASIS_CHECK_EQ(counts.dim(2), 2) << "FetchOverlap counts";
  const int64_t c = fetch_dst.dim(2);
  for (int64_t r = 0; r < R; ++r) {
    if (rows.data<int32_t>()[r] < 0) continue;
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t base = r * hkv + h;
      const int32_t* dst = fetch_dst.data<int32_t>() + base * c;
      const int32_t* slots = ws_slots.data<int32_t>() + base * k;
      const int32_t* blocks = ws_blocks.data<int32_t>() + base * k;
      const int32_t* a = actual.data<int32_t>() + base * k;
      int32_t used = 0, fetched = 0;
      for (int64_t i = 0; i < c; ++i) {
        if (dst[i] < 0) continue;
        ++fetched;
        int32_t block = -1;
        for (int64_t j = 0; j < k; ++j) {
          if (slots[j] == dst[i]) block = blocks[j];
        }
        if (block < 0) continue;
        for (int64_t j = 0; j < k; ++j) {
          if (a[j] == block) {
            ++used;
            break;
          }
        }
      }
      counts.data<int32_t>()[base * 2] += used;
      counts.data<int32_t>()[base * 2 + 1] += fetched;
    }
  }
}

void CpuBackend::TopKOverlap(const Tensor& predicted, const Tensor& actual, const Tensor& rows,
                             Tensor& counts) {
  CheckInt(rows, DType::kI32, "TopKOverlap rows");
  const int64_t R = rows.numel(), hkv = predicted.dim(1), k = predicted.dim(2);
  CheckState(predicted, R, hkv, "TopKOverlap predicted");
  CheckState(actual, R, hkv, "TopKOverlap actual");
  OASIS_CHECK_EQ(actual.dim(2), k) << "TopKOverlap widths";
  CheckState(counts, R, hkv, "TopKOverlap counts");
  OASIS_CHECK_EQ(counts.dim(2), 2) << "TopKOverlap counts";
  for (int64_t r = 0; r < R; ++r) {
    if (rows.data<int32_t>()[r] < 0) continue;
    for (int64_t h = 0; h < hkv; ++h) {
      const int32_t* p = predicted.data<int32_t>() + (r * hkv + h) * k;
      const int32_t* a = actual.data<int32_t>() + (r * hkv + h) * k;
      int32_t overlap = 0, total = 0;
      for (int64_t i = 0; i < k; ++i) {
        if (a[i] < 0) continue;
        ++total;
        for (int64_t j = 0; j < k; ++j) {
          if (p[j] == a[i]) {
            ++overlap;
            break;
          }
        }
      }
      counts.data<int32_t>()[(r * hkv + h) * 2] += overlap;
      counts.data<int32_t>()[(r * hkv + h) * 2 + 1] += total;
    }
  }
}

}  // namespace oasis

#include "runner/batch_builder.h"

#include <algorithm>

#include "common/check.h"

namespace oasis {

ForwardInput BuildHostForwardInput(const std::vector<StepSequence>& seqs, LogitsFor logits) {
  OASIS_CHECK(!seqs.empty()) << "empty batch";
  auto heads_of = [](const StepSequence& s) {
    if (s.table != nullptr) return s.table->num_kv_heads();
    OASIS_CHECK(s.sparse != nullptr && s.sparse->num_tail_blocks > 0)
        << "a sequence has neither table nor sparse slots";
    return static_cast<int32_t>(s.sparse->tail_slots.size()) / s.sparse->num_tail_blocks;
  };
  const int32_t heads = heads_of(seqs[0]);
  int64_t total = 0, max_blocks = 1, sparse_kv = 0;
  int32_t max_q = 0;
  for (const StepSequence& s : seqs) {
    OASIS_CHECK(!s.tokens.empty()) << "a sequence in the batch has no tokens";
    OASIS_CHECK_EQ(heads_of(s), heads) << "KV head counts differ within a batch";
    if (s.table != nullptr) {
      OASIS_CHECK_LE(
          (s.start + static_cast<int64_t>(s.tokens.size()) + kBlockSize - 1) / kBlockSize,
          s.table->num_blocks())
          << "block table too small for the step";
      max_blocks = std::max(max_blocks, s.table->num_blocks());
    }
    if (s.sparse != nullptr) {
      OASIS_CHECK_EQ(static_cast<int64_t>(s.sparse->slot_mapping.size()),
                     static_cast<int64_t>(s.tokens.size()) * heads)
          << "sparse slot mapping size";
      max_blocks =
          std::max<int64_t>({max_blocks, s.sparse->table_width, s.sparse->num_tail_blocks});
      sparse_kv =
          std::max<int64_t>(sparse_kv, static_cast<int64_t>(s.sparse->table_width) * kBlockSize);
    }
    total += static_cast<int64_t>(s.tokens.size());
    max_q = std::max(max_q, static_cast<int32_t>(s.tokens.size()));
  }
  const int64_t S = static_cast<int64_t>(seqs.size());
  Tensor ids = Tensor::Empty({total}, DType::kI32);
  Tensor pos = Tensor::Empty({total}, DType::kI32);
  Tensor slots = Tensor::Empty({total, heads}, DType::kI64);
  Tensor qstart = Tensor::Empty({S + 1}, DType::kI32);
  Tensor kv_lens = Tensor::Empty({S, heads}, DType::kI32);
  Tensor tables = Tensor::Zeros({S, heads, max_blocks}, DType::kI32);
  const int64_t num_rows = logits == LogitsFor::kEveryToken ? total : S;
  Tensor rows = Tensor::Empty({num_rows}, DType::kI32);

  int64_t t = 0;
  for (int64_t s = 0; s < S; ++s) {
    const StepSequence& seq = seqs[static_cast<size_t>(s)];
    qstart.data<int32_t>()[s] = static_cast<int32_t>(t);
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    for (int64_t i = 0; i < n; ++i, ++t) {
      ids.data<int32_t>()[t] = seq.tokens[static_cast<size_t>(i)];
      pos.data<int32_t>()[t] = static_cast<int32_t>(seq.start + i);
      for (int32_t h = 0; h < heads; ++h) {
        slots.data<int64_t>()[t * heads + h] =
            seq.sparse != nullptr ? seq.sparse->slot_mapping[static_cast<size_t>(i * heads + h)]
                                  : seq.table->SlotMapping(h, seq.start + i);
      }
      if (logits == LogitsFor::kEveryToken) rows.data<int32_t>()[t] = static_cast<int32_t>(t);
    }
    if (logits == LogitsFor::kLastTokenOfEachSequence)
      rows.data<int32_t>()[s] = static_cast<int32_t>(t - 1);
    for (int32_t h = 0; h < heads; ++h) {
      int32_t* row = tables.data<int32_t>() + (s * heads + h) * max_blocks;
      if (seq.table != nullptr) {
        kv_lens.data<int32_t>()[s * heads + h] = static_cast<int32_t>(seq.start + n);
        const auto& hs = seq.table->head_slots(h);
        std::copy(hs.begin(), hs.end(), row);
      } else {  // sparse, tail only: a valid local-window row until the pipeline writes the layer's
        const int32_t nt = seq.sparse->num_tail_blocks;
        kv_lens.data<int32_t>()[s * heads + h] = seq.sparse->tail_len;
        std::copy_n(seq.sparse->tail_slots.begin() + h * nt, nt, row);
      }
    }
  }
  qstart.data<int32_t>()[S] = static_cast<int32_t>(t);

  ForwardInput in;
  in.token_ids = ids;
  in.positions = pos;
  in.slot_mapping = slots;
  in.attention.query_start = qstart;
  in.attention.kv_lens = kv_lens;
  in.attention.block_tables = tables;
  in.attention.max_query_len = max_q;
  int32_t max_kv = 0;
  for (int64_t i = 0; i < kv_lens.numel(); ++i)
    max_kv = std::max(max_kv, kv_lens.data<int32_t>()[i]);
  in.attention.max_kv_len = std::max<int32_t>(max_kv, static_cast<int32_t>(sparse_kv));
  in.logit_rows = rows;
  return in;
}

ForwardInput UploadForwardInput(Backend& b, const ForwardInput& h, bool async) {
  const auto up = [&](const Tensor& t) { return async ? b.UploadAsync(t) : b.Upload(t); };
  ForwardInput in;
  in.token_ids = up(h.token_ids);
  in.positions = up(h.positions);
  in.slot_mapping = up(h.slot_mapping);
  in.attention.query_start = up(h.attention.query_start);
  in.attention.kv_lens = up(h.attention.kv_lens);
  in.attention.block_tables = up(h.attention.block_tables);
  in.attention.max_query_len = h.attention.max_query_len;
  in.attention.max_kv_len = h.attention.max_kv_len;
  in.logit_rows = up(h.logit_rows);
  return in;
}

}  // namespace oasis

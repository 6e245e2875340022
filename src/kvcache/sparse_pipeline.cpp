#include "kvcache/sparse_pipeline.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/check.h"

namespace oasis {

SparseLayerMetrics SparseMetrics::Total() const {
  SparseLayerMetrics t;
  for (const SparseLayerMetrics& l : layers) {
    t.hits += l.hits;
    t.misses += l.misses;
    t.fetched += l.fetched;
    t.agree_overlap += l.agree_overlap;
    t.agree_total += l.agree_total;
    t.fetch_used += l.fetch_used;
    t.fetch_sampled += l.fetch_sampled;
  }
  return t;
}

double SparseMetrics::hit_rate() const {
  const SparseLayerMetrics t = Total();
  return t.hits + t.misses == 0
             ? 0.0
             : static_cast<double>(t.hits) / static_cast<double>(t.hits + t.misses);
}

double SparseMetrics::agreement() const {
  const SparseLayerMetrics t = Total();
  return t.agree_total == 0
             ? 0.0
             : static_cast<double>(t.agree_overlap) / static_cast<double>(t.agree_total);
}

double SparseMetrics::fetch_use() const {
  const SparseLayerMetrics t = Total();
  return t.fetch_sampled == 0
             ? 0.0
             : static_cast<double>(t.fetch_used) / static_cast<double>(t.fetch_sampled);
}

double SparseMetrics::fetched_per_step() const {
  return steps == 0 ? 0.0 : static_cast<double>(Total().fetched) / static_cast<double>(steps);
}

void SparseMetrics::MergeRank(const SparseMetrics& other) {
  if (layers.size() < other.layers.size()) layers.resize(other.layers.size());
  for (size_t l = 0; l < other.layers.size(); ++l) {
    layers[l].hits += other.layers[l].hits;
    layers[l].misses += other.layers[l].misses;
    layers[l].fetched += other.layers[l].fetched;
    layers[l].agree_overlap += other.layers[l].agree_overlap;
    layers[l].agree_total += other.layers[l].agree_total;
    layers[l].fetch_used += other.layers[l].fetch_used;
    layers[l].fetch_sampled += other.layers[l].fetch_sampled;
  }
  transfer_wait_seconds = std::max(transfer_wait_seconds, other.transfer_wait_seconds);
}

double SparseMetrics::h2d_bytes_per_step() const {
  return fetched_per_step() * static_cast<double>(bytes_per_block);
}

namespace {
Tensor TableIndexOf(const SparseStepPlan& plan);
Tensor LagOf(const SparseStepPlan& plan, const Tensor& lag);
}  // namespace

namespace {
uint64_t NextPipelineSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

SparseAttentionPipeline::SparseAttentionPipeline(SparseKvManager& manager, Backend& backend,
                                                 int64_t num_q_heads, SparseStageSync* sync,
                                                 int side)
    : manager_(manager),
      backend_(backend),
      num_q_heads_(num_q_heads),
      sync_(sync),
      side_(side),
      serial_(NextPipelineSerial()) {
  const SparseModelShape& shape = manager.shape();
  OASIS_CHECK(side >= 0 && side < manager.num_sides()) << "sparse pipeline side " << side;
  OASIS_CHECK(num_q_heads > 0 && num_q_heads % shape.num_kv_heads == 0)
      << "query heads " << num_q_heads;
  q_snapshots_.resize(static_cast<size_t>(shape.num_layers));
  const int64_t chain = manager.config().chain_queries;
  for (int64_t l = manager.config().dense_layers; l < shape.num_layers; ++l) {
    q_snapshots_[static_cast<size_t>(l)] =
        backend.Empty({manager.config().max_sparse_seqs * chain, num_q_heads * shape.head_dim},
                      backend.activation_dtype());
  }
}

void SparseAttentionPipeline::BeginStep(const SparseStepPlan& plan,
                                        const AttentionMetadata& attention,
                                        const Tensor& slot_mapping) {
  OASIS_CHECK(!in_step_) << "BeginStep twice without EndStep";
  in_step_ = true;
  num_sparse_ = plan.num_sparse;
  num_predicting_ = plan.predict_gather.numel() / GatherPerSequence();
  measure_agreement_ = plan.measure_agreement;
  planned_ = false;  // the members below no longer view the persistent buffers
  meta_ = attention;
  slot_mapping_ = slot_mapping;
  if (num_sparse_ == 0) return;
  OASIS_CHECK_EQ(attention.block_tables.dim(0), plan.seq_rows.numel())
      << "plan and batch sequence counts";
  OASIS_CHECK(slot_mapping.shape() == plan.host_mapping.shape())
      << "plan and batch token counts: " << slot_mapping.ToString() << " vs "
      << plan.host_mapping.ToString();
  // Asynchronous uploads on the main stream: every side-stream stage that reads them waits
  // for an event the main stream records after them (Exit(kAttention, l)), and the previous
  // step's tensors are freed (stream-ordered) only after EndStep joined the side streams.
  Backend& b = backend_;
  seq_rows_ = b.UploadAsync(plan.seq_rows);
  tail_slots_ = b.UploadAsync(plan.tail_slots);
  tail_lens_ = b.UploadAsync(plan.tail_lens);
  host_mapping_ = b.UploadAsync(plan.host_mapping);
  lag_src_ = b.UploadAsync(LagOf(plan, plan.lag_src));
  lag_dst_ = b.UploadAsync(LagOf(plan, plan.lag_dst));
  summary_src_ = b.UploadAsync(plan.summary_src);
  summary_len_ = b.UploadAsync(plan.summary_len);
  summary_dst_ = b.UploadAsync(plan.summary_dst);
  table_index_ = b.UploadAsync(TableIndexOf(plan));
  predict_gather_ = b.UploadAsync(plan.predict_gather);
  predict_rows_ = b.UploadAsync(plan.predict_rows);
  predict_num_blocks_ = b.UploadAsync(plan.predict_num_blocks);
  current_rows_ = b.UploadAsync(plan.current_rows);
  current_num_blocks_ = b.UploadAsync(plan.current_num_blocks);
  ++metric_steps_;
  metric_seq_steps_ += num_sparse_;
}

namespace {

// The plan's table_index, or none (-1 for every sequence and head) when it has none.
Tensor TableIndexOf(const SparseStepPlan& plan) {
  if (plan.table_index.defined() && plan.table_index.numel() == plan.summary_dst.numel())
    return plan.table_index;
  Tensor t = Tensor::Empty({plan.summary_dst.numel()}, DType::kI32);
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), -1);
  return t;
}

// The plan's lag_src or lag_dst, or none (-1 everywhere) when a hand-made plan has none.
Tensor LagOf(const SparseStepPlan& plan, const Tensor& lag) {
  const int64_t n = plan.summary_dst.numel() * kMaxSparseDraftTokens;
  if (lag.defined() && lag.numel() == n) return lag;
  Tensor t = Tensor::Empty({n}, DType::kI64);
  std::fill(t.data<int64_t>(), t.data<int64_t>() + t.numel(), -1);
  return t;
}

// A copy of `t` ([n, ...] with `row` elements per leading index) grown to `rows` leading
// entries, the new ones filled with `fill`.
Tensor PadRows(const Tensor& t, int64_t rows, int64_t fill) {
  const int64_t n = t.ndim() == 0 ? 0 : t.dim(0);
  OASIS_CHECK_LE(n, rows) << "padding " << t.ToString() << " to " << rows << " rows";
  std::vector<int64_t> shape = t.shape();
  if (shape.empty()) shape = {0};
  shape[0] = rows;
  Tensor out = Tensor::Empty(shape, t.dtype());
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  const int64_t total = out.numel(), from = t.numel();
  for (int64_t i = from; i < total; ++i) {
    if (t.dtype() == DType::kI64) {
      out.data<int64_t>()[i] = fill;
    } else {
      out.data<int32_t>()[i] = static_cast<int32_t>(fill);
    }
  }
  return out;
}

}  // namespace

SparseStepPlan PadStepPlan(const SparseStepPlan& plan, int64_t seqs, int64_t tokens) {
  const int64_t S = plan.seq_rows.numel();
  OASIS_CHECK(plan.tail_slots.ndim() == 3 && plan.host_mapping.ndim() == 2)
      << "a step plan's shapes";
  const int64_t H = plan.tail_slots.dim(1);
  SparseStepPlan p = plan;
  p.seq_rows = PadRows(plan.seq_rows, seqs, -1);
  p.tail_slots = PadRows(plan.tail_slots, seqs, -1);
  p.tail_lens = PadRows(plan.tail_lens, seqs, 0);
  p.host_mapping = PadRows(plan.host_mapping, tokens, -1);
  p.lag_src = PadRows(LagOf(plan, plan.lag_src), seqs * H * kMaxSparseDraftTokens, -1);
  p.lag_dst = PadRows(LagOf(plan, plan.lag_dst), seqs * H * kMaxSparseDraftTokens, -1);
  p.summary_src = PadRows(plan.summary_src.Reshape({S * H}), seqs * H, 0);
  p.summary_len = PadRows(plan.summary_len.Reshape({S * H}), seqs * H, 0);
  p.summary_dst = PadRows(plan.summary_dst.Reshape({S * H}), seqs * H, -1);
  p.table_index = PadRows(TableIndexOf(plan).Reshape({S * H}), seqs * H, -1);
  p.slots.resize(static_cast<size_t>(seqs));
  return p;
}

void SparseAttentionPipeline::ReservePlan(int64_t max_seqs, int64_t max_tokens) {
  const int64_t H = manager_.shape().num_kv_heads, R = manager_.config().max_sparse_seqs;
  if (max_seqs <= cap_seqs_ && max_tokens <= cap_tokens_) return;
  max_seqs = std::max(max_seqs, cap_seqs_);
  max_tokens = std::max(max_tokens, cap_tokens_);
  Backend& b = backend_;
  cap_seq_rows_ = b.Empty({max_seqs}, DType::kI32);
  cap_tail_slots_ = b.Empty({max_seqs * H * 2}, DType::kI32);
  cap_tail_lens_ = b.Empty({max_seqs}, DType::kI32);
  cap_host_mapping_ = b.Empty({max_tokens * H}, DType::kI64);
  cap_lag_src_ = b.Empty({max_seqs * H * kMaxSparseDraftTokens}, DType::kI64);
  cap_lag_dst_ = b.Empty({max_seqs * H * kMaxSparseDraftTokens}, DType::kI64);
  cap_summary_src_ = b.Empty({max_seqs * H}, DType::kI32);
  cap_summary_len_ = b.Empty({max_seqs * H}, DType::kI32);
  cap_summary_dst_ = b.Empty({max_seqs * H}, DType::kI32);
  cap_table_index_ = b.Empty({max_seqs * H}, DType::kI32);
  cap_predict_gather_ = b.Empty({R * GatherPerSequence()}, DType::kI32);
  cap_predict_rows_ = b.Empty({R}, DType::kI32);
  cap_predict_num_blocks_ = b.Empty({R}, DType::kI32);
  cap_current_rows_ = b.Empty({R}, DType::kI32);
  cap_current_num_blocks_ = b.Empty({R}, DType::kI32);
  cap_seqs_ = max_seqs;
  cap_tokens_ = max_tokens;
}

void SparseAttentionPipeline::UploadPlan(const SparseStepPlan& plan) {
  OASIS_CHECK(!in_step_) << "UploadPlan inside a step";
  const int64_t S = plan.seq_rows.numel(),
                T = plan.host_mapping.numel() / std::max<int64_t>(1, manager_.shape().num_kv_heads);
  const int64_t R = manager_.config().max_sparse_seqs;
  OASIS_CHECK(S <= cap_seqs_ && T <= cap_tokens_)
      << "plan of " << S << " sequences and " << T << " tokens past ReservePlan's " << cap_seqs_
      << " and " << cap_tokens_;
  OASIS_CHECK_LE(plan.predict_gather.numel(), R * GatherPerSequence()) << "predicting rows";
  Backend& b = backend_;
  // A view of a capacity buffer with the plan tensor's shape.
  const auto into = [&](Tensor& cap, const Tensor& host, Tensor& view) {
    view = Tensor(cap.raw(), host.dtype(), host.shape(), cap.device(), cap.owner());
    b.UploadAsyncInto(view, host);
  };
  into(cap_seq_rows_, plan.seq_rows, seq_rows_);
  into(cap_tail_slots_, plan.tail_slots, tail_slots_);
  into(cap_tail_lens_, plan.tail_lens, tail_lens_);
  into(cap_host_mapping_, plan.host_mapping, host_mapping_);
  into(cap_lag_src_, LagOf(plan, plan.lag_src), lag_src_);
  into(cap_lag_dst_, LagOf(plan, plan.lag_dst), lag_dst_);
  into(cap_summary_src_, plan.summary_src, summary_src_);
  into(cap_summary_len_, plan.summary_len, summary_len_);
  into(cap_summary_dst_, plan.summary_dst, summary_dst_);
  into(cap_table_index_, TableIndexOf(plan), table_index_);
  into(cap_predict_gather_, PadRows(plan.predict_gather, R * GatherPerSequence(), 0),
       predict_gather_);
  into(cap_predict_rows_, plan.predict_rows, predict_rows_);
  into(cap_predict_num_blocks_, plan.predict_num_blocks, predict_num_blocks_);
  into(cap_current_rows_, plan.current_rows, current_rows_);
  into(cap_current_num_blocks_, plan.current_num_blocks, current_num_blocks_);
  num_sparse_ = plan.num_sparse;
  num_predicting_ = R;
  measure_agreement_ = plan.measure_agreement;
  planned_ = true;
  ++metric_steps_;
  metric_seq_steps_ += num_sparse_;
}

void SparseAttentionPipeline::BeginPlannedStep(const AttentionMetadata& attention,
                                               const Tensor& slot_mapping) {
  OASIS_CHECK(!in_step_) << "BeginPlannedStep twice without EndStep";
  OASIS_CHECK(planned_) << "BeginPlannedStep without UploadPlan";
  OASIS_CHECK(num_sparse_ > 0) << "a planned step without sparse sequences";
  OASIS_CHECK_EQ(attention.block_tables.dim(0), seq_rows_.numel())
      << "plan and batch sequence counts";
  OASIS_CHECK(slot_mapping.shape() == host_mapping_.shape())
      << "plan and batch token counts: " << slot_mapping.ToString() << " vs "
      << host_mapping_.ToString();
  in_step_ = true;
  meta_ = attention;
  slot_mapping_ = slot_mapping;
}

void SparseAttentionPipeline::EndStep() {
  OASIS_CHECK(in_step_) << "EndStep without BeginStep";
  if (sync_) sync_->Join();
  in_step_ = false;
}

bool SparseAttentionPipeline::Active(int layer) const {
  OASIS_CHECK(in_step_) << "sparse hook called outside BeginStep/EndStep";
  return num_sparse_ > 0 && layer >= manager_.config().dense_layers;
}

bool SparseAttentionPipeline::SideWrites() const {
  return manager_.config().predictor != SparsePredictor::kOracle && num_predicting_ > 0;
}

const AttentionMetadata& SparseAttentionPipeline::BeforeAttention(int layer, const Tensor& q,
                                                                  LayerKvPool& pool,
                                                                  const AttentionMetadata& step) {
  if (!Active(layer)) return step;
  OASIS_CHECK(step.block_tables.raw() == meta_.block_tables.raw())
      << "hook called with another step's metadata";
  Backend& b = backend_;
  HostKvStore& store = manager_.host_store(side_);
  SparseDeviceState& st = manager_.state(side_);
  SparseLayerState& ls = st.layer(layer);
  const SparseConfig& cfg = manager_.config();
  Enter(SparseStage::kAttention, layer);
  // HBM home: the blocks this step starts join the tables (their entries name their GPU slots).
  if (store.num_in_place_rows() > 0)
    b.WriteIndexed(summary_dst_.Reshape({summary_dst_.numel()}), table_index_, ls.host_tables);
  if (!SideWrites()) {
    b.CopyTokens(pool, slot_mapping_, store.pool(layer), host_mapping_);
    b.CopyTokens(pool, lag_src_, store.pool(layer), lag_dst_);
    b.BlockSummaries(pool, summary_src_, summary_len_, summary_dst_, store.kmin(layer),
                     store.kmax(layer));
  }
  if (cfg.predictor == SparsePredictor::kOracle) {
    // The step's own query selects its working set right now (transfers on the critical path).
    b.ScoreBlocks(q, current_rows_, current_num_blocks_, ls.host_tables, store.kmin(layer),
                  store.kmax(layer), cfg.group_reduce, st.scores_actual);
    b.TopKBlocks(st.scores_actual, current_rows_, current_num_blocks_, ls.topk);
    b.SelectBlocks(ls.topk, current_rows_, ls.host_tables, st.ws_slots, ls.ws_blocks, ls.ws_age,
                   ls.fetch_src, ls.fetch_dst, ls.resident_slots, ls.num_resident, ls.select_stats,
                   st.remote_cap() > 0 ? &ls.remote : nullptr,
                   st.remote_cap() > 0 ? &ls.remote_out : nullptr, store.in_place_base(),
                   cfg.budget == SparseBudget::kAdaptive ? &ls.fetch_cap : nullptr);
    if (cfg.transfers) {
      b.CopyBlocks(store.pool(layer), ls.fetch_src.Reshape({ls.fetch_src.numel()}), pool,
                   ls.fetch_dst.Reshape({ls.fetch_dst.numel()}));
    }
  } else if (measure_agreement_) {
    b.ScoreBlocks(q, current_rows_, current_num_blocks_, ls.host_tables, store.kmin(layer),
                  store.kmax(layer), cfg.group_reduce, st.scores_actual);
    b.TopKBlocks(st.scores_actual, current_rows_, current_num_blocks_, ls.topk_actual);
    b.TopKOverlap(ls.topk, ls.topk_actual, current_rows_, ls.agree_stats);
    // The blocks the previous select fetched for this step (its fetch list and working set
    // are not rewritten before this layer's next select): in the real top-K or not.
    b.FetchOverlap(ls.fetch_dst, st.ws_slots, ls.ws_blocks, ls.topk_actual, current_rows_,
                   ls.fetch_use_stats);
  }
  b.AssembleSparseTables(seq_rows_, ls.resident_slots, ls.num_resident, tail_slots_, tail_lens_,
                         meta_);
  return meta_;
}

void SparseAttentionPipeline::AfterAttention(int layer, const Tensor& q, LayerKvPool& pool) {
  if (!Active(layer)) return;
  const SparseConfig& cfg = manager_.config();
  if (!SideWrites()) {
    Exit(SparseStage::kAttention, layer);
    return;
  }
  Backend& b = backend_;
  HostKvStore& store = manager_.host_store(side_);
  SparseDeviceState& st = manager_.state(side_);
  SparseLayerState& ls = st.layer(layer);
  const int64_t T = q.dim(0), chain = manager_.config().chain_queries;
  Tensor snapshot = q_snapshots_[static_cast<size_t>(layer)].Slice(0, num_predicting_ * chain);
  if (chain == 1) {
    b.GatherRows(q.Reshape({T, q.dim(1) * q.dim(2)}), predict_gather_, snapshot);
  } else {  // the chain's queries per KV head, as one group of chain x G query heads
    const int64_t hkv = manager_.shape().num_kv_heads, width = q.dim(1) / hkv * q.dim(2);
    Tensor rows = snapshot.Reshape({num_predicting_ * chain * hkv, width});
    b.GatherRows(q.Reshape({T * hkv, width}), predict_gather_, rows);
  }
  Exit(SparseStage::kAttention, layer);

  // The new tokens' summaries and their write-through to the host store run on the side
  // streams, off the layer's critical path: the summaries before this layer's scores (which
  // cover a block this step completes), the host copy before this layer's transfer (which may
  // fetch that block). Both read the step's appended KV (after Exit(kAttention)); EndStep's
  // join orders them before the next step touches those slots.
  Enter(SparseStage::kPredict, layer);
  b.BlockSummaries(pool, summary_src_, summary_len_, summary_dst_, store.kmin(layer),
                   store.kmax(layer));
  b.ScoreBlocks(snapshot.Reshape({num_predicting_, chain * q.dim(1), q.dim(2)}), predict_rows_,
                predict_num_blocks_, ls.host_tables, store.kmin(layer), store.kmax(layer),
                cfg.group_reduce, st.scores);
  b.TopKBlocks(st.scores, predict_rows_, predict_num_blocks_, ls.topk);
  Exit(SparseStage::kPredict, layer);

  Enter(SparseStage::kSelect, layer);
  b.CopyTokens(pool, slot_mapping_, store.pool(layer), host_mapping_);
  b.CopyTokens(pool, lag_src_, store.pool(layer), lag_dst_);  // drafts accepted last step
  b.SelectBlocks(ls.topk, predict_rows_, ls.host_tables, st.ws_slots, ls.ws_blocks, ls.ws_age,
                 ls.fetch_src, ls.fetch_dst, ls.resident_slots, ls.num_resident, ls.select_stats,
                 st.remote_cap() > 0 ? &ls.remote : nullptr,
                 st.remote_cap() > 0 ? &ls.remote_out : nullptr, store.in_place_base(),
                 cfg.budget == SparseBudget::kAdaptive ? &ls.fetch_cap : nullptr);
  Exit(SparseStage::kSelect, layer);

  if (!cfg.transfers) return;  // measurement mode: nothing crosses PCIe
  Enter(SparseStage::kTransfer, layer);
  b.CopyBlocks(store.pool(layer), ls.fetch_src.Reshape({ls.fetch_src.numel()}), pool,
               ls.fetch_dst.Reshape({ls.fetch_dst.numel()}));
  Exit(SparseStage::kTransfer, layer);
}

SparseMetrics SparseAttentionPipeline::CollectMetrics() {
  const SparseModelShape& shape = manager_.shape();
  SparseDeviceState& st = manager_.state(side_);
  SparseMetrics m;
  m.steps = metric_steps_;
  m.sparse_seq_steps = metric_seq_steps_;
  m.layers.resize(static_cast<size_t>(shape.num_layers));
  m.bytes_per_block = static_cast<int64_t>(2 * kBlockSize * shape.head_dim) *
                      static_cast<int64_t>(DTypeSize(KvCacheDtype(backend_, shape.kv_fp8)));
  m.transfer_wait_seconds = sync_ ? sync_->TakeTransferWaitSeconds() : 0.0;
  for (int64_t l = manager_.config().dense_layers; l < shape.num_layers; ++l) {
    SparseLayerState& ls = st.layer(l);
    const Tensor sel = backend_.Download(ls.select_stats),
                 agree = backend_.Download(ls.agree_stats),
                 use = backend_.Download(ls.fetch_use_stats);
    SparseLayerMetrics& out = m.layers[static_cast<size_t>(l)];
    for (int64_t i = 0; i < sel.numel(); i += 3) {
      out.hits += sel.data<int32_t>()[i];
      out.misses += sel.data<int32_t>()[i + 1];
      out.fetched += sel.data<int32_t>()[i + 2];
    }
    for (int64_t i = 0; i < agree.numel(); i += 2) {
      out.agree_overlap += agree.data<int32_t>()[i];
      out.agree_total += agree.data<int32_t>()[i + 1];
    }
    for (int64_t i = 0; i < use.numel(); i += 2) {
      out.fetch_used += use.data<int32_t>()[i];
      out.fetch_sampled += use.data<int32_t>()[i + 1];
    }
  }
  st.ZeroStats();
  metric_steps_ = 0;
  metric_seq_steps_ = 0;
  return m;
}

}  // namespace oasis

#include "kvcache/sparse_pipeline.h"

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
  }
  return t;
}

double SparseMetrics::hit_rate() const {
  const SparseLayerMetrics t = Total();
  return t.hits + t.misses == 0 ? 0.0 : static_cast<double>(t.hits) / static_cast<double>(t.hits + t.misses);
}

double SparseMetrics::agreement() const {
  const SparseLayerMetrics t = Total();
  return t.agree_total == 0 ? 0.0 : static_cast<double>(t.agree_overlap) / static_cast<double>(t.agree_total);
}

double SparseMetrics::fetched_per_step() const {
  return steps == 0 ? 0.0 : static_cast<double>(Total().fetched) / static_cast<double>(steps);
}

double SparseMetrics::h2d_bytes_per_step() const { return fetched_per_step() * static_cast<double>(bytes_per_block); }

SparseAttentionPipeline::SparseAttentionPipeline(SparseKvManager& manager, Backend& backend, int64_t num_q_heads,
                                                 SparseStageSync* sync)
    : manager_(manager), backend_(backend), num_q_heads_(num_q_heads), sync_(sync) {
  const SparseModelShape& shape = manager.shape();
  OASIS_CHECK(num_q_heads > 0 && num_q_heads % shape.num_kv_heads == 0) << "query heads " << num_q_heads;
  q_snapshots_.resize(static_cast<size_t>(shape.num_layers));
  for (int64_t l = manager.config().dense_layers; l < shape.num_layers; ++l) {
    q_snapshots_[static_cast<size_t>(l)] =
        backend.Empty({manager.config().max_sparse_seqs, num_q_heads * shape.head_dim}, backend.activation_dtype());
  }
}

void SparseAttentionPipeline::BeginStep(const SparseStepPlan& plan, const AttentionMetadata& attention,
                                        const Tensor& slot_mapping) {
  OASIS_CHECK(!in_step_) << "BeginStep twice without EndStep";
  in_step_ = true;
  num_sparse_ = plan.num_sparse;
  num_predicting_ = plan.predict_gather.numel();
  measure_agreement_ = plan.measure_agreement;
  meta_ = attention;
  slot_mapping_ = slot_mapping;
  if (num_sparse_ == 0) return;
  OASIS_CHECK_EQ(attention.block_tables.dim(0), plan.seq_rows.numel()) << "plan and batch sequence counts";
  OASIS_CHECK(slot_mapping.shape() == plan.host_mapping.shape()) << "plan and batch token counts: "
                                                                 << slot_mapping.ToString() << " vs "
                                                                 << plan.host_mapping.ToString();
  // Asynchronous uploads on the main stream: every side-stream stage that reads them waits
  // for an event the main stream records after them (Exit(kAttention, l)), and the previous
  // step's tensors are freed (stream-ordered) only after EndStep joined the side streams.
  Backend& b = backend_;
  seq_rows_ = b.UploadAsync(plan.seq_rows);
  tail_slots_ = b.UploadAsync(plan.tail_slots);
  tail_lens_ = b.UploadAsync(plan.tail_lens);
  host_mapping_ = b.UploadAsync(plan.host_mapping);
  summary_src_ = b.UploadAsync(plan.summary_src);
  summary_len_ = b.UploadAsync(plan.summary_len);
  summary_dst_ = b.UploadAsync(plan.summary_dst);
  predict_gather_ = b.UploadAsync(plan.predict_gather);
  predict_rows_ = b.UploadAsync(plan.predict_rows);
  predict_num_blocks_ = b.UploadAsync(plan.predict_num_blocks);
  current_rows_ = b.UploadAsync(plan.current_rows);
  current_num_blocks_ = b.UploadAsync(plan.current_num_blocks);
  ++metric_steps_;
  metric_seq_steps_ += num_sparse_;
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

const AttentionMetadata& SparseAttentionPipeline::BeforeAttention(int layer, const Tensor& q, LayerKvPool& pool,
                                                                  const AttentionMetadata& step) {
  if (!Active(layer)) return step;
  OASIS_CHECK(step.block_tables.raw() == meta_.block_tables.raw()) << "hook called with another step's metadata";
  Backend& b = backend_;
  HostKvStore& store = manager_.host_store();
  SparseDeviceState& st = manager_.state();
  SparseLayerState& ls = st.layer(layer);
  const SparseConfig& cfg = manager_.config();
  Enter(SparseStage::kAttention, layer);
  b.CopyTokens(pool, slot_mapping_, store.pool(layer), host_mapping_);
  b.BlockSummaries(pool, summary_src_, summary_len_, summary_dst_, store.kmin(layer), store.kmax(layer));
  if (cfg.predictor == SparsePredictor::kOracle) {
    // The step's own query selects its working set right now (transfers on the critical path).
    b.ScoreBlocks(q, current_rows_, current_num_blocks_, st.host_tables, store.kmin(layer), store.kmax(layer),
                  cfg.group_reduce, st.scores_actual);
    b.TopKBlocks(st.scores_actual, current_rows_, current_num_blocks_, ls.topk);
    b.SelectBlocks(ls.topk, current_rows_, st.host_tables, st.ws_slots, ls.ws_blocks, ls.ws_age, ls.fetch_src,
                   ls.fetch_dst, ls.resident_slots, ls.num_resident, ls.select_stats);
    if (cfg.transfers) {
      b.CopyBlocks(store.pool(layer), ls.fetch_src.Reshape({ls.fetch_src.numel()}), pool,
                   ls.fetch_dst.Reshape({ls.fetch_dst.numel()}));
    }
  } else if (measure_agreement_) {
    b.ScoreBlocks(q, current_rows_, current_num_blocks_, st.host_tables, store.kmin(layer), store.kmax(layer),
                  cfg.group_reduce, st.scores_actual);
    b.TopKBlocks(st.scores_actual, current_rows_, current_num_blocks_, ls.topk_actual);
    b.TopKOverlap(ls.topk, ls.topk_actual, current_rows_, ls.agree_stats);
  }
  b.AssembleSparseTables(seq_rows_, ls.resident_slots, ls.num_resident, tail_slots_, tail_lens_, meta_);
  return meta_;
}

void SparseAttentionPipeline::AfterAttention(int layer, const Tensor& q, LayerKvPool& pool) {
  if (!Active(layer)) return;
  const SparseConfig& cfg = manager_.config();
  if (cfg.predictor == SparsePredictor::kOracle || num_predicting_ == 0) {
    Exit(SparseStage::kAttention, layer);
    return;
  }
  Backend& b = backend_;
  HostKvStore& store = manager_.host_store();
  SparseDeviceState& st = manager_.state();
  SparseLayerState& ls = st.layer(layer);
  const int64_t T = q.dim(0);
  Tensor snapshot = q_snapshots_[static_cast<size_t>(layer)].Slice(0, num_predicting_);
  b.GatherRows(q.Reshape({T, q.dim(1) * q.dim(2)}), predict_gather_, snapshot);
  Exit(SparseStage::kAttention, layer);

  Enter(SparseStage::kPredict, layer);
  b.ScoreBlocks(snapshot.Reshape({num_predicting_, q.dim(1), q.dim(2)}), predict_rows_, predict_num_blocks_,
                st.host_tables, store.kmin(layer), store.kmax(layer), cfg.group_reduce, st.scores);
  b.TopKBlocks(st.scores, predict_rows_, predict_num_blocks_, ls.topk);
  Exit(SparseStage::kPredict, layer);

  Enter(SparseStage::kSelect, layer);
  b.SelectBlocks(ls.topk, predict_rows_, st.host_tables, st.ws_slots, ls.ws_blocks, ls.ws_age, ls.fetch_src,
                 ls.fetch_dst, ls.resident_slots, ls.num_resident, ls.select_stats);
  Exit(SparseStage::kSelect, layer);

  if (!cfg.transfers) return;  // measurement mode: nothing crosses PCIe
  Enter(SparseStage::kTransfer, layer);
  b.CopyBlocks(store.pool(layer), ls.fetch_src.Reshape({ls.fetch_src.numel()}), pool,
               ls.fetch_dst.Reshape({ls.fetch_dst.numel()}));
  Exit(SparseStage::kTransfer, layer);
}

SparseMetrics SparseAttentionPipeline::CollectMetrics() {
  const SparseModelShape& shape = manager_.shape();
  SparseDeviceState& st = manager_.state();
  SparseMetrics m;
  m.steps = metric_steps_;
  m.sparse_seq_steps = metric_seq_steps_;
  m.layers.resize(static_cast<size_t>(shape.num_layers));
  m.bytes_per_block = static_cast<int64_t>(2 * kBlockSize * shape.head_dim) *
                      static_cast<int64_t>(DTypeSize(backend_.activation_dtype()));
  m.transfer_wait_seconds = sync_ ? sync_->TakeTransferWaitSeconds() : 0.0;
  for (int64_t l = manager_.config().dense_layers; l < shape.num_layers; ++l) {
    SparseLayerState& ls = st.layer(l);
    const Tensor sel = backend_.Download(ls.select_stats), agree = backend_.Download(ls.agree_stats);
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
  }
  st.ZeroStats();
  metric_steps_ = 0;
  metric_seq_steps_ = 0;
  return m;
}

}  // namespace oasis

// SparseAttentionPipeline: the per-layer order of the sparse-KV operations inside one forward
// pass (docs/sparse.md §4), as an AttentionLayerHook of DecoderLM::Forward. Every operation
// is a Backend op over SparseDeviceState and the step's uploaded plan; nothing reads device
// memory on the host. For sparse layer l of step t:
//
//   BeforeAttention(l)  [main stream, after QKV/RoPE/KV append]
//     Enter(kAttention, l)      CUDA: wait transfer_done[l] of step t-1
//     CopyTokens                write-through of the real tokens' K/V to the host store
//     BlockSummaries            min/max of the blocks those tokens went to
//     oracle:   ScoreBlocks + TopKBlocks + SelectBlocks + CopyBlocks with the step's own query
//     sampled:  ScoreBlocks + TopKBlocks (real query) + TopKOverlap with the prediction of t-1
//               + FetchOverlap with the blocks the select of t-1 fetched
//     AssembleSparseTables      layer l's resident blocks + tail into the step's tables (in place)
//   attention
//   AfterAttention(l)   [draft / previous-query predictors]
//     GatherRows                snapshot of the predicting queries (q is reused by layer l+1)
//     Exit(kAttention, l)       CUDA: record attn_done[l]
//     Enter/Exit(kPredict, l)   ScoreBlocks + TopKBlocks  -> topk[l] for step t+1
//     Enter/Exit(kSelect, l)    SelectBlocks              -> fetch lists, resident table[l]
//     Enter/Exit(kTransfer, l)  CopyBlocks host -> GPU    (waits select and attn_done[l])
//
// The resident table written by select(l) at step t is copied into the batch's tables by
// AssembleSparseTables(l) at step t+1 after transfer_done[l]: that copy is the double buffer
// (attention of step t read the batch tables, never the state select writes).
//
// Owns the uploaded plan of the current step and the query snapshots. Not thread-safe: the
// thread running the forward pass.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/stage_sync.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_step_plan.h"

namespace oasis {

struct SparseLayerMetrics {
  int64_t hits = 0;           // predicted blocks already resident
  int64_t misses = 0;         // predicted blocks not resident
  int64_t fetched = 0;        // misses admitted (<= C per head per step)
  int64_t agree_overlap = 0;  // sampled: |predicted top-K ∩ real query's top-K|
  int64_t agree_total = 0;    // sampled: |real query's top-K|
  // Sampled at the same steps: of the blocks the previous select fetched for this step, how
  // many are in the step's real top-K when attention reads them ("fetched block used").
  int64_t fetch_used = 0;
  int64_t fetch_sampled = 0;
};

// Counters since the previous CollectMetrics().
struct SparseMetrics {
  int64_t steps = 0;                       // steps with at least one sparse sequence
  int64_t sparse_seq_steps = 0;            // Σ sparse sequences per step
  std::vector<SparseLayerMetrics> layers;  // [num_layers]; dense layers stay zero
  int64_t bytes_per_block = 0;             // K + V of one head-block: the H2D bytes of one fetch
  double transfer_wait_seconds = 0;

  SparseLayerMetrics Total() const;
  // Adds another rank's counters over its own KV heads (tensor parallelism): per-layer counts
  // add up; steps are the same on every rank; the transfer wait is the longest.
  void MergeRank(const SparseMetrics& other);
  double hit_rate() const;          // hits / (hits + misses)
  double agreement() const;         // agree_overlap / agree_total
  double fetch_use() const;         // fetch_used / fetch_sampled (0 when nothing was sampled)
  double fetched_per_step() const;  // blocks fetched per step, all requests, layers and heads
  double h2d_bytes_per_step() const;
};

// `plan` padded to a batch of `seqs` sequences and `tokens` tokens (a CUDA graph's bucket):
// padding sequences are dense (seq_rows -1, no tail, no summary update), padding tokens
// write nothing through (host_mapping -1). seqs/tokens must be at least the plan's.
SparseStepPlan PadStepPlan(const SparseStepPlan& plan, int64_t seqs, int64_t tokens);

class SparseAttentionPipeline final : public AttentionLayerHook {
 public:
  // Over the manager's device side `side` (tensor parallelism: one pipeline per rank, on
  // that rank's backend, with its local query heads; built and used on the rank's thread).
  SparseAttentionPipeline(SparseKvManager& manager, Backend& backend, int64_t num_q_heads,
                          SparseStageSync* sync = nullptr, int side = 0);

  // Uploads `plan` for the step whose device input has `attention` (its block_tables and
  // kv_lens are rewritten in place for sparse rows, layer by layer; the batch builder made
  // them wide enough) and `slot_mapping` ([T, Hkv] int64, where the step's K/V went).
  void BeginStep(const SparseStepPlan& plan, const AttentionMetadata& attention,
                 const Tensor& slot_mapping);
  void EndStep();

  // The same step in two halves, for CUDA graphs (docs/sparse.md §10): UploadPlan copies a
  // plan into persistent device buffers (fixed addresses, allocated by ReservePlan for up to
  // `max_seqs` batch sequences and `max_tokens` tokens; call it before any capture), padding
  // predict_gather to R rows (row 0: a harmless copy; predict_rows never names them), so the
  // predict stage always snapshots and scores R rows and the ops skip the inactive ones.
  // BeginPlannedStep then starts the step over those buffers without uploading: a captured
  // step replays with whatever the last UploadPlan wrote. The plan must have exactly the
  // batch's sequences and tokens (pad it with PadStepPlan for a padded batch).
  void ReservePlan(int64_t max_seqs, int64_t max_tokens);
  void UploadPlan(const SparseStepPlan& plan);
  void BeginPlannedStep(const AttentionMetadata& attention, const Tensor& slot_mapping);

  const AttentionMetadata& BeforeAttention(int layer, const Tensor& q, LayerKvPool& pool,
                                           const AttentionMetadata& step) override;
  void AfterAttention(int layer, const Tensor& q, LayerKvPool& pool) override;

  // Downloads and zeroes the device counters (a host synchronisation: call it every few steps).
  SparseMetrics CollectMetrics();

  SparseKvManager& manager() { return manager_; }
  SparseStageSync* stage_sync() const { return sync_; }
  int side() const { return side_; }
  // Unique over the process's pipelines (never reused, unlike an address): what a CUDA graph
  // captured over this pipeline's buffers is keyed by.
  uint64_t serial() const { return serial_; }

 private:
  bool Active(int layer) const;
  // Whether AfterAttention writes the step's new KV (summaries, host copy) on the side streams;
  // otherwise (oracle, or no sequence predicting) BeforeAttention does on the main stream.
  bool SideWrites() const;
  void Enter(SparseStage s, int64_t l) {
    if (sync_) sync_->Enter(s, l);
  }
  void Exit(SparseStage s, int64_t l) {
    if (sync_) sync_->Exit(s, l);
  }

  SparseKvManager& manager_;
  Backend& backend_;
  int64_t num_q_heads_;
  SparseStageSync* sync_;
  int side_;
  uint64_t serial_;
  bool in_step_ = false;
  int64_t num_sparse_ = 0, num_predicting_ = 0;
  bool measure_agreement_ = false;
  AttentionMetadata meta_;  // views of the step's tables, rewritten per layer
  Tensor slot_mapping_;
  // The step's plan on the device (SparseStepPlan).
  Tensor seq_rows_, tail_slots_, tail_lens_, host_mapping_, lag_src_, lag_dst_, summary_src_,
      summary_len_, summary_dst_, table_index_;
  Tensor predict_gather_, predict_rows_, predict_num_blocks_, current_rows_, current_num_blocks_;
  std::vector<Tensor> q_snapshots_;  // [num_layers] of [R * Q, Hq * D] (sparse layers only)
  // predict_gather entries per predicting sequence: 1, or Hkv * Q for chains of Q queries.
  int64_t GatherPerSequence() const {
    const int64_t q = manager_.config().chain_queries;
    return q == 1 ? 1 : q * manager_.shape().num_kv_heads;
  }
  // ReservePlan's persistent buffers (flat, at capacity) and the plan shape they hold.
  Tensor cap_seq_rows_, cap_tail_slots_, cap_tail_lens_, cap_host_mapping_, cap_lag_src_,
      cap_lag_dst_, cap_summary_src_, cap_summary_len_, cap_summary_dst_, cap_table_index_,
      cap_predict_gather_, cap_predict_rows_, cap_predict_num_blocks_, cap_current_rows_,
      cap_current_num_blocks_;
  int64_t cap_seqs_ = 0, cap_tokens_ = 0;
  bool planned_ = false;  // UploadPlan wrote the buffers since the last planned step began
  int64_t metric_steps_ = 0, metric_seq_steps_ = 0;
};

}  // namespace oasis

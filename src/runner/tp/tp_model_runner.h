// TpModelRunner: the ModelRunner the engine talks to under tensor parallelism
// (docs/parallel.md §3). It drives N ranks, each a ModelRunner over its own backend, model
// shard and KV pools, on one worker thread per rank (LockstepGroup): every call hands the
// same host batch to every rank, waits for all, and returns rank 0's results. Every rank
// computes the same logits (embedding and lm_head are replicated, the hidden states
// all-reduced), so rank 0's samples are the group's; the others' are compared with them
// (sample_mismatches()).
//
// KV heads and block tables. Rank r holds KV heads [r·Hkv/N, (r+1)·Hkv/N) in pools of its
// own. The engine sees rank 0's shard as the model (model().config() has the LOCAL head
// counts), so its block allocator and head-level tables cover Hkv/N heads per sequence, and
// the same table serves every rank: local head j of rank r (global head r·Hkv/N + j) lives
// in slot table[s, j, b] of rank r's pool. The allocator is thus shared logically — one slot
// id names the same (sequence, local head, block) on every rank — each pool holds
// num_kv_slots() slots of its own heads, and the memory plan counts local heads per GPU.
// Inputs whose tables list ALL the checkpoint's KV heads (full_config()) are accepted too:
// each rank then receives its own columns of block_tables / kv_lens / slot_mapping
// (SliceKvHeads), with slot ids that must be below num_kv_slots() on every rank (pools sized
// for the whole model: for callers that build global tables, e.g. tests against TP=1).
//
// Failures: a rank that throws fails the call on the caller's thread (std::runtime_error
// naming the rank) after the other ranks were aborted (TpRank::AbortFunction: NCCL abort, so none
// hangs in a collective) and returned; the runner is unusable from then on (every call
// throws). Sparse KV steps run per rank: each rank's runner holds its pipeline over its own
// device side of the sparse manager (ModelRunner::AttachSparse; docs/parallel.md §6).
//
// Owns the group and the ranks (destroyed on their own threads). Not thread-safe: the
// engine loop calls it. The engine thread may use rank 0's backend between calls (an
// EAGLE-3 head runs there, replicated work the other ranks skip).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/lockstep_group.h"
#include "runner/model_runner.h"

namespace oasis {

// One rank of the group: its backend, model shard (tp = {r, N, communicator}) and runner,
// plus whatever else it owns (its communicator). Created and destroyed on the rank's worker.
class TpRank {
 public:
  virtual ~TpRank() = default;
  virtual Backend& backend() = 0;
  virtual DecoderLM& model() = 0;
  virtual ModelRunner& runner() = 0;
  // What makes this rank's pending collectives return after another rank failed
  // (NcclCommunicator::AbortFunction). It is called on a helper thread, possibly while or
  // after this object is destroyed, so it must own what it uses. Empty: nothing to abort.
  virtual std::function<void()> AbortFunction() { return {}; }
};

// InvalidArgument unless size >= 1 and the config's num_attention_heads, num_key_value_heads
// and intermediate_size divide by it (the message names the count and the flag), before
// anything is loaded.
Status CheckTensorParallelSize(const ModelConfig& config, int size);

// The columns [first, first + count) of the KV-head dimension of a host batch: slot_mapping
// [T, H] → [T, count], kv_lens [S, H] → [S, count], block_tables [S, H, W] → [S, count, W];
// the other tensors are shared (views).
ForwardInput SliceKvHeads(const ForwardInput& host_input, int64_t first, int64_t count);

class TpModelRunner final : public ModelRunner {
 public:
  // `ranks[r]` was created on `group`'s worker r. InvalidArgument (after destroying the
  // ranks on their workers) unless there is one rank per worker, rank r's model is shard r
  // of group size N, and all ranks agree on the local config and num_kv_slots.
  static StatusOr<std::unique_ptr<TpModelRunner>> Create(
      std::unique_ptr<LockstepGroup> group, std::vector<std::unique_ptr<TpRank>> ranks);
  ~TpModelRunner() override;

  int size() const { return static_cast<int>(ranks_.size()); }
  TpRank& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }
  // Calls in which some rank sampled a token other than rank 0's (0 unless ranks diverge).
  int64_t sample_mismatches() const { return sample_mismatches_; }

  // Rank 0's host logits.
  Tensor Execute(const ForwardInput& host_input) override;
  // Every rank runs the step on its own runner and returns rank 0's samples. With a capture,
  // every rank captures into its own buffer and step.capture receives rank 0's (on rank 0's
  // device). A sparse step runs on every rank with the rank's own pipeline (its device side
  // of the sparse manager, its local KV heads: no communication beyond the forward pass's
  // all-reduces); its batch must list the ranks' local KV heads. `while_running` runs on the
  // calling thread once every rank has enqueued its step; `after_sampling` is not used.
  std::vector<SampleResult> Run(const StepInputs& step) override;
  int num_ranks() const override { return size(); }
  void ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn,
                   bool teardown = false) override;
  SparseStageSync* sparse_stage_sync() override { return nullptr; }

 protected:
  // Never used (the ranks' runners sample); throws.
  std::vector<SampleResult> SampleLogits(const Tensor& logits,
                                         const std::vector<SampleRow>& rows) override;

 private:
  TpModelRunner(std::unique_ptr<LockstepGroup> group, std::vector<std::unique_ptr<TpRank>> ranks);
  // Whether the batch lists all KV heads (slice per rank) rather than the local ones; throws
  // std::invalid_argument for any other head count.
  bool NeedsSlicing(const ForwardInput& host_input) const;
  // Runs step(r, rank r's input) on every rank.
  void RunStep(const ForwardInput& host_input,
               const std::function<void(int, const ForwardInput&)>& step,
               const std::function<void()>& while_running = {});
  void CompareSamples(const std::vector<std::vector<SampleResult>>& per_rank);

  std::unique_ptr<LockstepGroup> group_;
  std::vector<std::unique_ptr<TpRank>> ranks_;
  std::vector<std::function<void()>> aborts_;  // per rank, TpRank::AbortFunction()
  std::vector<ResidualCapture> captures_;      // ranks > 0: their own capture buffers
  int64_t sample_mismatches_ = 0;
};

}  // namespace oasis

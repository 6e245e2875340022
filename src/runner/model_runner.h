// ModelRunner: executes the steps of one DecoderLM over KV pools it owns. One call per engine
// step (Run): the plain runner uploads the host-built batch, runs the model eagerly and
// samples on the host; backends may provide faster runners (CUDA graphs for decode steps,
// sampling on the device) behind the same call, each choosing graph or eager itself.
// Owns the KV pools and, while sparse KV is attached, its sparse pipeline (one per rank).
// Not thread-safe: the engine loop (or a TP worker) owns it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/stage_sync.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"
#include "kvcache/sparse_step_plan.h"
#include "models/decoder_lm.h"
#include "runner/sampler.h"

namespace oasis {

// Where a step's sampled tokens sit on the device before the host has them: row r's token id
// (int32) at base + r · stride bytes, written by work queued on `stream` (a cudaStream_t for
// the CUDA backend).
struct DeviceSamples {
  const void* base = nullptr;
  int64_t stride = 0;
  void* stream = nullptr;
};

// The sparse part of a step (docs/sparse.md §9): the plan, and what the KV policy
// (SparseConfig) decided about running it, so that the runner reads no policy.
struct SparseStepInputs {
  // SparseKvManager::BuildStepPlan of this batch (the same sequences in the same order as
  // the step's input, built with StepSequence::sparse).
  const SparseStepPlan* plan = nullptr;
  // Whether a graph may replay the step: false when the selection reads the step's own
  // query (the oracle predictor), which only an eager step can.
  bool replayable = true;
  // SparseConfig::transfers: whether selected blocks cross PCIe (a graph captured with
  // transfers is not the graph without).
  bool transfers = true;
};

// Everything one step needs. The referenced input, rows and capture outlive the Run call.
struct StepInputs {
  // Host tensors (BuildHostForwardInput).
  const ForwardInput& input;
  // One per logits row; rows with needed == false get a default result.
  const std::vector<SampleRow>& rows;
  // The residual stream for a draft head from the same forward pass (lookahead decoding,
  // docs/lookahead.md), or null. The caller sets capture->layer_ids; the runner
  // (re)allocates capture->out as [layer_ids.size(), T', hidden] with T' >= T (activation
  // dtype, on the backend's device; rows past T are padding a device runner may add) and
  // fills its first T rows; it stays valid until the next step.
  ResidualCapture* capture = nullptr;
  // A step with sparse sequences: the runner runs it with its sparse pipeline (AttachSparse)
  // as the layer hook on every rank.
  std::optional<SparseStepInputs> sparse = std::nullopt;
  // Called once the forward pass is enqueued and before the runner waits for the samples:
  // host work that overlaps the device's (the engine prepares the draft head's next batch
  // there). It must not use the runner or its backend.
  std::function<void()> while_running = nullptr;
  // A runner that samples on the device calls it once, after the step's sampling is queued
  // and before it waits for it, so that more device work can queue behind the step on the
  // same stream (the engine chains the draft head's step there: docs/lookahead.md). Runners
  // (and steps) that cannot ignore it; the caller learns from the hook itself whether it ran.
  std::function<void(const DeviceSamples&)> after_sampling = nullptr;
};

class ModelRunner {
 public:
  ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots);
  virtual ~ModelRunner() = default;

  DecoderLM& model() { return model_; }
  const DecoderLM& model() const { return model_; }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }
  int64_t num_kv_slots() const { return num_kv_slots_; }
  // The KV pools, one per layer (the sparse manager copies from them when a request switches).
  std::vector<LayerKvPool>& kv_pools() { return kv_; }

  // One step: runs the forward pass of step.input (with the capture and the sparse pipeline
  // when asked) and samples one token per logits row (rows.size() == the number of logits
  // rows). The plain runner runs eagerly and samples on the host; device runners may replay
  // graphs and sample where the logits are, bringing back only tokens and log-probabilities.
  // A sparse step calls the pipeline's EndStep also when the forward pass throws.
  virtual std::vector<SampleResult> Run(const StepInputs& step);

  // Not a step (tests and tools that compare raw logits): `host_input` holds host tensors
  // (BuildHostForwardInput). Returns host F32 logits [R, vocab] for the requested rows.
  virtual Tensor Execute(const ForwardInput& host_input);

  // Sparse KV (docs/sparse.md): builds one SparseAttentionPipeline per rank over `manager`'s
  // device side r, each on its rank's thread with its backend, local query heads and the
  // runner's stage sync. The manager must outlive DetachSparse. DetachSparse destroys them on
  // their ranks' threads (`teardown`: also on a failed group, as ForEachRank).
  void AttachSparse(SparseKvManager& manager);
  void DetachSparse(bool teardown = false);
  // Each rank's pipeline counters since the last collection (SparseAttentionPipeline::
  // CollectMetrics, a host synchronisation, each on its rank's thread), and their sum over
  // the ranks (SparseMetrics::MergeRank).
  std::vector<SparseMetrics> CollectSparseMetricsEach();
  SparseMetrics CollectSparseMetrics();

  // Tensor parallelism: the number of ranks, and fn(r, rank r's own runner) on every rank,
  // each where that rank's backend may be used (its worker thread, its device current);
  // returns when all have returned. A single runner is its own rank 0 and runs fn inline.
  // `teardown`: also on a failed group, failures logged rather than thrown (destructors).
  virtual int num_ranks() const { return 1; }
  virtual void ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn,
                           bool teardown = false);
  // Where this runner's sparse pipeline orders its stages on the device's streams (predict,
  // select, transfer; SparseStageSync), for measurement (bench_sparse_decode --timeline).
  // nullptr (the plain runner): every op runs in order on the backend's current stream,
  // which is correct everywhere. Owned by the runner.
  virtual SparseStageSync* sparse_stage_sync() { return nullptr; }

 protected:
  // Samples one token per row of logits [R, vocab] where the forward pass left them. The
  // plain runner downloads them and samples on the host; device runners sample in place and
  // bring back only tokens and log-probabilities.
  virtual std::vector<SampleResult> SampleLogits(const Tensor& logits,
                                                 const std::vector<SampleRow>& rows);
  // (Re)allocates capture.out as [layer_ids.size(), tokens, hidden] unless it already is.
  void AllocateCapture(ResidualCapture& capture, int64_t tokens);
  // SampleResult::rank of the rows with want_rank (and needed), from `logits` [R, vocab] F32
  // on the backend's device: copied to the host a block of rows at a time when they are not
  // there already (prompt logprobs: correctness first; the rows are a prefill chunk's).
  void FillRanks(const Tensor& logits, const std::vector<SampleRow>& rows,
                 std::vector<SampleResult>& results);
  static bool WantsRanks(const std::vector<SampleRow>& rows);
  // Samples one token per logits row of host F32 logits [R, vocab] (rows with needed ==
  // false get a default result).
  static std::vector<SampleResult> SampleOnHost(const Tensor& logits,
                                                const std::vector<SampleRow>& rows);
  // This runner's own pipeline (AttachSparse; a TP rank's runner: its rank's). CHECKs that
  // one is attached.
  SparseAttentionPipeline& sparse_pipeline();

  // For runners whose KV pools live elsewhere (TpModelRunner: every rank's own runner holds
  // the pools of its KV heads): allocates none, kv_pools() stays empty.
  struct ExternalKvPools {};
  ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots, ExternalKvPools);

  DecoderLM& model_;
  Backend& backend_;
  int64_t num_kv_slots_;
  std::vector<LayerKvPool> kv_;

 private:
  std::unique_ptr<SparseAttentionPipeline> sparse_pipeline_;
};

}  // namespace oasis

// ModelRunner: executes forward passes of one DecoderLM over KV pools it owns.
// The plain runner uploads the host-built batch and runs the model eagerly; backends may
// provide faster runners (CUDA graphs for decode steps) behind the same interface.
// Owns the KV pools. Not thread-safe: the engine loop (or a TP worker) owns it.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "kvcache/sparse_pipeline.h"
#include "kvcache/sparse_step_plan.h"
#include "models/decoder_lm.h"

namespace oasis {

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

  // `host_input` holds host tensors (BuildHostForwardInput). Returns host F32 logits
  // [R, vocab] for the requested rows.
  virtual Tensor Execute(const ForwardInput& host_input);

  // Executes the step and samples one token per logits row (rows.size() == the number of
  // logits rows; rows with needed == false get a default result). The plain runner samples
  // on the host from Execute()'s logits; device runners sample where the logits are and
  // bring back only tokens and log-probabilities.
  virtual std::vector<SampleResult> ExecuteAndSample(const ForwardInput& host_input, const std::vector<SampleRow>& rows);

  // ExecuteAndSample that also captures the residual stream for a draft head from the same
  // forward pass (lookahead decoding, docs/lookahead.md). The caller sets
  // capture.layer_ids; the runner (re)allocates capture.out as [layer_ids.size(), T',
  // hidden] with T' >= T (activation dtype, on the backend's device; rows past T are
  // padding a device runner may add) and fills its first T rows; it stays valid until the
  // next step. The plain runner runs eagerly and samples on the host; device runners
  // may override it (e.g. a graph per decode bucket with a resident capture buffer).
  // `while_running`, when set, is called once the forward pass is enqueued and before the
  // runner waits for the samples: host work that overlaps the device's (the engine prepares
  // the draft head's next batch there). It must not use the runner or its backend.
  virtual std::vector<SampleResult> ExecuteSampleAndCapture(const ForwardInput& host_input,
                                                            const std::vector<SampleRow>& rows,
                                                            ResidualCapture& capture,
                                                            const std::function<void()>& while_running = {});

  // A step with sparse sequences (docs/sparse.md): `plan` is SparseKvManager::BuildStepPlan
  // of this batch (the same sequences in the same order as `host_input`, built with
  // StepSequence::sparse). The runner uploads the input, calls pipeline.BeginStep(plan, the
  // device attention metadata, the device slot mapping), runs the forward pass with the
  // pipeline as the layer hook (and the residual capture when `capture` is not null, as
  // ExecuteSampleAndCapture), calls pipeline.EndStep() (also when the forward pass throws)
  // and samples as ExecuteAndSample. The plain runner does all of it eagerly, which is
  // correct on every backend; a CUDA graph runner may override it (the hook inside the
  // captured forward; R-row sparse state has fixed shapes). `while_running` as in
  // ExecuteSampleAndCapture: called once the step is enqueued, before waiting for the samples.
  virtual std::vector<SampleResult> ExecuteSparseStep(const ForwardInput& host_input, const std::vector<SampleRow>& rows,
                                                      ResidualCapture* capture, SparseAttentionPipeline& pipeline,
                                                      const SparseStepPlan& plan,
                                                      const std::function<void()>& while_running = {});
  // The same step with one pipeline per rank (pipelines[r] over the sparse manager's device
  // side r; tensor parallelism, docs/parallel.md §6). A single-rank runner takes pipelines[0].
  virtual std::vector<SampleResult> ExecuteSparseStepRanks(const ForwardInput& host_input,
                                                           const std::vector<SampleRow>& rows,
                                                           ResidualCapture* capture,
                                                           const std::vector<SparseAttentionPipeline*>& pipelines,
                                                           const SparseStepPlan& plan,
                                                           const std::function<void()>& while_running = {});
  // Tensor parallelism: the number of ranks, and fn(r, rank r's own runner) on every rank,
  // each where that rank's backend may be used (its worker thread, its device current);
  // returns when all have returned. A single runner is its own rank 0 and runs fn inline.
  // `teardown`: also on a failed group, failures logged rather than thrown (destructors).
  virtual int num_ranks() const { return 1; }
  virtual void ForEachRank(const std::function<void(int rank, ModelRunner& runner)>& fn, bool teardown = false);
  // Where the sparse pipeline orders its stages on the device's streams (predict, select,
  // transfer; SparseStageSync). nullptr (the plain runner): every op runs in order on the
  // backend's current stream, which is correct everywhere. Owned by the runner; the engine
  // passes it to its SparseAttentionPipeline at construction.
  virtual SparseStageSync* sparse_stage_sync() { return nullptr; }

  // Where a step's sampled tokens sit on the device before the host has them: row r's token id
  // (int32) at base + r · stride bytes, written by work queued on `stream` (a cudaStream_t for
  // the CUDA backend).
  struct DeviceSamples {
    const void* base = nullptr;
    int64_t stride = 0;
    void* stream = nullptr;
  };
  // A hook for the next ExecuteSampleAndCapture: a runner that samples on the device calls it
  // once, after the step's sampling is queued and before it waits for it, so that more device
  // work can queue behind the step on the same stream (the engine chains the draft head's
  // step there: docs/lookahead.md). Runners that cannot ignore it; the caller learns from the
  // hook itself whether it ran. The call that runs it (or not) clears it.
  void SetAfterSampling(std::function<void(const DeviceSamples&)> hook) { after_sampling_ = std::move(hook); }

 protected:
  std::function<void(const DeviceSamples&)> TakeAfterSampling() { return std::exchange(after_sampling_, {}); }
  // Runs the step and returns the logits [R, vocab] where the backend keeps them (device
  // memory for GPU backends; valid until the next step).
  virtual Tensor ForwardLogits(const ForwardInput& host_input);
  // Samples one token per row of logits [R, vocab] where ForwardLogits left them. The plain
  // runner downloads them and samples on the host; device runners sample in place and bring
  // back only tokens and log-probabilities.
  virtual std::vector<SampleResult> SampleLogits(const Tensor& logits, const std::vector<SampleRow>& rows);
  // (Re)allocates capture.out as [layer_ids.size(), tokens, hidden] unless it already is.
  void AllocateCapture(ResidualCapture& capture, int64_t tokens);
  // Samples one token per logits row of host F32 logits [R, vocab] (rows with needed ==
  // false get a default result).
  static std::vector<SampleResult> SampleOnHost(const Tensor& logits, const std::vector<SampleRow>& rows);

  // For runners whose KV pools live elsewhere (TpModelRunner: every rank's own runner holds
  // the pools of its KV heads): allocates none, kv_pools() stays empty.
  struct ExternalKvPools {};
  ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots, ExternalKvPools);

  DecoderLM& model_;
  Backend& backend_;
  int64_t num_kv_slots_;
  std::vector<LayerKvPool> kv_;
  std::function<void(const DeviceSamples&)> after_sampling_;
};

}  // namespace oasis

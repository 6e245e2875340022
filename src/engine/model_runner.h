// ModelRunner: executes forward passes of one DecoderLM over KV pools it owns.
// The plain runner uploads the host-built batch and runs the model eagerly; backends may
// provide faster runners (CUDA graphs for decode steps) behind the same interface.
// Owns the KV pools. Not thread-safe: the engine loop (or a TP worker) owns it.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "models/decoder_lm.h"

namespace oasis {

class ModelRunner {
 public:
  ModelRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots);
  virtual ~ModelRunner() = default;

  DecoderLM& model() { return model_; }
  const DecoderLM& model() const { return model_; }
  Backend& backend() { return backend_; }
  int64_t num_kv_slots() const { return num_kv_slots_; }

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
  virtual std::vector<SampleResult> ExecuteSampleAndCapture(const ForwardInput& host_input,
                                                            const std::vector<SampleRow>& rows,
                                                            ResidualCapture& capture);

 protected:
  // Runs the step and returns the logits [R, vocab] where the backend keeps them (device
  // memory for GPU backends; valid until the next step).
  virtual Tensor ForwardLogits(const ForwardInput& host_input);
  // Samples one token per logits row of host F32 logits [R, vocab] (rows with needed ==
  // false get a default result).
  static std::vector<SampleResult> SampleOnHost(const Tensor& logits, const std::vector<SampleRow>& rows);

  DecoderLM& model_;
  Backend& backend_;
  int64_t num_kv_slots_;
  std::vector<LayerKvPool> kv_;
};

}  // namespace oasis

// DraftRunner: runs the EAGLE-3 draft head of lookahead decoding (docs/lookahead.md) over
// its own one-layer paged KV cache and returns greedy draft tokens as target ids. The
// engine builds the head's batch on the host (token ids = the NEXT token of each target
// position, positions, the head's own head-level block tables) and names, per head row,
// the row of the target's residual capture (ModelRunner::Run with a capture, of the
// same step) that feeds it.
//
// The plain runner uploads the batch, runs Eagle3Head::Forward eagerly, downloads the
// logits and takes the argmax on the host. Device backends override Propose (e.g. argmax
// on the device through Eagle3Head::draft_to_target_device(), a resident capture-row index,
// CUDA graphs) behind the same interface.
//
// Owns the head's KV pool (borrows the head, which must outlive it). Not thread-safe: the
// engine loop owns it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "models/decoder_lm.h"
#include "models/eagle3.h"
#include "runner/model_runner.h"

namespace oasis {

class DraftRunner {
 public:
  // A head KV pool of `num_kv_slots` head-blocks (of the head's num_key_value_heads).
  DraftRunner(Eagle3Head& head, Backend& backend, int64_t num_kv_slots);
  virtual ~DraftRunner() = default;

  Eagle3Head& head() { return head_; }
  const Eagle3Head& head() const { return head_; }
  Backend& backend() { return backend_; }
  int64_t num_kv_slots() const { return num_kv_slots_; }
  int32_t num_kv_heads() const { return static_cast<int32_t>(head_.config().num_key_value_heads); }
  // The target layers whose residual streams the head reads (ResidualCapture::layer_ids).
  const std::vector<int64_t>& aux_layer_ids() const { return head_.aux_layer_ids(); }
  // The head's KV pool [num_kv_slots, kBlockSize, head_dim] (disaggregation copies a
  // request's head KV out of it and into it).
  LayerKvPool& kv_pool() { return kv_; }

  // One head step. `host_input`: host tensors laid out like the target's ForwardInput for
  // the head (BuildHostForwardInput over the head's block tables; token_ids[t] = the token
  // AFTER the target position whose features row t uses; positions = those target
  // positions); its logit_rows name the rows whose drafts are wanted (may be empty: the
  // step only appends K/V). `aux`: the target's capture [num_aux, T_target, target_hidden]
  // on the backend's device; head row t reads its row aux_rows[t]. Appends every row's K/V
  // to the head's pool. Returns one greedy draft token (a target id) per logits row.
  virtual std::vector<int32_t> Propose(const ForwardInput& host_input, const Tensor& aux,
                                       std::span<const int32_t> aux_rows);

  // Propose, queued behind the target step on the device instead of run after it (runners
  // that can: the CUDA one; the others return false and queue nothing). Head row
  // pairs[2i + 1]'s token id is the target step's sampled token of sample row pairs[2i], read
  // on the device from `samples` (the target runner's DeviceSamples, handed to the
  // StepInputs::after_sampling hook); the other ids come from host_input. Returns whether
  // the step was queued; then CollectChained (after the target's samples are back) returns
  // its drafts, and must be called before the next Propose or ProposeChained.
  virtual bool ProposeChained(const ForwardInput& host_input, const Tensor& aux,
                              std::span<const int32_t> aux_rows, const DeviceSamples& samples,
                              std::span<const int32_t> pairs) {
    (void)host_input, (void)aux, (void)aux_rows, (void)samples, (void)pairs;
    return false;
  }
  virtual std::vector<int32_t> CollectChained() { return {}; }

  // Draft chains (--num-speculative-tokens > 1; docs/lookahead.md "Chains"). A step's drafts
  // (one per logits row) with the logits rows' pre-norm outputs [R, hidden] on the device,
  // which feed the chain's next step.
  struct ChainStep {
    std::vector<int32_t> drafts;
    Tensor features;
  };
  // Propose, also returning the logits rows' features.
  virtual ChainStep ProposeWithFeatures(const ForwardInput& host_input, const Tensor& aux,
                                        std::span<const int32_t> aux_rows);
  // One chained step: head row t embeds host_input's token t (the previous draft) at its
  // position and takes features[feature_rows[t]] (a previous ChainStep's) as its residual
  // input; every row is a logits row (host_input.logit_rows = 0..T-1). Appends the rows' K/V.
  virtual ChainStep ProposeFromFeatures(const ForwardInput& host_input, const Tensor& features,
                                        std::span<const int32_t> feature_rows);

 protected:
  Eagle3Head& head_;
  Backend& backend_;
  int64_t num_kv_slots_;
  LayerKvPool kv_;
};

// Head-blocks a draft head's pool needs to hold as many tokens as a target pool of
// `target_slots` head-blocks: ceil(target_slots * head_kv_heads / target_kv_heads).
inline int64_t DraftKvSlotsFor(int64_t target_slots, int64_t target_kv_heads,
                               int64_t head_kv_heads) {
  return (target_slots * head_kv_heads + target_kv_heads - 1) / target_kv_heads;
}

}  // namespace oasis

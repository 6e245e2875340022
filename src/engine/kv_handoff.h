// Disaggregated prefill and decode at the engine level (docs/disaggregation.md §2, §5): what a
// prefill instance's engine hands out after a request's handoff step, and what a decode
// instance's engine takes in to continue it. The transport (the UCX staging pool on the
// prefill side, the remote reader on the decode side) implements the two interfaces below in
// src/disagg; the engine packs a request's staged state into a lease and unpacks it on the
// other side (disagg/staged_kv.h, over the layout of disagg/staged_layout.h) and fills the
// handoff ticket's contents.
//
// Prefill side: a request submitted with EngineRequest::handoff runs its prompt, samples x1,
// switches to sparse at once, runs one sparse step (x1 and, with the draft predictor, x̂2),
// samples x2, runs the draft head (x̂3) and then, instead of decoding on, exports: the KV of
// its P + 1 tokens from the host store, every block summary, the draft head's KV, and per
// (layer, KV head) the blocks decode will attend to first (its working set, then the
// prediction's blocks not yet resident, then the tail block). It finishes with
// FinishReasonKind::kHandoff and the encoded ticket in RequestOutput::handoff_ticket.
//
// Decode side: a request submitted with EngineRequest::import (a parsed, checked ticket and a
// source to fetch from) is admitted without a prefill: host-store room is reserved, the blocks
// to fetch (the admission lists, or every block in full-transfer mode) are read from the
// remote lease straight into the host store on the engine's import thread, then on the loop
// thread the summaries and the draft KV are uploaded, the working sets are filled on the GPU
// (disagg::ImportSparse) and the request decodes from x2 on, emitting x1 and x2
// first (with the log-probabilities the prefill node computed) so its stream is the whole
// completion.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "disagg/kv_requantize.h"
#include "disagg/staged_kv.h"
#include "disagg/staged_layout.h"
#include "disagg/ticket.h"
#include "oasis/status.h"
#include "runner/sampler.h"

namespace oasis {

// A lease of staging slots for one handoff (prefill side). Destroying it before Commit gives
// the slots back.
class KvHandoffLease {
 public:
  virtual ~KvHandoffLease() = default;
  // Host memory of slot `ordinal` (< layout.num_slots(), layout.slot_bytes() bytes).
  virtual void* Slot(uint64_t ordinal) = 0;
  // Seals the lease: fills the transport fields of `ticket` (address, pool, lease id, TTL,
  // extents) and returns it encoded. The slots then live until the decode side completes
  // or aborts the lease, or it expires.
  virtual StatusOr<std::string> Commit(disagg::HandoffTicket ticket) = 0;
};

class KvHandoffExporter {
 public:
  virtual ~KvHandoffExporter() = default;
  // On the engine loop thread: room for a request of this layout, or ResourceExhausted (the
  // staging pool is full: the request fails and the router tries another instance).
  virtual StatusOr<std::unique_ptr<KvHandoffLease>> Acquire(
      const disagg::StagedKvLayout& layout) = 0;
};

// One slot of the lease to read into local memory (slot_bytes of host memory).
using KvFetchItem = disagg::StagedSlotRef;

// The remote side of one imported request (decode side).
class KvImportSource {
 public:
  virtual ~KvImportSource() = default;
  // The parsed ticket (checked against this instance's model by the engine at Submit).
  virtual const disagg::HandoffTicket& ticket() const = 0;
  // true: fetch every KV block at admission (the full-transfer baseline, §6); false: the
  // admission lists only (remote partial fetch).
  virtual bool full_transfer() const = 0;
  // On the engine's import thread: reads the slots into their destinations, all or an error.
  virtual Status Fetch(const std::vector<KvFetchItem>& items) = 0;
  // The request no longer needs the lease: it finished (`completed`) or was aborted or
  // failed. Called once, on the engine loop thread; must not block for long.
  virtual void Release(bool completed) = 0;

  // FP8 KV: how the fetched bytes map from the ticket's scales into this instance's (the
  // identity when they are equal, and for other dtypes). Set by the engine on its loop thread
  // before the request's first fetch; read by its fetch threads after each fetch.
  void set_requantizer(disagg::KvRequantizer q) { requantizer_ = std::move(q); }
  const disagg::KvRequantizer& requantizer() const { return requantizer_; }

 private:
  disagg::KvRequantizer requantizer_;
};

// x1's and x2's sampling results as the prefill node computed them, and the seed, carried in
// the ticket's opaque sampling state so that the decode node emits them unchanged and samples
// on identically.
struct HandoffSampling {
  uint64_t seed = 0;
  struct Token {
    float logprob = 0.0f;
    std::vector<TokenLogprob> top;  // at most kMaxTopLogprobs
  };
  std::vector<Token> tokens;  // x1, x2
};
std::string EncodeHandoffSampling(const HandoffSampling& s);
StatusOr<HandoffSampling> ParseHandoffSampling(std::string_view bytes);

}  // namespace oasis

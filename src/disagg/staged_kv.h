// Pack and unpack of one request's staged state (docs/disaggregation.md §3): the K/V of every
// staged block from the host store, every block summary, and the EAGLE-3 draft head's KV,
// to and from the slots of a staging lease. One description of where each piece lives — the
// StagedKvLayout's ordinals and, locally, a StagedKvHome — serves both directions: the
// prefill instance packs after the handoff step, the decode instance unpacks in two halves
// (the reads' destinations before its fetch, the device uploads after).
//
// Neither keeps a reference to the home; the unpacker owns the landing buffers of the
// summaries and draft KV between its two halves. Not thread-safe: the engine loop thread (the
// fetch between the halves writes only the destinations it was given).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "disagg/kv_import.h"
#include "disagg/staged_layout.h"
#include "kvcache/head_block_table.h"
#include "kvcache/sparse_kv_manager.h"
#include "oasis/status.h"

namespace oasis::disagg {

// Where one request's staged state lives on this instance: its K/V and summaries in the host
// store (the manager's host slots / cells of request `id`, staged layer i = model layer
// dense_layers + i) and its draft head's KV blocks (logical block b of head h in
// draft_table's slot, of draft_pool).
struct StagedKvHome {
  Backend* backend = nullptr;  // the device of the summaries and the draft KV pool
  SparseKvManager* manager = nullptr;
  uint64_t id = 0;
  LayerKvPool* draft_pool = nullptr;  // [slots, kBlockSize, draft_head_dim]; null: no draft KV
  const HeadBlockTable* draft_table = nullptr;
};

// One slot of a lease and local memory of layout.slot_bytes() to read into.
struct StagedSlotRef {
  uint64_t ordinal = 0;
  void* dst = nullptr;
};

// Prefill side: copies the request's staged state into a lease; slot(ordinal) is the lease's
// memory of that slot. The layout's draft KV is packed only when it has draft heads (then
// home.draft_pool and draft_table are needed). Downloads from the device (a sync).
void PackStagedKv(const StagedKvLayout& layout, const StagedKvHome& home,
                  const std::function<void*(uint64_t ordinal)>& slot);

// Decode side.
class StagedKvUnpacker {
 public:
  explicit StagedKvUnpacker(const StagedKvLayout& layout) : layout_(layout) {}

  // The reads of the request's admission: the K/V of `blocks[i * Hkv + h]` of staged layer i
  // and head h (null: every staged block) straight into the home's host store, and every
  // summary and draft KV slot into this unpacker's buffers.
  std::vector<StagedSlotRef> Destinations(const StagedKvHome& home,
                                          const std::vector<std::vector<uint16_t>>* blocks);
  // After those reads landed: the summaries into the host store's summary rows of the
  // request, the draft KV (when the layout has draft heads and the home a draft pool) into its
  // draft blocks.
  void Finish(const StagedKvHome& home);

 private:
  StagedKvLayout layout_;
  std::vector<char> summaries_, draft_;  // [num_summary_slots][slot_bytes], [num_draft_slots][...]
};

// Drift (partial mode): the reads of the K and V of `blocks` (model layers) into `buffer`,
// resized to hold them (block i: K then V); then, once read, block i stored into host slot
// `slot` of the host store.
std::vector<StagedSlotRef> DriftReads(const StagedKvLayout& layout, int64_t first_layer,
                                      const std::vector<RemoteBlock>& blocks,
                                      std::vector<char>& buffer);
void StoreDriftBlock(const StagedKvLayout& layout, HostKvStore& store, const RemoteBlock& b,
                     int32_t slot, const std::vector<char>& buffer, size_t i);

}  // namespace oasis::disagg

// The handoff ticket (docs/disaggregation.md §3): what the router passes from the prefill
// instance to the decode instance, next to the OpenAI request, so that the decode node can
// find the request's staged state (staging address, pool id, lease and its slots), check it
// against its own model (geometry), continue the token stream (x1, x2, draft x̂3, sampling
// state) and pull the admission set (per (layer, KV head) block lists).
//
// Binary, little-endian, version 3 (2 added the prompt block hashes, 3 the KV dtype, the
// draft dtype and the FP8 scales; this build reads version 3 only):
//   magic "OKHT", u16 version (3)
//   staging address    u16 length + bytes: "host:port" of the prefill node's StagingServer
//                      (1..kMaxTicketAddressBytes, host non-empty, port 1..65535 in decimal)
//   pool id            u64
//   lease id           u64
//   lease TTL ms       u32 (> 0)
//   geometry           u32 × 9: StagedKvGeometry (layers, KV heads, head_dim, dtype bytes,
//                      blocks, draft KV heads, draft head_dim, KV dtype code, draft dtype
//                      bytes); must make a StagedKvLayout, with blocks ≤ 65536 (admission ids
//                      are u16) and a slot of at most kMaxBlockBytes
//   prompt length P    u32 (≥ 1); blocks must be ceil((P + 1) / 16): prompt + x1 are staged
//   position           u32: the position of x2, which is P + 1 (x1 is at P)
//   tokens             u32 count + count × u32: x1, x2, then x̂3 when the geometry stages a
//                      draft head (draft KV heads > 0): count 3 with a draft, 2 without
//   sampling state     u16 length + bytes (0..kMaxSamplingStateBytes; opaque here)
//   slot extents       EncodeSlotExtents (wire.h): the lease's slots in ordinal order;
//                      disjoint, below kMaxBlocks, their slots summing to the layout's
//                      num_slots()
//   admission lists    layers × KV heads lists, (l, h) in order l-major: u16 count +
//                      count × u16 block ids, each id < blocks, no id twice in one list
//   prompt block hashes u32 count (= P / 16) + count × u64
//   KV scales          u32 count: layers × KV heads for an FP8 (e4m3) KV dtype, else 0; then
//                      count × f32 K scales and count × f32 V scales, (l, h) l-major: the
//                      prefill instance's per-(layer, KV head) scales, finite and > 0
// Nothing may follow the KV scales.
//
// The parser treats its input as untrusted (fuzzed: tests/fuzz/fuzz_disagg_ticket.cpp):
// every rejection is kInvalidArgument, its message naming the field. Value type;
// thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "disagg/staged_layout.h"
#include "disagg/wire.h"
#include "oasis/status.h"

namespace oasis::disagg {

inline constexpr uint16_t kHandoffTicketVersion = 3;
inline constexpr size_t kMaxTicketAddressBytes = 1024;
inline constexpr size_t kMaxSamplingStateBytes = 4096;
inline constexpr uint32_t kMaxTicketBlocks = 65536;  // admission ids are u16

struct HandoffTicket {
  std::string staging_address;  // "host:port"
  uint64_t pool_id = 0;
  uint64_t lease_id = 0;
  uint32_t lease_ttl_ms = 0;
  StagedKvGeometry geometry;
  uint32_t prompt_length = 0;  // P
  uint32_t position = 0;       // of x2 (= P + 1)
  // x1, x2, and the draft x̂3 when geometry.draft_kv_heads > 0.
  std::vector<uint32_t> tokens;
  std::string sampling_state;  // opaque: seed / RNG counter
  std::vector<SlotExtent> extents;
  // admission[l * num_kv_heads + h]: logical block ids of the admission set of (l, h).
  std::vector<std::vector<uint16_t>> admission;
  // The chained hashes of the prompt's full blocks (exactly prompt_length / 16 of them; the
  // prefix cache's keys, kvcache/prefix_cache.h, with the request's cache salt): the staged
  // KV of those blocks is the prompt's dense prefill, which a decode instance may already hold
  // from an earlier import of the same prefix and then does not fetch.
  std::vector<uint64_t> prompt_block_hashes;
  // FP8 KV (geometry.kv_dtype e4m3): the scales the staged bytes are in, [layers × KV heads]
  // each (staged layer l, head h at l · Hkv + h): a stored x of (l, h) stands for
  // x · k_scales[l · Hkv + h] (keys) or x · v_scales[...] (values). Empty otherwise.
  std::vector<float> k_scales, v_scales;

  bool operator==(const HandoffTicket& o) const;
};

// Tokens a ticket of this geometry carries: 3 with a staged draft head, 2 without.
inline uint32_t TicketTokenCount(const StagedKvGeometry& g) { return g.draft_kv_heads > 0 ? 3 : 2; }

// Writes the ticket. Precondition (checked): lengths fit their fields (address and sampling
// state ≤ 65535 bytes, each admission list ≤ 65535 ids). It does not validate the contents:
// ParseHandoffTicket(EncodeHandoffTicket(t)) succeeds only for a valid t.
std::string EncodeHandoffTicket(const HandoffTicket& t);
StatusOr<HandoffTicket> ParseHandoffTicket(std::string_view bytes);

// What a decode instance serves, to check a parsed ticket against before it reads anything
// (ParseHandoffTicket only checks the ticket against itself).
struct DecodeSideModel {
  StagedKvGeometry geometry;  // num_blocks ignored: staged layers, this rank's KV heads,
                              // head_dim, KV dtype, and the draft head's KV (0 heads: none)
  uint32_t vocab_size = 0;    // the target's: x1, x2 and x̂3 must be below it
  uint32_t max_context = 0;   // positions must stay below it (the engine's context length)
  uint32_t topk_blocks = 0;   // K: an admission list holds at most 2K + 1 blocks (the union
                              // of the x1 and x̂2 top-K sets plus the tail); 0 = unchecked
  uint64_t pool_id = 0;       // the staging pool's id from its descriptor; 0 = unchecked
};

// Ok, or kInvalidArgument naming the first mismatch ("handoff ticket for this model: ...,
// ticket X, model Y"): the KV dtype first (by name: both instances of a pair need the same
// --kv-cache-dtype), the geometry (each field), the pool id, tokens outside the vocabulary,
// a context of P + 2 tokens that does not fit (x2 decodes at P + 1 and writes its KV there),
// and admission lists that lack the tail block (nb − 1, where x1's KV went) or are larger
// than 2K + 1.
Status CheckTicketForDecode(const HandoffTicket& t, const DecodeSideModel& m);

}  // namespace oasis::disagg

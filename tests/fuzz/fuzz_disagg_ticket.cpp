// libFuzzer target: the handoff ticket (src/disagg/ticket.h) on arbitrary bytes — what a
// decode node parses from the router's /internal/decode body. A rejection must carry a
// message; a successful parse must satisfy the documented invariants and re-encode to
// exactly the input; the decode side's check of it (CheckTicketForDecode) must answer with a
// message and reject another geometry. Seeds (tests/fuzz/corpus/disagg_ticket/) are kept current by
// test_disagg_wire.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "disagg/ticket.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oasis::disagg;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto t = ParseHandoffTicket(bytes);
  if (!t.ok()) {
    if (t.status().message().empty()) __builtin_trap();
    return 0;
  }
  const StagedKvGeometry& g = t->geometry;
  auto layout = StagedKvLayout::Create(g);
  if (!layout.ok()) __builtin_trap();
  if (t->staging_address.empty() || t->lease_ttl_ms == 0) __builtin_trap();
  if (t->tokens.size() != TicketTokenCount(g)) __builtin_trap();
  if (t->position != uint64_t{t->prompt_length} + 1) __builtin_trap();
  uint64_t slots = 0;
  for (const SlotExtent& e : t->extents) slots += e.count;
  if (slots != layout->num_slots()) __builtin_trap();
  if (t->admission.size() != uint64_t{g.num_layers} * g.num_kv_heads) __builtin_trap();
  for (const auto& list : t->admission) {
    std::vector<bool> seen(g.num_blocks);
    for (uint16_t id : list) {
      if (id >= g.num_blocks || seen[id]) __builtin_trap();
      seen[id] = true;
    }
  }
  if (EncodeHandoffTicket(*t) != bytes) __builtin_trap();
  // The decode side's check of a parsed ticket: against its own geometry it may only reject
  // what the model bounds (a small vocabulary and context, K 1) or a missing tail block,
  // always with a message; against another geometry it must reject.
  DecodeSideModel m{.geometry = g, .vocab_size = 1000, .max_context = 4096, .topk_blocks = 1, .pool_id = t->pool_id};
  const oasis::Status same = CheckTicketForDecode(*t, m);
  if (!same.ok() && same.message().empty()) __builtin_trap();
  m.geometry.head_dim += 1;
  if (CheckTicketForDecode(*t, m).ok()) __builtin_trap();
  return 0;
}

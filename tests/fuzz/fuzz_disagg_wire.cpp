// libFuzzer target: the disaggregation wire formats (src/disagg/wire.h) on arbitrary bytes —
// what a decode node parses from a prefill node's hello reply, and what a staging server
// parses from lease messages and handoffs (slot extents). The first byte picks the parser. A
// successful parse must re-serialize to exactly the input and satisfy the documented bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "disagg/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oasis::disagg;
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 3 == 2) {
    auto ext = ParseSlotExtents(bytes, kMaxBlocks);
    if (!ext.ok()) {
      if (ext.status().message().empty()) __builtin_trap();
      return 0;
    }
    for (const SlotExtent& e : *ext) {
      if (e.count == 0 || uint64_t{e.start} + e.count > kMaxBlocks) __builtin_trap();
    }
    if (EncodeSlotExtents(*ext) != bytes) __builtin_trap();
  } else if (data[0] % 3 == 1) {
    auto d = ParseDescriptor(bytes);
    if (!d.ok()) {
      if (d.status().message().empty()) __builtin_trap();
      return 0;
    }
    if (d->block_bytes == 0 || d->block_bytes > kMaxBlockBytes) __builtin_trap();
    if (d->num_blocks == 0 || d->num_blocks > kMaxBlocks) __builtin_trap();
    if (d->rkey.empty() || d->rkey.size() > kMaxRkeyBytes) __builtin_trap();
    // The last block's end does not wrap.
    if (d->BlockAddress(d->num_blocks - 1) + d->block_bytes < d->base_address) __builtin_trap();
    if (SerializeDescriptor(*d) != bytes) __builtin_trap();
  } else {
    auto ids = ParseLeaseIds(bytes);
    if (!ids.ok()) {
      if (ids.status().message().empty()) __builtin_trap();
      return 0;
    }
    if (ids->size() > kMaxLeaseIdsPerMessage) __builtin_trap();
    if (EncodeLeaseIds(*ids) != bytes) __builtin_trap();
  }
  return 0;
}

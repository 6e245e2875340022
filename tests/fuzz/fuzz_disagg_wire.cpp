// libFuzzer target: the disaggregation wire formats (src/disagg/wire.h) on arbitrary bytes —
// what a decode node parses from a prefill node's hello reply or refusal, and what a staging
// server parses from hellos (and checks against its secret), lease messages and handoffs
// (slot extents). The first byte picks the parser (mod 5: 0 lease ids, 1 descriptor, 2 slot
// extents, 3 hello, 4 hello refusal). A successful parse must re-serialize to exactly the
// input and satisfy the documented bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "disagg/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oasis::disagg;
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int selector = data[0] % 5;
  if (selector == 3) {
    auto h = ParseHello(bytes);
    // The server's check agrees with the parser: a hello it cannot parse is never accepted,
    // one it can is accepted by a server without a secret and by one with that secret.
    const auto refusal = CheckHello(bytes, "fuzz-secret");
    if (!h.ok()) {
      if (h.status().message().empty()) __builtin_trap();
      if (!refusal || *refusal == HelloRefusal::kSecret) __builtin_trap();
      if (!CheckHello(bytes, "")) __builtin_trap();
      return 0;
    }
    if (h->version != kProtocolVersion || h->secret.size() > kMaxSecretBytes) __builtin_trap();
    if (EncodeHello(h->secret) != bytes) __builtin_trap();
    if (CheckHello(bytes, "") || CheckHello(bytes, h->secret)) __builtin_trap();
    if (refusal.has_value() != (h->secret != "fuzz-secret")) __builtin_trap();
    if (refusal && *refusal != HelloRefusal::kSecret) __builtin_trap();
    return 0;
  }
  if (selector == 4) {
    auto r = ParseHelloRefusal(bytes);
    if (!r.ok()) {
      if (r.status().message().empty()) __builtin_trap();
      return 0;
    }
    // The server's version is whatever it said; the reason is one of the known ones.
    std::string again = EncodeHelloRefusal(r->reason);
    if (again.substr(0, 4) != bytes.substr(0, 4)) __builtin_trap();
    if (ParseHelloRefusal(again).value().server_version != kProtocolVersion) __builtin_trap();
    if (DescribeHelloRefusal(*r).empty()) __builtin_trap();
    return 0;
  }
  if (selector == 2) {
    auto ext = ParseSlotExtents(bytes, kMaxBlocks);
    if (!ext.ok()) {
      if (ext.status().message().empty()) __builtin_trap();
      return 0;
    }
    for (const SlotExtent& e : *ext) {
      if (e.count == 0 || uint64_t{e.start} + e.count > kMaxBlocks) __builtin_trap();
    }
    if (EncodeSlotExtents(*ext) != bytes) __builtin_trap();
  } else if (selector == 1) {
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

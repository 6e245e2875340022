// The bytes that cross the network between a prefill node's staging pool and a decode node,
// other than KV itself: the staging-pool descriptor (what a remote reader needs to address
// the pool with RMA gets) and the payloads of the control active messages (lease ids).
//
// Everything here is plain data and parsing, without UCX, so that the parsers can be fuzzed
// (tests/fuzz/fuzz_disagg_wire.cpp). All integers are little-endian. Parsers treat their
// input as untrusted: every length and count is checked against the bytes present, and a
// descriptor's geometry is checked for overflow. Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/status.h"

namespace oasis::disagg {

// Describes one registered staging pool: `num_blocks` slots of `block_bytes` each, laid out
// contiguously from `base_address` in the owner's address space, readable with the packed
// UCX remote key `rkey`. `pool_id` is random per pool instance, so a decode node can tell a
// restarted prefill node (whose old block indices mean nothing) from the one it talked to.
//
// Serialized layout (version 1), 44 bytes + rkey:
//   offset  size  field
//        0     4  magic "OKSP"
//        4     2  version (1)
//        6     2  reserved (0)
//        8     8  pool_id
//       16     8  base_address
//       24     8  block_bytes   (1 .. kMaxBlockBytes)
//       32     8  num_blocks    (1 .. kMaxBlocks; base + num_blocks * block_bytes must not wrap)
//       40     4  rkey_len      (1 .. kMaxRkeyBytes)
//       44     n  rkey bytes (as ucp_rkey_pack produced them)
// Nothing may follow the rkey. The rkey bytes themselves are opaque here: UCX unpacks them
// (ucp_ep_rkey_unpack) and trusts them as it trusts the rest of its wire-up with that peer.
struct StagingDescriptor {
  uint64_t pool_id = 0;
  uint64_t base_address = 0;
  uint64_t block_bytes = 0;
  uint64_t num_blocks = 0;
  std::string rkey;

  // Address of block `index` in the owner's address space (index < num_blocks).
  uint64_t BlockAddress(uint64_t index) const { return base_address + index * block_bytes; }
  bool operator==(const StagingDescriptor&) const = default;
};

inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 30;  // 1 GiB per slot
inline constexpr uint64_t kMaxBlocks = uint64_t{1} << 31;      // slot indices and counts fit uint32
inline constexpr uint32_t kMaxRkeyBytes = 64 * 1024;
inline constexpr size_t kDescriptorHeaderBytes = 44;

std::string SerializeDescriptor(const StagingDescriptor& d);
StatusOr<StagingDescriptor> ParseDescriptor(std::string_view bytes);

// Control active messages between a RemoteReader (decode side) and a StagingServer (prefill
// side). Ids are UCX AM ids; the payload is the AM data (the AM header is unused). A reader
// says kHello first; the server answers kHelloReply (the pool's descriptor: what RMA needs)
// only to a hello carrying its shared secret, and applies lease messages only from endpoints
// whose hello it accepted.
enum class ControlMessage : uint16_t {
  kHello = 1,         // reader → server; payload: a hello (EncodeHello)
  kHelloReply = 2,    // server → reader; payload: a serialized StagingDescriptor
  kRenew = 3,         // reader → server; payload: lease-id list; extends each lease by its TTL
  kComplete = 4,      // reader → server; payload: lease-id list; the requests finished
  kAbort = 5,         // reader → server; payload: lease-id list; the requests were aborted
  kLeaseGone = 6,     // server → reader, answering kRenew; payload: lease-id list; the ids the
                      // pool no longer holds (expired or ended): their slots may be reused
  kHelloRefused = 7,  // server → reader, answering a hello it refuses; payload: a refusal
                      // (EncodeHelloRefusal); the server then closes the endpoint
};
// 1: the hello was the version alone; 2: the hello carries the shared secret, and a refused
// hello is answered with kHelloRefused.
inline constexpr uint32_t kProtocolVersion = 2;

// Hello (version 2): u32 protocol version, u32 secret length (0 .. kMaxSecretBytes), the
// secret's bytes; nothing after them. Every version starts with the u32 version (version 1
// was that alone), so a server can tell an older reader by it.
inline constexpr uint32_t kMaxSecretBytes = 4096;
struct Hello {
  uint32_t version = kProtocolVersion;
  std::string secret;
  bool operator==(const Hello&) const = default;
};
std::string EncodeHello(std::string_view secret);
// InvalidArgument for a payload too short for its version, a version other than
// kProtocolVersion (named), a secret longer than kMaxSecretBytes or bytes past the secret.
StatusOr<Hello> ParseHello(std::string_view bytes);

// Why a staging server refuses a hello (kHelloRefused's payload: u32 reason, u32 the server's
// protocol version; nothing after them).
enum class HelloRefusal : uint32_t {
  kMalformed = 1,  // not a hello of any version this server can tell
  kVersion = 2,    // a hello of another protocol version
  kSecret = 3,     // a wrong or missing shared secret
};
struct HelloRefusalMessage {
  HelloRefusal reason = HelloRefusal::kMalformed;
  uint32_t server_version = kProtocolVersion;
  bool operator==(const HelloRefusalMessage&) const = default;
};
std::string EncodeHelloRefusal(HelloRefusal reason);
StatusOr<HelloRefusalMessage> ParseHelloRefusal(std::string_view bytes);
// The server's check of a hello payload against its shared secret (`secret` empty: none is
// required, any secret is accepted). nullopt: accepted; else why it is refused. The secret is
// compared in constant time (its duration depends only on the presented secret's length).
std::optional<HelloRefusal> CheckHello(std::string_view payload, const std::string& secret);
// What a refusal means to the reader, as the error its Connect returns.
std::string DescribeHelloRefusal(const HelloRefusalMessage& refusal);

// Lease-id list: u32 count, then count × u64 ids. At most kMaxLeaseIdsPerMessage ids.
inline constexpr uint32_t kMaxLeaseIdsPerMessage = 65536;
std::string EncodeLeaseIds(std::span<const uint64_t> ids);
StatusOr<std::vector<uint64_t>> ParseLeaseIds(std::string_view bytes);

// A run of consecutive staging slots [start, start + count). A lease's slots are a list of
// extents (StagingPool allocates lowest-first, so a lease is usually a few extents), which is
// how a handoff names them compactly.
struct SlotExtent {
  uint32_t start = 0;
  uint32_t count = 0;
  bool operator==(const SlotExtent&) const = default;
};
// Extent list: u32 count, then count × (u32 start, u32 count). At most kMaxExtentsPerList
// extents; every extent non-empty and ending at or below `num_slots`.
inline constexpr uint32_t kMaxExtentsPerList = 1 << 20;
std::string EncodeSlotExtents(std::span<const SlotExtent> extents);
StatusOr<std::vector<SlotExtent>> ParseSlotExtents(std::string_view bytes, uint64_t num_slots);
// Run-length form of a slot list, and back.
std::vector<SlotExtent> ToExtents(std::span<const uint32_t> slots);
std::vector<uint32_t> ExpandExtents(std::span<const SlotExtent> extents);

// Helpers for the fixed-width little-endian fields (exposed for the tests).
void AppendU16(std::string& out, uint16_t v);
void AppendU32(std::string& out, uint32_t v);
void AppendU64(std::string& out, uint64_t v);
uint16_t LoadU16(const char* p);
uint32_t LoadU32(const char* p);
uint64_t LoadU64(const char* p);

}  // namespace oasis::disagg

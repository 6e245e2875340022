#include "disagg/wire.h"

#include <limits>

#include "common/http_util.h"

namespace oasis::disagg {
namespace {
constexpr char kMagic[4] = {'O', 'K', 'S', 'P'};
constexpr uint16_t kDescriptorVersion = 1;
}  // namespace

void AppendU16(std::string& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void AppendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t LoadU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string SerializeDescriptor(const StagingDescriptor& d) {
  std::string out;
  out.reserve(kDescriptorHeaderBytes + d.rkey.size());
  out.append(kMagic, 4);
  AppendU16(out, kDescriptorVersion);
  AppendU16(out, 0);
  AppendU64(out, d.pool_id);
  AppendU64(out, d.base_address);
  AppendU64(out, d.block_bytes);
  AppendU64(out, d.num_blocks);
  AppendU32(out, static_cast<uint32_t>(d.rkey.size()));
  out.append(d.rkey);
  return out;
}

StatusOr<StagingDescriptor> ParseDescriptor(std::string_view bytes) {
  if (bytes.size() < kDescriptorHeaderBytes) {
    return InvalidArgument("staging descriptor: " + std::to_string(bytes.size()) +
                           " bytes, shorter than its 44-byte header");
  }
  const char* p = bytes.data();
  if (std::string_view(p, 4) != std::string_view(kMagic, 4)) {
    return InvalidArgument("staging descriptor: bad magic (not an OasisKV staging descriptor)");
  }
  const uint16_t version = LoadU16(p + 4);
  if (version != kDescriptorVersion) {
    return InvalidArgument("staging descriptor: version " + std::to_string(version) +
                           ", this build reads version " + std::to_string(kDescriptorVersion));
  }
  if (LoadU16(p + 6) != 0) return InvalidArgument("staging descriptor: reserved field not zero");
  StagingDescriptor d;
  d.pool_id = LoadU64(p + 8);
  d.base_address = LoadU64(p + 16);
  d.block_bytes = LoadU64(p + 24);
  d.num_blocks = LoadU64(p + 32);
  const uint32_t rkey_len = LoadU32(p + 40);
  if (d.block_bytes == 0 || d.block_bytes > kMaxBlockBytes) {
    return InvalidArgument("staging descriptor: block size " + std::to_string(d.block_bytes) +
                           " outside 1.." + std::to_string(kMaxBlockBytes));
  }
  if (d.num_blocks == 0 || d.num_blocks > kMaxBlocks) {
    return InvalidArgument("staging descriptor: block count " + std::to_string(d.num_blocks) +
                           " outside 1.." + std::to_string(kMaxBlocks));
  }
  // block_bytes <= 2^30 and num_blocks <= 2^32: the product fits in 63 bits.
  const uint64_t total = d.block_bytes * d.num_blocks;
  if (d.base_address > std::numeric_limits<uint64_t>::max() - total) {
    return InvalidArgument("staging descriptor: pool [base, base + size) wraps the address space");
  }
  if (rkey_len == 0 || rkey_len > kMaxRkeyBytes) {
    return InvalidArgument("staging descriptor: remote key of " + std::to_string(rkey_len) +
                           " bytes outside 1.." + std::to_string(kMaxRkeyBytes));
  }
  if (bytes.size() != kDescriptorHeaderBytes + rkey_len) {
    return InvalidArgument("staging descriptor: " + std::to_string(bytes.size()) +
                           " bytes, the header announces " +
                           std::to_string(kDescriptorHeaderBytes + rkey_len));
  }
  d.rkey.assign(p + kDescriptorHeaderBytes, rkey_len);
  return d;
}

std::string EncodeLeaseIds(std::span<const uint64_t> ids) {
  std::string out;
  out.reserve(4 + 8 * ids.size());
  AppendU32(out, static_cast<uint32_t>(ids.size()));
  for (uint64_t id : ids) AppendU64(out, id);
  return out;
}

StatusOr<std::vector<uint64_t>> ParseLeaseIds(std::string_view bytes) {
  if (bytes.size() < 4) return InvalidArgument("lease-id list: shorter than its 4-byte count");
  const uint32_t count = LoadU32(bytes.data());
  if (count > kMaxLeaseIdsPerMessage) {
    return InvalidArgument("lease-id list: " + std::to_string(count) + " ids, at most " +
                           std::to_string(kMaxLeaseIdsPerMessage) + " per message");
  }
  if (bytes.size() != 4 + 8 * static_cast<size_t>(count)) {
    return InvalidArgument("lease-id list: " + std::to_string(bytes.size()) + " bytes for " +
                           std::to_string(count) + " ids");
  }
  std::vector<uint64_t> ids(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = LoadU64(bytes.data() + 4 + 8 * size_t{i});
  return ids;
}

std::string EncodeHello(std::string_view secret) {
  std::string out;
  out.reserve(8 + secret.size());
  AppendU32(out, kProtocolVersion);
  AppendU32(out, static_cast<uint32_t>(secret.size()));
  out.append(secret);
  return out;
}

StatusOr<Hello> ParseHello(std::string_view bytes) {
  if (bytes.size() < 4) return InvalidArgument("hello: shorter than its 4-byte version");
  Hello h;
  h.version = LoadU32(bytes.data());
  if (h.version != kProtocolVersion) {
    return InvalidArgument("hello: protocol version " + std::to_string(h.version) +
                           ", this build speaks version " + std::to_string(kProtocolVersion));
  }
  if (bytes.size() < 8) return InvalidArgument("hello: shorter than its 8-byte header");
  const uint32_t length = LoadU32(bytes.data() + 4);
  if (length > kMaxSecretBytes) {
    return InvalidArgument("hello: a secret of " + std::to_string(length) + " bytes, at most " +
                           std::to_string(kMaxSecretBytes));
  }
  if (bytes.size() != 8 + size_t{length}) {
    return InvalidArgument("hello: " + std::to_string(bytes.size()) +
                           " bytes, the header announces " + std::to_string(8 + size_t{length}));
  }
  h.secret.assign(bytes.data() + 8, length);
  return h;
}

std::string EncodeHelloRefusal(HelloRefusal reason) {
  std::string out;
  AppendU32(out, static_cast<uint32_t>(reason));
  AppendU32(out, kProtocolVersion);
  return out;
}

StatusOr<HelloRefusalMessage> ParseHelloRefusal(std::string_view bytes) {
  if (bytes.size() != 8) {
    return InvalidArgument("hello refusal: " + std::to_string(bytes.size()) + " bytes, expected 8");
  }
  const uint32_t reason = LoadU32(bytes.data());
  if (reason < static_cast<uint32_t>(HelloRefusal::kMalformed) ||
      reason > static_cast<uint32_t>(HelloRefusal::kSecret)) {
    return InvalidArgument("hello refusal: unknown reason " + std::to_string(reason));
  }
  return HelloRefusalMessage{static_cast<HelloRefusal>(reason), LoadU32(bytes.data() + 4)};
}

std::optional<HelloRefusal> CheckHello(std::string_view payload, const std::string& secret) {
  auto hello = ParseHello(payload);
  if (!hello.ok()) {
    const bool other_version = payload.size() >= 4 && LoadU32(payload.data()) != kProtocolVersion;
    return other_version ? HelloRefusal::kVersion : HelloRefusal::kMalformed;
  }
  if (!secret.empty() && !KeyMatches(hello->secret, secret)) return HelloRefusal::kSecret;
  return std::nullopt;
}

std::string DescribeHelloRefusal(const HelloRefusalMessage& refusal) {
  switch (refusal.reason) {
    case HelloRefusal::kSecret:
      return "the staging pool refused the connection: wrong or missing staging secret (the "
             "decode and prefill instances need the same --staging-secret)";
    case HelloRefusal::kVersion:
      return "the staging pool refused the connection: it speaks protocol version " +
             std::to_string(refusal.server_version) + ", this build version " +
             std::to_string(kProtocolVersion) + " (run the same OasisKV version on both sides)";
    case HelloRefusal::kMalformed:
      break;
  }
  return "the staging pool refused the connection: it could not read the hello (protocol "
         "version " +
         std::to_string(refusal.server_version) + ", this build version " +
         std::to_string(kProtocolVersion) + ")";
}

std::string EncodeSlotExtents(std::span<const SlotExtent> extents) {
  std::string out;
  out.reserve(4 + 8 * extents.size());
  AppendU32(out, static_cast<uint32_t>(extents.size()));
  for (const SlotExtent& e : extents) {
    AppendU32(out, e.start);
    AppendU32(out, e.count);
  }
  return out;
}

StatusOr<std::vector<SlotExtent>> ParseSlotExtents(std::string_view bytes, uint64_t num_slots) {
  if (bytes.size() < 4) return InvalidArgument("slot extents: shorter than their 4-byte count");
  const uint32_t count = LoadU32(bytes.data());
  if (count > kMaxExtentsPerList) {
    return InvalidArgument("slot extents: " + std::to_string(count) + " extents, at most " +
                           std::to_string(kMaxExtentsPerList));
  }
  if (bytes.size() != 4 + 8 * static_cast<size_t>(count)) {
    return InvalidArgument("slot extents: " + std::to_string(bytes.size()) + " bytes for " +
                           std::to_string(count) + " extents");
  }
  std::vector<SlotExtent> extents(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + 4 + 8 * size_t{i};
    extents[i] = {LoadU32(p), LoadU32(p + 4)};
    if (extents[i].count == 0 || uint64_t{extents[i].start} + extents[i].count > num_slots) {
      return InvalidArgument("slot extents: [" + std::to_string(extents[i].start) + ", +" +
                             std::to_string(extents[i].count) + ") empty or past the pool's " +
                             std::to_string(num_slots) + " slots");
    }
  }
  return extents;
}

std::vector<SlotExtent> ToExtents(std::span<const uint32_t> slots) {
  std::vector<SlotExtent> out;
  for (uint32_t s : slots) {
    if (!out.empty() && out.back().start + out.back().count == s && out.back().count < UINT32_MAX) {
      ++out.back().count;
    } else {
      out.push_back({s, 1});
    }
  }
  return out;
}

std::vector<uint32_t> ExpandExtents(std::span<const SlotExtent> extents) {
  std::vector<uint32_t> out;
  for (const SlotExtent& e : extents) {
    for (uint32_t i = 0; i < e.count; ++i) out.push_back(e.start + i);
  }
  return out;
}

}  // namespace oasis::disagg

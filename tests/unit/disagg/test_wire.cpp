// The staging descriptor and lease-id list formats: round trips, and every malformed input
// rejected with a Status (the fuzzer, tests/fuzz/fuzz_disagg_wire.cpp, covers the rest).
#include <catch2/catch.hpp>

#include "disagg/wire.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {
StagingDescriptor Example() {
  StagingDescriptor d;
  d.pool_id = 0x0123456789abcdefull;
  d.base_address = 0x7f0000001000ull;
  d.block_bytes = 8192;
  d.num_blocks = 1000;
  d.rkey = std::string("\x01\x00\xffrkey-bytes", 13);
  return d;
}
}  // namespace

TEST_CASE("descriptor round trip, layout as documented", "[disagg][wire]") {
  const StagingDescriptor d = Example();
  const std::string bytes = SerializeDescriptor(d);
  REQUIRE(bytes.size() == kDescriptorHeaderBytes + d.rkey.size());
  CHECK(bytes.substr(0, 4) == "OKSP");
  CHECK(LoadU16(bytes.data() + 4) == 1);
  CHECK(LoadU64(bytes.data() + 8) == d.pool_id);
  CHECK(LoadU64(bytes.data() + 16) == d.base_address);
  CHECK(LoadU64(bytes.data() + 24) == 8192);
  CHECK(LoadU64(bytes.data() + 32) == 1000);
  CHECK(LoadU32(bytes.data() + 40) == 13);
  auto parsed = ParseDescriptor(bytes);
  REQUIRE(parsed.ok());
  CHECK(*parsed == d);
  CHECK(parsed->BlockAddress(3) == d.base_address + 3 * 8192);
}

TEST_CASE("descriptor parser rejects malformed input", "[disagg][wire]") {
  const std::string good = SerializeDescriptor(Example());
  auto rejects = [](const std::string& bytes, const std::string& needle) {
    auto r = ParseDescriptor(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(needle));
  };
  rejects("", "shorter than its 44-byte header");
  rejects(good.substr(0, 43), "shorter");
  std::string bad = good;
  bad[0] = 'X';
  rejects(bad, "bad magic");
  bad = good;
  bad[4] = 2;
  rejects(bad, "version 2");
  bad = good;
  bad[6] = 1;
  rejects(bad, "reserved");
  auto with_u64 = [&](size_t offset, uint64_t v) {
    std::string b = good;
    std::string enc;
    AppendU64(enc, v);
    b.replace(offset, 8, enc);
    return b;
  };
  rejects(with_u64(24, 0), "block size 0");
  rejects(with_u64(24, kMaxBlockBytes + 1), "block size");
  rejects(with_u64(32, 0), "block count 0");
  rejects(with_u64(32, kMaxBlocks + 1), "block count");
  rejects(with_u64(16, ~uint64_t{0} - 4096), "wraps");
  bad = good;
  bad.replace(40, 4, std::string("\0\0\0\0", 4));
  rejects(bad, "remote key of 0 bytes");
  rejects(good + "x", "the header announces");
  rejects(good.substr(0, good.size() - 1), "the header announces");
}

TEST_CASE("lease-id lists round trip and reject bad counts", "[disagg][wire]") {
  const std::vector<uint64_t> ids = {1, 42, ~uint64_t{0}};
  const std::string bytes = EncodeLeaseIds(ids);
  CHECK(bytes.size() == 4 + 8 * 3);
  auto parsed = ParseLeaseIds(bytes);
  REQUIRE(parsed.ok());
  CHECK(*parsed == ids);
  auto empty = ParseLeaseIds(EncodeLeaseIds({}));
  REQUIRE(empty.ok());
  CHECK(empty->empty());
  CHECK_FALSE(ParseLeaseIds("").ok());
  CHECK_FALSE(ParseLeaseIds(bytes.substr(0, bytes.size() - 1)).ok());
  CHECK_FALSE(ParseLeaseIds(bytes + "z").ok());
  std::string huge;
  AppendU32(huge, kMaxLeaseIdsPerMessage + 1);
  auto r = ParseLeaseIds(huge);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("at most"));
}

TEST_CASE("slot extents round trip, convert and reject bad lists", "[disagg][wire]") {
  const std::vector<SlotExtent> ext = {{0, 4}, {10, 1}, {100, 28}};
  const std::string bytes = EncodeSlotExtents(ext);
  CHECK(bytes.size() == 4 + 8 * 3);
  auto parsed = ParseSlotExtents(bytes, 128);
  REQUIRE(parsed.ok());
  CHECK(*parsed == ext);
  const std::vector<uint32_t> slots = ExpandExtents(ext);
  CHECK(slots.size() == 33);
  CHECK(slots[4] == 10);
  CHECK(ToExtents(slots) == ext);
  CHECK(ToExtents(std::vector<uint32_t>{5, 6, 4, 7}) ==
        (std::vector<SlotExtent>{{5, 2}, {4, 1}, {7, 1}}));

  CHECK_FALSE(ParseSlotExtents(bytes, 127).ok());  // [100, 128) past 127 slots
  CHECK_FALSE(ParseSlotExtents(bytes.substr(0, 11), 128).ok());
  CHECK_FALSE(ParseSlotExtents("", 128).ok());
  const std::vector<SlotExtent> empty_run = {{3, 0}};
  CHECK_FALSE(ParseSlotExtents(EncodeSlotExtents(empty_run), 128).ok());
  const std::vector<SlotExtent> wraps = {{0xfffffff0u, 0x20}};
  CHECK_FALSE(ParseSlotExtents(EncodeSlotExtents(wraps), kMaxBlocks).ok());
}

// The staging descriptor, lease-id list, slot extent and hello formats: round trips, the
// hello's secret check, and every malformed input rejected with a Status (the fuzzer, tests/fuzz/fuzz_disagg_wire.cpp, covers the rest).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "disagg/net_address.h"
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

TEST_CASE("hello round trip, layout as documented", "[disagg][wire][hello]") {
  const std::string secret("s3cr\0t\xff", 7);  // any bytes
  const std::string bytes = EncodeHello(secret);
  REQUIRE(bytes.size() == 8 + secret.size());
  CHECK(LoadU32(bytes.data()) == kProtocolVersion);
  CHECK(kProtocolVersion == 2);
  CHECK(LoadU32(bytes.data() + 4) == secret.size());
  CHECK(bytes.substr(8) == secret);
  auto parsed = ParseHello(bytes);
  REQUIRE(parsed.ok());
  CHECK(*parsed == Hello{kProtocolVersion, secret});
  // No secret, and the longest one.
  CHECK(ParseHello(EncodeHello("")).value() == Hello{kProtocolVersion, ""});
  const std::string longest(kMaxSecretBytes, 'k');
  CHECK(ParseHello(EncodeHello(longest)).value().secret == longest);
}

TEST_CASE("hello parser rejects malformed input", "[disagg][wire][hello]") {
  const std::string good = EncodeHello("secret");
  auto rejects = [](const std::string& bytes, const std::string& needle) {
    auto h = ParseHello(bytes);
    INFO("expecting a rejection naming \"" << needle << "\"");
    REQUIRE_FALSE(h.ok());
    CHECK(h.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(h.status().message(), Catch::Contains(needle));
  };
  rejects("", "shorter than its 4-byte version");
  rejects(good.substr(0, 3), "shorter than its 4-byte version");
  std::string v1;
  AppendU32(v1, 1);  // a version-1 hello: the version alone
  rejects(v1, "protocol version 1, this build speaks version 2");
  std::string v3 = good;
  v3[0] = 3;
  rejects(v3, "protocol version 3");
  rejects(good.substr(0, 7), "shorter than its 8-byte header");
  rejects(good.substr(0, good.size() - 1), "the header announces 14");
  rejects(good + "x", "15 bytes, the header announces 14");
  std::string huge;
  AppendU32(huge, kProtocolVersion);
  AppendU32(huge, kMaxSecretBytes + 1);
  huge.append(kMaxSecretBytes + 1, 'k');
  rejects(huge, "a secret of 4097 bytes, at most 4096");
  std::string wraps;  // a length near 2^32 must not wrap the size check
  AppendU32(wraps, kProtocolVersion);
  AppendU32(wraps, 0xffffffffu);
  rejects(wraps, "at most 4096");
}

TEST_CASE("the hello check: the secret, the version, malformed hellos", "[disagg][wire][hello]") {
  const std::string secret = "correct horse battery staple";
  CHECK_FALSE(CheckHello(EncodeHello(secret), secret).has_value());  // accepted
  // Wrong or missing secrets, however close, are refused.
  for (const std::string& wrong :
       {std::string(), std::string("correct horse battery stapl"), secret + "e",
        std::string("Correct horse battery staple"), std::string("x"),
        std::string(secret.size(), '\0'), secret + std::string(1, '\0')}) {
    INFO("presented: \"" << wrong << "\" (" << wrong.size() << " bytes)");
    CHECK(CheckHello(EncodeHello(wrong), secret) == HelloRefusal::kSecret);
  }
  // A server without a secret accepts any (and none).
  CHECK_FALSE(CheckHello(EncodeHello(""), "").has_value());
  CHECK_FALSE(CheckHello(EncodeHello("anything"), "").has_value());
  // Another version: a version-1 hello (the version alone), or a later one.
  std::string v1;
  AppendU32(v1, 1);
  CHECK(CheckHello(v1, secret) == HelloRefusal::kVersion);
  CHECK(CheckHello(v1, "") == HelloRefusal::kVersion);
  std::string v9 = EncodeHello(secret);
  v9[0] = 9;
  CHECK(CheckHello(v9, secret) == HelloRefusal::kVersion);
  // Malformed: too short to carry a version, or a version-2 hello with bad lengths.
  CHECK(CheckHello("", secret) == HelloRefusal::kMalformed);
  CHECK(CheckHello(std::string_view("\x02\x00", 2), "") == HelloRefusal::kMalformed);
  const std::string good = EncodeHello(secret);
  CHECK(CheckHello(good.substr(0, good.size() - 1), secret) == HelloRefusal::kMalformed);
  CHECK(CheckHello(good + "!", secret) == HelloRefusal::kMalformed);
  CHECK(CheckHello(good.substr(0, 6), "") == HelloRefusal::kMalformed);
}

TEST_CASE("hello refusals round trip and say what is wrong", "[disagg][wire][hello]") {
  for (HelloRefusal r : {HelloRefusal::kMalformed, HelloRefusal::kVersion, HelloRefusal::kSecret}) {
    const std::string bytes = EncodeHelloRefusal(r);
    REQUIRE(bytes.size() == 8);
    CHECK(LoadU32(bytes.data()) == static_cast<uint32_t>(r));
    CHECK(LoadU32(bytes.data() + 4) == kProtocolVersion);
    auto parsed = ParseHelloRefusal(bytes);
    REQUIRE(parsed.ok());
    CHECK(*parsed == HelloRefusalMessage{r, kProtocolVersion});
  }
  CHECK_THAT(DescribeHelloRefusal({HelloRefusal::kSecret, 2}),
             Catch::Contains("wrong or missing staging secret"));
  CHECK_THAT(DescribeHelloRefusal({HelloRefusal::kVersion, 7}),
             Catch::Contains("it speaks protocol version 7, this build version 2"));
  CHECK_THAT(DescribeHelloRefusal({HelloRefusal::kMalformed, 2}),
             Catch::Contains("could not read the hello"));
  CHECK_FALSE(ParseHelloRefusal("").ok());
  CHECK_FALSE(ParseHelloRefusal(EncodeHelloRefusal(HelloRefusal::kSecret) + "x").ok());
  std::string unknown;
  AppendU32(unknown, 0);
  AppendU32(unknown, 2);
  CHECK_THAT(ParseHelloRefusal(unknown).status().message(), Catch::Contains("unknown reason 0"));
  unknown[0] = 4;
  CHECK_FALSE(ParseHelloRefusal(unknown).ok());
}

TEST_CASE("listen addresses: loopback or reachable from other machines", "[disagg][wire]") {
  const auto loopback = [](const std::string& host_port) {
    auto a = ResolveHostPort(host_port);
    INFO(host_port << ": " << a.status().ToString());
    REQUIRE(a.ok());
    return IsLoopback(*a);
  };
  CHECK(loopback("127.0.0.1:0"));
  CHECK(loopback("127.255.1.2:5000"));
  CHECK(loopback("localhost:0"));
  CHECK(loopback("[::1]:0"));
  CHECK(loopback("[::ffff:127.0.0.1]:0"));
  CHECK_FALSE(loopback("0.0.0.0:0"));
  CHECK_FALSE(loopback("[::]:0"));
  CHECK_FALSE(loopback("10.1.2.3:0"));
  CHECK_FALSE(loopback("128.0.0.1:0"));
  CHECK_FALSE(loopback("[::ffff:10.0.0.1]:0"));
  CHECK_FALSE(loopback("[::2]:0"));
  CHECK(ResolveHostPort("127.0.0.1").status().code() == StatusCode::kInvalidArgument);
  CHECK(ResolveHostPort(":0").status().code() == StatusCode::kInvalidArgument);
  CHECK(FormatSockAddr(ResolveHostPort("[::1]:7").value().get()) == "[::1]:7");
}

#ifdef OASIS_WIRE_CORPUS_DIR
// The fuzzer's seeds (tests/fuzz/corpus/disagg_wire/): a selector byte (fuzz_disagg_wire.cpp:
// 0 lease ids, 1 descriptor, 2 slot extents, 3 hello, 4 hello refusal), then the bytes of a
// fixed message of that kind. With OASIS_WRITE_WIRE_SEEDS=1 the test (re)writes them;
// otherwise it checks they are current (e.g. after a protocol version change).
TEST_CASE("disagg wire: the fuzzer's seed corpus is current", "[disagg][wire]") {
  StagingDescriptor d;
  d.pool_id = 0x1234;
  d.base_address = 0x7f0000001000ull;
  d.block_bytes = 0x2000;
  d.num_blocks = 1000;
  d.rkey = "rkey-bytes";
  const uint64_t ids[] = {7, 9};
  const SlotExtent extents[] = {{0, 4}, {10, 1}};
  const std::pair<const char*, std::string> seeds[] = {
      {"lease_ids", std::string(1, '\0') + EncodeLeaseIds(ids)},
      {"descriptor", "\x01" + SerializeDescriptor(d)},
      {"slot_extents", "\x02" + EncodeSlotExtents(extents)},
      {"hello", "\x03" + EncodeHello("staging-secret")},
      {"hello_refused", "\x04" + EncodeHelloRefusal(HelloRefusal::kSecret)},
  };
  for (const auto& [name, bytes] : seeds) {
    const std::string path = std::string(OASIS_WIRE_CORPUS_DIR) + "/" + name;
    if (const char* w = std::getenv("OASIS_WRITE_WIRE_SEEDS"); w && std::string(w) == "1") {
      std::ofstream(path, std::ios::binary) << bytes;
    }
    std::ifstream in(path, std::ios::binary);
    INFO(path);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    CHECK(ss.str() == bytes);
  }
}
#endif

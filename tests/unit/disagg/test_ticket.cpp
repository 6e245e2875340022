// The handoff ticket (src/disagg/ticket.h, docs/disaggregation.md §3): round trips of random
// tickets (a fresh seed every run, printed on failure), every truncation and each field
// corrupted in turn rejected with a message naming the field, geometry mismatches, and the
// fuzzer's seed corpus (tests/fuzz/corpus/disagg_ticket/) kept equal to the tickets made here.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "disagg/ticket.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {

uint32_t BlocksFor(uint32_t prompt_length) {
  return (prompt_length + 1 + kStagedBlockTokens - 1) / kStagedBlockTokens;
}

// `num_slots` slots as 1..5 disjoint extents with gaps, in shuffled order.
std::vector<SlotExtent> RandomExtents(std::mt19937_64& rng, uint64_t num_slots) {
  const uint64_t pieces = std::min<uint64_t>(num_slots, 1 + rng() % 5);
  std::vector<uint64_t> cuts{0, num_slots};
  while (cuts.size() < pieces + 1) {
    const uint64_t c = 1 + rng() % (num_slots - 1);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<SlotExtent> out;
  uint64_t at = rng() % 1000;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const auto n = static_cast<uint32_t>(cuts[i + 1] - cuts[i]);
    out.push_back({static_cast<uint32_t>(at), n});
    at += n + rng() % 3;
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

HandoffTicket RandomTicket(std::mt19937_64& rng, StagedKvGeometry g, uint32_t prompt_length,
                           uint32_t max_ids) {
  HandoffTicket t;
  t.staging_address =
      "prefill-" + std::to_string(rng() % 100) + ".example:" + std::to_string(1 + rng() % 65535);
  t.pool_id = rng();
  t.lease_id = rng();
  t.lease_ttl_ms = 1 + static_cast<uint32_t>(rng() % 100000);
  g.num_blocks = BlocksFor(prompt_length);
  t.geometry = g;
  t.prompt_length = prompt_length;
  t.position = prompt_length + 1;
  for (uint32_t i = 0; i < TicketTokenCount(g); ++i)
    t.tokens.push_back(static_cast<uint32_t>(rng()));
  t.sampling_state.resize(rng() % 40);
  for (char& c : t.sampling_state) c = static_cast<char>(rng());
  auto layout = StagedKvLayout::Create(g);
  REQUIRE(layout.ok());
  t.extents = RandomExtents(rng, layout->num_slots());
  std::vector<uint16_t> all(g.num_blocks);
  std::iota(all.begin(), all.end(), 0);
  t.admission.resize(uint64_t{g.num_layers} * g.num_kv_heads);
  for (auto& list : t.admission) {
    const uint32_t n = std::min(max_ids, g.num_blocks);
    const uint32_t count = max_ids >= 129 ? n : static_cast<uint32_t>(rng() % (n + 1));
    for (uint32_t i = 0; i < count; ++i) {  // partial Fisher–Yates: distinct ids
      std::swap(all[i], all[i + rng() % (all.size() - i)]);
    }
    list.assign(all.begin(), all.begin() + count);
  }
  for (uint32_t b = 0; b < prompt_length / kStagedBlockTokens; ++b)
    t.prompt_block_hashes.push_back(rng());
  if (g.kv_dtype == static_cast<uint32_t>(StagedKvDtype::kF8E4M3)) {
    std::uniform_real_distribution<float> scale(1e-4f, 10.0f);
    for (uint64_t i = 0; i < uint64_t{g.num_layers} * g.num_kv_heads; ++i) {
      t.k_scales.push_back(scale(rng));
      t.v_scales.push_back(scale(rng));
    }
  }
  return t;
}

StagedKvGeometry SmallGeometry(std::mt19937_64& rng) {
  StagedKvGeometry g;
  g.num_layers = 1 + rng() % 4;
  g.num_kv_heads = 1 + rng() % 4;
  g.head_dim = rng() % 2 ? 64 : 128;
  // bf16, f32 or FP8 KV (e4m3 with scales; the draft KV in bf16 over 2 slots a block).
  const uint32_t kind = static_cast<uint32_t>(rng() % 3);
  g.kv_dtype = static_cast<uint32_t>(kind == 0   ? StagedKvDtype::kBF16
                                     : kind == 1 ? StagedKvDtype::kF32
                                                 : StagedKvDtype::kF8E4M3);
  g.dtype_bytes = StagedKvDtypeBytes(g.kv_dtype);
  if (rng() % 2) {
    g.draft_kv_heads = 1 + rng() % 4;
    g.draft_head_dim = g.head_dim;
    g.draft_dtype_bytes = kind == 1 ? 4 : 2;
  }
  return g;
}

StagedKvGeometry Qwen3_8B() {
  return {.num_layers = 36,
          .num_kv_heads = 8,
          .head_dim = 128,
          .dtype_bytes = 2,
          .num_blocks = 0,
          .draft_kv_heads = 8,
          .draft_head_dim = 128,
          .kv_dtype = static_cast<uint32_t>(StagedKvDtype::kBF16),
          .draft_dtype_bytes = 2};
}

// A fixed ticket with a known layout, for the corruption tests and the fuzzer's seeds.
HandoffTicket FixedTicket(bool draft) {
  HandoffTicket t;
  t.staging_address = "10.0.0.2:5000";
  t.pool_id = 0x1122334455667788ull;
  t.lease_id = 42;
  t.lease_ttl_ms = 30000;
  t.geometry = {.num_layers = 2,
                .num_kv_heads = 2,
                .head_dim = 64,
                .dtype_bytes = 2,
                .num_blocks = BlocksFor(40),
                .draft_kv_heads = draft ? 1u : 0u,
                .draft_head_dim = draft ? 64u : 0u,
                .kv_dtype = static_cast<uint32_t>(StagedKvDtype::kBF16),
                .draft_dtype_bytes = draft ? 2u : 0u};
  t.prompt_length = 40;
  t.position = 41;
  t.tokens = draft ? std::vector<uint32_t>{1001, 1002, 1003} : std::vector<uint32_t>{7, 8};
  t.sampling_state = draft ? std::string("seed\x01\x02\x03\x04", 8) : std::string();
  // 3 blocks: 2 · 2 · 2 · 3 = 24 KV slots, 4 summary slots, draft 1 · 2 · 3 = 6.
  const uint32_t slots = draft ? 34 : 28;
  t.extents = {{100, 10}, {0, slots - 10}};
  t.admission = {{0, 2}, {2}, {1, 0, 2}, {}};
  t.prompt_block_hashes = {0x0102030405060708ull, 0xa1a2a3a4a5a6a7a8ull};  // 40 / 16 full blocks
  return t;
}

void Rejects(std::string_view bytes, const std::string& needle) {
  auto r = ParseHandoffTicket(bytes);
  INFO("expecting a rejection naming \"" << needle << "\"");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::StartsWith("handoff ticket: "));
  CHECK_THAT(r.status().message(), Catch::Contains(needle));
}

void PutU16(std::string& b, size_t at, uint16_t v) {
  std::string e;
  AppendU16(e, v);
  b.replace(at, 2, e);
}
void PutU32(std::string& b, size_t at, uint32_t v) {
  std::string e;
  AppendU32(e, v);
  b.replace(at, 4, e);
}

}  // namespace

TEST_CASE("handoff ticket: random round trips, small and Qwen3-8B geometry", "[disagg][ticket]") {
  const uint64_t seed =
      std::random_device{}() * uint64_t{0x9e3779b97f4a7c15ull} ^ std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200; ++i) {
    const HandoffTicket t = RandomTicket(rng, SmallGeometry(rng), 1 + rng() % 300, 1 + rng() % 20);
    const std::string bytes = EncodeHandoffTicket(t);
    auto parsed = ParseHandoffTicket(bytes);
    INFO("ticket " << i);
    REQUIRE(parsed.ok());
    CHECK(*parsed == t);
    CHECK(EncodeHandoffTicket(*parsed) == bytes);
  }
  // Qwen3-8B at 32K: 36 layers × 8 KV heads, 2,048 blocks, 129 admitted per (l, h).
  const HandoffTicket t = RandomTicket(rng, Qwen3_8B(), 32767, 129);
  REQUIRE(t.geometry.num_blocks == 2048);
  REQUIRE(t.admission.size() == 288);
  const std::string bytes = EncodeHandoffTicket(t);
  // 74,880 bytes of admission lists and 2,047 prompt block hashes (16 KB), plus a small header.
  CHECK(bytes.size() > 288 * 260 + 4 + 8 * 2047);
  CHECK(bytes.size() < 288 * 260 + 4 + 8 * 2047 + 300);
  CHECK(bytes.substr(0, 4) == "OKHT");
  auto parsed = ParseHandoffTicket(bytes);
  REQUIRE(parsed.ok());
  CHECK(*parsed == t);
  CHECK(EncodeHandoffTicket(*parsed) == bytes);
}

TEST_CASE("handoff ticket: layout as documented", "[disagg][ticket]") {
  const HandoffTicket t = FixedTicket(true);
  const std::string b = EncodeHandoffTicket(t);
  CHECK(b.substr(0, 4) == "OKHT");
  CHECK(LoadU16(b.data() + 4) == 3);
  CHECK(LoadU16(b.data() + 6) == 13);
  CHECK(b.substr(8, 13) == "10.0.0.2:5000");
  CHECK(LoadU64(b.data() + 21) == t.pool_id);
  CHECK(LoadU64(b.data() + 29) == 42);
  CHECK(LoadU32(b.data() + 37) == 30000);
  CHECK(LoadU32(b.data() + 41) == 2);   // layers
  CHECK(LoadU32(b.data() + 57) == 3);   // blocks
  CHECK(LoadU32(b.data() + 69) == 2);   // KV dtype: bf16
  CHECK(LoadU32(b.data() + 73) == 2);   // draft dtype bytes
  CHECK(LoadU32(b.data() + 77) == 40);  // P
  CHECK(LoadU32(b.data() + 81) == 41);  // position of x2
  CHECK(LoadU32(b.data() + 85) == 3);   // token count
  CHECK(LoadU32(b.data() + 97) == 1003);
  CHECK(LoadU16(b.data() + 101) == 8);  // sampling state
  CHECK(b.substr(111, 20) == EncodeSlotExtents(t.extents));
  CHECK(LoadU16(b.data() + 131) == 2);  // admission (0, 0): 2 ids
  const size_t hashes = 131 + (2 + 4) + (2 + 2) + (2 + 6) + 2;
  CHECK(LoadU32(b.data() + hashes) == 2);  // prompt block hashes
  CHECK(LoadU64(b.data() + hashes + 4) == 0x0102030405060708ull);
  CHECK(LoadU64(b.data() + hashes + 12) == 0xa1a2a3a4a5a6a7a8ull);
  CHECK(LoadU32(b.data() + hashes + 20) == 0);  // KV scales: none for bf16
  CHECK(b.size() == hashes + 4 + 16 + 4);
}

TEST_CASE("handoff ticket: every truncation and any trailing byte rejected", "[disagg][ticket]") {
  for (bool draft : {false, true}) {
    const std::string good = EncodeHandoffTicket(FixedTicket(draft));
    REQUIRE(ParseHandoffTicket(good).ok());
    for (size_t n = 0; n < good.size(); ++n) {
      INFO("prefix of " << n << " bytes");
      auto r = ParseHandoffTicket(std::string_view(good).substr(0, n));
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == StatusCode::kInvalidArgument);
    }
    Rejects(good + '\0', "trailing bytes");
    Rejects(good + std::string("\x00\x00", 2), "trailing bytes: 2 after the KV scales");
  }
  // The 75 KB ticket: every 61st prefix and the last 600.
  std::mt19937_64 rng(7);
  const std::string big = EncodeHandoffTicket(RandomTicket(rng, Qwen3_8B(), 32767, 129));
  for (size_t n = 0; n < big.size(); n += (n + 600 < big.size() ? 61 : 1)) {
    INFO("prefix of " << n << " bytes");
    REQUIRE_FALSE(ParseHandoffTicket(std::string_view(big).substr(0, n)).ok());
  }
}

TEST_CASE("handoff ticket: each field corrupted is rejected, naming it", "[disagg][ticket]") {
  const std::string good = EncodeHandoffTicket(FixedTicket(true));
  REQUIRE(ParseHandoffTicket(good).ok());
  auto with16 = [&](size_t at, uint16_t v) {
    std::string b = good;
    PutU16(b, at, v);
    return b;
  };
  auto with32 = [&](size_t at, uint32_t v) {
    std::string b = good;
    PutU32(b, at, v);
    return b;
  };
  auto with_char = [&](size_t at, char c) {
    std::string b = good;
    b[at] = c;
    return b;
  };

  Rejects(with_char(0, 'X'), "magic");
  Rejects(with16(4, 1), "version: 1, this build reads version 3");
  Rejects(with16(4, 2), "version: 2, this build reads version 3 (run the same OasisKV build");
  Rejects(with16(4, 4), "version: 4");
  Rejects(with16(6, 0), "staging address: empty");
  Rejects(with16(6, 0xffff), "staging address: truncated");
  Rejects(with_char(8 + 8, 'x'), "staging address: \"10.0.0.2x5000\" is not host:port");
  Rejects(with_char(8 + 9, 'a'), "staging address: \"10.0.0.2:a000\" has no port");
  Rejects(with_char(8 + 2, ' '), "staging address: not printable");
  {
    std::string b = good;  // port 0
    b.replace(6, 15, std::string("\x0a\x00", 2) + "10.0.0.2:0");
    Rejects(b, "has no port 1..65535");
  }
  Rejects(with32(37, 0), "lease TTL: 0 ms");
  Rejects(with32(41, 0), "geometry: staged KV layout");  // layers
  Rejects(with32(45, 0), "geometry: staged KV layout");  // KV heads
  Rejects(with32(49, 0), "geometry");                    // head_dim
  Rejects(with32(53, 0), "geometry");                    // dtype
  Rejects(with32(53, 1u << 30), "geometry: staged KV layout: dtype of 1073741824 bytes");
  Rejects(with32(53, 3), "geometry: staged KV layout: dtype of 3 bytes");
  Rejects(with32(49, 0xFFFFFFFFu), "beyond what a staging pool lays out");  // head_dim
  Rejects(with32(57, 4), "geometry blocks: 4 for prompt length 40");
  Rejects(with32(57, 70000), "geometry blocks: 70000, at most 65536");
  Rejects(with32(61, 0),
          "geometry: staged KV layout: draft KV heads, draft head_dim and draft dtype");
  Rejects(with32(69, 0),
          "geometry: staged KV layout: KV dtype unknown (0) with elements of 2 bytes");
  Rejects(with32(69, 4), "geometry: staged KV layout: KV dtype fp8_e4m3 with elements of 2 bytes");
  Rejects(with32(73, 0),
          "geometry: staged KV layout: draft KV heads, draft head_dim and draft dtype");
  Rejects(with32(73, 3), "geometry: staged KV layout: draft dtype of 3 bytes");
  Rejects(with32(65, 128), "geometry: staged KV layout: a draft head-block");
  Rejects(with32(41, 0xffffffffu), "geometry");  // layers × heads far too many
  Rejects(with32(77, 0), "prompt length: 0");
  Rejects(with32(77, 60), "geometry blocks: 3 for prompt length 60");
  Rejects(with32(81, 40), "position: 40");
  Rejects(with32(85, 2), "token count: 2");
  Rejects(with32(85, 4), "token count: 4");
  Rejects(with32(85, 0xffffffffu), "token count");
  Rejects(with16(101, 5000), "sampling state: 5000 bytes");
  Rejects(with16(101, 4000), "sampling state: truncated");
  Rejects(with32(111, 1u << 20), "slot extents: truncated");
  Rejects(with32(111, 1), "slot extents: 10 slots, the geometry's layout has 34");
  Rejects(with32(111, 0xffffffffu), "slot extents: 4294967295 extents");
  Rejects(with32(119, 0), "slot extents: [100, +0) empty");  // an extent's count
  Rejects(with32(119, 11), "slot extents: 35 slots");        // total off by one
  Rejects(with32(115, 20), "slot extents: [0, +24) and [20, +10) overlap");
  Rejects(with32(115, 0xfffffffau), "past the pool's");
  Rejects(with16(131, 3), "admission list (0, 1): block id 3");  // (0, 0) eats the next count
  Rejects(with16(133, 3), "admission list (0, 0): block id 3 not below the geometry's 3 blocks");
  Rejects(with16(135, 0), "admission list (0, 0): block id 0 twice");
  const size_t hashes = good.size() - 4 - 16 - 4;  // after the admission lists
  // (1, 1) then eats half the hashes' count (its id 2 is valid), so the count read is garbage.
  Rejects(with16(hashes - 2, 1), "prompt block hashes: 117964800 for prompt length 40");
  Rejects(good.substr(0, hashes - 1), "admission list (1, 1): truncated count");
  Rejects(good.substr(0, 131 + 5), "admission lists: truncated (the geometry has 4 lists");
  Rejects(good.substr(0, hashes + 3), "prompt block hashes: truncated count");
  Rejects(with32(hashes, 3), "prompt block hashes: 3 for prompt length 40 (its full blocks: 2)");
  Rejects(with32(hashes, 0), "prompt block hashes: 0 for prompt length 40");
  Rejects(good.substr(0, hashes + 4 + 15),
          "prompt block hashes: 2 run past the end (15 bytes left)");
  Rejects(good.substr(0, good.size() - 1), "KV scales: truncated count");
  Rejects(with32(good.size() - 4, 4),
          "KV scales: 4 for a bf16 KV dtype of 4 (layer, KV head) pairs (none)");
}

TEST_CASE("handoff ticket: geometry mismatches rejected", "[disagg][ticket]") {
  HandoffTicket t = FixedTicket(true);
  REQUIRE(ParseHandoffTicket(EncodeHandoffTicket(t)).ok());
  SECTION("fewer admission lists than layers × heads") {
    t.admission.pop_back();
    t.admission.pop_back();
    Rejects(EncodeHandoffTicket(t), "admission list");
  }
  SECTION("more admission lists than layers × heads") {
    t.admission.push_back({1});
    // (Its 4 bytes, count 1 and id 1, are read as the prompt block hashes' count.)
    Rejects(EncodeHandoffTicket(t), "prompt block hashes: 65537 for prompt length 40");
  }
  SECTION("a layer more: the lease's slots no longer match") {
    t.geometry.num_layers = 3;
    t.admission.resize(6);
    Rejects(EncodeHandoffTicket(t), "slot extents: 34 slots, the geometry's layout has 48");
  }
  SECTION("no draft head, but a draft token") {
    t.geometry.draft_kv_heads = 0;
    t.geometry.draft_head_dim = 0;
    t.geometry.draft_dtype_bytes = 0;
    t.extents = {{0, 28}};
    Rejects(EncodeHandoffTicket(t), "token count: 3, a ticket without a draft head carries 2");
    t.tokens.pop_back();
    CHECK(ParseHandoffTicket(EncodeHandoffTicket(t)).ok());
  }
  SECTION("a longer prompt than the staged blocks hold") {
    t.prompt_length = 48;
    t.position = 49;
    Rejects(EncodeHandoffTicket(t), "geometry blocks: 3 for prompt length 48, which stages 4");
  }
  SECTION("admission ids of a longer prompt") {
    t.admission[2] = {1, 3};
    Rejects(EncodeHandoffTicket(t), "admission list (1, 0): block id 3 not below");
  }
}

// An FP8 ticket: e4m3 KV and summaries, the draft KV in bf16 (2 slots a block), and the
// prefill instance's K and V scales per (layer, KV head).
HandoffTicket Fp8Ticket() {
  HandoffTicket t = FixedTicket(true);
  t.geometry.kv_dtype = static_cast<uint32_t>(StagedKvDtype::kF8E4M3);
  t.geometry.dtype_bytes = 1;
  // 24 KV slots, 4 summary slots, draft 1 · 2 · 3 · 2 = 12.
  t.extents = {{100, 10}, {0, 30}};
  t.k_scales = {0.0213f, 0.0237f, 1.5f, 1e-3f};
  t.v_scales = {0.005f, 0.0129f, 0.25f, 7.0f};
  return t;
}

TEST_CASE("handoff ticket: FP8 KV dtype and scales", "[disagg][ticket][fp8]") {
  const HandoffTicket t = Fp8Ticket();
  const std::string good = EncodeHandoffTicket(t);
  auto parsed = ParseHandoffTicket(good);
  INFO(parsed.status().ToString());
  REQUIRE(parsed.ok());
  CHECK(*parsed == t);
  CHECK(parsed->geometry.kv_dtype == 4);
  CHECK(parsed->k_scales == t.k_scales);
  CHECK(parsed->v_scales == t.v_scales);
  CHECK(EncodeHandoffTicket(*parsed) == good);
  // The scales at the end: count 4, then 4 K and 4 V scales as f32 bits.
  const size_t at = good.size() - 4 - 32;
  CHECK(LoadU32(good.data() + at) == 4);
  float first;
  const uint32_t bits = LoadU32(good.data() + at + 4);
  std::memcpy(&first, &bits, 4);
  CHECK(first == 0.0213f);
  // Another scale is another ticket.
  HandoffTicket other = t;
  other.v_scales[3] = 7.0000005f;
  CHECK_FALSE(other == t);

  auto with_u32 = [&](size_t pos, uint32_t v) {
    std::string b = good;
    PutU32(b, pos, v);
    return b;
  };
  auto with_f32 = [&](size_t pos, float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return with_u32(pos, u);
  };
  Rejects(with_u32(at, 0),
          "KV scales: 0 for a fp8_e4m3 KV dtype of 4 (layer, KV head) pairs (one K and one V scale "
          "each)");
  Rejects(with_u32(at, 5), "KV scales: 5 for a fp8_e4m3 KV dtype");
  Rejects(good.substr(0, good.size() - 1),
          "KV scales: 4 K and V scales run past the end (31 bytes left)");
  Rejects(good + "x", "trailing bytes: 1 after the KV scales");
  Rejects(with_f32(at + 4, 0.0f),
          "KV scales: the K scale of (layer 0, KV head 0) is 0.000000, not finite and positive");
  Rejects(with_f32(at + 4 + 16 + 12, -1.0f), "the V scale of (layer 1, KV head 1) is -1.000000");
  Rejects(with_f32(at + 8, std::numeric_limits<float>::quiet_NaN()),
          "the K scale of (layer 0, KV head 1)");
  Rejects(with_f32(at + 8, std::numeric_limits<float>::infinity()),
          "the K scale of (layer 0, KV head 1)");
  // FP8 KV with 2-byte elements, or bf16 with scales: refused.
  Rejects(with_u32(53, 2),
          "geometry: staged KV layout: KV dtype fp8_e4m3 with elements of 2 bytes");
  HandoffTicket bf16_with_scales = FixedTicket(true);
  bf16_with_scales.k_scales = {1, 1, 1, 1};
  bf16_with_scales.v_scales = {1, 1, 1, 1};
  Rejects(EncodeHandoffTicket(bf16_with_scales),
          "KV scales: 4 for a bf16 KV dtype of 4 (layer, KV head) pairs (none)");
  // Every truncation.
  for (size_t n = 0; n < good.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    REQUIRE_FALSE(ParseHandoffTicket(std::string_view(good).substr(0, n)).ok());
  }
}

TEST_CASE("handoff ticket: a decode instance refuses another KV dtype", "[disagg][ticket][fp8]") {
  HandoffTicket fp8 = Fp8Ticket();
  fp8.admission = {{0, 2}, {2}, {1, 0, 2}, {2}};
  DecodeSideModel m;
  m.geometry = fp8.geometry;
  REQUIRE(CheckTicketForDecode(fp8, m).ok());
  // A bf16 decode instance (the draft KV is bf16 on both): refused by name, before any size.
  DecodeSideModel bf16 = m;
  bf16.geometry.kv_dtype = static_cast<uint32_t>(StagedKvDtype::kBF16);
  bf16.geometry.dtype_bytes = 2;
  Status st = CheckTicketForDecode(fp8, bf16);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(st.message(),
             Catch::Contains("KV cache dtype differs (ticket fp8_e4m3, this instance bf16)"));
  CHECK_THAT(st.message(), Catch::Contains("the same --kv-cache-dtype"));
  // And the other way round.
  HandoffTicket plain = FixedTicket(true);
  plain.admission = fp8.admission;
  st = CheckTicketForDecode(plain, m);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(),
             Catch::Contains("KV cache dtype differs (ticket bf16, this instance fp8_e4m3)"));
  // The draft KV's dtype is compared too.
  DecodeSideModel f32_draft = m;
  f32_draft.geometry.draft_dtype_bytes = 4;
  st = CheckTicketForDecode(fp8, f32_draft);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("draft dtype bytes differs (ticket 2, model 4)"));
}

#ifdef OASIS_TICKET_CORPUS_DIR
// The fuzzer's seeds are FixedTicket(false/true) with its selector-free bytes. With
// OASIS_WRITE_TICKET_SEEDS=1 the test (re)writes them; otherwise it checks they are current.
TEST_CASE("handoff ticket: checked against the decode side's model", "[disagg][ticket]") {
  for (bool draft : {false, true}) {
    DYNAMIC_SECTION((draft ? "with" : "without") << " a staged draft head") {
      HandoffTicket t = FixedTicket(draft);
      t.admission = {{0, 2}, {2}, {1, 0, 2}, {2}};  // every list holds the tail block (2)
      DecodeSideModel m;
      m.geometry = t.geometry;
      m.geometry.num_blocks = 0;  // (ignored: the prompt decides it)
      m.vocab_size = 2000;
      m.max_context = 64;
      m.topk_blocks = 1;  // lists of at most 3
      m.pool_id = t.pool_id;
      REQUIRE(CheckTicketForDecode(t, m).ok());
      REQUIRE(CheckTicketForDecode(t, DecodeSideModel{.geometry = m.geometry})
                  .ok());  // the rest unchecked

      const auto rejects = [&](const HandoffTicket& bad, const DecodeSideModel& model,
                               const std::string& needle) {
        const Status st = CheckTicketForDecode(bad, model);
        INFO("expecting a rejection naming \"" << needle << "\"");
        REQUIRE_FALSE(st.ok());
        CHECK(st.code() == StatusCode::kInvalidArgument);
        CHECK_THAT(st.message(), Catch::StartsWith("handoff ticket for this model: "));
        CHECK_THAT(st.message(), Catch::Contains(needle));
      };
      const std::vector<std::pair<uint32_t StagedKvGeometry::*, std::string>> fields = {
          {&StagedKvGeometry::num_layers, "staged layers"},
          {&StagedKvGeometry::num_kv_heads, "KV heads"},
          {&StagedKvGeometry::head_dim, "head_dim"},
          {&StagedKvGeometry::dtype_bytes, "dtype bytes"},
          {&StagedKvGeometry::draft_kv_heads, "draft head KV heads"}};
      for (const auto& [field, name] : fields) {
        DecodeSideModel other = m;
        other.geometry.*field += 1;
        rejects(t, other, name + " differs (ticket " + std::to_string(t.geometry.*field));
      }
      DecodeSideModel other_draft_dim = m;
      other_draft_dim.geometry.draft_head_dim += 64;
      if (draft) {
        rejects(t, other_draft_dim, "draft head_dim differs");
      } else {
        CHECK(CheckTicketForDecode(t, other_draft_dim).ok());  // no draft staged: not compared
      }
      DecodeSideModel other_pool = m;
      other_pool.pool_id = t.pool_id + 1;
      rejects(t, other_pool, "staging pool id differs");

      for (size_t i = 0; i < t.tokens.size(); ++i) {
        HandoffTicket bad = t;
        bad.tokens[i] = 2000;
        rejects(bad, m,
                std::string(i == 0   ? "token x1"
                            : i == 1 ? "token x2"
                                     : "token draft x3") +
                    " = 2000 is outside the vocabulary of 2000");
      }
      DecodeSideModel short_context = m;
      short_context.max_context = t.prompt_length + 1;
      rejects(t, short_context,
              "a prompt of 40 tokens leaves no room to decode in a context of 41");
      short_context.max_context = t.prompt_length + 2;
      CHECK(CheckTicketForDecode(t, short_context).ok());

      HandoffTicket no_tail = t;
      no_tail.admission[3] = {0, 1};
      rejects(no_tail, m, "the admission list of (layer 1, KV head 1) lacks the tail block 2");
      DecodeSideModel small_k = m;
      small_k.max_context = 128;
      small_k.topk_blocks = 0;  // unchecked
      HandoffTicket longer = t;
      longer.prompt_length = 100;  // 7 blocks
      longer.position = 101;
      longer.geometry.num_blocks = 7;
      longer.admission = {{6}, {6}, {0, 1, 2, 3, 4, 5, 6}, {6}};
      CHECK(CheckTicketForDecode(longer, small_k).ok());
      small_k.topk_blocks = 3;  // at most 7
      CHECK(CheckTicketForDecode(longer, small_k).ok());
      small_k.topk_blocks = 2;  // at most 5
      rejects(longer, small_k,
              "the admission list of (layer 1, KV head 0) holds 7 blocks, more than 2K + 1 = 5");
    }
  }
}

TEST_CASE("handoff ticket: the fuzzer's seed corpus is current", "[disagg][ticket]") {
  for (bool draft : {false, true}) {
    const std::string path =
        std::string(OASIS_TICKET_CORPUS_DIR) + (draft ? "/with_draft" : "/without_draft");
    const std::string bytes = EncodeHandoffTicket(FixedTicket(draft));
    if (const char* w = std::getenv("OASIS_WRITE_TICKET_SEEDS"); w && std::string(w) == "1") {
      std::ofstream(path, std::ios::binary) << bytes;
    }
    std::ifstream in(path, std::ios::binary);
    INFO(path);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    CHECK(ss.str() == bytes);
    CHECK(ParseHandoffTicket(ss.str()).ok());
  }
}
#endif

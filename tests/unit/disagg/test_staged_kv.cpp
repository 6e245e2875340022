// Pack and unpack of a request's staged state (disagg/staged_kv.h) on the CPU backend: random
// host KV, summaries and draft-head KV packed from one sparse KV manager's host store and
// draft pool into a lease, read into another's (whole slots on one side, per-layer cells and
// summary-only rows on the other) and compared byte for byte, over several geometries, with
// and without the draft head, full and partial transfers, f32 and FP8 (e4m3 KV and summaries,
// f32 draft KV over several slots a block); FP8 bytes mapped into other scales on import
// (KvRequantizer); and the drift reads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "disagg/kv_import.h"
#include "disagg/kv_requantize.h"
#include "disagg/staged_kv.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {

struct Geometry {
  int64_t layers = 2, heads = 2, dim = 8, tokens = 50;
  int64_t draft_heads = 0, draft_dim = 0;
  bool partial = false;  // the decode side reads only the admission lists' K/V
  bool fp8 = false;      // e4m3 KV and summaries in the host store (the draft KV stays f32)
};

constexpr int64_t kDraftSlots = 64;

DType KvDtype(const Geometry& g) { return g.fp8 ? DType::kF8E4M3 : DType::kF32; }
constexpr uint64_t kId = 5;

void Randomize(Tensor& t, std::mt19937& rng) {
  if (t.dtype() == DType::kF8E4M3) {  // any finite e4m3 (not 0x7f / 0xff, NaN)
    auto* b = static_cast<uint8_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) {
      do b[i] = static_cast<uint8_t>(rng());
      while ((b[i] & 0x7f) == 0x7f);
    }
    return;
  }
  REQUIRE(t.dtype() == DType::kF32);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
}

// One instance: a sparse KV manager (its host store) and a draft head's pool.
struct Side {
  CpuBackend backend{1};
  BlockAllocator gpu{64};
  BlockAllocator draft_alloc{kDraftSlots};
  std::unique_ptr<SparseKvManager> manager;
  LayerKvPool draft_pool;
  HeadBlockTable draft_table;
  Side(const Geometry& g, int64_t skip_draft_slots)
      : draft_table(static_cast<int32_t>(std::max<int64_t>(1, g.draft_heads))) {
    SparseConfig c;
    c.topk_blocks = 3;
    c.fetch_ratio = 0.5;
    c.sparse_threshold = 32;
    c.max_sparse_seqs = 2;
    c.max_seq_len = 400;
    const double slot = static_cast<double>(HostKvStore::BytesPerSlot(g.layers, g.dim, KvDtype(g)));
    c.host_kv_gib = 120.0 * slot / (1024.0 * 1024.0 * 1024.0);
    c.remote_kv_gib = 40.0 * slot / (1024.0 * 1024.0 * 1024.0);
    c.remote_fetch_cap = 2;
    manager = std::make_unique<SparseKvManager>(
        c, SparseModelShape{g.layers, g.heads, g.dim, g.fp8}, backend, gpu);
    if (g.draft_heads > 0) {
      draft_pool = {Tensor::Empty({kDraftSlots, kBlockSize, g.draft_dim}, DType::kF32),
                    Tensor::Empty({kDraftSlots, kBlockSize, g.draft_dim}, DType::kF32)};
      REQUIRE(draft_alloc.Allocate(static_cast<int32_t>(skip_draft_slots)).has_value());
      REQUIRE(draft_table.Reserve(g.tokens, draft_alloc).ok());
    }
  }
  ~Side() {
    draft_table.Release(draft_alloc);
    manager->Release(kId);
  }
  StagedKvHome Home(const Geometry& g) {
    StagedKvHome h;
    h.backend = &backend;
    h.manager = manager.get();
    h.id = kId;
    if (g.draft_heads > 0) {
      h.draft_pool = &draft_pool;
      h.draft_table = &draft_table;
    }
    return h;
  }
};

StagedKvGeometry StagedGeometry(const Geometry& g) {
  StagedKvGeometry s;
  s.num_layers = static_cast<uint32_t>(g.layers);
  s.num_kv_heads = static_cast<uint32_t>(g.heads);
  s.head_dim = static_cast<uint32_t>(g.dim);
  s.kv_dtype = static_cast<uint32_t>(g.fp8 ? StagedKvDtype::kF8E4M3 : StagedKvDtype::kF32);
  s.dtype_bytes = g.fp8 ? 1 : 4;
  s.num_blocks = static_cast<uint32_t>((g.tokens + kBlockSize - 1) / kBlockSize);
  s.draft_kv_heads = static_cast<uint32_t>(g.draft_heads);
  s.draft_head_dim = static_cast<uint32_t>(g.draft_dim);
  s.draft_dtype_bytes = g.draft_heads > 0 ? 4 : 0;  // the draft head's KV: f32 on the CPU
  return s;
}

bool SameBytes(const Tensor& a, int64_t row_a, const Tensor& b, int64_t row_b) {
  const size_t row = a.nbytes() / static_cast<size_t>(a.dim(0));
  REQUIRE(row == b.nbytes() / static_cast<size_t>(b.dim(0)));
  return std::memcmp(static_cast<const char*>(a.raw()) + static_cast<size_t>(row_a) * row,
                     static_cast<const char*>(b.raw()) + static_cast<size_t>(row_b) * row,
                     row) == 0;
}

// `rq`: the decode side maps the landed bytes (FP8 into its own scales) before Finish; then
// every K/V and summary byte of the decode side must be the mapped byte of the prefill side.
void RoundTrip(const Geometry& g, const KvRequantizer& rq = {}) {
  std::mt19937 rng(std::random_device{}());
  const StagedKvGeometry sg = StagedGeometry(g);
  auto layout = StagedKvLayout::Create(sg);
  REQUIRE(layout.ok());
  const int64_t nb = sg.num_blocks, max_total = g.tokens + 20;

  // Prefill side: whole host slots, every byte random.
  Side a(g, 0);
  REQUIRE(a.manager->Reserve(kId, max_total, /*always_sparse=*/true).ok());
  for (int64_t l = 0; l < g.layers; ++l) {
    HostKvStore& store = a.manager->host_store();
    for (Tensor* t : {&store.pool(l).k, &store.pool(l).v, &store.kmin(l), &store.kmax(l)})
      Randomize(*t, rng);
  }
  if (g.draft_heads > 0) {
    Randomize(a.draft_pool.k, rng);
    Randomize(a.draft_pool.v, rng);
  }
  std::vector<std::vector<char>> lease(layout->num_slots(),
                                       std::vector<char>(layout->slot_bytes()));
  PackStagedKv(*layout, a.Home(g),
               [&](uint64_t ordinal) { return static_cast<void*>(lease.at(ordinal).data()); });

  // Decode side: the staged complete blocks per layer; in partial mode a few blocks per
  // (layer, head) local, the rest remote (summary-only rows).
  Side b(g, 7);
  std::vector<std::vector<uint16_t>> lists(static_cast<size_t>(g.layers * g.heads));
  std::vector<std::vector<int32_t>> local(lists.size());
  for (size_t i = 0; i < lists.size(); ++i) {
    for (int64_t blk = static_cast<int64_t>(i % 2); blk < nb; blk += 2)
      lists[i].push_back(static_cast<uint16_t>(blk));
    lists[i].push_back(static_cast<uint16_t>(nb - 1));
    std::sort(lists[i].begin(), lists[i].end());
    lists[i].erase(std::unique(lists[i].begin(), lists[i].end()), lists[i].end());
    std::reverse(lists[i].begin(), lists[i].end());  // the unpacker sorts
    local[i].assign(lists[i].begin(), lists[i].end());
  }
  REQUIRE(
      ReserveImport(*b.manager, kId, max_total, g.tokens / kBlockSize, g.partial ? &local : nullptr)
          .ok());
  StagedKvUnpacker unpacker(*layout);
  const std::vector<StagedSlotRef> reads =
      unpacker.Destinations(b.Home(g), g.partial ? &lists : nullptr);
  std::set<uint64_t> ordinals;
  for (const StagedSlotRef& r : reads) {
    REQUIRE(r.ordinal < layout->num_slots());
    REQUIRE(ordinals.insert(r.ordinal).second);
    std::memcpy(r.dst, lease[r.ordinal].data(), layout->slot_bytes());
  }
  CHECK(ordinals.size() == (g.partial ? reads.size() : layout->num_slots()));
  rq.ApplyLanded(*layout, reads);
  unpacker.Finish(b.Home(g));
  // Row `row` of `t` (e4m3) mapped by (l, h, kv)'s table, for comparison.
  auto mapped = [&](const Tensor& t, int64_t row, int64_t l, int64_t h, uint32_t kv) {
    const size_t n = t.nbytes() / static_cast<size_t>(t.dim(0));
    Tensor out = Tensor::Empty({1, static_cast<int64_t>(n)}, DType::kF8E4M3);
    std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + static_cast<size_t>(row) * n, n);
    rq.Apply(static_cast<uint32_t>(l), static_cast<uint32_t>(h), kv,
             static_cast<uint8_t*>(out.raw()), n);
    return out;
  };
  auto same = [&](const Tensor& a_rows, int64_t from, const Tensor& b_rows, int64_t to, int64_t l,
                  int64_t h, uint32_t kv) {
    if (rq.identity()) return SameBytes(a_rows, from, b_rows, to);
    return SameBytes(mapped(a_rows, from, l, h, kv), 0, b_rows, to);
  };

  HostKvStore& sa = a.manager->host_store();
  HostKvStore& sb = b.manager->host_store();
  for (int64_t l = 0; l < g.layers; ++l) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const auto& list = lists[static_cast<size_t>(l * g.heads + h)];
      for (int64_t blk = 0; blk < nb; ++blk) {
        const int32_t from = a.manager->HostSlotOf(kId, l, h, blk),
                      to = b.manager->HostSlotOf(kId, l, h, blk);
        REQUIRE(from >= 0);
        REQUIRE(to >= 0);
        INFO("layer " << l << " head " << h << " block " << blk);
        CHECK(same(sa.kmin(l), from, sb.kmin(l), to, l, h, 0));
        CHECK(same(sa.kmax(l), from, sb.kmax(l), to, l, h, 0));
        if (g.partial && std::find(list.begin(), list.end(), blk) == list.end()) {
          CHECK_FALSE(sb.IsSlot(to));  // remote: no K/V here
          continue;
        }
        CHECK(same(sa.pool(l).k, from, sb.pool(l).k, to, l, h, 0));
        CHECK(same(sa.pool(l).v, from, sb.pool(l).v, to, l, h, 1));
      }
    }
  }
  for (int64_t h = 0; h < g.draft_heads; ++h) {
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int32_t from =
          a.draft_table.head_slots(static_cast<int32_t>(h))[static_cast<size_t>(blk)];
      const int32_t to =
          b.draft_table.head_slots(static_cast<int32_t>(h))[static_cast<size_t>(blk)];
      REQUIRE(from != to);
      CHECK(SameBytes(a.draft_pool.k, from, b.draft_pool.k, to));
      CHECK(SameBytes(a.draft_pool.v, from, b.draft_pool.v, to));
    }
  }
}

}  // namespace

TEST_CASE("staged KV: pack on one instance, unpack on another, byte for byte", "[disagg]") {
  SECTION("two layers, two heads, no draft head") { RoundTrip({2, 2, 8, 50, 0, 0, false}); }
  SECTION("one head, head_dim 16, a draft head of smaller head_dim") {
    RoundTrip({3, 1, 16, 33, 1, 8, false});
  }
  SECTION("one layer, four heads, one token past a block, two draft heads") {
    RoundTrip({1, 4, 8, 81, 2, 8, false});
  }
  SECTION("block-aligned context, draft head") { RoundTrip({2, 2, 8, 64, 1, 8, false}); }
  SECTION("partial transfer: the admission lists' K/V, every summary") {
    RoundTrip({2, 2, 8, 100, 1, 8, true});
  }
  SECTION("partial transfer without a draft head") { RoundTrip({3, 3, 8, 70, 0, 0, true}); }
}

TEST_CASE("staged KV: FP8 pools pack and unpack byte for byte", "[disagg][fp8]") {
  // e4m3 KV and summaries (1-byte slots of 16 x head_dim), the f32 draft KV over 4 slots a
  // block (head_dim 8) or 2 (draft head_dim 8 over KV head_dim 16).
  SECTION("no draft head") { RoundTrip({2, 2, 8, 50, 0, 0, false, true}); }
  SECTION("a draft head, 4 slots a draft block") { RoundTrip({1, 4, 8, 81, 2, 8, false, true}); }
  SECTION("a draft head of smaller head_dim") { RoundTrip({3, 1, 16, 33, 1, 8, false, true}); }
  SECTION("partial transfer") { RoundTrip({2, 2, 8, 100, 1, 8, true, true}); }
  SECTION("partial, the same scales on both sides: the identity, bytes untouched") {
    const std::vector<float> k = {0.5f, 0.25f, 0.125f, 1.0f}, v = {2.0f, 1.0f, 0.75f, 3.0f};
    auto rq = KvRequantizer::Create(2, k, v, k, v);
    REQUIRE(rq.ok());
    CHECK(rq->identity());
    RoundTrip({2, 2, 8, 100, 1, 8, true, true}, *rq);
  }
  SECTION("other scales on the decode side: every K/V and summary byte mapped") {
    // (2 layers x 2 heads) K and V scales, the decode side's up to 2x apart either way.
    const std::vector<float> from_k = {0.5f, 0.25f, 0.125f, 1.0f},
                             from_v = {2.0f, 1.0f, 0.75f, 3.0f};
    const std::vector<float> to_k = {0.5f, 0.4f, 0.25f, 0.6f}, to_v = {1.5f, 2.0f, 0.75f, 1.7f};
    auto rq = KvRequantizer::Create(2, from_k, from_v, to_k, to_v);
    REQUIRE(rq.ok());
    CHECK_FALSE(rq->identity());
    RoundTrip({2, 2, 8, 100, 1, 8, true, true}, *rq);
    RoundTrip({2, 2, 8, 50, 0, 0, false, true}, *rq);
  }
}

TEST_CASE("KvRequantizer: identity, the mapping, monotone, refusals", "[disagg][fp8]") {
  const std::vector<float> one = {0.03f}, same = {0.03f};
  auto id = KvRequantizer::Create(1, one, one, same, same);
  REQUIRE(id.ok());
  CHECK(id->identity());
  CHECK(id->max_ratio() == 1.0);
  {
    uint8_t bytes[3] = {0x12, 0x7e, 0x80};
    id->Apply(0, 0, 0, bytes, 3);
    CHECK((bytes[0] == 0x12 && bytes[1] == 0x7e && bytes[2] == 0x80));
  }
  // A ratio of exactly 2 (decode's scale half the prefill's): values double, exactly, up to
  // the saturation at 448 (prefill values above 224 x its scale clip).
  auto twice = KvRequantizer::Create(1, {0.5f}, {0.5f}, {0.25f}, {0.5f});
  REQUIRE(twice.ok());
  CHECK_FALSE(twice->identity());
  CHECK(twice->max_ratio() == 2.0);
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    uint8_t k = static_cast<uint8_t>(b), v = static_cast<uint8_t>(b);
    twice->Apply(0, 0, 0, &k, 1);
    twice->Apply(0, 0, 1, &v, 1);
    CHECK(v == b);  // V scales equal: untouched
    const float x = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    CHECK(Fp8E4M3ToFloat(k) == std::clamp(2 * x, -448.0f, 448.0f));
  }
  // Any ratio: the decode side's own rounding of the value, and monotone (so summaries, the
  // min/max of stored keys, map to the summaries of the mapped blocks).
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> scale(0.01f, 1.0f), factor(0.5f, 2.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const float from = scale(rng), to = from * factor(rng);
    auto q = KvRequantizer::Create(1, {from}, {from}, {to}, {to});
    REQUIRE(q.ok());
    float last = -1e30f;
    // The finite e4m3 values in increasing order: negatives from the largest magnitude, then
    // the positives.
    std::vector<uint8_t> order;
    for (int b = 0x7e; b >= 0; --b) order.push_back(static_cast<uint8_t>(0x80 | b));
    for (int b = 0; b <= 0x7e; ++b) order.push_back(static_cast<uint8_t>(b));
    for (uint8_t b : order) {
      uint8_t m = b;
      q->Apply(0, 0, 0, &m, 1);
      CHECK(m == FloatToFp8E4M3(Fp8E4M3ToFloat(b) * from / to));
      const float y = Fp8E4M3ToFloat(m);
      CHECK(y >= last);
      last = y;
    }
  }
  // More than 2x apart, sizes that differ: refused, naming the (layer, head).
  auto far = KvRequantizer::Create(2, {0.1f, 0.1f}, {0.1f, 0.1f}, {0.1f, 0.049f}, {0.1f, 0.1f});
  REQUIRE_FALSE(far.ok());
  CHECK(far.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(far.status().message(), Catch::Contains("K scale of (layer 0, KV head 1)"));
  CHECK_THAT(far.status().message(), Catch::Contains("cannot be reconciled"));
  auto far_v = KvRequantizer::Create(1, {0.1f}, {0.1f}, {0.1f}, {0.21f});
  REQUIRE_FALSE(far_v.ok());
  CHECK_THAT(far_v.status().message(), Catch::Contains("V scale of (layer 0, KV head 0)"));
  CHECK_FALSE(KvRequantizer::Create(2, {0.1f, 0.1f}, {0.1f, 0.1f}, {0.1f}, {0.1f}).ok());
  CHECK_FALSE(KvRequantizer::Create(2, {0.1f}, {0.1f}, {0.1f}, {0.1f}).ok());
}

TEST_CASE("staged KV: drift reads land in the host slots given", "[disagg]") {
  std::mt19937 rng(std::random_device{}());
  const bool fp8 = GENERATE(false, true);
  CAPTURE(fp8);
  const Geometry g{2, 2, 8, 100, 0, 0, true, fp8};
  auto layout = StagedKvLayout::Create(StagedGeometry(g));
  REQUIRE(layout.ok());
  std::vector<std::vector<char>> lease(layout->num_slots(),
                                       std::vector<char>(layout->slot_bytes()));
  for (auto& slot : lease) {
    for (char& c : slot) c = static_cast<char>(rng());
  }
  Side b(g, 0);
  const std::vector<RemoteBlock> blocks = {{0, 1, 3}, {1, 0, 0}, {1, 1, 5}};
  std::vector<char> buffer;
  const std::vector<StagedSlotRef> reads = DriftReads(*layout, 0, blocks, buffer);
  REQUIRE(reads.size() == 2 * blocks.size());
  for (const StagedSlotRef& r : reads)
    std::memcpy(r.dst, lease.at(r.ordinal).data(), layout->slot_bytes());
  HostKvStore& store = b.manager->host_store();
  const std::vector<int32_t> slots = {4, 9, 2};
  for (size_t i = 0; i < blocks.size(); ++i)
    StoreDriftBlock(*layout, store, blocks[i], slots[i], buffer, i);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& blk = blocks[i];
    const auto li = static_cast<uint32_t>(blk.layer), hi = static_cast<uint32_t>(blk.head),
               bi = static_cast<uint32_t>(blk.block);
    const size_t bb = layout->slot_bytes();
    CHECK(std::memcmp(static_cast<const char*>(store.pool(blk.layer).k.raw()) + slots[i] * bb,
                      lease[layout->KvSlot(li, hi, bi, 0)].data(), bb) == 0);
    CHECK(std::memcmp(static_cast<const char*>(store.pool(blk.layer).v.raw()) + slots[i] * bb,
                      lease[layout->KvSlot(li, hi, bi, 1)].data(), bb) == 0);
  }
}

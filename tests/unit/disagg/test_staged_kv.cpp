// Pack and unpack of a request's staged state (disagg/staged_kv.h) on the CPU backend: random
// host KV, summaries and draft-head KV packed from one sparse KV manager's host store and
// draft pool into a lease, read into another's (whole slots on one side, per-layer cells and
// summary-only rows on the other) and compared byte for byte, over several geometries, with
// and without the draft head, full and partial transfers; and the drift reads.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "disagg/kv_import.h"
#include "disagg/staged_kv.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {

struct Geometry {
  int64_t layers = 2, heads = 2, dim = 8, tokens = 50;
  int64_t draft_heads = 0, draft_dim = 0;
  bool partial = false;  // the decode side reads only the admission lists' K/V
};

constexpr int64_t kDraftSlots = 64;
constexpr uint64_t kId = 5;

void Randomize(Tensor& t, std::mt19937& rng) {
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
    const double slot =
        static_cast<double>(HostKvStore::BytesPerSlot(g.layers, g.dim, DType::kF32));
    c.host_kv_gib = 120.0 * slot / (1024.0 * 1024.0 * 1024.0);
    c.remote_kv_gib = 40.0 * slot / (1024.0 * 1024.0 * 1024.0);
    c.remote_fetch_cap = 2;
    manager = std::make_unique<SparseKvManager>(c, SparseModelShape{g.layers, g.heads, g.dim},
                                                backend, gpu);
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
  s.dtype_bytes = 4;
  s.num_blocks = static_cast<uint32_t>((g.tokens + kBlockSize - 1) / kBlockSize);
  s.draft_kv_heads = static_cast<uint32_t>(g.draft_heads);
  s.draft_head_dim = static_cast<uint32_t>(g.draft_dim);
  return s;
}

bool SameBytes(const Tensor& a, int64_t row_a, const Tensor& b, int64_t row_b) {
  const size_t row = a.nbytes() / static_cast<size_t>(a.dim(0));
  REQUIRE(row == b.nbytes() / static_cast<size_t>(b.dim(0)));
  return std::memcmp(static_cast<const char*>(a.raw()) + static_cast<size_t>(row_a) * row,
                     static_cast<const char*>(b.raw()) + static_cast<size_t>(row_b) * row,
                     row) == 0;
}

void RoundTrip(const Geometry& g) {
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
  unpacker.Finish(b.Home(g));

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
        CHECK(SameBytes(sa.kmin(l), from, sb.kmin(l), to));
        CHECK(SameBytes(sa.kmax(l), from, sb.kmax(l), to));
        if (g.partial && std::find(list.begin(), list.end(), blk) == list.end()) {
          CHECK_FALSE(sb.IsSlot(to));  // remote: no K/V here
          continue;
        }
        CHECK(SameBytes(sa.pool(l).k, from, sb.pool(l).k, to));
        CHECK(SameBytes(sa.pool(l).v, from, sb.pool(l).v, to));
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

TEST_CASE("staged KV: drift reads land in the host slots given", "[disagg]") {
  std::mt19937 rng(std::random_device{}());
  const Geometry g{2, 2, 8, 100, 0, 0, true};
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

// SparseKvManager's host logic with the CPU backend as the device and synthetic KV pools:
// admission against the host store, the dense -> sparse switch (host copy, summaries, initial
// working set, slot hand-over, failure without side effects), step plans (tails straddling a
// block boundary, write-through targets, predictor rows) and release.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <tuple>

#include "kvcache/sparse_kv_manager.h"
#include "sparse_kv_rig.h"

using namespace oasis;

namespace {

constexpr int64_t kLayers = testing::kRigLayers, kHeads = testing::kRigHeads, kDim = testing::kRigDim,
                  kGpuSlots = testing::kRigGpuSlots;
using Rig = testing::SparseKvRig;
SparseConfig Config(int32_t k = 3, int32_t dense_layers = 0) { return testing::RigConfig(k, dense_layers); }

const float* Block(const Tensor& pool, int32_t slot) { return pool.data<float>() + slot * kBlockSize * kDim; }

std::vector<int32_t> Row(const Tensor& t, int64_t row) {
  const int64_t w = t.dim(-1);  // rows of the last dimension
  return std::vector<int32_t>(t.data<int32_t>() + row * w, t.data<int32_t>() + (row + 1) * w);
}

}  // namespace

TEST_CASE("host admission: not needed, fits, wait, never; reservations return", "[kvcache][sparse]") {
  Rig rig(Config());
  SparseKvManager& m = *rig.manager;
  REQUIRE(m.host_store().num_slots() == 60);
  CHECK(m.CheckAdmission(32) == HostAdmission::kNotNeeded);  // never above the threshold
  CHECK(m.CheckAdmission(401) == HostAdmission::kNever);     // beyond max_seq_len
  REQUIRE(m.CheckAdmission(400) == HostAdmission::kFits);    // 25 blocks x 2 heads = 50 slots
  REQUIRE(m.Reserve(1, 400).ok());
  CHECK(m.host_slots_reserved() == 50);
  CHECK(m.CheckAdmission(100) == HostAdmission::kWait);  // 14 slots, 10 free
  Status s = m.Reserve(2, 100);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(m.host_slots_reserved() == 50);  // nothing taken
  CHECK(m.CheckAdmission(80) == HostAdmission::kFits);  // 5 blocks x 2 = 10
  CHECK_FALSE(m.Reserve(1, 80).ok());                   // one reservation per request
  m.Release(1);
  CHECK(m.host_slots_reserved() == 0);
  CHECK(m.CheckAdmission(100) == HostAdmission::kFits);
  m.Release(1);  // unknown now: ignored
}

TEST_CASE("the switch copies KV to the host store and summarises every block", "[kvcache][sparse]") {
  Rig rig(Config(/*k=*/3));
  SparseKvManager& m = *rig.manager;
  HeadBlockTable table = rig.SwitchNew(5, 45, 100);  // 2 full blocks + 13 tokens
  const std::vector<std::vector<int32_t>> dense = {table.head_slots(0), table.head_slots(1)};
  REQUIRE(m.SwitchToSparse(5, table, 45, rig.pools).ok());
  REQUIRE(m.IsSparse(5));
  SparseDeviceState& st = m.state();
  const int32_t row = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    const LayerKvPool& host = m.host_store().pool(l);
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 3; ++b) {
        const int32_t hs = st.layer(l).host_tables.data<int32_t>()[(row * kHeads + h) * st.max_blocks() + b];
        const int32_t gs = dense[static_cast<size_t>(h)][static_cast<size_t>(b)];
        const int64_t valid = b < 2 ? kBlockSize : 13;
        REQUIRE(std::equal(Block(host.k, hs), Block(host.k, hs) + valid * kDim, Block(rig.pools[l].k, gs)));
        REQUIRE(std::equal(Block(host.v, hs), Block(host.v, hs) + valid * kDim, Block(rig.pools[l].v, gs)));
        for (int64_t x = 0; x < kDim; ++x) {
          float lo = std::numeric_limits<float>::infinity(), hi = -lo;
          for (int64_t j = 0; j < valid; ++j) {
            lo = std::min(lo, Block(rig.pools[l].k, gs)[j * kDim + x]);
            hi = std::max(hi, Block(rig.pools[l].k, gs)[j * kDim + x]);
          }
          REQUIRE(m.host_store().kmin(l).data<float>()[hs * kDim + x] == lo);
          REQUIRE(m.host_store().kmax(l).data<float>()[hs * kDim + x] == hi);
        }
      }
    }
  }
  m.Release(5);
  REQUIRE(rig.alloc.num_free() == kGpuSlots);
}

TEST_CASE("the switch keeps block 0 and the newest blocks in place and frees the rest", "[kvcache][sparse]") {
  Rig rig(Config(/*k=*/3));
  SparseKvManager& m = *rig.manager;
  HeadBlockTable table = rig.SwitchNew(9, 170, 200);  // 10 full blocks + 10 tokens: 11 blocks
  const std::vector<std::vector<int32_t>> dense = {table.head_slots(0), table.head_slots(1)};
  const int32_t free_before = rig.alloc.num_free();
  REQUIRE(m.SwitchToSparse(9, table, 170, rig.pools).ok());
  CHECK(table.num_blocks() == 0);
  CHECK(m.gpu_slots_held() == (3 + 2) * kHeads);
  CHECK(rig.alloc.num_free() == free_before + (11 - 5) * kHeads);
  SparseDeviceState& st = m.state();
  for (int64_t l = 0; l < kLayers; ++l) {
    SparseLayerState& ls = st.layer(l);
    for (int64_t h = 0; h < kHeads; ++h) {
      const auto& d = dense[static_cast<size_t>(h)];
      CHECK(Row(ls.ws_blocks, h) == std::vector<int32_t>{0, 8, 9});
      CHECK(Row(ls.resident_slots, h) == std::vector<int32_t>{d[0], d[8], d[9]});  // no copy: same slots
      CHECK(ls.num_resident.data<int32_t>()[h] == 3);
    }
  }
  // The partial block 10 is tail slot 10 % 2 = 0: the next token (position 170) goes there.
  SparseStepPlan plan = m.BuildStepPlan({{9, 170, 2, nullptr}});
  for (int64_t h = 0; h < kHeads; ++h) {
    CHECK(plan.slots[0].slot_mapping[static_cast<size_t>(h)] == int64_t{dense[static_cast<size_t>(h)][10]} * 16 + 10);
  }
  m.Release(9);
  CHECK(rig.alloc.num_free() == kGpuSlots);
  CHECK(m.host_slots_reserved() == 0);
}

TEST_CASE("a switch that cannot get a row or GPU slots changes nothing", "[kvcache][sparse]") {
  Rig rig(Config(/*k=*/6));
  SparseKvManager& m = *rig.manager;
  // 3 full blocks < K = 6: the switch needs 3 + 2 fresh slots per head.
  HeadBlockTable a = rig.SwitchNew(1, 48, 100);
  std::optional<std::vector<int32_t>> hog = rig.alloc.Allocate(rig.alloc.num_free() - 9);
  REQUIRE(hog);
  const std::vector<int32_t> slots0 = a.head_slots(0);
  Status s = m.SwitchToSparse(1, a, 48, rig.pools);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_FALSE(m.IsSparse(1));
  CHECK(a.head_slots(0) == slots0);
  CHECK(rig.alloc.num_free() == 9);
  rig.alloc.Free(*hog);
  REQUIRE(m.SwitchToSparse(1, a, 48, rig.pools).ok());
  HeadBlockTable b = rig.SwitchNew(2, 48, 100);
  REQUIRE(m.SwitchToSparse(2, b, 48, rig.pools).ok());
  HeadBlockTable c = rig.SwitchNew(3, 48, 100);  // only 2 sparse rows
  const int32_t free_now = rig.alloc.num_free();
  CHECK(m.SwitchToSparse(3, c, 48, rig.pools).code() == StatusCode::kResourceExhausted);
  CHECK(rig.alloc.num_free() == free_now);
  CHECK(c.num_blocks() == 3);
  for (uint64_t id : {1, 2, 3}) m.Release(id);
  c.Release(rig.alloc);
  CHECK(rig.alloc.num_free() == kGpuSlots);
}

TEST_CASE("step plans: tails across a block boundary, write-through targets, predictor rows", "[kvcache][sparse]") {
  for (SparsePredictor predictor : {SparsePredictor::kDraft, SparsePredictor::kPreviousQuery, SparsePredictor::kOracle}) {
    DYNAMIC_SECTION(SparsePredictorName(predictor)) {
      SparseConfig cfg = Config(/*k=*/3);
      cfg.predictor = predictor;
      cfg.agreement_interval = 1;
      Rig rig(cfg);
      SparseKvManager& m = *rig.manager;
      HeadBlockTable table = rig.SwitchNew(4, 79, 120);  // next real token: position 79 = block 4 offset 15
      const int32_t tail4 = table.head_slots(1)[4];
      REQUIRE(m.SwitchToSparse(4, table, 79, rig.pools).ok());
      HeadBlockTable dense(kHeads);
      REQUIRE(dense.Reserve(10, rig.alloc).ok());
      // Batch: a dense sequence (3 tokens), then the sparse one with [x_t, draft].
      std::vector<SparseBatchEntry> batch = {{99, 7, 3, &dense}, {4, 79, 2, nullptr}};
      SparseStepPlan p = m.BuildStepPlan(batch);
      CHECK(p.num_sparse == 1);
      CHECK(Row(p.seq_rows.Reshape({1, 2}), 0) == std::vector<int32_t>{-1, 0});
      CHECK(p.tail_lens.data<int32_t>()[1] == 17);  // 16 tokens of block 4 + the draft in block 5
      const SparseStepSlots& sl = p.slots[1];
      CHECK(sl.num_tail_blocks == 2);
      CHECK(p.slots[0].slot_mapping.empty());
      const int32_t t4 = p.tail_slots.data<int32_t>()[(1 * kHeads + 1) * 2], t5 = p.tail_slots.data<int32_t>()[(1 * kHeads + 1) * 2 + 1];
      CHECK(t4 == tail4);  // the partial block stayed in its slot
      CHECK(t5 != t4);
      CHECK(sl.slot_mapping[1] == int64_t{t4} * 16 + 15);  // x_t, head 1
      CHECK(sl.slot_mapping[kHeads + 1] == int64_t{t5} * 16 + 0);  // draft, head 1
      // Write-through: only x_t (batch row 3), to host block 4 offset 15.
      const int32_t host4 = m.state().layer(kLayers - 1).host_tables.data<int32_t>()[(0 * kHeads + 1) * m.state().max_blocks() + 4];
      for (int64_t t = 0; t < 5; ++t) {
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t v = p.host_mapping.data<int64_t>()[t * kHeads + h];
          if (t == 3 && h == 1) CHECK(v == int64_t{host4} * 16 + 15);
          if (t != 3) CHECK(v == -1);
        }
      }
      CHECK(p.summary_len.data<int32_t>()[1 * kHeads + 1] == 16);
      CHECK(p.summary_dst.data<int32_t>()[1 * kHeads + 1] == host4);
      CHECK(p.summary_len.data<int32_t>()[0] == 0);
      const int32_t predict = p.predict_rows.data<int32_t>()[0];
      if (predictor == SparsePredictor::kOracle) {
        CHECK(predict == -1);
        CHECK(p.predict_gather.numel() == 0);
        CHECK(p.current_rows.data<int32_t>()[0] == 3);
        CHECK(p.current_num_blocks.data<int32_t>()[0] == 4);
      } else {
        REQUIRE(predict == 0);
        CHECK(p.predict_gather.data<int32_t>()[0] == (predictor == SparsePredictor::kDraft ? 4 : 3));
        CHECK(p.predict_num_blocks.data<int32_t>()[0] == 5);  // block 4 is complete for the next step
        CHECK(p.current_rows.data<int32_t>()[0] == -1);       // no previous prediction yet
        SparseStepPlan next = m.BuildStepPlan({{4, 80, 2, nullptr}});
        CHECK(next.current_rows.data<int32_t>()[0] == 0);  // measured now
        CHECK(next.tail_lens.data<int32_t>()[0] == 2);
        CHECK(next.slots[0].num_tail_blocks == 1);
        CHECK(next.slots[0].tail_slots[1] == t5);  // block 5 keeps its tail slot
      }
      m.Release(4);
      dense.Release(rig.alloc);
      CHECK(rig.alloc.num_free() == kGpuSlots);
    }
  }
}

TEST_CASE("step plans after accepted drafts: the owed write-through, the tail from kv_end, its summary",
          "[kvcache][sparse]") {
  Rig rig(Config(/*k=*/3));
  SparseKvManager& m = *rig.manager;
  HeadBlockTable table = rig.SwitchNew(4, 77, 120);  // next real token: position 77 (block 4, offset 13)
  REQUIRE(m.SwitchToSparse(4, table, 77, rig.pools).ok());
  CHECK(m.KvEnd(4) == 77);
  // Step at 77 with a chain of 3 drafts (78, 79, 80: across into block 5).
  SparseStepPlan p = m.BuildStepPlan({{4, 77, 4, nullptr}});
  CHECK(m.KvEnd(4) == 78);  // only the real token is final
  CHECK(p.slots[0].num_tail_blocks == 2);
  CHECK(p.tail_lens.data<int32_t>()[0] == 17);
  for (int64_t i = 0; i < p.lag_src.numel(); ++i) CHECK(p.lag_src.data<int64_t>()[i] == -1);  // nothing owed
  const int32_t t4 = p.tail_slots.data<int32_t>()[(0 * kHeads + 1) * 2], t5 = p.tail_slots.data<int32_t>()[(0 * kHeads + 1) * 2 + 1];
  const int32_t host4 = m.HostSlotOf(4, kLayers - 1, 1, 4), host5 = m.HostSlotOf(4, kLayers - 1, 1, 5);
  CHECK(p.host_mapping.data<int64_t>()[0 * kHeads + 1] == int64_t{host4} * 16 + 13);
  for (int64_t t = 1; t < 4; ++t) CHECK(p.host_mapping.data<int64_t>()[t * kHeads + 1] == -1);  // drafts: none
  CHECK(p.summary_len.data<int32_t>()[1] == 14);

  // All three accepted: the next real token sits at 81 (block 5). Positions 78..80 are owed
  // (79 completes block 4), the tail starts at block 4, which is summarised whole.
  SparseStepPlan q = m.BuildStepPlan({{4, 81, 2, nullptr}});
  CHECK(m.KvEnd(4) == 82);
  CHECK(q.slots[0].num_tail_blocks == 2);
  CHECK(q.tail_lens.data<int32_t>()[0] == 81 + 2 - 64);  // blocks 4 and 5 up to the draft at 82
  CHECK(q.tail_slots.data<int32_t>()[(0 * kHeads + 1) * 2] == t4);
  CHECK(q.tail_slots.data<int32_t>()[(0 * kHeads + 1) * 2 + 1] == t5);
  const int64_t* src = q.lag_src.data<int64_t>() + (0 * kHeads + 1) * kMaxSparseDraftTokens;
  const int64_t* dst = q.lag_dst.data<int64_t>() + (0 * kHeads + 1) * kMaxSparseDraftTokens;
  CHECK(std::vector<int64_t>(src, src + 4) ==
        std::vector<int64_t>{int64_t{t4} * 16 + 14, int64_t{t4} * 16 + 15, int64_t{t5} * 16 + 0, -1});
  CHECK(std::vector<int64_t>(dst, dst + 4) ==
        std::vector<int64_t>{int64_t{host4} * 16 + 14, int64_t{host4} * 16 + 15, int64_t{host5} * 16 + 0, -1});
  CHECK(q.host_mapping.data<int64_t>()[0 * kHeads + 1] == int64_t{host5} * 16 + 1);  // the real token
  CHECK(q.summary_src.data<int32_t>()[1] == t4);
  CHECK(q.summary_len.data<int32_t>()[1] == 16);  // block 4 whole
  CHECK(q.summary_dst.data<int32_t>()[1] == host4);
  CHECK(q.predict_num_blocks.data<int32_t>()[0] == 5);  // block 4 predicted from here on
  // Then a rejected chain: the next step is at 82, the tail back at block 5 alone.
  SparseStepPlan r = m.BuildStepPlan({{4, 82, 1, nullptr}});
  CHECK(r.slots[0].num_tail_blocks == 1);
  CHECK(r.tail_lens.data<int32_t>()[0] == 3);
  CHECK(r.summary_len.data<int32_t>()[1] == 3);
  for (int64_t i = 0; i < r.lag_src.numel(); ++i) CHECK(r.lag_src.data<int64_t>()[i] == -1);
  m.Release(4);
  CHECK(rig.alloc.num_free() == kGpuSlots);
}

TEST_CASE("with dense layers the tails are the dense table's slots", "[kvcache][sparse]") {
  Rig rig(Config(/*k=*/2, /*dense_layers=*/1));
  SparseKvManager& m = *rig.manager;
  HeadBlockTable table = rig.SwitchNew(3, 50, 100);  // blocks 0-2 full, block 3 holds 2 tokens
  const Tensor layer0 = rig.pools[0].k.Clone();
  const int32_t free_before = rig.alloc.num_free();
  REQUIRE(m.SwitchToSparse(3, table, 50, rig.pools).ok());
  CHECK(table.num_blocks() == 4);                             // kept for the dense layer
  CHECK(rig.alloc.num_free() == free_before - 2 * kHeads);   // K fresh working slots per head
  CHECK(std::equal(layer0.data<float>(), layer0.data<float>() + layer0.numel(), rig.pools[0].k.data<float>()));
  SparseLayerState& ls = m.state().layer(2);
  for (int64_t h = 0; h < kHeads; ++h) {
    CHECK(Row(ls.ws_blocks, h) == std::vector<int32_t>{0, 2});  // block 0 and the newest full block
    const int32_t ws1 = ls.resident_slots.data<int32_t>()[h * 2 + 1];
    const int32_t src = table.head_slots(static_cast<int32_t>(h))[2];
    CHECK(ws1 != src);
    CHECK(std::equal(Block(rig.pools[2].v, ws1), Block(rig.pools[2].v, ws1) + kBlockSize * kDim, Block(rig.pools[2].v, src)));
  }
  REQUIRE(table.Reserve(52, rig.alloc).ok());
  SparseStepPlan p = m.BuildStepPlan({{3, 50, 2, &table}});
  CHECK(p.slots[0].slot_mapping[0] == table.SlotMapping(0, 50));
  CHECK(p.tail_slots.data<int32_t>()[0] == table.head_slots(0)[3]);
  m.Release(3);
  table.Release(rig.alloc);
  CHECK(rig.alloc.num_free() == kGpuSlots);
}

TEST_CASE("host store cells: one layer's share of a slot, slots split and made whole again", "[kvcache][sparse]") {
  CpuBackend backend{1};
  // 3 sparse layers, 10 slots.
  HostKvStore store(backend, 3, 0, kDim, 10 * HostKvStore::BytesPerSlot(3, kDim, DType::kF32), /*summary_rows=*/4);
  REQUIRE(store.num_slots() == 10);
  CHECK(store.bytes_per_cell() * 3 == store.bytes_per_slot());
  CHECK(store.FreshSlotsForCells(0, 4) == 4);
  auto a = store.AllocateCells(0, 4);  // 4 fresh slots: 4 free cells in layers 1 and 2
  REQUIRE(a);
  CHECK(store.num_free() == 6);
  CHECK(store.num_cell_slots() == 4);
  CHECK(store.num_free_cells(0) == 0);
  CHECK(store.num_free_cells(1) == 4);
  CHECK(store.FreshSlotsForCells(1, 6) == 2);
  auto b = store.AllocateCells(1, 6);  // 4 shared + 2 fresh
  REQUIRE(b);
  CHECK(store.num_free() == 4);
  CHECK(store.num_free_cells(0) == 2);
  CHECK(store.num_free_cells(2) == 6);
  std::vector<int32_t> seen = *b;
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());  // distinct within a layer
  CHECK_FALSE(store.AllocateCells(2, 11).has_value());  // 6 free + 4 fresh at most
  CHECK(store.num_free_cells(2) == 6);
  auto whole = store.Allocate(4);
  REQUIRE(whole);
  CHECK_FALSE(store.AllocateCells(0, 3).has_value());  // 2 free cells, no fresh slot
  // Summary-only rows are per layer, after the slots.
  auto rows = store.AllocateSummaryRows(2, 4);
  REQUIRE(rows);
  for (int32_t r : *rows) CHECK_FALSE(store.IsSlot(r));
  CHECK(store.num_free_summary_rows(2) == 0);
  CHECK(store.num_free_summary_rows(1) == 4);
  CHECK(store.kmin(2).dim(0) == 14);
  store.FreeCells(2, *rows);
  CHECK(store.num_free_summary_rows(2) == 4);
  // Freeing every cell of a slot makes it whole (free) again.
  store.FreeCells(0, *a);
  CHECK(store.num_free() == 0);  // layer 1 still uses those 4 slots
  store.FreeCells(1, *b);
  CHECK(store.num_free() == 6);
  CHECK(store.num_cell_slots() == 0);
  CHECK(store.num_free_cells(0) == 0);
  CHECK(store.num_free_cells(2) == 0);
  store.Free(*whole);
  CHECK(store.num_free() == 10);
  // Churn: many rounds of uneven use leave nothing behind.
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> held(3);
  for (int round = 0; round < 300; ++round) {
    const int64_t l = static_cast<int64_t>(rng() % 3);
    if (rng() % 2 == 0 && !held[static_cast<size_t>(l)].empty()) {
      const size_t n = 1 + rng() % held[static_cast<size_t>(l)].size();
      std::vector<int32_t> give(held[static_cast<size_t>(l)].end() - static_cast<int64_t>(n), held[static_cast<size_t>(l)].end());
      held[static_cast<size_t>(l)].resize(held[static_cast<size_t>(l)].size() - n);
      store.FreeCells(l, give);
    } else if (auto got = store.AllocateCells(l, static_cast<int32_t>(1 + rng() % 4))) {
      held[static_cast<size_t>(l)].insert(held[static_cast<size_t>(l)].end(), got->begin(), got->end());
    }
    std::vector<int32_t> mine = held[static_cast<size_t>(l)];
    std::sort(mine.begin(), mine.end());
    REQUIRE(std::adjacent_find(mine.begin(), mine.end()) == mine.end());
  }
  for (int64_t l = 0; l < 3; ++l) store.FreeCells(l, held[static_cast<size_t>(l)]);
  CHECK(store.num_free() == 10);
  CHECK(store.num_cell_slots() == 0);
}

namespace {

// A layout that holds blocks [0, n) of every layer and head as cells of the store.
class CellLayout final : public HostLayout {
 public:
  CellLayout(HostKvStore& store, int64_t layers, int64_t heads, int64_t n) : heads_(heads), n_(n) {
    for (int64_t l = 0; l < layers; ++l) {
      auto got = store.AllocateCells(l, static_cast<int32_t>(heads * n));
      REQUIRE(got);
      cells_.push_back(*got);
    }
  }
  int64_t layer_blocks() const override { return n_; }
  int32_t Slot(int64_t layer, int64_t head, int64_t block) const override {
    return cells_[static_cast<size_t>(layer)][static_cast<size_t>(head * n_ + block)];
  }
  int64_t BytesHeld(const HostKvStore& store) const override {
    return static_cast<int64_t>(cells_.size()) * heads_ * n_ * static_cast<int64_t>(store.bytes_per_cell());
  }
  void Release(HostKvStore& store) override {
    for (size_t l = 0; l < cells_.size(); ++l) store.FreeCells(static_cast<int64_t>(l), cells_[l]);
    cells_.clear();
    *released_ = true;
  }
  std::shared_ptr<bool> released_ = std::make_shared<bool>(false);

 private:
  int64_t heads_, n_;
  std::vector<std::vector<int32_t>> cells_;
};

}  // namespace

TEST_CASE("a reservation whose first blocks a HostLayout holds: its slots, whole slots after, release and errors", "[kvcache][sparse]") {
  Rig rig(Config());
  SparseKvManager& m = *rig.manager;
  HostKvStore& store = m.host_store();
  REQUIRE(store.num_slots() == 60);
  auto layout = std::make_unique<CellLayout>(store, kLayers, kHeads, 4);
  const std::shared_ptr<bool> released = layout->released_;
  const CellLayout* seen = layout.get();
  REQUIRE(m.ReserveWith(3, 160, std::move(layout)).ok());  // 10 blocks: 4 per layer, 6 whole
  CHECK(m.Layout(3) == seen);
  CHECK(m.Layout(4) == nullptr);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 4; ++b) CHECK(m.HostSlotOf(3, l, h, b) == seen->Slot(l, h, b));
      // Blocks past the layout: one whole slot in every layer.
      for (int64_t b = 4; b < 10; ++b) CHECK(m.HostSlotOf(3, l, h, b) == m.HostSlotOf(3, 0, h, b));
    }
  }
  CHECK(m.HostSlotOf(3, 0, 0, 10) == -1);  // beyond the reservation
  CHECK(m.HostBytesHeld(3) == kHeads * 6 * static_cast<int64_t>(store.bytes_per_slot()) +
                                  kLayers * kHeads * 4 * static_cast<int64_t>(store.bytes_per_cell()));
  CHECK(store.num_free() == 60 - kHeads * 6 - kHeads * 4);  // cells of every layer share slots
  m.Release(3);
  CHECK(*released);
  CHECK(store.num_free() == 60);
  CHECK(store.num_cell_slots() == 0);
  // Errors release the layout and take nothing: a second reservation of the same id, a
  // layout longer than the reservation, whole slots that do not fit.
  REQUIRE(m.Reserve(5, 160).ok());  // 20 whole slots
  for (auto [id, tokens, n] : {std::tuple<uint64_t, int64_t, int64_t>{5, 160, 2}, {6, 32, 4}, {7, 400, 1}}) {
    auto bad = std::make_unique<CellLayout>(store, kLayers, kHeads, n);
    const std::shared_ptr<bool> gone = bad->released_;
    CHECK_FALSE(m.ReserveWith(id, tokens, std::move(bad)).ok());
    CHECK(*gone);
    CHECK(store.num_free() == 40);  // 400 tokens: 48 whole slots, 38 free beside the cells
    CHECK(store.num_cell_slots() == 0);
    CHECK_FALSE(m.HasReservation(id == 5 ? 99 : id));
  }
  m.Release(5);
  CHECK(store.num_free() == 60);
}

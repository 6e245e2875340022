// The decode side of disaggregation over SparseKvManager (disagg/kv_import.h and the
// manager's layered reservations and remote blocks), on the CPU backend: staged blocks held
// per layer (cells for local blocks, summary-only rows for remote ones), admission, working
// sets from the host store, landing remote blocks and marking them local, release.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>

#include "disagg/kv_import.h"
#include "sparse_kv_rig.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {

constexpr int64_t kLayers = testing::kRigLayers, kHeads = testing::kRigHeads, kDim = testing::kRigDim,
                  kGpuSlots = testing::kRigGpuSlots;
using Rig = testing::SparseKvRig;
SparseConfig Config(int32_t k = 3, int32_t dense_layers = 0) { return testing::RigConfig(k, dense_layers); }

}  // namespace

TEST_CASE(
    "decode side: staged blocks held per layer, remote ones on summary-only rows until they land",
    "[kvcache][sparse]") {
  SparseConfig c = Config(/*k=*/3);
  c.remote_fetch_cap = 2;
  c.remote_kv_gib = c.host_kv_gib * 40.0 / 60.0;  // 40 summary-only rows per layer
  Rig rig(c);
  SparseKvManager& m = *rig.manager;
  HostKvStore& store = m.host_store();
  REQUIRE(store.num_slots() == 60);
  REQUIRE(store.num_summary_rows() == 40);
  REQUIRE(store.kmin(0).dim(0) == 100);
  // 400 tokens = 25 blocks; blocks 0-19 are staged (per layer), 20-24 whole slots.
  // Local per layer: head 0 blocks 15-19, head 1 blocks 0-4 in layers 0 and 1; layer 2 also
  // head 0 block 3. The rest (15 per head and layer) is remote.
  std::vector<std::vector<int32_t>> local(static_cast<size_t>(kLayers * kHeads));
  for (int64_t l = 0; l < kLayers; ++l) {
    local[static_cast<size_t>(l * kHeads)] = {15, 16, 17, 18, 19};
    local[static_cast<size_t>(l * kHeads + 1)] = {0, 1, 2, 3, 4};
  }
  local[static_cast<size_t>(2 * kHeads)].push_back(3);
  CHECK(CheckImportAdmission(m, 400, 20, &local) == HostAdmission::kFits);
  CHECK(CheckImportAdmission(m, 401, 20, &local) == HostAdmission::kNever);
  CHECK(CheckImportAdmission(m, 400, 20, nullptr) ==
        HostAdmission::kFits);  // full: 50 slots' worth
  REQUIRE(ReserveImport(m, 7, 400, 20, &local).ok());
  // Whole slots: 5 blocks x 2 heads = 10; cells: 10 per layer (11 in layer 2) on 11 split slots.
  CHECK(m.HostBytesHeld(7) ==
        static_cast<int64_t>(10 * store.bytes_per_slot() + 31 * store.bytes_per_cell()));
  CHECK(m.host_slots_reserved() == 21);
  CHECK(m.summary_rows_held() == 30 + 30 + 29);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 25; ++b) {
        const auto& lst = local[static_cast<size_t>(l * kHeads + h)];
        const bool is_local = b >= 20 || std::find(lst.begin(), lst.end(), b) != lst.end();
        CHECK(store.IsSlot(m.HostSlotOf(7, l, h, b)) == is_local);
      }
    }
  }
  CHECK(m.HostSlotOf(7, 0, 0, 22) ==
        m.HostSlotOf(7, 2, 0, 22));  // whole slots: one id in every layer
  // A second import whose remote blocks outnumber the rows left take cells for the rest.
  CHECK(CheckImportAdmission(m, 160, 10, &local) == HostAdmission::kFits);
  REQUIRE(ReserveImport(m, 8, 160, 10, &local)
              .ok());  // 10 staged blocks: head 0 all remote, head 1 5 local
  CHECK(store.num_free_summary_rows(0) == 0);  // 15 remote, 10 rows left: 5 take cells
  m.Release(8);
  CHECK(store.num_free_summary_rows(0) == 10);
  CHECK(m.host_slots_reserved() == 21);

  // Distinct summaries per (layer, head, block) in whatever row each block holds.
  auto value = [](int64_t l, int64_t h, int64_t b) {
    return static_cast<float>(1000 * l + 100 * h + b);
  };
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 25; ++b) {
        const int32_t row = m.HostSlotOf(7, l, h, b);
        std::fill_n(store.kmin(l).data<float>() + row * kDim, kDim, value(l, h, b));
        std::fill_n(store.kmax(l).data<float>() + row * kDim, kDim, -value(l, h, b));
      }
    }
  }
  // Import 20 staged blocks: working sets from the local blocks, the rest remote.
  std::vector<std::vector<int32_t>> working(static_cast<size_t>(kLayers * kHeads));
  for (int64_t l = 0; l < kLayers; ++l) {
    working[static_cast<size_t>(l * kHeads)] = {15, 16, 17};
    working[static_cast<size_t>(l * kHeads + 1)] = {0, 1, 2};
  }
  REQUIRE(ImportSparse(m, 7, 20 * kBlockSize, working, rig.pools, &local).ok());
  CHECK(RemoteBlocksLeft(m, 7) == 30 + 30 + 29);
  SparseDeviceState& st = m.state();
  auto table = [&](int64_t l, int64_t h, int64_t b) {
    return st.layer(l).host_tables.data<int32_t>()[(0 * kHeads + h) * st.max_blocks() + b];
  };
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t b = 0; b < 25; ++b) CHECK(table(l, 1, b) == m.HostSlotOf(7, l, 1, b));
  }
  CHECK_FALSE(store.IsSlot(table(0, 0, 3)));
  CHECK(store.IsSlot(table(2, 0, 3)));

  // Head 0 block 3 arrives in layers 0 and 1, head 1 block 10 in layer 2: a cell each.
  const std::vector<RemoteBlock> arriving = {{0, 0, 3}, {1, 0, 3}, {2, 1, 10}};
  const int32_t old_row = m.HostSlotOf(7, 0, 0, 3);
  const int64_t held = m.HostBytesHeld(7);
  const std::vector<int32_t> slots = LandingSlots(m, 7, arriving);
  REQUIRE(slots.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(store.IsSlot(slots[i]));
    CHECK(m.HostSlotOf(7, arriving[i].layer, arriving[i].head, arriving[i].block) == slots[i]);
    CHECK(table(arriving[i].layer, arriving[i].head, arriving[i].block) ==
          slots[i]);  // the device's table follows
  }
  CHECK(m.HostBytesHeld(7) == held + static_cast<int64_t>(3 * store.bytes_per_cell()));
  CHECK(m.summary_rows_held() == 30 + 30 + 29 - 3);
  CHECK(old_row != slots[0]);
  // The summaries moved with the block, in its layer only.
  CHECK(store.kmin(0).data<float>()[slots[0] * kDim + kDim - 1] == value(0, 0, 3));
  CHECK(store.kmax(1).data<float>()[slots[1] * kDim] == -value(1, 0, 3));
  CHECK(store.kmin(2).data<float>()[slots[2] * kDim] == value(2, 1, 10));
  CHECK_FALSE(store.IsSlot(m.HostSlotOf(7, 2, 1, 11)));
  // Still remote until marked; a block still on a summary-only row cannot be marked.
  CHECK(RemoteBlocksLeft(m, 7) == 89);
  MarkLocal(m, 7, {0, 0, 3});
  MarkLocal(m, 7, {0, 0, 4});  // not landed: ignored
  CHECK(RemoteBlocksLeft(m, 7) == 88);
  CHECK(st.layer(0).remote.data<uint8_t>()[(0 * kHeads + 0) * st.max_blocks() + 3] == 0);
  CHECK(st.layer(1).remote.data<uint8_t>()[(0 * kHeads + 0) * st.max_blocks() + 3] == 1);
  CHECK(st.layer(0).remote.data<uint8_t>()[(0 * kHeads + 0) * st.max_blocks() + 4] == 1);
  // Landing again reuses the cell; a whole slot lands where it is.
  CHECK(LandingSlots(m, 7, {{0, 0, 3}, {1, 0, 21}}) ==
        std::vector<int32_t>{slots[0], m.HostSlotOf(7, 1, 0, 21)});
  CHECK(m.HostBytesHeld(7) == held + static_cast<int64_t>(3 * store.bytes_per_cell()));

  // No free cell or slot: the block stays on its row.
  std::optional<std::vector<int32_t>> hog = store.Allocate(store.num_free());
  std::optional<std::vector<int32_t>> hog0 = store.AllocateCells(0, store.num_free_cells(0));
  REQUIRE(hog);
  REQUIRE(hog0);
  CHECK(LandingSlots(m, 7, {{0, 0, 5}}) == std::vector<int32_t>{-1});
  CHECK_FALSE(store.IsSlot(m.HostSlotOf(7, 0, 0, 5)));
  CHECK(LandingSlots(m, 99, {{0, 0, 5}}) == std::vector<int32_t>{-1});  // unknown request
  store.FreeCells(0, *hog0);
  store.Free(*hog);

  m.Release(7);
  CHECK(m.host_slots_reserved() == 0);
  CHECK(m.summary_rows_held() == 0);
  CHECK(store.num_cell_slots() == 0);
  CHECK(rig.alloc.num_free() == kGpuSlots);
}

// Prefix reuse on the decode side (kvcache/store_prefix_cache.h): when an import ends, the
// cells of its full prompt blocks whose K/V is in the store (admitted, or drifted in and
// marked local) are parked, never a remote block's (a cell not written yet); the next import
// of the same prefix takes the leading run and holds those cells, data and all.
TEST_CASE("decode side: an ended import parks its local prompt blocks, the next one adopts them",
          "[kvcache][sparse][prefix]") {
  SparseConfig c = Config(/*k=*/3);
  c.remote_fetch_cap = 2;  // no summary-only rows: remote blocks take cells, empty until they land
  Rig rig(c);
  SparseKvManager& m = *rig.manager;
  HostKvStore& store = m.host_store();
  StorePrefixCache cache(store, kHeads);
  // Local: head 1 blocks 0-4 in every layer, head 0 blocks 15-19; layer 2 also head 0 block 3.
  std::vector<std::vector<int32_t>> local(static_cast<size_t>(kLayers * kHeads));
  for (int64_t l = 0; l < kLayers; ++l) {
    local[static_cast<size_t>(l * kHeads)] = {15, 16, 17, 18, 19};
    local[static_cast<size_t>(l * kHeads + 1)] = {0, 1, 2, 3, 4};
  }
  local[static_cast<size_t>(2 * kHeads)].push_back(3);
  REQUIRE(ReserveImport(m, 7, 400, 20, &local).ok());
  std::vector<std::vector<int32_t>> working(static_cast<size_t>(kLayers * kHeads));
  for (int64_t l = 0; l < kLayers; ++l) {
    working[static_cast<size_t>(l * kHeads)] = {15, 16, 17};
    working[static_cast<size_t>(l * kHeads + 1)] = {0, 1, 2};
  }
  REQUIRE(ImportSparse(m, 7, 20 * kBlockSize, working, rig.pools, &local).ok());
  // Head 0 block 3 lands in layers 0 and 1; only layer 0's is marked local.
  const std::vector<int32_t> landed = LandingSlots(m, 7, {{0, 0, 3}, {1, 0, 3}});
  MarkLocal(m, 7, {0, 0, 3});
  // Every held cell's K gets a value naming its (layer, head, block).
  auto value = [](int64_t l, int64_t h, int64_t b) { return static_cast<float>(1000 * l + 100 * h + b + 1); };
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 20; ++b) {
        const int32_t cell = m.HostSlotOf(7, l, h, b);
        if (store.IsSlot(cell)) store.pool(l).k.data<float>()[cell * kBlockSize * kDim] = value(l, h, b);
      }
    }
  }
  // The prompt's first 10 full blocks as keys.
  std::vector<int32_t> tokens(10 * kBlockSize);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % 500);
  std::vector<PrefixBlockKey> keys;
  uint64_t parent = PrefixCacheRoot(0);
  for (int64_t b = 0; b < 10; ++b) {
    const std::span<const int32_t> t(tokens.data() + b * kBlockSize, kBlockSize);
    const uint64_t h = HashPrefixBlock(parent, t);
    keys.push_back({h, parent, t});
    parent = h;
  }
  const int64_t free_cells_before = store.num_free();
  // Head 1 blocks 0-4 in 3 layers, head 0 block 3 in layers 0 (landed, marked) and 2 (admitted).
  CHECK(ParkImportPrefix(m, 7, cache, keys, AdoptedPrefix{}, /*landed=*/true) == 15 + 2);
  CHECK(cache.num_blocks() == 5);
  CHECK(store.num_parked_cells() == 17);
  CHECK(store.num_free() >= free_cells_before);  // parked cells are room
  m.Release(7);
  CHECK(store.num_free() == store.num_slots());   // everything else freed, the rest evictable
  CHECK(m.host_slots_reserved() == 0);

  // The next import with the same prefix acquires blocks 0-4 (block 5 was never local).
  AdoptedPrefix adopted;
  for (const PrefixBlockKey& k : keys) {
    auto cells = cache.Acquire(k);
    if (!cells) break;
    adopted.cells.insert(adopted.cells.end(), cells->begin(), cells->end());
    ++adopted.blocks;
  }
  REQUIRE(adopted.blocks == 5);
  CHECK(store.num_parked_cells() == 0);
  CHECK(adopted.Cell(3, 1, 0, kLayers, kHeads) == -1);  // layer 1's landed block was not given
  CHECK(adopted.Cell(3, 0, 0, kLayers, kHeads) == landed[0]);
  // Its own admission set: head 0 blocks 8-10; the adopted blocks need no new cells.
  std::vector<std::vector<int32_t>> local2(static_cast<size_t>(kLayers * kHeads));
  for (int64_t l = 0; l < kLayers; ++l) local2[static_cast<size_t>(l * kHeads)] = {8, 9, 10};
  const LayeredHold with = PlanImportHold(m, 400, 20, &local2, &adopted);
  const LayeredHold without = PlanImportHold(m, 400, 20, &local2);
  // (No summary-only rows: every block takes a cell, but not the 6 adopted ones of layer 0.)
  CHECK(with.cells[0] == without.cells[0] - 6);
  CHECK(with.num_local[0] == without.num_local[0] + 5 + 1);
  REQUIRE(CheckImportAdmission(m, 400, 20, &local2, &adopted) == HostAdmission::kFits);
  REQUIRE(ReserveImport(m, 9, 400, 20, &local2, &adopted).ok());
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < 5; ++b) {
        const int32_t own = adopted.Cell(b, l, h, kLayers, kHeads);
        if (own < 0) continue;
        CHECK(m.HostSlotOf(9, l, h, b) == own);
        CHECK(store.pool(l).k.data<float>()[own * kBlockSize * kDim] == value(l, h, b));
      }
    }
  }
  const std::vector<std::vector<int32_t>> working2 = local2;
  std::vector<std::vector<int32_t>> local2_all = local2;
  for (int64_t j = 0; j < kLayers * kHeads; ++j) {
    for (int64_t b = 0; b < 5; ++b) {
      if (adopted.Cell(b, j / kHeads, j % kHeads, kLayers, kHeads) >= 0)
        local2_all[static_cast<size_t>(j)].push_back(static_cast<int32_t>(b));
    }
  }
  REQUIRE(ImportSparse(m, 9, 20 * kBlockSize, working2, rig.pools, &local2_all).ok());
  CHECK(RemoteBlocksLeft(m, 9) == kLayers * kHeads * 20 - (3 * kLayers + 17));
  // A third import holds the same blocks at once: shared, read-only, no new cells.
  const int64_t free_now = store.num_free();
  AdoptedPrefix also;
  for (int64_t b = 0; b < 5; ++b) {
    auto cells = cache.Acquire(keys[static_cast<size_t>(b)]);
    REQUIRE(cells);
    also.cells.insert(also.cells.end(), cells->begin(), cells->end());
    ++also.blocks;
  }
  CHECK(also.cells == adopted.cells);
  CHECK(cache.num_held_blocks() == 5);
  const Status r10 = ReserveImport(m, 10, 80, 5, &local2, &also);
  INFO(r10.ToString() << " free " << store.num_free() << " of " << store.num_slots());
  REQUIRE(r10.ok());
  CHECK(store.num_free() < free_now);  // its other blocks only
  // Import 10 ends before its fetch landed: it only ends its hold. Import 9 ends having
  // fetched head 0 blocks 8-10 of its own (not prompt blocks the cache is given: keys end at 10
  // blocks, so 8 and 9 are).
  CHECK(ParkImportPrefix(m, 10, cache, keys, also, /*landed=*/false) == 0);
  m.Release(10);
  CHECK(cache.num_held_blocks() == 5);
  CHECK(store.num_parked_cells() == 0);
  CHECK(ParkImportPrefix(m, 9, cache, keys, adopted, /*landed=*/true) == 2 * kLayers);
  m.Release(9);
  CHECK(cache.num_held_blocks() == 0);
  CHECK(cache.num_blocks() == 7);  // blocks 0-4, and 8 and 9 now
  CHECK(store.num_parked_cells() == 17 + 2 * kLayers);
  while (cache.EvictOldest()) {
  }
  CHECK(store.num_free() == store.num_slots());
  CHECK(store.num_cell_slots() == 0);
  CHECK(store.num_parked_cells() == 0);
}

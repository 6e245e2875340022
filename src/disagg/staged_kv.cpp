#include "disagg/staged_kv.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/check.h"

namespace oasis::disagg {
namespace {

// Which way bytes go between a lease's slots and local memory.
enum class Direction { kPack, kUnpack };

using SlotMemory = std::function<char*(uint64_t ordinal)>;

// Copies `bytes` from each ref's local memory into its lease slot, on up to 8 threads when
// there are many bytes (a 32K request stages GiBs). The slots are resolved on this thread.
void ParallelCopy(const std::vector<StagedSlotRef>& refs, const SlotMemory& slot, size_t bytes) {
  std::vector<char*> to;
  to.reserve(refs.size());
  for (const StagedSlotRef& r : refs) to.push_back(slot(r.ordinal));
  const size_t total = refs.size() * bytes;
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({8, hw, std::max<size_t>(1, total >> 25), refs.size()});
  auto run = [&](size_t t) {
    for (size_t i = t; i < refs.size(); i += threads) std::memcpy(to[i], refs[i].dst, bytes);
  };
  if (threads <= 1) {
    run(0);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& th : pool) th.join();
}

int64_t FirstLayer(const StagedKvHome& home) { return home.manager->config().dense_layers; }

// The staged K/V blocks and where each lives in the host store: for staged layer i, head h,
// K then V, the blocks of blocks[i * Hkv + h] (null: all) in ascending order (so runs of
// blocks are runs of ordinals).
std::vector<StagedSlotRef> KvHomes(const StagedKvLayout& layout, const StagedKvHome& home,
                                   const std::vector<std::vector<uint16_t>>* blocks) {
  const StagedKvGeometry& g = layout.geometry();
  const int64_t first = FirstLayer(home);
  HostKvStore& store = home.manager->host_store();
  const size_t bb = layout.slot_bytes();
  OASIS_CHECK_EQ(
      static_cast<size_t>(store.pool(first).k.nbytes() / std::max<int32_t>(1, store.num_slots())),
      bb)
      << "host store block size";
  std::vector<StagedSlotRef> refs;
  for (uint32_t i = 0; i < g.num_layers; ++i) {
    const LayerKvPool& pool = store.pool(first + i);
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      std::vector<uint32_t> list;
      if (blocks == nullptr) {
        for (uint32_t b = 0; b < g.num_blocks; ++b) list.push_back(b);
      } else {
        for (uint16_t b : (*blocks)[static_cast<size_t>(i) * g.num_kv_heads + h]) list.push_back(b);
        std::sort(list.begin(), list.end());  // runs of blocks merge into one get
      }
      for (uint32_t kv = 0; kv < 2; ++kv) {
        char* base = static_cast<char*>(kv == 0 ? pool.k.raw() : pool.v.raw());
        for (uint32_t b : list) {
          const int32_t host = home.manager->HostSlotOf(home.id, first + i, h, b);
          OASIS_CHECK_GE(host, 0) << "staged block beyond the host reservation";
          refs.push_back({layout.KvSlot(i, h, b, kv), base + static_cast<size_t>(host) * bb});
        }
      }
    }
  }
  return refs;
}

// The request's host-store summary rows of staged layer i: [Hkv * nb], head-major.
std::vector<int32_t> SummaryRows(const StagedKvLayout& layout, const StagedKvHome& home,
                                 uint32_t i) {
  const StagedKvGeometry& g = layout.geometry();
  std::vector<int32_t> rows;
  for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
    for (uint32_t b = 0; b < g.num_blocks; ++b)
      rows.push_back(home.manager->HostSlotOf(home.id, FirstLayer(home) + i, h, b));
  }
  return rows;
}

// Staged layer i's summaries between the lease and kmin / kmax rows [Hkv * nb, head_dim].
void MoveSummaries(const StagedKvLayout& layout, uint32_t i, const SlotMemory& slot, char* kmin,
                   char* kmax, Direction dir) {
  const StagedKvGeometry& g = layout.geometry();
  const size_t row = static_cast<size_t>(g.head_dim) * g.dtype_bytes;
  for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      const SummarySlot ss = layout.Summary(i, h, b);
      char* packed = slot(ss.ordinal) + ss.offset;
      const size_t r = (static_cast<size_t>(h) * g.num_blocks + b) * row;
      if (dir == Direction::kPack) {
        std::memcpy(packed, kmin + r, row);
        std::memcpy(packed + row, kmax + r, row);
      } else {
        std::memcpy(kmin + r, packed, row);
        std::memcpy(kmax + r, packed + row, row);
      }
    }
  }
}

// The draft head's blocks of the request: [draft heads * nb] slots of the draft pool.
std::vector<int32_t> DraftRows(const StagedKvLayout& layout, const StagedKvHome& home) {
  const StagedKvGeometry& g = layout.geometry();
  OASIS_CHECK(home.draft_pool != nullptr && home.draft_table != nullptr)
      << "staged draft KV without a draft head";
  std::vector<int32_t> rows;
  for (uint32_t h = 0; h < g.draft_kv_heads; ++h) {
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      rows.push_back(home.draft_table->head_slots(static_cast<int32_t>(h))[b]);
    }
  }
  return rows;
}

// K (kv 0) or V of the draft KV between the lease and rows [draft heads * nb, 16 *
// draft_head_dim] of the draft dtype: each block over its draft_slots_per_block() slots.
void MoveDraft(const StagedKvLayout& layout, uint32_t kv, const SlotMemory& slot, char* rows,
               Direction dir) {
  const StagedKvGeometry& g = layout.geometry();
  const size_t dbb = layout.draft_block_bytes(), sb = layout.slot_bytes();
  for (uint32_t h = 0; h < g.draft_kv_heads; ++h) {
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      const uint64_t first = layout.DraftKvSlot(h, b, kv);
      char* local = rows + (static_cast<size_t>(h) * g.num_blocks + b) * dbb;
      for (size_t at = 0, j = 0; at < dbb; at += sb, ++j) {
        char* packed = slot(first + j);
        const size_t n = std::min(sb, dbb - at);
        if (dir == Direction::kPack) {
          std::memcpy(packed, local + at, n);
        } else {
          std::memcpy(local + at, packed, n);
        }
      }
    }
  }
}

// The element type of staged layer rows: the host store's summaries (KV dtype: e4m3 for an FP8
// pool) or the draft pool's KV (activation dtype), checked against the layout's sizes.
DType Checked(const Tensor& t, uint32_t bytes, const char* what) {
  OASIS_CHECK_EQ(DTypeSize(t.dtype()), size_t{bytes})
      << "staged " << what << ": " << DTypeName(t.dtype()) << " elements, the layout has " << bytes
      << "-byte ones";
  return t.dtype();
}

}  // namespace

void PackStagedKv(const StagedKvLayout& layout, const StagedKvHome& home,
                  const std::function<void*(uint64_t ordinal)>& slot) {
  const StagedKvGeometry& g = layout.geometry();
  const SlotMemory lease = [&](uint64_t ordinal) { return static_cast<char*>(slot(ordinal)); };
  // KV: the host store holds all staged tokens (the last one's K/V written through by the step).
  ParallelCopy(KvHomes(layout, home, nullptr), lease, layout.slot_bytes());
  // Summaries (device): each layer's rows of this request gathered, downloaded, packed.
  Backend& be = *home.backend;
  HostKvStore& store = home.manager->host_store();
  const int64_t first = FirstLayer(home), rows = int64_t{g.num_kv_heads} * g.num_blocks,
                D = g.head_dim;
  for (uint32_t i = 0; i < g.num_layers; ++i) {
    const Tensor rows_dev = be.Upload(Tensor::FromInts(SummaryRows(layout, home, i)));
    const DType sdt = Checked(store.kmin(first + i), g.dtype_bytes, "summaries");
    Tensor kmin = be.Empty({rows, D}, sdt), kmax = be.Empty({rows, D}, sdt);
    be.GatherRows(store.kmin(first + i), rows_dev, kmin);
    be.GatherRows(store.kmax(first + i), rows_dev, kmax);
    Tensor kmin_h = be.Download(kmin), kmax_h = be.Download(kmax);
    MoveSummaries(layout, i, lease, static_cast<char*>(kmin_h.raw()),
                  static_cast<char*>(kmax_h.raw()), Direction::kPack);
  }
  // The draft head's KV (device), the same way.
  if (g.draft_kv_heads == 0) return;
  const int64_t dw = int64_t{kStagedBlockTokens} * g.draft_head_dim;
  const Tensor drows_dev = be.Upload(Tensor::FromInts(DraftRows(layout, home)));
  for (uint32_t kv = 0; kv < 2; ++kv) {
    const Tensor& src = kv == 0 ? home.draft_pool->k : home.draft_pool->v;
    Tensor out = be.Empty({int64_t{g.draft_kv_heads} * g.num_blocks, dw},
                          Checked(src, g.draft_dtype_bytes, "draft KV"));
    be.GatherRows(src.Reshape({src.dim(0), dw}), drows_dev, out);
    Tensor host = be.Download(out);
    MoveDraft(layout, kv, lease, static_cast<char*>(host.raw()), Direction::kPack);
  }
}

std::vector<StagedSlotRef> StagedKvUnpacker::Destinations(
    const StagedKvHome& home, const std::vector<std::vector<uint16_t>>* blocks) {
  const size_t bb = layout_.slot_bytes();
  std::vector<StagedSlotRef> items = KvHomes(layout_, home, blocks);
  summaries_.resize(layout_.num_summary_slots() * bb);
  draft_.resize(layout_.num_draft_slots() * bb);
  for (uint64_t j = 0; j < layout_.num_summary_slots(); ++j) {
    items.push_back({layout_.num_kv_slots() + j, summaries_.data() + j * bb});
  }
  for (uint64_t j = 0; j < layout_.num_draft_slots(); ++j) {
    items.push_back(
        {layout_.num_kv_slots() + layout_.num_summary_slots() + j, draft_.data() + j * bb});
  }
  return items;
}

void StagedKvUnpacker::Finish(const StagedKvHome& home) {
  const StagedKvGeometry& g = layout_.geometry();
  const size_t bb = layout_.slot_bytes();
  // The landing buffers as the lease: summary slots, then draft slots.
  const uint64_t kv_slots = layout_.num_kv_slots(),
                 draft_base = kv_slots + layout_.num_summary_slots();
  const SlotMemory landed = [&](uint64_t ordinal) {
    return ordinal >= draft_base ? draft_.data() + (ordinal - draft_base) * bb
                                 : summaries_.data() + (ordinal - kv_slots) * bb;
  };
  // Summaries of every block into the summary rows of the request's cells and slots.
  Backend& be = *home.backend;
  HostKvStore& store = home.manager->host_store();
  const int64_t first = FirstLayer(home), rows = int64_t{g.num_kv_heads} * g.num_blocks,
                D = g.head_dim;
  for (uint32_t i = 0; i < g.num_layers; ++i) {
    const Tensor rows_dev = be.Upload(Tensor::FromInts(SummaryRows(layout_, home, i)));
    const DType sdt = Checked(store.kmin(first + i), g.dtype_bytes, "summaries");
    Tensor kmin = Tensor::Empty({rows, D}, sdt), kmax = Tensor::Empty({rows, D}, sdt);
    MoveSummaries(layout_, i, landed, static_cast<char*>(kmin.raw()),
                  static_cast<char*>(kmax.raw()), Direction::kUnpack);
    be.ScatterRows(be.Upload(kmin), rows_dev, store.kmin(first + i));
    be.ScatterRows(be.Upload(kmax), rows_dev, store.kmax(first + i));
  }
  // The draft head's KV into the blocks reserved for it (a decode instance without a draft
  // head ignores it).
  if (g.draft_kv_heads == 0 || home.draft_pool == nullptr) return;
  const int64_t dw = int64_t{kStagedBlockTokens} * g.draft_head_dim;
  const Tensor drows_dev = be.Upload(Tensor::FromInts(DraftRows(layout_, home)));
  for (uint32_t kv = 0; kv < 2; ++kv) {
    Tensor& dst = kv == 0 ? home.draft_pool->k : home.draft_pool->v;
    Tensor host = Tensor::Empty({int64_t{g.draft_kv_heads} * g.num_blocks, dw},
                                Checked(dst, g.draft_dtype_bytes, "draft KV"));
    MoveDraft(layout_, kv, landed, static_cast<char*>(host.raw()), Direction::kUnpack);
    Tensor view = dst.Reshape({dst.dim(0), dw});
    be.ScatterRows(be.Upload(host), drows_dev, view);
  }
}

std::vector<StagedSlotRef> DriftReads(const StagedKvLayout& layout, int64_t first_layer,
                                      const std::vector<RemoteBlock>& blocks,
                                      std::vector<char>& buffer) {
  const size_t bb = layout.slot_bytes();
  buffer.resize(blocks.size() * 2 * bb);
  std::vector<StagedSlotRef> items;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const RemoteBlock& b = blocks[i];
    for (uint32_t kv = 0; kv < 2; ++kv) {
      items.push_back(
          {layout.KvSlot(static_cast<uint32_t>(b.layer - first_layer),
                         static_cast<uint32_t>(b.head), static_cast<uint32_t>(b.block), kv),
           buffer.data() + (2 * i + kv) * bb});
    }
  }
  return items;
}

void StoreDriftBlock(const StagedKvLayout& layout, HostKvStore& store, const RemoteBlock& b,
                     int32_t slot, const std::vector<char>& buffer, size_t i) {
  const size_t bb = layout.slot_bytes();
  OASIS_CHECK_LE((2 * i + 2) * bb, buffer.size()) << "drift block " << i << " beyond its buffer";
  LayerKvPool& pool = store.pool(b.layer);
  std::memcpy(static_cast<char*>(pool.k.raw()) + static_cast<size_t>(slot) * bb,
              buffer.data() + 2 * i * bb, bb);
  std::memcpy(static_cast<char*>(pool.v.raw()) + static_cast<size_t>(slot) * bb,
              buffer.data() + (2 * i + 1) * bb, bb);
}

}  // namespace oasis::disagg

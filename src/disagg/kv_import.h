// The sparse KV side of disaggregation (docs/disaggregation.md §4, §5), over SparseKvManager's
// public API: on the prefill instance, which blocks a handoff ships first; on the decode
// instance, how an import's staged blocks are held (per layer: cells for the local ones,
// summary-only rows for the remote ones while they last), whether that fits the host store,
// the reservation, and the remote misses a step's select listed.
//
// An import's staged blocks are held by a HostLayout (kvcache/host_layout.h) that also counts
// its remote blocks; the manager owns it with the reservation. Free functions; they keep no
// other state. Not thread-safe: the engine loop thread, like the manager.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/sparse_kv_manager.h"
#include "kvcache/store_prefix_cache.h"
#include "oasis/status.h"

namespace oasis::disagg {

// Ok when `m` can take part in disaggregation (one device side, no dense layers).
Status CheckDisaggregation(const SparseKvManager& m);

// How an import holds its first blocks: per sparse layer i, the cells and summary-only rows
// it takes and which blocks of each head are local (their K/V in the host store); the blocks
// past layer_blocks take whole slots.
struct LayeredHold {
  int64_t layer_blocks = 0;              // blocks held per layer (≤ the reservation's)
  int64_t whole = 0;                     // whole host slots: Hkv * (blocks - layer_blocks)
  std::vector<int64_t> cells, rows;      // [Ls]: cells and summary-only rows of layer i
  std::vector<int64_t> num_local;        // [Ls]: local blocks of layer i, all heads
  std::vector<std::vector<char>> local;  // [Ls * Hkv][layer_blocks]: 1 = local
};

// The leading full prompt blocks [0, blocks) an import acquires from the decode side's prefix
// cache (kvcache/store_prefix_cache.h) instead of fetching them: per block, the cell of each
// sparse layer i and KV head h, cells[(b * Ls + i) * Hkv + h], -1 where the cache has no local
// copy of that head-block (it is then held like any other staged block).
struct AdoptedPrefix {
  int64_t blocks = 0;
  std::vector<int32_t> cells;
  int32_t Cell(int64_t block, int64_t layer_index, int64_t head, int64_t num_layers,
               int64_t num_kv_heads) const {
    return block < blocks ? cells[static_cast<size_t>(
                                (block * num_layers + layer_index) * num_kv_heads + head)]
                          : -1;
  }
};

// A block of a sparse layer and KV head whose K/V is not in the host store (remote).
struct RemoteBlock {
  int32_t layer = 0;  // model layer (>= dense_layers)
  int32_t head = 0;
  int32_t block = 0;
};

// Per sparse layer and KV head (index (layer - dense_layers) * Hkv + head) of a sparse
// request after a step: its working set in working-slot order, then the blocks of its
// prediction for the next step that are not resident (score order). What a handoff ships
// besides the tail. Downloads the request's rows from `backend` (the manager's one device
// side; a sync).
StatusOr<std::vector<std::vector<int32_t>>> HandoffBlocks(const SparseKvManager& m,
                                                          Backend& backend, uint64_t id);

// How an import of a request of `max_total_tokens` holds its staged complete blocks [0,
// layer_blocks) per layer: the blocks of `local[(l - dense_layers) * Hkv + h]` take a cell of
// layer l, the others (remote: their K/V stays on the prefill instance) a summary-only row
// while the layer has free ones, a cell otherwise. local == nullptr: every staged block is
// local (full transfer). Head-blocks `adopted` holds (adopted->blocks <= layer_blocks) are local
// and keep their cells: no new cell for them.
LayeredHold PlanImportHold(const SparseKvManager& m, int64_t max_total_tokens, int64_t layer_blocks,
                           const std::vector<std::vector<int32_t>>* local,
                           const AdoptedPrefix* adopted = nullptr);
// Whether a hold fits the manager's host store now (kFits), later (kWait) or never.
HostAdmission ImportAdmission(const SparseKvManager& m, const LayeredHold& hold);
// The decode side's admission: like SparseKvManager::CheckAdmission / Reserve with
// always_sparse, with the staged blocks held as PlanImportHold says.
HostAdmission CheckImportAdmission(const SparseKvManager& m, int64_t max_total_tokens,
                                   int64_t layer_blocks,
                                   const std::vector<std::vector<int32_t>>* local,
                                   const AdoptedPrefix* adopted = nullptr);
// Reserves the import's host room (SparseKvManager::ReserveWith with the layout of
// PlanImportHold): blocks [0, layer_blocks) per sparse layer i and head h a summary-only row
// where the block is remote while the layer's rows last, else a cell; the others whole slots.
// ResourceExhausted (nothing taken) unless CheckImportAdmission says kFits. `adopted`'s cells
// (acquired from the import cache, shared with other imports) join the reservation; call
// ParkImportPrefix before its release, which must not free them.
Status ReserveImport(SparseKvManager& m, uint64_t id, int64_t max_total_tokens,
                     int64_t layer_blocks, const std::vector<std::vector<int32_t>>* local,
                     const AdoptedPrefix* adopted = nullptr);
// Before an import's release (SparseKvManager::Release), for its blocks [0, keys.size()): ends
// its hold of the blocks it adopted (their shared cells leave its reservation) and gives the
// cache the cells of its own whose K/V is in the host store — with `landed` (its fetch landed
// and it ran sparse) those the remote mask says are local, else none (an import whose fetch did
// not complete). Returns the cells it gave. The caller passes full prompt blocks only: their
// K/V is the prefill instance's dense prefill, the same for every prompt with that prefix.
// Nothing happens for a request without an import reservation.
// After an import's fetch landed (it is sparse): publishes its full prompt blocks past
// `adopted` that the cache lacks (StorePrefixCache::Publish: its local cells, held by it),
// extending `adopted` while they run on from it, so imports of the same prefix arriving while
// it decodes share them. Returns the blocks published.
int64_t PublishImportPrefix(SparseKvManager& m, uint64_t id, StorePrefixCache& cache,
                            std::span<const PrefixBlockKey> keys, AdoptedPrefix& adopted);
int64_t ParkImportPrefix(SparseKvManager& m, uint64_t id, StorePrefixCache& cache,
                         std::span<const PrefixBlockKey> keys, const AdoptedPrefix& adopted,
                         bool landed);

// Makes a reserved import sparse (SparseKvManager::SwitchFromHost: `num_tokens` tokens have
// K/V and summaries in the host store, `working` its initial working sets). `local` (indexed
// (l - dense_layers) * Hkv + h; null = every block): the blocks whose K/V is in the host
// store; the other blocks below ceil(num_tokens / 16) are *remote* (a reservation of
// ReserveImport and config().remote_fetch_cap > 0 needed): select lists them (RemoteMisses)
// instead of fetching them until MarkLocal. Errors as SwitchFromHost; nothing changed.
Status ImportSparse(SparseKvManager& m, uint64_t id, int64_t num_tokens,
                    const std::vector<std::vector<int32_t>>& working,
                    std::vector<LayerKvPool>& gpu_pools,
                    const std::vector<std::vector<int32_t>>* local = nullptr);
// Where the K/V of remote blocks about to arrive goes (between steps): per block, its host
// slot, or -1 when the request is unknown or no host slot is free (the block then stays
// remote). A block on a summary-only row moves to a fresh cell first — its summaries and the
// device's host table — so it scores as before; it stays remote in every layer until
// MarkLocal. One set of device operations for all the blocks.
struct Landing {
  uint64_t id = 0;
  RemoteBlock block;
};
std::vector<int32_t> LandingSlots(SparseKvManager& m, const std::vector<Landing>& blocks);
std::vector<int32_t> LandingSlots(SparseKvManager& m, uint64_t id,
                                  const std::vector<RemoteBlock>& blocks);
// A remote block's K/V is now in the host store (written before this call, to the slot
// LandingSlots gave): from the next select on it is local and admissible. Unknown ids,
// local blocks and blocks without a host slot are ignored.
void MarkLocal(SparseKvManager& m, uint64_t id, const RemoteBlock& b);
// Remote blocks a request still has.
int64_t RemoteBlocksLeft(const SparseKvManager& m, uint64_t id);

// The remote misses the last step's select listed for a sparse request (read from host
// memory: call after the step). Empty for a request without remote blocks.
std::vector<RemoteBlock> RemoteMisses(const SparseKvManager& m, uint64_t id);

}  // namespace oasis::disagg

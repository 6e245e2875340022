// The sparse KV side of disaggregation (docs/disaggregation.md §4, §5), over SparseKvManager's
// public API: on the prefill instance, which blocks a handoff ships first; on the decode
// instance, how an import's staged blocks are held (per layer: cells for the local ones,
// summary-only rows for the remote ones while they last), whether that fits the host store,
// the reservation, and the remote misses a step's select listed.
//
// Free functions; they keep no state (the manager holds the reservations). Not thread-safe:
// the engine loop thread, like the manager.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/sparse_kv_manager.h"
#include "oasis/status.h"

namespace oasis::disagg {

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
// local (full transfer).
LayeredHold PlanImportHold(const SparseKvManager& m, int64_t max_total_tokens, int64_t layer_blocks,
                           const std::vector<std::vector<int32_t>>* local);
// Whether a hold fits the manager's host store now (kFits), later (kWait) or never.
HostAdmission ImportAdmission(const SparseKvManager& m, const LayeredHold& hold);
// The decode side's admission: like SparseKvManager::CheckAdmission / Reserve with
// always_sparse, with the staged blocks held as PlanImportHold says.
HostAdmission CheckImportAdmission(const SparseKvManager& m, int64_t max_total_tokens,
                                   int64_t layer_blocks,
                                   const std::vector<std::vector<int32_t>>* local);
Status ReserveImport(SparseKvManager& m, uint64_t id, int64_t max_total_tokens,
                     int64_t layer_blocks, const std::vector<std::vector<int32_t>>* local);

// The remote misses the last step's select listed for a sparse request (read from host
// memory: call after the step). Empty for a request without remote blocks.
std::vector<SparseKvManager::RemoteBlock> RemoteMisses(const SparseKvManager& m, uint64_t id);

}  // namespace oasis::disagg

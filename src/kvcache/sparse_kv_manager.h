// SparseKvManager: the host-side logic of lookahead sparse KV (docs/sparse.md) — host-store
// admission, the dense -> sparse switch, per-step plans and release. It runs only at
// admission, switch and finish, plus a per-step plan built from host-known positions (no
// device reads); every per-step device operation is a Backend op run by
// SparseAttentionPipeline over SparseDeviceState.
//
// Per sparse request and KV head it owns K working GPU slots (the selected blocks) and, with
// dense_layers == 0, two tail GPU slots: logical block b of the tail lives in tail slot b % 2
// (the block of the step's real token and, when the stacked draft crosses a block boundary,
// the next one). With dense_layers > 0 the request keeps its dense HeadBlockTable (the dense
// layers need it; the engine keeps growing it) and the tail blocks are that table's slots.
// A slot id addresses the same head-block in every layer's pool, so one set of slots serves
// all sparse layers; their contents (which logical block sits where) differ per layer.
//
// Tensor parallelism (docs/parallel.md §6): the host side (reservations, rows, slots, plans)
// is one, and there is one *device side* per rank — its HostKvStore (the host KV of that
// rank's local KV heads, a 1/N share of --host-kv-gib) and SparseDeviceState on that rank's
// backend. One slot id names the same (request, local head, block) on every side, as the
// engine's GPU slots do in every rank's pool; side 0's store keeps the host-slot free list.
// Device work of a side runs through `run_sides` (TP: on the rank's worker thread, its
// device current); without TP there is one side and it runs inline.
//
// A reservation may hold its first blocks per layer through a HostLayout (host_layout.h; the
// decode side of disaggregation builds them, with remote blocks: disagg/kv_import.h); the
// switch's plan is in sparse_switch_plan.h; a switch from KV already in the host store is in
// sparse_kv_from_host.cpp.
//
// Owns: the device sides, the per-request host reservations, sparse rows and GPU slots it
// took over. The GPU BlockAllocator is the engine's (shared with the scheduler). Not
// thread-safe: the engine loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "kvcache/host_kv_store.h"
#include "kvcache/host_layout.h"
#include "kvcache/sparse_config.h"
#include "kvcache/sparse_device_state.h"
#include "kvcache/sparse_step_plan.h"
#include "kvcache/sparse_switch_plan.h"
#include "oasis/status.h"

namespace oasis {

struct SparseModelShape {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;  // KV heads on this device (TP: the local ones)
  int64_t head_dim = 0;
  bool kv_fp8 = false;  // FP8 KV pools (ModelConfig::kv_cache_fp8): the host store holds e4m3
};

// Whether a request needs host-store room, and whether it has it.
enum class HostAdmission {
  kNotNeeded,  // it can never exceed the sparse threshold: no host room needed
  kFits,       // Reserve() will succeed now
  kWait,       // not enough free host slots now: queue it until requests finish
  kNever,      // larger than the whole host store (or the sparse state's max_seq_len): refuse
};

// One sequence of a step's batch, in batch order, as BuildStepPlan needs it.
struct SparseBatchEntry {
  uint64_t id = 0;         // the request (looked up only when it is sparse)
  int64_t start = 0;       // position of its first token this step
  int32_t num_tokens = 0;  // tokens this step; sparse: 1 + drafts ([x_t, x̂_{t+1}, ...]),
                           //   at most 1 + kMaxSparseDraftTokens
  const HeadBlockTable* table = nullptr;  // its dense table (needed when dense_layers > 0)
};

// Head-blocks of one device side's host store a sparse configuration holds outside the GPU
// pool: the host slots (`num_sides` share config.host_kv_gib) plus the summary-only rows of
// remote blocks. Each is a head-block of a request whose K/V the GPU pool does not carry, so a
// pool that must hold every running request's tokens whatever their home (the EAGLE-3 head's)
// needs this many head-blocks beyond the target pool. SparseKvManager sizes its stores so.
struct HostKvSlots {
  int32_t slots = 0;         // host slots (K/V storage)
  int32_t summary_rows = 0;  // summary-only rows per layer (remote blocks)
  int64_t total() const { return static_cast<int64_t>(slots) + summary_rows; }
};
HostKvSlots HostKvSlotsFor(const SparseConfig& config, const SparseModelShape& shape, DType dtype,
                           int64_t num_sides);

// Runs fn(side) for every device side, each where that side's backend may be used (TP: on
// the rank's worker thread), and returns when all have returned.
using SparseSideRunner = std::function<void(const std::function<void(int side)>& fn)>;

class SparseKvManager {
 public:
  // One device side on `backend`, its work run inline.
  SparseKvManager(const SparseConfig& config, const SparseModelShape& shape, Backend& backend,
                  BlockAllocator& gpu_allocator);
  // One device side per backend (tensor parallelism: rank r's backend, `shape` its local KV
  // heads); each side's store gets 1/N of config.host_kv_gib. The sides are built through
  // `run_sides`.
  SparseKvManager(const SparseConfig& config, const SparseModelShape& shape,
                  std::vector<Backend*> backends, BlockAllocator& gpu_allocator,
                  SparseSideRunner run_sides);
  // Destroys every side through run_sides (each side's device memory on its own thread).
  ~SparseKvManager();
  // Requests still held are not returned to the GPU allocator (it may be gone already):
  // release them first (Release) when the allocator outlives the manager.

  const SparseConfig& config() const { return config_; }
  // Measurement only (bench_sparse_decode): switches SparseConfig::transfers between steps.
  void SetTransfers(bool on) { config_.transfers = on; }
  // The adaptive budget (--sparse-budget adaptive, docs/sparse.md §13): each sparse layer's
  // admission cap (caps[l], [num_layers], clamped to [1, C]) on every side, written between
  // steps; only layers whose cap changed are written. fetch_caps(): the caps in use ([num_layers],
  // 0 for dense layers; C everywhere with the fixed budget).
  void SetFetchCaps(const std::vector<int32_t>& caps);
  const std::vector<int32_t>& fetch_caps() const { return fetch_caps_; }
  const SparseModelShape& shape() const { return shape_; }
  int num_sides() const { return static_cast<int>(sides_.size()); }
  // Side 0's (its free list is the host store's); host_store(r) / state(r): side r's.
  HostKvStore& host_store(int side = 0) { return *sides_.at(static_cast<size_t>(side)).store; }
  const HostKvStore& host_store(int side = 0) const {
    return *sides_.at(static_cast<size_t>(side)).store;
  }
  SparseDeviceState& state(int side = 0) { return *sides_.at(static_cast<size_t>(side)).state; }
  const SparseDeviceState& state(int side = 0) const {
    return *sides_.at(static_cast<size_t>(side)).state;
  }

  // ---- Admission (host store). `max_total_tokens` = prompt + max output tokens.
  // `always_sparse`: a request that goes sparse whatever its length (disaggregation: a
  // handoff on the prefill node, an import on the decode node) needs room even below the
  // threshold.
  HostAdmission CheckAdmission(int64_t max_total_tokens, bool always_sparse = false) const;
  // Reserves the host slots of every block the request can reach (all KV heads). After a
  // kFits answer this succeeds; otherwise ResourceExhausted / InvalidArgument and nothing is
  // taken. A request that never needs host room (kNotNeeded) need not call it. An
  // always-sparse request switches (ShouldSwitch) as soon as it has KV.
  Status Reserve(uint64_t id, int64_t max_total_tokens, bool always_sparse = false);
  bool HasReservation(uint64_t id) const { return requests_.count(id) > 0; }
  // ---- HBM home (config().home hbm or auto; docs/sparse.md §12): registers a request whose
  // KV stays in the GPU pool when it goes sparse — no host room; its dense table keeps
  // growing (the engine's) and each step reads the selected blocks in place. InvalidArgument
  // as CanReserve; FailedPrecondition when the store has no in-place summary rows.
  Status ReserveInPlace(uint64_t id, int64_t max_total_tokens);
  bool InPlace(uint64_t id) const;
  // GPU head-blocks the in-place requests may reach together (each its max_total_tokens).
  int64_t in_place_slots_committed() const;
  int64_t num_in_place() const;  // in-place requests that are sparse now

  // ---- Moves, HBM -> host (docs/sparse.md §12): an in-place sparse request's KV goes to the
  // host store over several steps while it keeps decoding; its output does not change. Needs
  // dense_layers == 0 and a request that has predicted (a step ran since its switch).
  // BeginMove reserves its host slots (ResourceExhausted, nothing changed, without room);
  // CopySome copies up to `max_blocks` complete logical blocks (every KV head and sparse layer,
  // with their summaries) that are not in the host store yet — the step still reads them in
  // place; FinishMove copies the rest and the tail block, returns the table's GPU slots to the
  // allocator and takes K working + 2 tail slots per head from it (ResourceExhausted, nothing
  // changed, when even then there are too few), points the device tables at the host store
  // and fills the working set with the blocks the last prediction chose (fetched at once, no
  // cap): from the next step on the request is host-home (its table is empty; the engine's
  // sequence runs as kSparse). All between steps, with `num_tokens` the tokens whose K/V the
  // table holds.
  Status BeginMove(uint64_t id);
  bool Moving(uint64_t id) const;
  int64_t num_moving() const;  // requests moving now (they hold working and tail slots too)
  int64_t CopySome(uint64_t id, const HeadBlockTable& table, int64_t num_tokens, int64_t max_blocks,
                   const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);
  Status FinishMove(uint64_t id, HeadBlockTable& table, int64_t num_tokens,
                    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);
  // CopySome's copies run on each side's background stream (Backend::BeginBackground) beside
  // the steps that follow. JoinMoves: every later op on the main streams waits for them —
  // FinishMove and the Release of a moving request do it themselves; the engine also joins
  // once per step so the copies stay at most a step behind. TakeMoveSeconds: the device
  // seconds they took (the slowest side), since the last call.
  void JoinMoves();
  double TakeMoveSeconds();
  // Logical blocks of `id` below `num_tokens`' tail block not copied to the host store yet.
  int64_t BlocksToCopy(uint64_t id, int64_t num_tokens) const;
  // Whether `id` is an in-place sparse request a move may start on.
  bool CanMove(uint64_t id) const;

  // ---- Dense -> sparse.
  // Whether a request with `context_tokens` of KV should switch now.
  bool ShouldSwitch(uint64_t id, int64_t context_tokens) const;
  // An in-place request (ReserveInPlace) switches without copies: its blocks' summaries are
  // computed where they are and its table stays the engine's (the sequence keeps growing it).
  // Switches a reserved request whose first `num_tokens` tokens have K/V in `table`'s slots of
  // `gpu_pools`: copies them to the host store (every sparse layer), computes their summaries,
  // keeps K blocks per head on the GPU as the initial working set (block 0 and the most recent
  // complete blocks) and, with dense_layers == 0, takes over the table's slots: the working and
  // tail slots stay, the rest go back to the allocator and `table` is left empty. Needs a free
  // sparse row and enough GPU slots; ResourceExhausted (nothing changed) otherwise.
  Status SwitchToSparse(uint64_t id, HeadBlockTable& table, int64_t num_tokens,
                        std::vector<LayerKvPool>& gpu_pools);
  // The same with each side's own pools (TP: rank r's KV pools, called on rank r's thread).
  Status SwitchToSparse(uint64_t id, HeadBlockTable& table, int64_t num_tokens,
                        const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);
  bool IsSparse(uint64_t id) const;

  // InvalidArgument when `id` already holds room or `max_total_tokens` exceeds max_seq_len.
  Status CanReserve(uint64_t id, int64_t max_total_tokens) const;

  // ---- Layered reservations and switches from the host store.
  // Reserves host room for `id` (an always-sparse request) whose blocks [0,
  // layout->layer_blocks()) are held per layer by `layout` (already taken from host_store());
  // the manager allocates whole slots for the others. On any error (CanReserve's, or
  // ResourceExhausted when the whole slots do not fit) the layout is released to the store
  // and nothing stays taken.
  Status ReserveWith(uint64_t id, int64_t max_total_tokens, std::unique_ptr<HostLayout> layout);
  // The layout a reservation holds (null: unknown request, or whole slots only).
  HostLayout* Layout(uint64_t id);
  const HostLayout* Layout(uint64_t id) const;
  // Host slot of (sparse layer, KV head, logical block) of a reserved request (-1: unknown
  // request or block beyond its reservation): below the layout's layer_blocks its Slot().
  int32_t HostSlotOf(uint64_t id, int64_t layer, int64_t head, int64_t block) const;
  // Host memory (K/V storage) a reserved request holds: whole slots and its layout's cells.
  int64_t HostBytesHeld(uint64_t id) const;
  // Makes a reserved request sparse from KV that is already in the host store (an import on
  // the decode node): `num_tokens` tokens have K/V there (and summaries), `working[(l -
  // dense_layers) * Hkv + h]` lists its initial working set of layer l and head h (entries
  // that are not complete blocks are skipped, at most K are taken, in order; the rest stay in
  // the host store, fetched by select as usual). Takes a sparse row and K + 2 fresh GPU slots
  // per head and copies the working set and the partial tail block from the host store into
  // `gpu_pools`, in every sparse layer. Needs one device side and dense_layers == 0
  // (FailedPrecondition); ResourceExhausted (nothing changed) without a free row or GPU slots.
  Status SwitchFromHost(uint64_t id, int64_t num_tokens,
                        const std::vector<std::vector<int32_t>>& working,
                        std::vector<LayerKvPool>& gpu_pools);
  // The backend of device side `side` (its device state's and host store's).
  Backend& backend(int side = 0) { return *sides_.at(static_cast<size_t>(side)).backend; }
  // The sparse row of a request (-1: unknown or dense); its row of state() holds its working
  // set, prediction and remote misses.
  int32_t SparseRow(uint64_t id) const;
  // Tokens [0, KvEnd(id)) of a sparse request are final where its KV lives: written through
  // to the host store (host home) and summarised (-1: unknown or dense). Tests and checks.
  int64_t KvEnd(uint64_t id) const;
  // The sparse requests now (ids, any order), and whether one keeps its KV in the GPU pool.
  std::vector<uint64_t> SparseIds() const;

  // ---- Per step. Builds the host plan for a batch (dense entries pass through). A sparse
  // request's position may advance by 1 + the drafts accepted at its previous step (at most
  // kMaxSparseDraftTokens): their K/V sit in the tail since that step; this plan writes them
  // through to the host store (SparseStepPlan::lag_src/lag_dst) and its tail starts at the
  // first of them, so a block they completed is summarised and attended as a tail block this
  // step and predicted from the next (docs/sparse.md §1, "Accepted drafts").
  SparseStepPlan BuildStepPlan(const std::vector<SparseBatchEntry>& batch);

  // ---- Finish. Returns every host slot, GPU slot and the sparse row of the request (a
  // request never switched returns its reservation). Unknown ids are ignored.
  void Release(uint64_t id);
  // Prefix reuse in the host store (kvcache/store_prefix_cache.h, Unit::kSlots): before a
  // host-home request's switch, its first `blocks` blocks take `slots` ([blocks][Hkv],
  // block-major: whole slots whose K/V and summaries are those blocks', held by a cache) in
  // place of the reservation's own, which go back to the store; the switch then does not copy
  // or summarise them. Needs a host reservation, no sparse row yet, no dense layers, one side.
  Status AdoptHostPrefix(uint64_t id, int64_t blocks, std::span<const int32_t> slots);
  // Before a release: the whole host slots of blocks [0, blocks) ([n][Hkv], block-major),
  // taken out of the request's reservation (its Release skips them). A request whose host
  // slots do not hold its K/V (not switched, a move not finished, in place, a layered import)
  // gives only the blocks it adopted (n = AdoptedHostBlocks), or nothing.
  std::vector<int32_t> DetachHostPrefix(uint64_t id, int64_t blocks);
  int64_t AdoptedHostBlocks(uint64_t id) const;

  // Accounting (tests, metrics).
  int64_t num_sparse() const;
  int64_t gpu_slots_held() const;  // working + tail slots of all sparse requests
  int64_t host_slots_reserved() const { return host_store().num_slots() - host_store().num_free(); }
  int64_t summary_rows_held() const;  // all layers
  int64_t steps() const { return step_; }

 private:
  struct Request {
    int64_t reserved_blocks = 0;      // logical blocks with host slots
    std::vector<int32_t> host_slots;  // [Hkv * reserved_blocks], head-major; -1 below layer_blocks
    std::unique_ptr<HostLayout> layout;  // blocks [0, layer_blocks) held per layer (or null)
    int64_t layer_blocks = 0;            // layout ? layout->layer_blocks() : 0
    int32_t row = -1;                    // sparse row, -1 while dense
    std::vector<int32_t> ws_slots;       // [Hkv * K]
    std::vector<int32_t> tail_slots;     // [Hkv * 2] (dense_layers == 0)
    bool has_prediction = false;         // a previous step predicted its next top-K
    bool always_sparse = false;          // switches whatever its length (disaggregation)
    bool in_place = false;               // HBM home: KV in the GPU pool, no host slots
    bool moving = false;                 // in place, its KV being copied to the host store
    int64_t copied = 0;                  // moving: blocks [0, copied) are in the host store
    // Sparse: tokens [0, kv_end) are final where the request's KV lives — written through to
    // the host store (host home) and summarised. The tokens from kv_end to the next step's
    // position are drafts its previous step accepted; they are still only in the tail.
    int64_t kv_end = 0;
    // Blocks [0, adopted_blocks) take whole host slots a prefix cache holds (AdoptHostPrefix):
    // the switch neither copies nor summarises them, and nothing writes them.
    int64_t adopted_blocks = 0;
  };
  // Copies logical blocks [from, to) of every head (GPU slots of `table`), whole, to the
  // request's host slots in every sparse layer: K/V and summary rows.
  void CopyToHost(const Request& req, const HeadBlockTable& table, int64_t from, int64_t to,
                  const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);
  // The in-place half of SwitchToSparse.
  Status SwitchInPlace(uint64_t id, Request& req, const HeadBlockTable& table, int64_t num_tokens,
                       const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);

  int32_t HostSlot(const Request& r, int64_t layer, int64_t head, int64_t block) const;
  // A block held as a whole slot (every layer): the ones a step writes through.
  int32_t WholeSlot(const Request& r, int64_t head, int64_t block) const;
  // The device host-table row of a request in `layer`: [Hkv, MB], -1 beyond its reservation.
  std::vector<int32_t> TablesRow(const Request& r, int64_t layer, int64_t max_blocks) const;
  // SwitchFromHost's working sets per sparse layer ([Ls][Hkv][K], -1 empty: complete blocks,
  // distinct, at most K) and per layer the host -> GPU copies that fill them and the partial
  // tail block (host slot src -> GPU slot dst).
  struct FromHostCopies {
    std::vector<std::vector<std::vector<int32_t>>> layer_ws;
    std::vector<std::vector<int32_t>> src, dst;
  };
  FromHostCopies PlanFromHostCopies(const Request& req, int64_t num_tokens,
                                    const std::vector<std::vector<int32_t>>& working) const;
  // BuildStepPlan's per-head part for batch sequence `s` (first token at batch row t0): its
  // tail slots, slot mapping, write-through, summary and (in place) table entry.
  // `first_tail`: the tail's first logical block (the block of req.kv_end).
  void PlanHeads(const Request& req, const SparseBatchEntry& e, int64_t s, int64_t t0,
                 int64_t first_tail, SparseStepPlan& p) const;
  // GPU slot of tail block `block` of head `head`.
  int32_t TailSlot(const Request& r, const HeadBlockTable* table, int64_t head,
                   int64_t block) const;
  // The device half of SwitchToSparse: the plan's copies and the row state, on every side.
  void RunSwitchCopies(const SparseSwitchPlan& plan, const Request& req,
                       const std::function<std::vector<LayerKvPool>&(int side)>& pools_of);
  // ws_blocks(l): [Hkv][K] logical blocks of layer l's working slots (-1 = empty).
  void WriteRowState(
      SparseDeviceState& state, const Request& r,
      const std::function<const std::vector<std::vector<int32_t>>&(int64_t layer)>& ws_blocks);

  struct DeviceSide {
    Backend* backend = nullptr;
    std::unique_ptr<HostKvStore> store;
    std::unique_ptr<SparseDeviceState> state;
  };

  SparseConfig config_;
  SparseModelShape shape_;
  BlockAllocator& gpu_allocator_;
  SparseSideRunner run_sides_;
  std::vector<int32_t> fetch_caps_;  // [num_layers] the caps the device states hold
  std::vector<DeviceSide> sides_;
  std::unordered_map<uint64_t, Request> requests_;
  std::vector<int32_t> free_rows_;  // LIFO
  int64_t step_ = 0;
};

}  // namespace oasis

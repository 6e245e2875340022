// SparseDecoding: lookahead sparse KV inside the engine loop (docs/sparse.md §9). It joins the
// pieces built below the engine — SparseKvManager (host KV store, device state, switch,
// plans) and SparseAttentionPipeline (the forward pass's layer hook) — to the scheduler and
// the step:
//   - admission (SequenceKvHooks): host-store room for the most tokens a request can reach
//     (wait when it is only full now, refuse when it can never hold it); release on finish,
//     abort, failure and preemption (a preempted sparse request recomputes densely and
//     switches again);
//   - switch: after a step, running decodes whose context exceeds the threshold go sparse
//     (their dense table's slots are freed except the working set and tails);
//   - the step: the plan of a batch that holds sparse sequences, pointing their
//     StepSequence::sparse at it; the runner runs it with the pipeline as the hook;
//   - metrics: the pipeline's device counters, collected every few steps into EngineStats.
//
// The pipelines are the runner's (ModelRunner::AttachSparse: one per rank over the manager's
// device side of that rank, detached before the manager goes, SparseAttachment); a step
// hands the runner its plan and what the policy decides about running it (RunInputs).
//
// Owns the manager; the GPU BlockAllocator and the ModelRunner are the engine's (the runner
// must outlive this). Not thread-safe: the engine loop thread — except CheckFits, which reads sizes
// fixed at construction and may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/scheduler.h"
#include "kvcache/block_allocator.h"
#include "kvcache/fetch_budget.h"
#include "kvcache/sparse_config.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"
#include "oasis/status.h"
#include "runner/batch_builder.h"
#include "runner/model_runner.h"
#include "runner/sparse_ranks.h"

namespace oasis {

struct EngineStats;

// Sparse requests of one length the homes hold at once (Engine::CapacityAt).
struct SparseCapacity {
  int64_t hbm = 0, host = 0;
};

// Tokens of KV (K and V, every layer and KV head, in the KV dtype: bf16, or one byte with
// c.kv_cache_fp8) whose bytes equal the weights a decode step reads: the pressure policy's read
// budget for dense decodes. Both scale by 1 / TP, so the full model's figures give the ratio.
// An MoE layer's experts count k of E (what one token reads; a batch touches more, so the
// budget errs towards switching early). Weights count as bf16 except `fp8_kept_bytes`: the
// device bytes of the linear weights an FP8 checkpoint keeps in e4m3 (over all ranks), which
// count once instead of twice.
int64_t DenseReadBudgetTokens(const ModelConfig& c, double fp8_kept_bytes = 0);

class SparseDecoding final : public SequenceKvHooks {
 public:
  // `config.max_seq_len` should be the engine's context length. `metrics_interval`: collect
  // the device counters (a host synchronisation) every that many sparse steps, and whenever
  // the last sparse request has gone.
  SparseDecoding(const SparseConfig& config, ModelRunner& runner, BlockAllocator& allocator,
                 int64_t metrics_interval);
  ~SparseDecoding() override;

  const SparseConfig& config() const { return manager_.config(); }
  SparseKvManager& manager() { return manager_; }

  // Submit time: ResourceExhausted naming the numbers when a request that may reach
  // `max_total_tokens` tokens can never fit the host KV store. Thread-safe.
  Status CheckFits(int64_t max_total_tokens) const;

  // SequenceKvHooks.
  Admission Admit(Sequence& seq) override;
  void Release(Sequence& seq) override;
  // kv-home auto: moves the in-place sparse decode with the most tokens to the host store at
  // once (SparseKvManager BeginMove + FinishMove), returning its table's blocks to the pool.
  bool Relieve(const std::vector<Sequence*>& running) override;
  // Why Admit refused `seq` (ResourceExhausted).
  // Why Admit refused `seq`: CheckFits's error, never OK (a refusal CheckFits would pass is
  // an internal inconsistency, named as such).
  Status RefusalStatus(const Sequence& seq) const {
    Status s = CheckFits(seq.max_total_tokens);
    if (!s.ok()) return s;
    return Internal("sparse admission refused a request of " +
                    std::to_string(seq.max_total_tokens) +
                    " tokens (prompt + max_tokens) that the KV pool and host store can hold");
  }
  // An imported request (disaggregation): its host room is reserved and its first
  // `num_tokens` tokens' K/V and summaries are in the host store; takes the sparse row and
  // GPU slots and fills its working sets (disagg::ImportSparse), then marks it sparse.
  Status Import(Sequence& seq, int64_t num_tokens, const std::vector<std::vector<int32_t>>& working,
                const std::vector<std::vector<int32_t>>* local = nullptr);

  // Whether a sparse decode feeds its draft token ([x_t, x̂_{t+1}]: the draft predictor)
  // or only x_t (previous-query, oracle).
  bool FeedsDraft() const { return config().predictor == SparsePredictor::kDraft; }
  // Whether a dense decode of `num_tokens` tokens should have a draft ready: only when it may
  // switch to sparse at the next step, whose prediction reads the draft (without one that step
  // predicts from its real query, docs/sparse.md §5). The threshold policy: from the threshold
  // on; the pressure policy: past the threshold while the pool is near pressure (Rebalance).
  // Otherwise the head's step only appends the request's K/V (Eagle3Head::Forward without
  // logit rows): a batch-1 long decode far from pressure pays a quarter of the head's bytes.
  bool DenseNeedsDraft(const Sequence& s, int64_t num_tokens) const;

  // The step's plan for a batch: `seqs[i]` runs `steps[i]` (same order). When some sequence
  // is sparse, fills `plan` (SparseKvManager::BuildStepPlan), sets each sparse step's
  // `sparse` (pointing into `plan`, which must outlive `steps`' use) and table (none for
  // kSparse, the dense table for kSparseDenseTable), and returns true.
  bool PlanStep(const std::vector<const Sequence*>& seqs, std::vector<StepSequence>& steps,
                SparseStepPlan& plan);
  // What the runner needs to run `plan` (StepInputs::sparse): the plan and the policy's say
  // on replaying it as a graph and on transfers.
  SparseStepInputs RunInputs(const SparseStepPlan& plan) const;
  // After a step: switches running decodes past the threshold to sparse. A switch that finds
  // no free sparse row or GPU slot leaves the request dense (retried next step). Returns
  // the number switched.
  int64_t SwitchReady(const std::vector<Sequence*>& running);
  // After a step and the switch (docs/sparse.md §12). The pressure policy with an HBM home
  // first switches dense decodes over the read budget in place. Then moves of in-place requests
  // to the host store: `shortfall` is the head-blocks the pool is short of (to admit the next
  // waiting request; at least 1 when the step preempted; 0: no pressure). Under pressure the
  // in-place requests with the most blocks start moving, until the moves under way will free
  // the shortfall (at most kMaxMoves at once); each moving request copies
  // config().move_blocks_per_step blocks per step while it decodes, then finishes (its table's
  // slots go back to the pool, it runs as kSparse). `pool_free`: the pool's free head-blocks;
  // with the shortfall and the dense decodes' share of the read budget it says whether the
  // pool is near pressure (DenseNeedsDraft).
  static constexpr int64_t kMaxMoves = 4;
  void Rebalance(const std::vector<Sequence*>& running, int64_t shortfall, int64_t pool_free);

  // Requests of `tokens` tokens (each past the threshold) the homes hold at once: the host
  // store's first, each with K + 2 working and tail head-blocks per KV head in the pool, then
  // in place in what the pool has left (kv-home hbm: in place only); within the sparse rows.
  SparseCapacity CapacityAt(int64_t tokens) const;

  // Publishes gauges and, when due, the collected counters into `stats`.
  void UpdateStats(EngineStats& stats);
  // Called with a dense request just before it switches to sparse, after its computed blocks
  // are registered in the prefix cache (the engine registers the draft head's blocks then).
  void set_before_switch(std::function<void(Sequence&)> f) { before_switch_ = std::move(f); }
  // Called with a request just before its host room and sparse row are released (finish,
  // abort, preemption): the engine parks an import's prompt blocks in its prefix cache then.
  void set_before_release(std::function<void(Sequence&)> f) { before_release_ = std::move(f); }

 private:
  ModelRunner& runner_;
  BlockAllocator& allocator_;  // the engine's GPU pool
  std::function<void(Sequence&)> before_switch_;
  std::function<void(Sequence&)> before_release_;
  bool tearing_down_ = false;  // (before manager_: its side runner reads it)
  SparseKvManager manager_;
  std::vector<std::vector<LayerKvPool>*> rank_pools_;  // each rank's KV pools
  SparseAttachment attachment_;                        // (after manager_: detached first)
  int64_t metrics_interval_;
  // Fixed at construction (CheckFits reads them from any thread).
  int64_t threshold_, max_seq_len_, num_kv_heads_, host_slots_, bytes_per_host_slot_;
  int64_t num_sides_;   // host bytes of a slot id: bytes_per_host_slot_ on each of num_sides_ ranks
  int64_t pool_slots_;  // the GPU pool's head-blocks
  KvHome home_;
  // The pressure policy's read budget: dense decodes may hold this many tokens of KV together
  // (their attention then reads at most as many bytes per step as the weights) before the
  // longest switch in place (home hbm or auto; docs/sparse.md §12).
  int64_t dense_read_budget_tokens_;
  // Set by Rebalance: the pool is short, has less than an eighth free, or (in-place switches
  // on) a request decodes sparse or the dense decodes hold over three quarters of the read
  // budget: a switch may come (drafts run for dense decodes near the threshold, and long
  // requests admitted now take their sparse home at once).
  bool near_pressure_ = false;
  // Bandwidth pressure: while the running dense decodes' KV exceeds the read budget, the longest
  // past the threshold switches to sparse in place (no copy; it keeps its blocks in the pool).
  // Once any request decodes sparse, the budget is 0: every dense decode past the threshold
  // switches.
  void SwitchInPlaceOverBudget(const std::vector<Sequence*>& running);
  static bool AnySparse(const std::vector<Sequence*>& running);
  // Head-blocks of s's table that releasing it would free (prefix caching: blocks another
  // sequence also reads stay allocated).
  int64_t ReleasableSlots(const Sequence& s) const;
  // Whether `seq` goes to the HBM home (SparseKvManager::ReserveInPlace) rather than the host.
  bool AdmitInPlace(const Sequence& seq) const;
  // The auto home: the GPU pool could hold `seq` whole once the in-place requests ahead of it
  // end (whatever it holds now).
  bool InPlaceCouldFit(const Sequence& seq) const;
  int64_t steps_uncollected_ = 0;  // sparse steps since the last CollectMetrics
  // --sparse-budget adaptive: per-layer fetch caps from each collection's counters
  // (docs/sparse.md §13); nullopt with the fixed budget.
  std::optional<FetchBudgetController> budget_;
  std::chrono::steady_clock::time_point interval_start_ = std::chrono::steady_clock::now();
  int64_t admission_waits_ = 0;  // requests that had to wait for host room (once each)
  std::unordered_set<uint64_t> waiting_for_host_;
  int64_t switch_failures_ = 0;
  int64_t in_place_blocks_ = 0;    // head-blocks in-place requests' tables hold (each step)
  int64_t in_place_switches_ = 0;  // switches that kept the KV in the GPU pool
  int64_t moves_started_ = 0, moves_total_ = 0, move_bytes_ = 0;
  int64_t pressure_switches_ = 0;  // dense -> sparse (host) switches the pressure policy made
  int64_t switches_ = 0;           // dense -> sparse switches of every kind
  // The pressure policy (SparseConfig::switch_on_pressure): whether `s` is a dense decode past
  // the threshold with no host room or home yet; whether it may switch to the host store now
  // (its KV fits there, and the switch frees blocks), and the switch itself: to the host store,
  // or in place (it keeps its blocks in the pool). False, nothing changed, when it cannot.
  bool DenseDecodePastThreshold(const Sequence& s) const;
  bool SwitchableUnderPressure(const Sequence& s) const;
  bool SwitchNow(Sequence& s, bool in_place);
  // K working + 2 tail head-blocks per KV head: what a host-home request keeps in the pool.
  int64_t WorkingSetSlots() const;
  // K/V bytes of `blocks` logical blocks (every KV head, sparse layer and rank).
  int64_t BlockBytes(int64_t blocks) const;
  // auto: whether `s` is an in-place sparse decode that can move (or is moving) now, and the
  // end of its move (false when the pool has too few slots for its working set yet).
  bool MovableNow(const Sequence& s) const;
  bool FinishMoveOf(Sequence& s);
  // Each rank's KV pools, as the manager's switches and moves take them.
  std::function<std::vector<LayerKvPool>&(int rank)> PoolsOf();
  double move_seconds_ = 0;
  double move_copy_seconds_ = 0;  // device seconds of the background copies
};

}  // namespace oasis

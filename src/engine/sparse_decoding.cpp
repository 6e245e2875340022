#include "engine/sparse_decoding.h"

#include <chrono>

#include <algorithm>
#include <cstdio>

#include "common/check.h"
#include "common/logging.h"
#include "disagg/kv_import.h"
#include "engine/engine.h"
#include "engine/prefix_reuse.h"

namespace oasis {
namespace {

SparseModelShape ShapeOf(ModelRunner& runner) {
  const ModelConfig& c = runner.model().config();
  return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim, c.kv_cache_fp8};
}

}  // namespace

int64_t DenseReadBudgetTokens(const ModelConfig& c, double fp8_kept_bytes) {
  int64_t weight_bytes = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(c)) {
    int64_t bytes = w.numel() * static_cast<int64_t>(DTypeSize(w.dtype));
    if (c.num_experts > 0 && w.name.find(".mlp.experts.") != std::string::npos)
      bytes = bytes * c.num_experts_per_tok / c.num_experts;
    weight_bytes += bytes;
  }
  weight_bytes -= static_cast<int64_t>(fp8_kept_bytes);  // counted as bf16 above
  const int64_t kv_bytes = c.kv_cache_fp8 ? 1 : 2;
  const int64_t kv_per_token =
      2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * kv_bytes;
  return kv_per_token > 0 ? weight_bytes / kv_per_token : 0;
}

SparseDecoding::SparseDecoding(const SparseConfig& config, ModelRunner& runner,
                               BlockAllocator& allocator, int64_t metrics_interval)
    : runner_(runner),
      allocator_(allocator),
      manager_(config, ShapeOf(runner), RankBackends(runner), allocator,
               RankSideRunner(runner, &tearing_down_)),
      rank_pools_(RankKvPools(runner)),
      attachment_(runner, manager_),
      metrics_interval_(std::max<int64_t>(1, metrics_interval)),
      threshold_(config.sparse_threshold),
      max_seq_len_(config.max_seq_len),
      num_kv_heads_(runner.model().config().num_key_value_heads),
      host_slots_(manager_.host_store().num_slots()),
      bytes_per_host_slot_(static_cast<int64_t>(manager_.host_store().bytes_per_slot())),
      num_sides_(manager_.num_sides()),
      pool_slots_(allocator.num_slots()),
      home_(config.home),
      dense_read_budget_tokens_(
          config.dense_read_tokens > 0
              ? config.dense_read_tokens
              : DenseReadBudgetTokens(
                    runner.model().full_config(),
                    runner.model().fp8_weights().kept_bytes * runner.num_ranks())) {
  spdlog::info(
      "sparse KV: threshold {} tokens, K {} blocks, C {} blocks per head per step, predictor {}, "
      "{} dense layers, host store {} head-blocks ({:.2f} GiB{}){}, {} sparse rows, KV home {}",
      config.sparse_threshold, config.topk_blocks, config.max_fetch(),
      SparsePredictorName(config.predictor), config.dense_layers, host_slots_,
      static_cast<double>(host_slots_ * bytes_per_host_slot_ * num_sides_) / (1 << 30),
      num_sides_ > 1 ? fmt::format(" over {} ranks", num_sides_) : std::string(),
      manager_.host_store().num_summary_rows() > 0
          ? fmt::format(" + {} summary-only rows for remote blocks",
                        manager_.host_store().num_summary_rows())
          : std::string(),
      config.max_sparse_seqs, KvHomeName(config.home));
  if (config.budget == SparseBudget::kAdaptive) {
    budget_.emplace(runner.model().config().num_hidden_layers, config.dense_layers,
                    config.max_fetch());
    spdlog::info(
        "sparse KV: adaptive fetch budget: per-layer caps in [1, {}], updated every {} sparse "
        "steps",
        config.max_fetch(), metrics_interval_);
  }
  if (config.switch_on_pressure)
    spdlog::info(
        "sparse KV: pressure policy: dense decodes past the threshold run dense while the pool has "
        "room{}",
        home_ == KvHome::kHost
            ? std::string()
            : fmt::format(" and hold at most {} tokens of KV together{}; beyond that the "
                          "longest switch in place",
                          dense_read_budget_tokens_,
                          config.dense_read_tokens > 0 ? "" : " (the weights' bytes)"));
}

SparseDecoding::~SparseDecoding() {
  // The runner's pipelines and then the device sides (~SparseKvManager) go on their ranks'
  // threads, also on a failed group.
  tearing_down_ = true;
}

Status SparseDecoding::CheckFits(int64_t max_total_tokens) const {
  if (threshold_ <= 0 || max_total_tokens <= threshold_) return Status::Ok();
  // Beyond the context (Submit refuses those first) counts as one context's worth, no overflow.
  const int64_t need = BlocksFor(std::min(max_total_tokens, max_seq_len_ + 1)) * num_kv_heads_;
  if (max_total_tokens <= max_seq_len_ && need <= host_slots_ && home_ != KvHome::kHbm)
    return Status::Ok();
  // HBM home, or the pressure policy (it may run dense to the end): the GPU pool's room is
  // enough (the scheduler's own check names it otherwise).
  if ((home_ != KvHome::kHost || config().switch_on_pressure) && max_total_tokens <= max_seq_len_ &&
      need <= pool_slots_)
    return Status::Ok();
  const double gib = static_cast<double>(bytes_per_host_slot_ * num_sides_) / (1 << 30);
  char need_gib[32], have_gib[32];
  std::snprintf(need_gib, sizeof need_gib, "%.3f", static_cast<double>(need) * gib);
  std::snprintf(have_gib, sizeof have_gib, "%.3f", static_cast<double>(host_slots_) * gib);
  return ResourceExhausted("the request may reach " + std::to_string(max_total_tokens) +
                           " tokens (prompt + max_tokens), past the sparse threshold of " +
                           std::to_string(threshold_) + ": its KV needs " + std::to_string(need) +
                           " head-blocks (" + need_gib + " GiB) of host KV store, which holds " +
                           std::to_string(host_slots_) + " (" + have_gib +
                           " GiB, --host-kv-gib); lower max_tokens or the prompt");
}

bool SparseDecoding::AdmitInPlace(const Sequence& seq) const {
  // Disaggregation's requests (handoffs, imports) always use the host store; past here a
  // request needs a home only once it can pass the threshold.
  if (seq.always_sparse || home_ == KvHome::kHost || threshold_ <= 0 ||
      seq.max_total_tokens <= threshold_) {
    return false;
  }
  if (home_ == KvHome::kHbm) return true;
  // auto: HBM while the pool can hold every in-place request whole, the working sets and tails
  // of the host-home ones, and this one.
  const int64_t need = BlocksFor(seq.max_total_tokens) * num_kv_heads_;
  return manager_.in_place_slots_committed() + manager_.gpu_slots_held() + need <= pool_slots_;
}

bool SparseDecoding::InPlaceCouldFit(const Sequence& seq) const {
  if (seq.always_sparse || home_ != KvHome::kAuto || threshold_ <= 0 ||
      seq.max_total_tokens <= threshold_ || seq.max_total_tokens > max_seq_len_) {
    return false;
  }
  return BlocksFor(seq.max_total_tokens) * num_kv_heads_ <= pool_slots_;
}

SequenceKvHooks::Admission SparseDecoding::Admit(Sequence& seq) {
  if (manager_.HasReservation(seq.id)) return Admission::kAdmit;
  // The pressure policy: a request runs dense and takes host room only when the pool runs short
  // and it is the longest (Relieve, Rebalance). Near pressure (or once a request decodes
  // sparse) a long request takes its home at admission, as under the threshold policy: it would
  // switch soon anyway, and a home taken now spares the pool its whole KV and a move later. One
  // no home can ever take runs dense.
  if (config().switch_on_pressure && !seq.always_sparse &&
      (!near_pressure_ || (!AdmitInPlace(seq) && manager_.CheckAdmission(seq.max_total_tokens) ==
                                                     HostAdmission::kNever))) {
    return Admission::kAdmit;
  }
  if (AdmitInPlace(seq)) {
    const Status st = manager_.ReserveInPlace(seq.id, seq.max_total_tokens);
    waiting_for_host_.erase(seq.id);
    return st.ok() ? Admission::kAdmit : Admission::kRefuse;
  }
  Admission a = Admission::kRefuse;
  switch (manager_.CheckAdmission(seq.max_total_tokens, seq.always_sparse)) {
    case HostAdmission::kNotNeeded:
      a = Admission::kAdmit;
      break;
    case HostAdmission::kFits:  // Reserve cannot fail after kFits; waiting would be the safe answer
      a = manager_.Reserve(seq.id, seq.max_total_tokens, seq.always_sparse).ok() ? Admission::kAdmit
                                                                                 : Admission::kWait;
      break;
    case HostAdmission::kWait:
      a = Admission::kWait;
      break;
    case HostAdmission::kNever:
      // The auto home: a request the pool could hold whole waits for the in-place requests
      // ahead of it to end (the host store never will hold it).
      a = InPlaceCouldFit(seq) ? Admission::kWait : Admission::kRefuse;
      break;
  }
  if (a == Admission::kWait) {
    if (waiting_for_host_.insert(seq.id).second) ++admission_waits_;
  } else {
    waiting_for_host_.erase(seq.id);
  }
  return a;
}

Status SparseDecoding::Import(Sequence& seq, int64_t num_tokens,
                              const std::vector<std::vector<int32_t>>& working,
                              const std::vector<std::vector<int32_t>>* local) {
  OASIS_RETURN_IF_ERROR(
      disagg::ImportSparse(manager_, seq.id, num_tokens, working, *rank_pools_.at(0), local));
  seq.kv = SequenceKv::kSparse;
  return Status::Ok();
}

void SparseDecoding::Release(Sequence& seq) {
  if (before_release_) before_release_(seq);
  manager_.Release(seq.id);
  waiting_for_host_.erase(seq.id);
}

bool SparseDecoding::PlanStep(const std::vector<const Sequence*>& seqs,
                              std::vector<StepSequence>& steps, SparseStepPlan& plan) {
  OASIS_CHECK_EQ(seqs.size(), steps.size()) << "one sequence per step sequence";
  bool any = false;
  std::vector<SparseBatchEntry> entries;
  entries.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *seqs[i];
    any = any || s.kv != SequenceKv::kDense;
    entries.push_back({s.id, steps[i].start, static_cast<int32_t>(steps[i].tokens.size()),
                       s.kv == SequenceKv::kSparseDenseTable ? &s.table : nullptr});
  }
  if (!any) return false;
  plan = manager_.BuildStepPlan(entries);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i]->kv == SequenceKv::kDense) continue;
    OASIS_CHECK(!plan.slots[i].slot_mapping.empty())
        << "sparse sequence " << seqs[i]->id << " has no plan";
    steps[i].sparse = &plan.slots[i];
    steps[i].table = seqs[i]->kv == SequenceKv::kSparseDenseTable ? &seqs[i]->table : nullptr;
  }
  ++steps_uncollected_;
  return true;
}

SparseStepInputs SparseDecoding::RunInputs(const SparseStepPlan& plan) const {
  return {&plan, config().predictor != SparsePredictor::kOracle, config().transfers};
}

int64_t SparseDecoding::SwitchReady(const std::vector<Sequence*>& running) {
  int64_t switched = 0;
  for (Sequence* s : running) {
    // Only decodes: a sparse step runs the pending token (and a draft), never a prefill chunk.
    if (s->kv != SequenceKv::kDense || s->num_pending() != 1 ||
        !manager_.ShouldSwitch(s->id, s->num_computed)) {
      continue;
    }
    CacheComputedBlocks(*s, allocator_);  // prefix caching: its dense blocks stay reusable
    if (before_switch_) before_switch_(*s);
    const Status st = manager_.SwitchToSparse(s->id, s->table, s->num_computed, PoolsOf());
    if (!st.ok()) {  // no sparse row or GPU slot now: stays dense, retried next step
      if (switch_failures_++ % 1000 == 0)
        spdlog::debug("request {} stays dense: {}", s->id, st.ToString());
      break;
    }
    // In place (HBM home) and with dense layers the request keeps growing its dense table.
    const bool in_place = manager_.InPlace(s->id);
    s->kv =
        config().dense_layers > 0 || in_place ? SequenceKv::kSparseDenseTable : SequenceKv::kSparse;
    in_place_switches_ += in_place ? 1 : 0;
    ++switched;
  }
  switches_ += switched;
  return switched;
}

namespace {

// The running sequence with the most computed tokens among those `eligible` accepts, or null.
template <class Eligible>
Sequence* Longest(const std::vector<Sequence*>& running, Eligible eligible) {
  Sequence* longest = nullptr;
  for (Sequence* s : running) {
    if (eligible(*s) && (longest == nullptr || s->num_computed > longest->num_computed))
      longest = s;
  }
  return longest;
}

}  // namespace

std::function<std::vector<LayerKvPool>&(int rank)> SparseDecoding::PoolsOf() {
  return [this](int r) -> std::vector<LayerKvPool>& {
    return *rank_pools_.at(static_cast<size_t>(r));
  };
}

int64_t SparseDecoding::WorkingSetSlots() const {
  return (static_cast<int64_t>(config().topk_blocks) + 2) * num_kv_heads_;
}

int64_t SparseDecoding::BlockBytes(int64_t blocks) const {
  return blocks * bytes_per_host_slot_ * num_kv_heads_ * num_sides_;
}

bool SparseDecoding::DenseDecodePastThreshold(const Sequence& s) const {
  return config().switch_on_pressure && s.kv == SequenceKv::kDense && s.num_pending() == 1 &&
         !s.always_sparse && threshold_ > 0 && s.num_computed > threshold_ &&
         !manager_.HasReservation(s.id);
}

bool SparseDecoding::SwitchableUnderPressure(const Sequence& s) const {
  return DenseDecodePastThreshold(s) && config().dense_layers == 0 &&
         // it frees blocks: its table is larger than the working set and tails it would keep
         BlocksFor(s.num_computed) > static_cast<int64_t>(config().topk_blocks) + 2 &&
         manager_.CheckAdmission(s.max_total_tokens) == HostAdmission::kFits &&
         ReleasableSlots(s) > WorkingSetSlots();
}

bool SparseDecoding::SwitchNow(Sequence& s, bool in_place) {
  const Status reserved = in_place ? manager_.ReserveInPlace(s.id, s.max_total_tokens)
                                   : manager_.Reserve(s.id, s.max_total_tokens);
  if (!reserved.ok()) return false;
  CacheComputedBlocks(s, allocator_);  // prefix caching: its dense blocks stay reusable
  if (before_switch_) before_switch_(s);
  if (!manager_.SwitchToSparse(s.id, s.table, s.num_computed, PoolsOf()).ok()) {
    Release(s);  // no sparse row or GPU slot now (nothing else taken; adopted slots go back)
    return false;
  }
  s.kv = in_place ? SequenceKv::kSparseDenseTable : SequenceKv::kSparse;
  ++(in_place ? in_place_switches_ : pressure_switches_);
  ++switches_;
  spdlog::debug("request {} switched to sparse {} ({} tokens)", s.id,
                in_place ? "in place (dense decodes over the read budget)"
                         : "in the host store (the pool ran short)",
                s.num_computed);
  return true;
}

bool SparseDecoding::FinishMoveOf(Sequence& s) {
  const int64_t blocks = manager_.BlocksToCopy(s.id, s.num_computed) + 1;  // + the tail block
  if (!manager_.FinishMove(s.id, s.table, s.num_computed, PoolsOf()).ok()) return false;
  s.kv = SequenceKv::kSparse;  // its table is empty now: tails and working set only
  ++moves_total_;
  move_bytes_ += BlockBytes(blocks);
  return true;
}

bool SparseDecoding::MovableNow(const Sequence& s) const {
  return home_ == KvHome::kAuto && s.kv != SequenceKv::kDense && s.num_pending() == 1 &&
         manager_.InPlace(s.id) && (manager_.Moving(s.id) || manager_.CanMove(s.id));
}

bool SparseDecoding::Relieve(const std::vector<Sequence*>& running) {
  // The longest request that can leave the pool: a dense decode past the threshold (the
  // pressure policy: it switches to the host store now) or an in-place one (auto: it moves).
  Sequence* longest = Longest(
      running, [this](const Sequence& s) { return MovableNow(s) || SwitchableUnderPressure(s); });
  if (longest == nullptr) return false;
  if (longest->kv == SequenceKv::kDense) return SwitchNow(*longest, false);
  if (!manager_.Moving(longest->id)) {
    if (!manager_.BeginMove(longest->id).ok()) return false;
    ++moves_started_;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // (On failure it keeps moving: Rebalance finishes it when there is room.)
  if (!FinishMoveOf(*longest)) return false;
  move_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::debug("request {} moved to the host store at once ({} tokens)", longest->id,
                longest->num_computed);
  return true;
}

namespace {

int64_t DenseTokens(const std::vector<Sequence*>& running) {
  int64_t n = 0;
  for (const Sequence* s : running)
    if (s->kv == SequenceKv::kDense) n += s->num_computed;
  return n;
}

}  // namespace

bool SparseDecoding::DenseNeedsDraft(const Sequence& s, int64_t num_tokens) const {
  if (!FeedsDraft()) return false;
  if (s.always_sparse) return true;
  // It switches once num_computed passes the threshold (one token behind num_tokens).
  if (threshold_ <= 0 || num_tokens + 2 <= threshold_) return false;
  return !config().switch_on_pressure || near_pressure_;
}

bool SparseDecoding::AnySparse(const std::vector<Sequence*>& running) {
  for (const Sequence* s : running)
    if (s->kv != SequenceKv::kDense) return true;
  return false;
}

void SparseDecoding::SwitchInPlaceOverBudget(const std::vector<Sequence*>& running) {
  int64_t dense_tokens = DenseTokens(running);
  // Once one request decodes sparse the sparse step's fixed costs (the draft head, the
  // predictor, the selection) are paid, and a dense decode past the threshold only adds its
  // whole KV to every step's reads: the rest join it (measured on the H200, 16K x 64: a budget
  // of the weights' bytes left a 21.3 ms step against 15.9 with every request sparse).
  const int64_t budget = AnySparse(running) ? 0 : dense_read_budget_tokens_;
  while (dense_tokens > budget) {
    Sequence* longest =
        Longest(running, [this](const Sequence& s) { return DenseDecodePastThreshold(s); });
    // (A failed switch is retried after the next step.)
    if (longest == nullptr || !SwitchNow(*longest, true)) return;
    dense_tokens -= longest->num_computed;
  }
}

void SparseDecoding::Rebalance(const std::vector<Sequence*>& running, int64_t shortfall,
                               int64_t pool_free) {
  // The last step's background move copies: this step's work waits for them (they had the
  // whole step to run beside it), so they stay at most one step behind.
  manager_.JoinMoves();
  move_copy_seconds_ += manager_.TakeMoveSeconds();
  if (config().switch_on_pressure && home_ != KvHome::kHost) SwitchInPlaceOverBudget(running);
  near_pressure_ =
      shortfall > 0 || pool_free * 8 < pool_slots_ ||
      (config().switch_on_pressure && home_ != KvHome::kHost &&
       (AnySparse(running) || DenseTokens(running) * 4 > dense_read_budget_tokens_ * 3));
  in_place_blocks_ = 0;
  for (const Sequence* s : running)
    if (manager_.InPlace(s->id) && s->kv != SequenceKv::kDense)
      in_place_blocks_ += s->table.num_blocks() * num_kv_heads_;
  if (shortfall > 0 && config().switch_on_pressure) {  // the longest dense request leaves the pool
    Sequence* longest =
        Longest(running, [this](const Sequence& s) { return SwitchableUnderPressure(s); });
    if (longest != nullptr && SwitchNow(*longest, false)) return;
  }
  if (home_ != KvHome::kAuto) return;  // only auto has two homes to move between
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t kept = WorkingSetSlots();
  int64_t moving = 0, freeing = 0;  // moves under way, and the head-blocks they will free
  for (Sequence* s : running) {
    if (!manager_.Moving(s->id)) continue;
    if (s->num_pending() == 1) {  // only between decode steps
      const int64_t n = manager_.CopySome(s->id, s->table, s->num_computed,
                                          config().move_blocks_per_step, PoolsOf());
      move_bytes_ += BlockBytes(n);
      if (manager_.BlocksToCopy(s->id, s->num_computed) == 0 && FinishMoveOf(*s)) continue;
    }
    ++moving;
    freeing += ReleasableSlots(*s) - kept;
  }
  // Under pressure, more moves begin (the longest first) until those under way free what the
  // pool is short of, at most kMaxMoves at once.
  bool any = moving > 0;
  while (shortfall > freeing && moving < kMaxMoves) {
    Sequence* longest = Longest(running, [this](const Sequence& s) {
      return manager_.CanMove(s.id) && s.num_pending() == 1;
    });
    if (longest == nullptr || !manager_.BeginMove(longest->id).ok()) break;
    ++moves_started_;
    ++moving;
    freeing += ReleasableSlots(*longest) - kept;
    any = true;
    spdlog::debug("request {} moves to the host store ({} tokens)", longest->id,
                  longest->num_computed);
  }
  if (any)
    move_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t SparseDecoding::ReleasableSlots(const Sequence& s) const {
  int64_t n = 0;
  for (int32_t h = 0; h < s.table.num_kv_heads(); ++h) {
    for (int32_t slot : s.table.head_slots(h)) n += allocator_.ref_count(slot) == 1 ? 1 : 0;
  }
  return n;
}

SparseCapacity SparseDecoding::CapacityAt(int64_t tokens) const {
  SparseCapacity c;
  if (tokens <= 0 || tokens > max_seq_len_) return c;
  const int64_t need = BlocksFor(tokens) * num_kv_heads_;
  const int64_t ws = WorkingSetSlots();
  const int64_t rows = config().max_sparse_seqs;
  if (home_ != KvHome::kHbm) c.host = std::min({host_slots_ / need, pool_slots_ / ws, rows});
  if (home_ != KvHome::kHost) c.hbm = std::min((pool_slots_ - c.host * ws) / need, rows - c.host);
  return c;
}

void SparseDecoding::UpdateStats(EngineStats& stats) {
  stats.sparse.num_requests = manager_.num_sparse();
  stats.sparse.num_host_kv_slots = host_slots_;
  stats.sparse.num_free_host_kv_slots = manager_.host_store().num_free();
  // Summary-only rows of every sparse layer (each layer has its own).
  stats.disagg.num_summary_rows =
      manager_.host_store().num_summary_rows() * manager_.host_store().num_sparse_layers();
  stats.disagg.num_free_summary_rows = stats.disagg.num_summary_rows - manager_.summary_rows_held();
  stats.sparse.gpu_slots = manager_.gpu_slots_held();
  stats.sparse.num_in_place = manager_.num_in_place();
  stats.sparse.in_place_blocks = manager_.num_in_place() > 0 ? in_place_blocks_ : 0;
  stats.sparse.in_place_switches_total = in_place_switches_;
  stats.sparse.pressure_switches_total = pressure_switches_;
  stats.sparse.switches_total = switches_;
  stats.sparse.moves_started_total = moves_started_;
  stats.sparse.moves_total = moves_total_;
  stats.sparse.move_bytes_total = move_bytes_;
  stats.sparse.move_seconds_total = move_seconds_;
  stats.sparse.move_copy_seconds_total = move_copy_seconds_;
  stats.sparse.admission_waits_total = admission_waits_;
  stats.sparse.fetch_caps = manager_.fetch_caps();
  if (steps_uncollected_ == 0) return;
  if (steps_uncollected_ < metrics_interval_ && manager_.num_sparse() > 0) return;
  steps_uncollected_ = 0;
  // Each rank's counters (its own KV heads), summed; steps are the same on every rank.
  const SparseMetrics m = runner_.CollectSparseMetrics();
  const auto now = std::chrono::steady_clock::now();
  if (budget_) {  // the adaptive budget: this interval's counters -> the next caps
    FetchBudgetInput in;
    in.layers.reserve(m.layers.size());
    for (const SparseLayerMetrics& l : m.layers)
      in.layers.push_back({l.hits, l.misses, l.fetched, l.fetch_used, l.fetch_sampled});
    in.transfer_wait_seconds = m.transfer_wait_seconds;
    in.interval_seconds = std::chrono::duration<double>(now - interval_start_).count();
    if (budget_->Update(in)) manager_.SetFetchCaps(budget_->caps());
    stats.sparse.fetch_caps = manager_.fetch_caps();
    stats.sparse.fetch_budget_backoffs_total = budget_->backoffs();
  }
  interval_start_ = now;
  const SparseLayerMetrics total = m.Total();
  stats.sparse.steps_total += m.steps;
  stats.sparse.seq_steps_total += m.sparse_seq_steps;
  stats.sparse.hits_total += total.hits;
  stats.sparse.misses_total += total.misses;
  stats.sparse.blocks_fetched_total += total.fetched;
  // Fetches are selected either way; bytes cross PCIe only with transfers on.
  if (manager_.config().transfers)
    stats.sparse.h2d_bytes_total += total.fetched * m.bytes_per_block;
  stats.sparse.transfer_wait_seconds_total += m.transfer_wait_seconds;
  stats.sparse.agree_overlap.resize(m.layers.size(), 0);
  stats.sparse.agree_total.resize(m.layers.size(), 0);
  stats.sparse.fetch_used.resize(m.layers.size(), 0);
  stats.sparse.fetch_sampled.resize(m.layers.size(), 0);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    stats.sparse.agree_overlap[l] += m.layers[l].agree_overlap;
    stats.sparse.agree_total[l] += m.layers[l].agree_total;
    stats.sparse.fetch_used[l] += m.layers[l].fetch_used;
    stats.sparse.fetch_sampled[l] += m.layers[l].fetch_sampled;
  }
}

}  // namespace oasis

#include "kvcache/sparse_kv_manager.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_set>

#include "common/check.h"
#include "common/logging.h"

namespace oasis {
namespace {

Tensor FilledI32(std::vector<int64_t> shape, int32_t value) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), value);
  return t;
}

}  // namespace

HostKvSlots HostKvSlotsFor(const SparseConfig& config, const SparseModelShape& shape, DType dtype,
                           int64_t num_sides) {
  const double gib = 1024.0 * 1024.0 * 1024.0,
               sides = static_cast<double>(std::max<int64_t>(1, num_sides));
  const size_t per_slot =
      HostKvStore::BytesPerSlot(shape.num_layers - config.dense_layers, shape.head_dim, dtype);
  HostKvSlots h;
  if (per_slot == 0) return h;
  const double cap = INT32_MAX / kBlockSize;
  h.slots = static_cast<int32_t>(
      std::min(cap, std::floor(config.host_kv_gib * gib / sides / static_cast<double>(per_slot))));
  h.summary_rows = static_cast<int32_t>(
      std::min(cap - h.slots, std::max(0.0, std::floor(config.remote_kv_gib * gib / sides /
                                                       static_cast<double>(per_slot)))));
  return h;
}

SparseKvManager::SparseKvManager(const SparseConfig& config, const SparseModelShape& shape,
                                 Backend& backend, BlockAllocator& gpu_allocator)
    : SparseKvManager(config, shape, std::vector<Backend*>{&backend}, gpu_allocator,
                      [](const std::function<void(int)>& fn) { fn(0); }) {}

SparseKvManager::SparseKvManager(const SparseConfig& config, const SparseModelShape& shape,
                                 std::vector<Backend*> backends, BlockAllocator& gpu_allocator,
                                 SparseSideRunner run_sides)
    : config_(config),
      shape_(shape),
      gpu_allocator_(gpu_allocator),
      run_sides_(std::move(run_sides)) {
  OASIS_CHECK_OK(config.Validate(shape.num_layers));
  OASIS_CHECK(shape.num_kv_heads > 0 && shape.head_dim > 0) << "sparse model shape";
  OASIS_CHECK(!backends.empty() && run_sides_) << "sparse KV: at least one device side";
  sides_.resize(backends.size());
  for (size_t i = 0; i < backends.size(); ++i) sides_[i].backend = backends[i];
  run_sides_([&](int side) {
    DeviceSide& d = sides_.at(static_cast<size_t>(side));
    const DType dtype = KvCacheDtype(*d.backend, shape.kv_fp8);
    const HostKvSlots n =
        HostKvSlotsFor(config, shape, dtype, static_cast<int64_t>(backends.size()));
    const size_t per_slot =
        HostKvStore::BytesPerSlot(shape.num_layers - config.dense_layers, shape.head_dim, dtype);
    // In-place summary rows: one per GPU pool slot (HBM home).
    const int32_t in_place_rows = config.home != KvHome::kHost ? gpu_allocator.num_slots() : 0;
    d.store = std::make_unique<HostKvStore>(*d.backend, shape.num_layers, config.dense_layers,
                                            shape.head_dim, per_slot * static_cast<size_t>(n.slots),
                                            n.summary_rows, in_place_rows, dtype);
    d.state = std::make_unique<SparseDeviceState>(
        *d.backend, config.max_sparse_seqs, shape.num_kv_heads, config.topk_blocks,
        config.max_fetch(), config.max_blocks_per_seq(), shape.num_layers, config.dense_layers,
        config.remote_fetch_cap);
  });
  for (const DeviceSide& d : sides_) {
    OASIS_CHECK(d.store && d.state) << "sparse KV: a device side was not built";
    OASIS_CHECK_EQ(d.store->num_slots(), sides_[0].store->num_slots())
        << "sparse KV: sides of unequal host stores";
  }
  for (int32_t r = config.max_sparse_seqs - 1; r >= 0; --r) free_rows_.push_back(r);
  fetch_caps_.assign(static_cast<size_t>(shape.num_layers), 0);
  for (int64_t l = config.dense_layers; l < shape.num_layers; ++l)
    fetch_caps_[static_cast<size_t>(l)] = config.max_fetch();
}

SparseKvManager::~SparseKvManager() {
  try {
    run_sides_([&](int side) {
      DeviceSide& d = sides_.at(static_cast<size_t>(side));
      d.state.reset();
      d.store.reset();
    });
  } catch (const std::exception& e) {
    spdlog::warn("sparse KV: releasing the device sides: {}", e.what());
  }
}

HostAdmission SparseKvManager::CheckAdmission(int64_t max_total_tokens, bool always_sparse) const {
  if (!always_sparse &&
      (config_.sparse_threshold <= 0 || max_total_tokens <= config_.sparse_threshold)) {
    return HostAdmission::kNotNeeded;
  }
  if (max_total_tokens > config_.max_seq_len) return HostAdmission::kNever;
  const int64_t need = BlocksFor(max_total_tokens) * shape_.num_kv_heads;
  if (need > host_store().num_slots()) return HostAdmission::kNever;
  return need <= host_store().num_free() ? HostAdmission::kFits : HostAdmission::kWait;
}

Status SparseKvManager::CanReserve(uint64_t id, int64_t max_total_tokens) const {
  if (requests_.count(id))
    return InvalidArgument("request " + std::to_string(id) + " already holds host KV room");
  if (max_total_tokens > config_.max_seq_len) {
    return InvalidArgument("request of " + std::to_string(max_total_tokens) +
                           " tokens exceeds the sparse KV limit of " +
                           std::to_string(config_.max_seq_len));
  }
  return Status::Ok();
}

Status SparseKvManager::Reserve(uint64_t id, int64_t max_total_tokens, bool always_sparse) {
  OASIS_RETURN_IF_ERROR(CanReserve(id, max_total_tokens));
  const int64_t blocks = BlocksFor(max_total_tokens);
  const int64_t need = blocks * shape_.num_kv_heads;
  auto slots = host_store().Allocate(static_cast<int32_t>(std::min<int64_t>(need, INT32_MAX)));
  if (!slots || need > INT32_MAX) {
    return ResourceExhausted("host KV store full: need " + std::to_string(need) + " head-blocks, " +
                             std::to_string(host_store().num_free()) + " of " +
                             std::to_string(host_store().num_slots()) + " free (--host-kv-gib)");
  }
  Request r;
  r.always_sparse = always_sparse;
  r.reserved_blocks = blocks;
  r.host_slots = std::move(*slots);
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

Status SparseKvManager::ReserveInPlace(uint64_t id, int64_t max_total_tokens) {
  OASIS_RETURN_IF_ERROR(CanReserve(id, max_total_tokens));
  if (host_store().num_in_place_rows() == 0)
    return FailedPrecondition("sparse KV without an HBM home (--kv-home host)");
  Request r;
  r.in_place = true;
  r.reserved_blocks = BlocksFor(max_total_tokens);
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

bool SparseKvManager::InPlace(uint64_t id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.in_place;
}

int64_t SparseKvManager::in_place_slots_committed() const {
  int64_t n = 0;
  for (const auto& [id, r] : requests_) n += r.in_place ? r.reserved_blocks : 0;
  return n * shape_.num_kv_heads;
}

int64_t SparseKvManager::num_in_place() const {
  return std::count_if(requests_.begin(), requests_.end(),
                       [](const auto& kv) { return kv.second.in_place && kv.second.row >= 0; });
}

bool SparseKvManager::CanMove(uint64_t id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.in_place && !it->second.moving &&
         it->second.row >= 0 && it->second.has_prediction && config_.dense_layers == 0;
}

bool SparseKvManager::Moving(uint64_t id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.moving;
}

int64_t SparseKvManager::num_moving() const {
  return std::count_if(requests_.begin(), requests_.end(),
                       [](const auto& kv) { return kv.second.moving; });
}

Status SparseKvManager::BeginMove(uint64_t id) {
  if (!CanMove(id))
    return FailedPrecondition("request " + std::to_string(id) + " cannot move to the host store");
  Request& req = requests_.at(id);
  const int64_t need = req.reserved_blocks * shape_.num_kv_heads;
  if (need > host_store().num_free())
    return ResourceExhausted("host KV store: need " + std::to_string(need) + " head-blocks, " +
                             std::to_string(host_store().num_free()) + " free");
  auto host = host_store().Allocate(static_cast<int32_t>(need));
  OASIS_CHECK(host.has_value()) << "move: room counted";
  req.host_slots = std::move(*host);
  req.moving = true;
  req.copied = 0;
  return Status::Ok();
}

int64_t SparseKvManager::BlocksToCopy(uint64_t id, int64_t num_tokens) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second.moving) return 0;
  // Blocks completed by accepted drafts get their final summary at the next step (kv_end).
  return std::max<int64_t>(
      0, std::min(num_tokens, it->second.kv_end) / kBlockSize - it->second.copied);
}

void SparseKvManager::CopyToHost(
    const Request& req, const HeadBlockTable& table, int64_t from, int64_t to,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  if (to <= from) return;
  const int64_t hkv = shape_.num_kv_heads;
  const int32_t base = host_store().in_place_base();
  std::vector<int32_t> src, dst, rows_from;
  for (int64_t h = 0; h < hkv; ++h) {
    const auto& slots = table.head_slots(static_cast<int32_t>(h));
    for (int64_t b = from; b < to; ++b) {
      src.push_back(slots[static_cast<size_t>(b)]);
      dst.push_back(WholeSlot(req, h, b));
      rows_from.push_back(base + slots[static_cast<size_t>(b)]);
    }
  }
  const auto n = static_cast<int64_t>(src.size());
  run_sides_([&](int side) {
    DeviceSide& d = sides_.at(static_cast<size_t>(side));
    Backend& b = *d.backend;
    std::vector<LayerKvPool>& gpu_pools = pools_of(side);
    const Tensor src_t = b.UploadAsync(Tensor::FromInts(src)),
                 dst_t = b.UploadAsync(Tensor::FromInts(dst)),
                 rows_t = b.UploadAsync(Tensor::FromInts(rows_from));
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      b.CopyBlocks(gpu_pools[static_cast<size_t>(l)], src_t, d.store->pool(l), dst_t);
      for (Tensor* t : {&d.store->kmin(l), &d.store->kmax(l)}) {  // summaries follow the blocks
        Tensor moved = b.Empty({n, t->dim(1)}, t->dtype());
        b.GatherRows(*t, rows_t, moved);
        b.ScatterRows(moved, dst_t, *t);
      }
    }
  });
}

int64_t SparseKvManager::CopySome(
    uint64_t id, const HeadBlockTable& table, int64_t num_tokens, int64_t max_blocks,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second.moving) return 0;
  Request& req = it->second;
  // Blocks below kv_end: a block accepted drafts completed is summarised at the next step.
  const int64_t to = std::min(std::min(num_tokens, req.kv_end) / kBlockSize,
                              req.copied + std::max<int64_t>(0, max_blocks));
  const int64_t n = std::max<int64_t>(0, to - req.copied);
  if (n == 0) return 0;
  // On each side's background stream, beside the steps that follow: the blocks are complete
  // (nothing writes them again while the request holds them) and the host slots are this
  // request's alone until FinishMove or Release, which join first.
  run_sides_([&](int side) { sides_.at(static_cast<size_t>(side)).backend->BeginBackground(); });
  CopyToHost(req, table, req.copied, to, pools_of);
  run_sides_([&](int side) { sides_.at(static_cast<size_t>(side)).backend->EndBackground(); });
  req.copied = std::max(req.copied, to);
  return n;
}

void SparseKvManager::SetFetchCaps(const std::vector<int32_t>& caps) {
  OASIS_CHECK_EQ(caps.size(), fetch_caps_.size()) << "SetFetchCaps: one cap per layer";
  std::vector<int64_t> changed;
  for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    const int32_t c = std::clamp(caps[i], 1, config_.max_fetch());
    if (c == fetch_caps_[i]) continue;
    fetch_caps_[i] = c;
    changed.push_back(l);
  }
  if (changed.empty()) return;
  run_sides_([&](int side) {
    for (int64_t l : changed) state(side).SetFetchCap(l, fetch_caps_[static_cast<size_t>(l)]);
  });
}

void SparseKvManager::JoinMoves() {
  run_sides_([&](int side) { sides_.at(static_cast<size_t>(side)).backend->JoinBackground(); });
}

double SparseKvManager::TakeMoveSeconds() {
  std::vector<double> seconds(sides_.size(), 0.0);
  run_sides_([&](int side) {
    seconds[static_cast<size_t>(side)] =
        sides_.at(static_cast<size_t>(side)).backend->TakeBackgroundSeconds();
  });
  return *std::max_element(seconds.begin(), seconds.end());
}

Status SparseKvManager::FinishMove(
    uint64_t id, HeadBlockTable& table, int64_t num_tokens,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  auto it = requests_.find(id);
  OASIS_CHECK(it != requests_.end() && it->second.moving) << "request " << id << " is not moving";
  Request& req = it->second;
  JoinMoves();  // the background copies land before the table's slots go back to the pool
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t complete = num_tokens / kBlockSize, partial = num_tokens % kBlockSize;
  OASIS_CHECK(table.num_blocks() >= BlocksFor(num_tokens) &&
              BlocksFor(num_tokens) <= req.reserved_blocks)
      << "move of " << num_tokens << " tokens";
  // Its working and tail slots come from the pool once the table's slots are back in it
  // (those the prefix cache holds count as free; those another sequence reads do not).
  int64_t table_slots = 0;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int32_t slot : table.head_slots(static_cast<int32_t>(h)))
      table_slots += gpu_allocator_.ref_count(slot) == 1 ? 1 : 0;
  }
  if ((k + 2) * hkv > gpu_allocator_.num_free() + table_slots) {
    return ResourceExhausted("no GPU slots for the working set of a move: need " +
                             std::to_string((k + 2) * hkv) + ", the table holds " +
                             std::to_string(table_slots) + " and " +
                             std::to_string(gpu_allocator_.num_free()) + " are free");
  }
  // The rest of the complete blocks, then the partial tail block (K/V and summaries: later
  // steps append to it in the host store and recompute its summary from its tail slot). From
  // here on the host store has every token, so every GPU copy below reads the host store: the
  // table's slots may come back as this request's own working or tail slots.
  CopyToHost(req, table, req.copied, partial > 0 ? complete + 1 : complete, pools_of);
  for (auto& head : table.TakeSlots()) gpu_allocator_.Free(head);
  auto gpu = gpu_allocator_.Allocate(static_cast<int32_t>((k + 2) * hkv));
  OASIS_CHECK(gpu.has_value()) << "move: GPU slots counted";
  req.ws_slots.assign(gpu->begin(), gpu->begin() + hkv * k);
  req.tail_slots.assign(gpu->begin() + hkv * k, gpu->end());
  // The tail: the partial block, and a block the last step's accepted drafts completed (its
  // final summary comes from the tail at the next step, which writes it into its host row).
  std::vector<int32_t> tail_src, tail_dst;
  const int64_t tail_end = partial > 0 ? complete + 1 : complete;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = std::min(req.kv_end / kBlockSize, tail_end); b < tail_end; ++b) {
      tail_src.push_back(WholeSlot(req, h, b));
      tail_dst.push_back(req.tail_slots[static_cast<size_t>(h * 2 + b % 2)]);
    }
  }
  run_sides_([&](int side) {
    DeviceSide& d = sides_.at(static_cast<size_t>(side));
    Backend& b = *d.backend;
    SparseDeviceState& st = *d.state;
    std::vector<LayerKvPool>& gpu_pools = pools_of(side);
    const int64_t mb = st.max_blocks(), R = st.rows();
    st.WriteRow(st.ws_slots, req.row, req.ws_slots);
    // Only this row: select its last prediction into the empty working set, every miss fetched
    // (a cap of K), so the next step attends the same blocks it would have read in place.
    std::vector<int32_t> rows(static_cast<size_t>(R), -1);
    rows[static_cast<size_t>(req.row)] = 0;
    const Tensor rows_t = b.Upload(Tensor::FromInts(rows));
    const Tensor tail_src_t = b.Upload(Tensor::FromInts(tail_src)),
                 tail_dst_t = b.Upload(Tensor::FromInts(tail_dst));
    Tensor src = b.Empty({R, hkv, k}, DType::kI32), dst = b.Empty({R, hkv, k}, DType::kI32),
           stats = b.Upload(Tensor::Zeros({R, hkv, 3}, DType::kI32));
    const std::vector<int32_t> none(static_cast<size_t>(hkv * k), -1),
        zeros(static_cast<size_t>(hkv * k), 0);
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      SparseLayerState& ls = st.layer(l);
      LayerKvPool& gpu = gpu_pools[static_cast<size_t>(l)];
      st.WriteRow(ls.host_tables, req.row, TablesRow(req, l, mb));
      st.WriteRow(ls.ws_blocks, req.row, none);
      st.WriteRow(ls.ws_age, req.row, zeros);
      b.SelectBlocks(ls.topk, rows_t, ls.host_tables, st.ws_slots, ls.ws_blocks, ls.ws_age, src,
                     dst, ls.resident_slots, ls.num_resident, stats);
      b.CopyBlocks(d.store->pool(l), src.Reshape({src.numel()}), gpu, dst.Reshape({dst.numel()}));
      if (!tail_src.empty()) b.CopyBlocks(d.store->pool(l), tail_src_t, gpu, tail_dst_t);
    }
  });
  req.in_place = false;
  req.moving = false;
  return Status::Ok();
}

bool SparseKvManager::ShouldSwitch(uint64_t id, int64_t context_tokens) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.row >= 0 || context_tokens <= 0) return false;
  return it->second.always_sparse ||
         (config_.sparse_threshold > 0 && context_tokens > config_.sparse_threshold);
}

int32_t SparseKvManager::SparseRow(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.row;
}

bool SparseKvManager::IsSparse(uint64_t id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.row >= 0;
}

int64_t SparseKvManager::num_sparse() const {
  return std::count_if(requests_.begin(), requests_.end(),
                       [](const auto& kv) { return kv.second.row >= 0; });
}

int64_t SparseKvManager::gpu_slots_held() const {
  int64_t n = 0;
  for (const auto& [id, r] : requests_)
    n += static_cast<int64_t>(r.ws_slots.size() + r.tail_slots.size());
  return n;
}

int32_t SparseKvManager::HostSlot(const Request& r, int64_t layer, int64_t head,
                                  int64_t block) const {
  OASIS_CHECK(block >= 0 && block < r.reserved_blocks)
      << "block " << block << " beyond the host reservation of " << r.reserved_blocks << " blocks";
  if (block < r.layer_blocks) {
    const int64_t i = layer - config_.dense_layers;
    OASIS_CHECK(i >= 0 && i < shape_.num_layers - config_.dense_layers)
        << "layer " << layer << " is not sparse";
    return r.layout->Slot(layer, head, block);
  }
  return r.host_slots[static_cast<size_t>(head * r.reserved_blocks + block)];
}

int32_t SparseKvManager::WholeSlot(const Request& r, int64_t head, int64_t block) const {
  OASIS_CHECK(block >= r.layer_blocks && block < r.reserved_blocks)
      << "block " << block << " has no whole host slot (reserved " << r.reserved_blocks
      << ", per layer below " << r.layer_blocks << ")";
  return r.host_slots[static_cast<size_t>(head * r.reserved_blocks + block)];
}

int32_t SparseKvManager::TailSlot(const Request& r, const HeadBlockTable* table, int64_t head,
                                  int64_t block) const {
  if (!r.in_place && config_.dense_layers == 0)
    return r.tail_slots[static_cast<size_t>(head * 2 + block % 2)];
  OASIS_CHECK(table != nullptr)
      << "dense_layers > 0: a sparse request's step needs its dense table";
  const auto& slots = table->head_slots(static_cast<int32_t>(head));
  OASIS_CHECK_LT(block, static_cast<int64_t>(slots.size()))
      << "dense table lacks tail block " << block;
  return slots[static_cast<size_t>(block)];
}

std::vector<int32_t> SparseKvManager::TablesRow(const Request& r, int64_t layer, int64_t mb) const {
  const int64_t hkv = shape_.num_kv_heads;
  std::vector<int32_t> tables(static_cast<size_t>(hkv * mb), -1);
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = 0; b < std::min(mb, r.reserved_blocks); ++b) {
      tables[static_cast<size_t>(h * mb + b)] = HostSlot(r, layer, h, b);
    }
  }
  return tables;
}

Status SparseKvManager::SwitchToSparse(uint64_t id, HeadBlockTable& table, int64_t num_tokens,
                                       std::vector<LayerKvPool>& gpu_pools) {
  OASIS_CHECK_EQ(num_sides(), 1) << "SwitchToSparse with one pool set: one device side only";
  return SwitchToSparse(id, table, num_tokens,
                        [&](int) -> std::vector<LayerKvPool>& { return gpu_pools; });
}

Status SparseKvManager::SwitchToSparse(
    uint64_t id, HeadBlockTable& table, int64_t num_tokens,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return FailedPrecondition("request " + std::to_string(id) + " has no host KV reservation");
  Request& req = it->second;
  OASIS_CHECK_LT(req.row, 0) << "request " << id << " is already sparse";
  if (req.in_place) return SwitchInPlace(id, req, table, num_tokens, pools_of);
  OASIS_CHECK_EQ(req.layer_blocks, 0) << "request " << id << ": a switch writes whole host slots";
  const int64_t hkv = shape_.num_kv_heads;
  OASIS_CHECK(num_tokens > 0 && table.num_blocks() >= BlocksFor(num_tokens))
      << "switch of " << num_tokens << " tokens with " << table.num_blocks() << " blocks";
  OASIS_CHECK_LE(BlocksFor(num_tokens), req.reserved_blocks)
      << "context beyond the host reservation";
  if (free_rows_.empty())
    return ResourceExhausted("all " + std::to_string(config_.max_sparse_seqs) +
                             " sparse rows in use");
  const SparseSwitchShape shape{hkv, config_.topk_blocks, num_tokens, config_.dense_layers == 0};
  // Blocks the prefix cache holds or another sequence reads are never overwritten.
  SharedSlots shared(static_cast<size_t>(hkv));
  bool any_shared = false;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int32_t slot : table.head_slots(static_cast<int32_t>(h))) {
      const bool sh = !gpu_allocator_.Overwritable(slot);
      shared[static_cast<size_t>(h)].push_back(sh ? 1 : 0);
      any_shared = any_shared || sh;
    }
  }
  if (!any_shared) shared.clear();
  const int64_t fresh_per_head = SwitchFreshSlotsPerHead(shape, table.num_blocks(), shared);
  // Shared slots outside the initial working set are only released (free_later): release them
  // before taking fresh slots, so that the cached ones among them (parked, evictable) can
  // serve as fresh slots when the pool is short. Safe: per layer, the host copy of every block
  // runs before the working-set copies write fresh slots, and tails are written by later steps.
  std::vector<int32_t> early;
  if (!shared.empty() && shape.own_tail) {
    const int64_t complete = num_tokens / kBlockSize;
    std::vector<char> kept(static_cast<size_t>(table.num_blocks()), 0);
    for (int64_t b : InitialWorkingBlocks(complete, config_.topk_blocks))
      kept[static_cast<size_t>(b)] = 1;
    if (num_tokens % kBlockSize != 0) kept[static_cast<size_t>(complete)] = 1;
    for (int64_t h = 0; h < hkv; ++h) {
      const auto& slots = table.head_slots(static_cast<int32_t>(h));
      for (size_t b = 0; b < slots.size(); ++b) {
        if (shared[static_cast<size_t>(h)][b] != 0 && !kept[b]) early.push_back(slots[b]);
      }
    }
  }
  const int64_t need = fresh_per_head * hkv;
  int64_t early_freed =
      0;  // early slots this request alone holds: free (or evictable) once released
  for (int32_t slot : early) early_freed += gpu_allocator_.ref_count(slot) == 1 ? 1 : 0;
  if (need > gpu_allocator_.num_free() + early_freed) {
    return ResourceExhausted("no GPU slots for the sparse working set: need " +
                             std::to_string(need) + ", " +
                             std::to_string(gpu_allocator_.num_free()) + " free");
  }
  gpu_allocator_.Free(early);
  std::vector<int32_t> fresh;
  if (need > 0) {
    auto got = gpu_allocator_.Allocate(static_cast<int32_t>(need));
    OASIS_CHECK(got.has_value()) << "switch: fresh GPU slots counted";
    fresh = std::move(*got);
  }
  std::vector<std::vector<int32_t>> table_slots;
  for (int64_t h = 0; h < hkv; ++h)
    table_slots.push_back(table.head_slots(static_cast<int32_t>(h)));
  SparseSwitchPlan plan =
      PlanSparseSwitch(shape, table_slots, req.host_slots, req.reserved_blocks, fresh, shared);
  if (req.adopted_blocks > 0) {
    // Blocks whose host slots a prefix cache holds: their K/V and summaries are there already
    // (and other requests read them): no copy, no summary.
    std::unordered_set<int32_t> adopted;
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t b = 0; b < req.adopted_blocks; ++b)
        adopted.insert(req.host_slots[static_cast<size_t>(h * req.reserved_blocks + b)]);
    }
    size_t n = 0;
    for (size_t i = 0; i < plan.dst.size(); ++i) {
      if (adopted.count(plan.dst[i])) continue;
      plan.src[n] = plan.src[i];
      plan.dst[n] = plan.dst[i];
      plan.len[n] = plan.len[i];
      ++n;
    }
    plan.src.resize(n);
    plan.dst.resize(n);
    plan.len.resize(n);
  }
  req.row = free_rows_.back();
  free_rows_.pop_back();
  req.has_prediction = false;
  req.kv_end = num_tokens;
  req.ws_slots = plan.ws_slots;
  req.tail_slots = plan.tail_slots;
  RunSwitchCopies(plan, req, pools_of);
  if (shape.own_tail)
    table.TakeSlots();   // ours now: working + tail slots kept, the rest freed below
  if (!early.empty()) {  // released already
    const std::unordered_set<int32_t> released(early.begin(), early.end());
    std::erase_if(plan.free_later, [&](int32_t slot) { return released.contains(slot); });
  }
  gpu_allocator_.Free(plan.free_later);
  return Status::Ok();
}

Status SparseKvManager::SwitchInPlace(
    uint64_t id, Request& req, const HeadBlockTable& table, int64_t num_tokens,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks;
  const int64_t nb = BlocksFor(num_tokens), complete = num_tokens / kBlockSize;
  OASIS_CHECK(num_tokens > 0 && table.num_blocks() >= nb)
      << "in-place switch of " << num_tokens << " tokens with " << table.num_blocks() << " blocks";
  if (free_rows_.empty())
    return ResourceExhausted("all " + std::to_string(config_.max_sparse_seqs) +
                             " sparse rows in use");
  req.row = free_rows_.back();
  free_rows_.pop_back();
  req.has_prediction = false;
  req.kv_end = num_tokens;
  const int32_t base = host_store().in_place_base();
  // Summaries of every block where it is (row base + GPU slot), the partial one over its tokens.
  std::vector<int32_t> src, len, dst;
  for (int64_t h = 0; h < hkv; ++h) {
    const auto& slots = table.head_slots(static_cast<int32_t>(h));
    for (int64_t b = 0; b < nb; ++b) {
      src.push_back(slots[static_cast<size_t>(b)]);
      len.push_back(
          static_cast<int32_t>(std::min<int64_t>(kBlockSize, num_tokens - b * kBlockSize)));
      dst.push_back(base + slots[static_cast<size_t>(b)]);
    }
  }
  // The first step attends the initial working set (block 0 and the latest complete blocks)
  // where it is, as a host-home request's first step attends the copies it got.
  const std::vector<int64_t> chosen = InitialWorkingBlocks(complete, k);
  run_sides_([&](int side) {
    DeviceSide& d = sides_.at(static_cast<size_t>(side));
    Backend& b = *d.backend;
    std::vector<LayerKvPool>& gpu_pools = pools_of(side);
    const Tensor src_t = b.Upload(Tensor::FromInts(src)), len_t = b.Upload(Tensor::FromInts(len)),
                 dst_t = b.Upload(Tensor::FromInts(dst));
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      b.BlockSummaries(gpu_pools[static_cast<size_t>(l)], src_t, len_t, dst_t, d.store->kmin(l),
                       d.store->kmax(l));
    }
    SparseDeviceState& st = *d.state;
    const int64_t mb = st.max_blocks();
    std::vector<int32_t> tables(static_cast<size_t>(hkv * mb), -1), resident, num_resident;
    for (int64_t h = 0; h < hkv; ++h) {
      const auto& slots = table.head_slots(static_cast<int32_t>(h));
      for (int64_t b2 = 0; b2 < std::min(nb, mb); ++b2)
        tables[static_cast<size_t>(h * mb + b2)] = base + slots[static_cast<size_t>(b2)];
      for (int64_t i = 0; i < k; ++i) {
        resident.push_back(i < static_cast<int64_t>(chosen.size())
                               ? slots[static_cast<size_t>(chosen[static_cast<size_t>(i)])]
                               : -1);
      }
      num_resident.push_back(static_cast<int32_t>(chosen.size()));
    }
    const std::vector<int32_t> none(static_cast<size_t>(hkv * k), -1),
        zeros(static_cast<size_t>(hkv * k), 0);
    st.WriteRow(st.ws_slots, req.row, none);
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      SparseLayerState& ls = st.layer(l);
      st.WriteRow(ls.host_tables, req.row, tables);
      st.WriteRow(ls.ws_blocks, req.row, none);
      st.WriteRow(ls.ws_age, req.row, zeros);
      st.WriteRow(ls.resident_slots, req.row, resident);
      st.WriteRow(ls.num_resident, req.row, num_resident);
      st.WriteRow(ls.topk, req.row, none);
      st.WriteRow(ls.topk_actual, req.row, none);
    }
  });
  spdlog::debug("request {} sparse in place: {} tokens", id, num_tokens);
  return Status::Ok();
}

void SparseKvManager::RunSwitchCopies(
    const SparseSwitchPlan& plan, const Request& req,
    const std::function<std::vector<LayerKvPool>&(int side)>& pools_of) {
  // Every sparse layer: full KV to the host store, summaries, and (without own_tail) the
  // initial working set copied into the fresh slots. Every side the same copies of its own
  // heads' KV (the slot ids are the same on every side).
  run_sides_([&](int side) {
    DeviceSide& d = sides_.at(static_cast<size_t>(side));
    Backend& b = *d.backend;
    std::vector<LayerKvPool>& gpu_pools = pools_of(side);
    OASIS_CHECK_EQ(static_cast<int64_t>(gpu_pools.size()), shape_.num_layers)
        << "one GPU pool per layer";
    const Tensor src_t = b.Upload(Tensor::FromInts(plan.src)),
                 dst_t = b.Upload(Tensor::FromInts(plan.dst));
    const Tensor len_t = b.Upload(Tensor::FromInts(plan.len));
    const Tensor ws_src_t = b.Upload(Tensor::FromInts(plan.ws_src)),
                 ws_dst_t = b.Upload(Tensor::FromInts(plan.ws_dst));
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      LayerKvPool& gpu = gpu_pools[static_cast<size_t>(l)];
      b.CopyBlocks(gpu, src_t, d.store->pool(l), dst_t);
      b.BlockSummaries(gpu, src_t, len_t, dst_t, d.store->kmin(l), d.store->kmax(l));
      if (!plan.ws_src.empty()) b.CopyBlocks(gpu, ws_src_t, gpu, ws_dst_t);
    }
    WriteRowState(*d.state, req, [&](int64_t) -> const std::vector<std::vector<int32_t>>& {
      return plan.ws_blocks;
    });
  });
}

void SparseKvManager::WriteRowState(
    SparseDeviceState& state, const Request& r,
    const std::function<const std::vector<std::vector<int32_t>>&(int64_t layer)>& layer_ws) {
  const int64_t hkv = shape_.num_kv_heads, k = config_.topk_blocks, mb = state.max_blocks();
  state.WriteRow(state.ws_slots, r.row, r.ws_slots);
  // A reused row starts with every block local and no remote misses listed.
  if (state.remote_cap() > 0) {
    const int64_t cr = state.remote_cap();
    for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
      SparseLayerState& s = state.layer(l);
      std::fill_n(s.remote.data<uint8_t>() + r.row * hkv * mb, hkv * mb, uint8_t{0});
      std::fill_n(s.remote_out.data<int32_t>() + r.row * hkv * cr, hkv * cr, -1);
    }
  }
  const std::vector<int32_t> none(static_cast<size_t>(hkv * k), -1);
  const std::vector<int32_t> zeros(static_cast<size_t>(hkv * k), 0);
  for (int64_t l = config_.dense_layers; l < shape_.num_layers; ++l) {
    const std::vector<std::vector<int32_t>>& ws_blocks = layer_ws(l);
    std::vector<int32_t> blocks, resident, num_resident;
    for (int64_t h = 0; h < hkv; ++h) {
      const auto& hb = ws_blocks[static_cast<size_t>(h)];
      blocks.insert(blocks.end(), hb.begin(), hb.end());
      // Resident table: working slots in ascending logical block.
      std::vector<std::pair<int32_t, int32_t>> order;
      for (int64_t j = 0; j < k; ++j) {
        if (hb[static_cast<size_t>(j)] >= 0)
          order.push_back({hb[static_cast<size_t>(j)], r.ws_slots[static_cast<size_t>(h * k + j)]});
      }
      std::sort(order.begin(), order.end());
      for (int64_t i = 0; i < k; ++i)
        resident.push_back(
            i < static_cast<int64_t>(order.size()) ? order[static_cast<size_t>(i)].second : -1);
      num_resident.push_back(static_cast<int32_t>(order.size()));
    }
    SparseLayerState& s = state.layer(l);
    state.WriteRow(s.host_tables, r.row, TablesRow(r, l, mb));
    state.WriteRow(s.ws_blocks, r.row, blocks);
    state.WriteRow(s.ws_age, r.row, zeros);
    state.WriteRow(s.resident_slots, r.row, resident);
    state.WriteRow(s.num_resident, r.row, num_resident);
    state.WriteRow(s.topk, r.row, none);
    state.WriteRow(s.topk_actual, r.row, none);
  }
}

namespace {

// A plan for S sequences of T tokens with nothing sparse in it yet.
SparseStepPlan EmptyStepPlan(int64_t S, int64_t T, int64_t hkv, int64_t R) {
  SparseStepPlan p;
  p.seq_rows = FilledI32({S}, -1);
  p.tail_slots = FilledI32({S, hkv, 2}, -1);
  p.tail_lens = FilledI32({S}, 0);
  p.host_mapping = Tensor::Empty({T, hkv}, DType::kI64);
  std::fill(p.host_mapping.data<int64_t>(), p.host_mapping.data<int64_t>() + p.host_mapping.numel(),
            -1);
  p.lag_src = Tensor::Empty({S * hkv * kMaxSparseDraftTokens}, DType::kI64);
  p.lag_dst = Tensor::Empty({S * hkv * kMaxSparseDraftTokens}, DType::kI64);
  for (Tensor* t : {&p.lag_src, &p.lag_dst})
    std::fill(t->data<int64_t>(), t->data<int64_t>() + t->numel(), -1);
  p.summary_src = FilledI32({S * hkv}, -1);
  p.summary_len = FilledI32({S * hkv}, 0);
  p.summary_dst = FilledI32({S * hkv}, -1);
  p.table_index = FilledI32({S * hkv}, -1);
  p.predict_rows = FilledI32({R}, -1);
  p.predict_num_blocks = FilledI32({R}, 0);
  p.current_rows = FilledI32({R}, -1);
  p.current_num_blocks = FilledI32({R}, 0);
  p.slots.resize(static_cast<size_t>(S));
  return p;
}

}  // namespace

void SparseKvManager::PlanHeads(const Request& req, const SparseBatchEntry& e, int64_t s,
                                int64_t t0, int64_t first_tail, SparseStepPlan& p) const {
  const int64_t hkv = shape_.num_kv_heads, mb = state().max_blocks();
  const int64_t pos = e.start, ft = first_tail, last = (pos + e.num_tokens - 1) / kBlockSize;
  SparseStepSlots& slots = p.slots[static_cast<size_t>(s)];
  // The tail's first block holds the tokens from kv_end on; summarised up to the real token
  // (a block the previous step's accepted drafts completed: whole).
  const int64_t summary_len = std::min(pos + 1, (ft + 1) * kBlockSize) - ft * kBlockSize;
  for (int64_t h = 0; h < hkv; ++h) {
    for (int64_t b = ft; b <= last; ++b) {
      const int32_t slot = TailSlot(req, e.table, h, b);
      p.tail_slots.data<int32_t>()[(s * hkv + h) * 2 + (b - ft)] = slot;
      slots.tail_slots.push_back(slot);
    }
    for (int64_t i = 0; i < e.num_tokens; ++i) {
      const int64_t x = pos + i;
      slots.slot_mapping[static_cast<size_t>(i * hkv + h)] =
          static_cast<int64_t>(TailSlot(req, e.table, h, x / kBlockSize)) * kBlockSize +
          x % kBlockSize;
    }
    const int32_t tail = TailSlot(req, e.table, h, ft);
    int32_t row = 0;  // the summary row of the tail's first block
    if (req.in_place) {
      // HBM home: no write-through; the block's summary row follows its GPU slot and the
      // device tables learn the slot (a block this step starts is new to them).
      row = host_store().in_place_base() + tail;
      if (ft < mb)
        p.table_index.data<int32_t>()[s * hkv + h] =
            static_cast<int32_t>((req.row * hkv + h) * mb + ft);
    } else {
      row = WholeSlot(req, h, ft);
      p.host_mapping.data<int64_t>()[t0 * hkv + h] =
          static_cast<int64_t>(WholeSlot(req, h, pos / kBlockSize)) * kBlockSize + pos % kBlockSize;
      // The write-through the previous step owed: its accepted drafts, now in the tail.
      for (int64_t x = req.kv_end; x < pos; ++x) {
        const int64_t i = (s * hkv + h) * kMaxSparseDraftTokens + (x - req.kv_end);
        p.lag_src.data<int64_t>()[i] =
            static_cast<int64_t>(TailSlot(req, e.table, h, x / kBlockSize)) * kBlockSize +
            x % kBlockSize;
        p.lag_dst.data<int64_t>()[i] =
            static_cast<int64_t>(WholeSlot(req, h, x / kBlockSize)) * kBlockSize + x % kBlockSize;
      }
    }
    p.summary_src.data<int32_t>()[s * hkv + h] = tail;
    p.summary_len.data<int32_t>()[s * hkv + h] = static_cast<int32_t>(summary_len);
    p.summary_dst.data<int32_t>()[s * hkv + h] = row;
  }
}

SparseStepPlan SparseKvManager::BuildStepPlan(const std::vector<SparseBatchEntry>& batch) {
  const int64_t S = static_cast<int64_t>(batch.size()), hkv = shape_.num_kv_heads;
  int64_t T = 0;
  for (const SparseBatchEntry& e : batch) T += e.num_tokens;
  SparseStepPlan p = EmptyStepPlan(S, T, hkv, config_.max_sparse_seqs);
  const bool oracle = config_.predictor == SparsePredictor::kOracle;
  p.measure_agreement =
      !oracle && config_.agreement_interval > 0 && step_ % config_.agreement_interval == 0;

  std::vector<int32_t> gather;
  int64_t next_row = 0;
  for (int64_t s = 0; s < S; ++s) {
    const SparseBatchEntry& e = batch[static_cast<size_t>(s)];
    const int64_t t0 = next_row;  // the batch row of its first token
    next_row += e.num_tokens;
    auto it = requests_.find(e.id);
    if (it == requests_.end() || it->second.row < 0) continue;
    Request& req = it->second;
    OASIS_CHECK(e.num_tokens >= 1 && e.num_tokens <= 1 + kMaxSparseDraftTokens)
        << "a sparse step runs 1 to " << 1 + kMaxSparseDraftTokens << " tokens, not "
        << e.num_tokens;
    const int64_t pos = e.start;
    OASIS_CHECK(pos >= req.kv_end && pos - req.kv_end <= kMaxSparseDraftTokens)
        << "sparse request " << e.id << " at position " << pos << " with its KV final up to "
        << req.kv_end << ": a step advances by 1 + at most " << kMaxSparseDraftTokens
        << " accepted drafts";
    // The tail starts at the block of the first token not yet final: the real token's block,
    // or the one before it when the previous step's accepted drafts completed that one.
    const int64_t ft = req.kv_end / kBlockSize, last = (pos + e.num_tokens - 1) / kBlockSize;
    OASIS_CHECK(last - ft <= 1) << "a sparse step's tail spans blocks " << ft << ".." << last;
    const int32_t r = req.row;
    ++p.num_sparse;
    p.seq_rows.data<int32_t>()[s] = r;
    p.tail_lens.data<int32_t>()[s] = static_cast<int32_t>(pos + e.num_tokens - ft * kBlockSize);
    SparseStepSlots& slots = p.slots[static_cast<size_t>(s)];
    slots.num_tail_blocks = static_cast<int32_t>(last - ft + 1);
    slots.tail_len = p.tail_lens.data<int32_t>()[s];
    slots.table_width = config_.topk_blocks + 2;
    slots.slot_mapping.resize(static_cast<size_t>(e.num_tokens * hkv));
    PlanHeads(req, e, s, t0, ft, p);
    // Prediction for the next step (real token at pos + 1, or later when drafts are
    // accepted): the draft row, else the real one. Its candidates are the blocks complete
    // once the real token is in; a block accepted drafts complete is the next step's tail.
    if (!oracle) {
      const bool draft = config_.predictor == SparsePredictor::kDraft && e.num_tokens >= 2;
      const int64_t q = config_.chain_queries;
      p.predict_rows.data<int32_t>()[r] =
          static_cast<int32_t>(gather.size() / (q > 1 ? q * hkv : 1));
      if (q == 1) {
        gather.push_back(static_cast<int32_t>(t0 + (draft ? 1 : 0)));
      } else {
        // The chain's first q draft rows (a shorter chain repeats its last; none: the real
        // row), per KV head as rows of [T * Hkv, G * D]: snapshot [P, Hkv * q * G, D].
        for (int64_t h = 0; h < hkv; ++h) {
          for (int64_t c = 0; c < q; ++c) {
            const int64_t row = draft ? t0 + 1 + std::min<int64_t>(c, e.num_tokens - 2) : t0;
            gather.push_back(static_cast<int32_t>(row * hkv + h));
          }
        }
      }
      p.predict_num_blocks.data<int32_t>()[r] = static_cast<int32_t>((pos + 1) / kBlockSize);
    }
    if (oracle || (p.measure_agreement && req.has_prediction)) {
      p.current_rows.data<int32_t>()[r] = static_cast<int32_t>(t0);
      p.current_num_blocks.data<int32_t>()[r] = static_cast<int32_t>(ft);
    }
    req.has_prediction = !oracle;
    req.kv_end = pos + 1;  // this step writes the real token through; drafts wait for acceptance
  }
  p.predict_gather = Tensor::FromInts(gather);
  ++step_;
  return p;
}

int64_t SparseKvManager::KvEnd(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() || it->second.row < 0 ? -1 : it->second.kv_end;
}

std::vector<uint64_t> SparseKvManager::SparseIds() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : requests_) {
    if (r.row >= 0) ids.push_back(id);
  }
  return ids;
}

Status SparseKvManager::AdoptHostPrefix(uint64_t id, int64_t blocks,
                                        std::span<const int32_t> slots) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return FailedPrecondition("request " + std::to_string(id) + " has no host KV reservation");
  Request& r = it->second;
  const int64_t hkv = shape_.num_kv_heads;
  if (r.in_place || r.row >= 0 || r.layer_blocks > 0 || r.adopted_blocks > 0 ||
      config_.dense_layers != 0 || num_sides() != 1 || blocks < 0 || blocks > r.reserved_blocks ||
      static_cast<int64_t>(slots.size()) != blocks * hkv) {
    return FailedPrecondition("request " + std::to_string(id) + " cannot adopt host slots now");
  }
  std::vector<int32_t> own;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t h = 0; h < hkv; ++h) {
      int32_t& at = r.host_slots[static_cast<size_t>(h * r.reserved_blocks + b)];
      own.push_back(at);
      at = slots[static_cast<size_t>(b * hkv + h)];
    }
  }
  host_store().Free(own);
  r.adopted_blocks = blocks;
  return Status::Ok();
}

std::vector<int32_t> SparseKvManager::DetachHostPrefix(uint64_t id, int64_t blocks) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  Request& r = it->second;
  // Whole host slots with every block's K/V: a host-home request that switched (or finished
  // its move); not an in-place one, a layered import or one that never switched — those give
  // back only the slots they adopted.
  const bool complete = !r.in_place && !r.moving && r.row >= 0 && r.layer_blocks == 0;
  if (r.host_slots.empty() || (!complete && r.adopted_blocks == 0)) return {};
  const int64_t hkv = shape_.num_kv_heads;
  blocks = std::min(complete ? blocks : r.adopted_blocks, r.reserved_blocks);
  std::vector<int32_t> out(static_cast<size_t>(blocks * hkv), -1);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t h = 0; h < hkv; ++h) {
      int32_t& at = r.host_slots[static_cast<size_t>(h * r.reserved_blocks + b)];
      out[static_cast<size_t>(b * hkv + h)] = at;
      at = -1;  // (Release frees only the others)
    }
  }
  return out;
}

int64_t SparseKvManager::AdoptedHostBlocks(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? 0 : it->second.adopted_blocks;
}

void SparseKvManager::Release(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  if (r.moving) JoinMoves();  // its background copies write host slots freed below
  if (r.row >= 0) {
    gpu_allocator_.Free(r.ws_slots);
    gpu_allocator_.Free(r.tail_slots);
    free_rows_.push_back(r.row);
  }
  std::vector<int32_t> whole;
  for (int32_t s : r.host_slots) {
    if (s >= 0) whole.push_back(s);
  }
  host_store().Free(whole);
  if (r.layout) r.layout->Release(host_store());
  requests_.erase(it);
}

}  // namespace oasis

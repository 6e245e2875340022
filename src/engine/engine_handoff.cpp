// Disaggregation inside the engine loop (engine/kv_handoff.h, docs/disaggregation.md): the
// prefill side's export of a handoff request after x2, and the decode side's import of a
// request from its ticket (queue → reserve → fetch on the import thread → finalize → run).
#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "common/logging.h"
#include "disagg/kv_import.h"
#include "disagg/kv_requantize.h"
#include "engine/engine_impl.h"

namespace oasis {
namespace {

// A remote block's key in RequestState::drift_requested.
uint64_t DriftCode(const disagg::RemoteBlock& b) {
  return (static_cast<uint64_t>(b.layer) << 48) | (static_cast<uint64_t>(b.head) << 32) |
         static_cast<uint32_t>(b.block);
}

// Per staged layer and KV head, the blocks an import reads at admission: its admission list
// (every staged block with a full transfer) less the head-blocks it holds from the import cache.
std::vector<std::vector<uint16_t>> BlocksToFetch(const disagg::HandoffTicket& t, bool full,
                                                 const disagg::AdoptedPrefix& adopted) {
  const int64_t hkv = t.geometry.num_kv_heads, ls = t.geometry.num_layers;
  std::vector<std::vector<uint16_t>> out(static_cast<size_t>(ls * hkv));
  for (int64_t i = 0; i < ls; ++i) {
    for (int64_t h = 0; h < hkv; ++h) {
      auto& list = out[static_cast<size_t>(i * hkv + h)];
      auto keep = [&](int64_t b) {
        if (adopted.Cell(b, i, h, ls, hkv) < 0) list.push_back(static_cast<uint16_t>(b));
      };
      if (full) {
        for (int64_t b = 0; b < t.geometry.num_blocks; ++b) keep(b);
      } else {
        for (uint16_t b : t.admission[static_cast<size_t>(i * hkv + h)]) keep(b);
      }
    }
  }
  return out;
}

// The wire code of a KV cache (or draft KV) element type.
uint32_t StagedDtypeCode(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<uint32_t>(disagg::StagedKvDtype::kF32);
    case DType::kBF16:
      return static_cast<uint32_t>(disagg::StagedKvDtype::kBF16);
    case DType::kF16:
      return static_cast<uint32_t>(disagg::StagedKvDtype::kF16);
    case DType::kF8E4M3:
      return static_cast<uint32_t>(disagg::StagedKvDtype::kF8E4M3);
    default:
      OASIS_CHECK(false) << "no staged KV dtype for " << DTypeName(dtype);
  }
  return 0;
}

// This instance's FP8 scales of staged layers [first, first + layers): K and V, [layers × KV
// heads] each, l-major, as HandoffTicket carries them (downloads: a few bytes per layer).
std::pair<std::vector<float>, std::vector<float>> StagedKvScales(ModelRunner& runner, int64_t first,
                                                                 int64_t layers) {
  std::pair<std::vector<float>, std::vector<float>> out;
  Backend& be = runner.backend();
  for (int64_t l = first; l < first + layers; ++l) {
    const LayerKvPool& pool = runner.kv_pools().at(static_cast<size_t>(l));
    OASIS_CHECK(pool.fp8()) << "FP8 scales of a KV pool that is not FP8 (layer " << l << ")";
    for (auto [from, to] : {std::pair{&pool.k_scale, &out.first}, {&pool.v_scale, &out.second}}) {
      const Tensor host = be.Download(*from);
      to->insert(to->end(), host.data<float>(), host.data<float>() + host.numel());
    }
  }
  return out;
}

}  // namespace

disagg::StagedKvHome Engine::Impl::StagedHome(RequestState& s) {
  disagg::StagedKvHome home;
  home.backend = &runner.backend();
  home.manager = &sparse->manager();
  home.id = s.seq.id;
  if (draft != nullptr) {
    home.draft_pool = &draft->kv_pool();
    home.draft_table = &s.draft_head.table;
  }
  return home;
}

disagg::StagedKvGeometry Engine::Impl::HandoffGeometry(int64_t staged_tokens) const {
  disagg::StagedKvGeometry g;
  g.num_layers = static_cast<uint32_t>(config.num_hidden_layers -
                                       (sparse ? sparse->config().dense_layers : 0));
  g.num_kv_heads = static_cast<uint32_t>(config.num_key_value_heads);
  g.head_dim = static_cast<uint32_t>(config.head_dim);
  // KV and summaries in the KV cache's dtype (e4m3 with --kv-cache-dtype fp8); the draft
  // head's KV in its pool's (the activation dtype).
  const DType kv = KvCacheDtype(runner.backend(), config.kv_cache_fp8);
  g.kv_dtype = StagedDtypeCode(kv);
  g.dtype_bytes = static_cast<uint32_t>(DTypeSize(kv));
  g.num_blocks = static_cast<uint32_t>(BlocksFor(staged_tokens));
  if (draft != nullptr) {
    g.draft_kv_heads = static_cast<uint32_t>(draft->num_kv_heads());
    g.draft_head_dim = static_cast<uint32_t>(draft->head().config().head_dim);
    g.draft_dtype_bytes = static_cast<uint32_t>(DTypeSize(draft->kv_pool().k.dtype()));
  }
  return g;
}

Status Engine::Impl::ValidateDisaggregation(const EngineRequest& r) const {
  if (!r.handoff && !r.import) return Status::Ok();
  if (r.handoff && r.import)
    return InvalidArgument("a request is either handed off or imported, not both");
  if (!sparse) {
    return FailedPrecondition(
        "disaggregated prefill/decode needs sparse KV on this instance (--sparse on)");
  }
  OASIS_RETURN_IF_ERROR(disagg::CheckDisaggregation(sparse->manager()));
  if (r.handoff) {
    if (options.handoff_exporter == nullptr) {
      return FailedPrecondition(
          "this instance does not hand requests off (it is not a prefill instance)");
    }
    return Status::Ok();
  }
  const disagg::HandoffTicket& t = r.import->ticket();
  if (!r.import->full_transfer() && sparse->config().remote_fetch_cap <= 0) {
    return FailedPrecondition(
        "a partial (remote partial fetch) import needs a remote fetch cap on this decode instance");
  }
  if (static_cast<int64_t>(r.prompt.size()) != static_cast<int64_t>(t.prompt_length)) {
    return InvalidArgument("handoff ticket for a prompt of " + std::to_string(t.prompt_length) +
                           " tokens, request prompt of " + std::to_string(r.prompt.size()));
  }
  disagg::DecodeSideModel m;
  m.geometry = HandoffGeometry(static_cast<int64_t>(t.prompt_length) + 1);
  // A ticket without the draft head's KV is fine for a decode instance with a head only if
  // nothing needs it: the head reads its own KV, so it must be there.
  m.vocab_size = static_cast<uint32_t>(config.vocab_size);
  m.max_context = static_cast<uint32_t>(context_tokens);
  m.topk_blocks = static_cast<uint32_t>(sparse->config().topk_blocks);
  OASIS_RETURN_IF_ERROR(disagg::CheckTicketForDecode(t, m));
  if (draft != nullptr && t.geometry.draft_kv_heads == 0) {
    return InvalidArgument(
        "handoff ticket without the draft head's KV, and this decode instance runs one");
  }
  auto sampling = ParseHandoffSampling(t.sampling_state);
  if (!sampling.ok()) return sampling.status();
  if (sampling->tokens.size() != 2)
    return InvalidArgument("handoff ticket: sampling state of x1 and x2 expected");
  const int64_t P = static_cast<int64_t>(t.prompt_length);
  const int64_t max_total = r.max_tokens == -1 ? context_tokens : P + r.max_tokens;
  if (max_total < P + 3) {
    return InvalidArgument("an imported request continues past x2: max_tokens " +
                           std::to_string(r.max_tokens) + " must be at least 3");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- prefill side

void Engine::Impl::HandoffReady(const std::vector<uint64_t>& keys) {
  for (uint64_t key : keys) {
    auto it = requests.find(key);
    if (it == requests.end()) continue;  // finished by itself (stop at x2, abort)
    RequestState& s = *it->second;
    if (s.seq.num_generated() != 2) continue;
    const auto t0 = EngineClock::now();
    StatusOr<std::string> ticket = ExportHandoff(s);
    stats.disagg.handoff_seconds_total += Seconds(EngineClock::now() - t0);
    if (!ticket.ok()) {
      Fail(s, ticket.status());
      continue;
    }
    ++stats.disagg.handoffs_total;
    RequestOutput out;
    out.handoff_ticket = std::move(*ticket);
    Finish(s, std::move(out), FinishReasonKind::kHandoff);
  }
}

StatusOr<std::string> Engine::Impl::ExportHandoff(RequestState& s) {
  if (s.seq.kv == SequenceKv::kDense) {
    return ResourceExhausted(
        "prefill instance busy: no sparse row or GPU slots for the handoff step");
  }
  const uint64_t id = s.seq.id;
  const int64_t P = s.seq.num_prompt_tokens, staged = P + 1;
  disagg::StagedKvGeometry g = HandoffGeometry(staged);
  const bool with_draft = draft != nullptr;
  if (with_draft && s.draft_head.num_computed < staged) {
    return Internal("handoff: the draft head holds " + std::to_string(s.draft_head.num_computed) +
                    " of " + std::to_string(staged) + " positions");
  }
  auto layout = disagg::StagedKvLayout::Create(g);
  if (!layout.ok()) return layout.status();
  auto lists = disagg::HandoffBlocks(sparse->manager(), runner.backend(),
                                     id);  // (downloads: the step's device work is done)
  if (!lists.ok()) return lists.status();
  auto lease = options.handoff_exporter->Acquire(*layout);
  if (!lease.ok()) return lease.status();
  KvHandoffLease& L = **lease;
  disagg::PackStagedKv(*layout, StagedHome(s), [&](uint64_t ordinal) { return L.Slot(ordinal); });
  // The ticket's contents.
  disagg::HandoffTicket t;
  t.geometry = g;
  if (g.kv_dtype == static_cast<uint32_t>(disagg::StagedKvDtype::kF8E4M3)) {
    // The staged bytes mean x · this instance's scales: the decode side maps them into its own.
    std::tie(t.k_scales, t.v_scales) =
        StagedKvScales(runner, sparse->config().dense_layers, g.num_layers);
  }
  t.prompt_length = static_cast<uint32_t>(P);
  t.position = static_cast<uint32_t>(P + 1);
  t.tokens = {static_cast<uint32_t>(s.seq.tokens[static_cast<size_t>(P)]),
              static_cast<uint32_t>(s.seq.tokens[static_cast<size_t>(P + 1)])};
  if (with_draft) {
    // x̂3: the head's draft for x3; x2 when it made none (the request ends within two tokens).
    t.tokens.push_back(static_cast<uint32_t>(s.seq.draft_tokens.empty() ? s.seq.tokens.back()
                                                                        : s.seq.draft_tokens[0]));
  }
  HandoffSampling hs;
  hs.seed = s.seed;
  hs.tokens = s.handoff_tokens;
  t.sampling_state = EncodeHandoffSampling(hs);
  const int64_t nb = g.num_blocks, tail = nb - 1;
  t.admission.reserve(lists->size());
  for (const std::vector<int32_t>& list : *lists) {
    std::vector<uint16_t> ids;
    for (int32_t b : list) {
      if (b >= 0 && b < nb) ids.push_back(static_cast<uint16_t>(b));
    }
    if (std::find(ids.begin(), ids.end(), static_cast<uint16_t>(tail)) == ids.end())
      ids.push_back(static_cast<uint16_t>(tail));
    t.admission.push_back(std::move(ids));
  }
  t.prompt_block_hashes =
      HashPrefixBlocks(PrefixCacheRoot(std::hash<std::string>{}(s.request.cache_salt)),
                       std::span<const int32_t>(s.seq.tokens.data(), static_cast<size_t>(P)));
  auto ticket = L.Commit(std::move(t));
  if (ticket.ok())
    stats.disagg.handoff_staged_bytes_total +=
        static_cast<int64_t>(layout->num_slots() * layout->slot_bytes());
  return ticket;
}

// ---------------------------------------------------------------- decode side

void Engine::Impl::QueueImport(std::unique_ptr<RequestState> state) {
  RequestState& s = *state;
  // Both were checked at Submit.
  auto sampling = ParseHandoffSampling(s.request.import->ticket().sampling_state);
  auto layout = disagg::StagedKvLayout::Create(s.request.import->ticket().geometry);
  OASIS_CHECK(sampling.ok() && sampling->tokens.size() == 2 && layout.ok())
      << "import ticket (checked at Submit)";
  s.import_sampling = std::move(*sampling);
  s.import_layout = *layout;
  s.seed = s.import_sampling.seed;
  if (import_cache != nullptr) {
    // The chain of the full prompt blocks (the prompt's own K/V, computed densely by the
    // prefill instance; the block holding x1, written by its sparse step, never counts), as
    // this instance hashes the prompt it was sent. It must be the ticket's (the prefill side's
    // hashes of the prompt it staged), else this import neither takes nor leaves blocks.
    const disagg::HandoffTicket& t = s.request.import->ticket();
    std::vector<uint64_t> hashes =
        HashPrefixBlocks(PrefixCacheRoot(std::hash<std::string>{}(s.request.cache_salt)),
                         std::span<const int32_t>(s.seq.tokens.data(), t.prompt_length));
    if (hashes == t.prompt_block_hashes) {
      s.import_block_hashes = std::move(hashes);
    } else {
      ++stats.disagg.import_prefix_mismatches_total;
      spdlog::warn(
          "request {}: its prompt's block hashes differ from its ticket's (another "
          "tokenizer or cache salt on the prefill instance?): no prefix reuse",
          s.request.id);
    }
  }
  s.import_phase = RequestState::ImportPhase::kQueued;
  requests.emplace(s.seq.id, std::move(state));
  const disagg::HandoffTicket& t = s.request.import->ticket();
  if (t.geometry.kv_dtype == static_cast<uint32_t>(disagg::StagedKvDtype::kF8E4M3)) {
    // FP8: the staged bytes are in the prefill instance's scales. Equal to ours (bitwise): the
    // bytes stay as they are; within kMaxImportScaleRatio: every fetch maps them into ours;
    // further apart: refused (another model or checkpoint).
    auto [k, v] = StagedKvScales(runner, sparse->config().dense_layers, t.geometry.num_layers);
    auto q = disagg::KvRequantizer::Create(t.geometry.num_kv_heads, t.k_scales, t.v_scales, k, v);
    if (!q.ok()) {
      Fail(s, q.status());
      return;
    }
    if (!q->identity()) {
      static std::once_flag said;  // (the first time only: then per request at debug level)
      std::call_once(said, [&] {
        spdlog::warn(
            "request {}: the prefill instance's FP8 KV scales differ from this instance's (up to "
            "{:.4f}x; another GPU or build calibrated them): imported KV is requantized into this "
            "instance's scales, one extra e4m3 rounding per value",
            s.request.id, q->max_ratio());
      });
      spdlog::debug(
          "request {}: the prefill instance's FP8 KV scales differ from this instance's (up to "
          "{:.4f}x): its KV is requantized on import",
          s.request.id, q->max_ratio());
    }
    s.request.import->set_requantizer(std::move(*q));
  }
  import_queue.push_back(s.seq.id);
}

void Engine::Impl::StartImports() {
  // Imports passed over this pass (their next prompt block is being fetched by another import:
  // they wait to hold it instead of fetching it too) go back to the queue's front, in order.
  std::deque<uint64_t> deferred;
  struct Requeue {
    std::deque<uint64_t>& from;
    std::deque<uint64_t>& to;
    ~Requeue() { to.insert(to.begin(), from.begin(), from.end()); }
  } requeue{deferred, import_queue};
  while (!import_queue.empty()) {
    const uint64_t key = import_queue.front();
    auto it = requests.find(key);
    if (it == requests.end() || it->second->import_phase != RequestState::ImportPhase::kQueued) {
      import_queue.pop_front();  // finished (aborted) while queued
      continue;
    }
    if (scheduler.num_running() + num_fetching >= options.max_num_seqs) return;
    RequestState& s = *it->second;
    if (AwaitsImportedBlock(s)) {
      import_queue.pop_front();
      deferred.push_back(key);
      continue;
    }
    const disagg::HandoffTicket& t = s.request.import->ticket();
    const int64_t P = t.prompt_length, staged = P + 1;
    SparseKvManager& m = sparse->manager();
    const bool full = s.request.import->full_transfer();
    // The staged complete blocks are held per layer: in partial mode only each layer's
    // admission list is local; the other blocks are remote and take summary-only rows (no host
    // memory) until drift brings them in. The tail block and the output's blocks are whole slots.
    std::vector<std::vector<int32_t>> local;
    if (!full) {
      local.reserve(t.admission.size());
      for (const auto& list : t.admission) local.emplace_back(list.begin(), list.end());
    }
    const int64_t layer_blocks = staged / kBlockSize;
    // Prompt blocks this instance holds from earlier imports: acquired first, so the
    // admission counts them as held, not as room.
    AdoptImportPrefix(s);
    const disagg::AdoptedPrefix* adopted =
        s.import_adopted.blocks > 0 ? &s.import_adopted : nullptr;
    const HostAdmission a = disagg::CheckImportAdmission(m, s.seq.max_total_tokens, layer_blocks,
                                                         full ? nullptr : &local, adopted);
    if (a == HostAdmission::kNever) {
      ReturnImportPrefix(s);
      import_queue.pop_front();
      Fail(s, sparse->RefusalStatus(s.seq));
      continue;
    }
    if (a != HostAdmission::kFits ||
        !disagg::ReserveImport(m, key, s.seq.max_total_tokens, layer_blocks,
                               full ? nullptr : &local, adopted)
             .ok()) {
      ReturnImportPrefix(s);
      return;  // wait for room
    }
    if (draft != nullptr && !s.draft_head.table.Reserve(staged, draft_allocator).ok()) {
      ParkImportPrefix(s);
      m.Release(key);
      return;
    }
    // The prompt blocks past those it holds are in flight now: a later import of the same
    // prefix waits for them (AwaitsImportedBlock) rather than fetching them too.
    s.import_pending_from = s.import_adopted.blocks;
    for (size_t b = static_cast<size_t>(s.import_pending_from); b < s.import_block_hashes.size();
         ++b)
      ++pending_import_blocks[s.import_block_hashes[b]];
    s.seq.num_cached_tokens = s.import_adopted.blocks * kBlockSize;
    if (import_cache != nullptr && !s.import_block_hashes.empty()) {
      ++stats.disagg.import_prefix_queries_total;
      stats.disagg.import_prefix_hit_tokens_total += s.seq.num_cached_tokens;
      stats.disagg.import_prefix_cells_adopted_total +=
          std::count_if(s.import_adopted.cells.begin(), s.import_adopted.cells.end(),
                        [](int32_t c) { return c >= 0; });
    }
    // What to read and where: KV blocks straight into the host store (not the adopted ones),
    // the summaries and the draft KV into the unpacker's buffers (uploaded by FinalizeImport).
    std::vector<std::vector<uint16_t>> to_fetch;
    if (adopted != nullptr) to_fetch = BlocksToFetch(t, full, *adopted);
    disagg::StagedKvUnpacker& unpacker =
        import_unpackers.insert_or_assign(key, disagg::StagedKvUnpacker(*s.import_layout))
            .first->second;
    std::vector<KvFetchItem> items = unpacker.Destinations(
        StagedHome(s), adopted != nullptr ? &to_fetch : (full ? nullptr : &t.admission));
    stats.disagg.import_admission_bytes_total +=
        static_cast<int64_t>(items.size() * s.import_layout->slot_bytes());
    import_queue.pop_front();
    s.import_phase = RequestState::ImportPhase::kFetching;
    ++num_fetching;
    FetchJob job;
    job.key = key;
    job.source = s.request.import;
    job.items = std::move(items);
    if (admission_workers.empty()) {
      for (int i = 0; i < kAdmissionWorkers; ++i) {
        admission_workers.push_back(
            std::make_unique<FetchWorker>([this](FetchJob done) { OnFetched(std::move(done)); }));
      }
    }
    admission_workers[next_admission_worker++ % admission_workers.size()]->Push(std::move(job));
  }
}

void Engine::Impl::OnFetched(FetchJob job) {
  {
    std::lock_guard<std::mutex> lock(mu);
    imports_done.push_back(std::move(job));
  }
  cv.notify_all();
}

void Engine::Impl::FinishImports() {
  std::vector<FetchJob> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    done.swap(imports_done);
  }
  std::vector<const FetchJob*> drifted;
  for (FetchJob& d : done) {
    auto it = requests.find(d.key);
    if (d.drift) {
      ++stats.disagg.drift_fetches_total;
      stats.disagg.drift_fetch_seconds_total += d.seconds;
      if (it == requests.end()) continue;  // finished meanwhile: the blocks are not needed
      RequestState& s = *it->second;
      if (!d.status.ok()) {
        ++stats.disagg.import_failures_total;
        Fail(s, Unavailable("reading drifted KV blocks from the prefill instance: " +
                            d.status.ToString()));
        continue;
      }
      if (s.import_generation == d.generation && s.seq.kv == SequenceKv::kSparse)
        drifted.push_back(&d);
      continue;
    }
    --num_fetching;
    stats.disagg.import_fetch_seconds_total += d.seconds;
    if (it == requests.end()) continue;
    RequestState& s = *it->second;
    s.import_phase = RequestState::ImportPhase::kQueued;  // out of the fetch; not running yet
    if (!d.status.ok()) {
      ++stats.disagg.import_failures_total;
      import_unpackers.erase(d.key);
      Fail(s, Unavailable("reading the request's KV from its prefill instance: " +
                          d.status.ToString()));
      continue;
    }
    if (s.abort_after_fetch) {
      import_unpackers.erase(d.key);
      RequestOutput out;
      Finish(s, std::move(out), FinishReasonKind::kAbort);
      continue;
    }
    try {
      FinalizeImport(s);
    } catch (const std::exception& e) {
      ++stats.disagg.import_failures_total;
      auto again = requests.find(d.key);
      if (again != requests.end())
        Fail(*again->second, Internal(std::string("importing the request: ") + e.what()));
    }
    import_unpackers.erase(d.key);
  }
  if (!drifted.empty()) ApplyDrift(drifted);
  for (FetchJob& d : done) {
    if (d.drift && d.buffer && d.buffer.use_count() == 1 && drift_buffers.size() < 256) {
      drift_buffers.push_back(std::move(d.buffer));
    }
  }
}

void Engine::Impl::FetchDrift() {
  if (!sparse || sparse->config().remote_fetch_cap <= 0) return;
  SparseKvManager& m = sparse->manager();
  for (auto& [key, state] : requests) {
    RequestState& s = *state;
    if (!s.request.import || s.request.import->full_transfer() ||
        s.import_phase != RequestState::ImportPhase::kNone || s.seq.kv != SequenceKv::kSparse ||
        disagg::RemoteBlocksLeft(m, key) == 0) {
      continue;
    }
    std::vector<disagg::RemoteBlock> want;
    for (const disagg::RemoteBlock& b : disagg::RemoteMisses(m, key)) {
      if (s.drift_requested.insert(DriftCode(b)).second) want.push_back(b);
    }
    if (want.empty()) continue;
    FetchJob job;
    job.key = key;
    job.drift = true;
    job.generation = s.import_generation;
    job.source = s.request.import;
    if (drift_buffers.empty()) {
      job.buffer = std::make_shared<std::vector<char>>();
    } else {
      job.buffer = std::move(drift_buffers.back());
      drift_buffers.pop_back();
    }
    job.items =
        disagg::DriftReads(*s.import_layout, sparse->config().dense_layers, want, *job.buffer);
    job.blocks = std::move(want);
    if (!drift_worker)
      drift_worker =
          std::make_unique<FetchWorker>([this](FetchJob done) { OnFetched(std::move(done)); });
    drift_worker->Push(std::move(job));
  }
}

void Engine::Impl::ApplyDrift(const std::vector<const FetchJob*>& jobs) {
  SparseKvManager& m = sparse->manager();
  HostKvStore& store = m.host_store();
  // (Requests may have finished while later jobs were handled: look each up again.)
  std::vector<const FetchJob*> live;
  std::vector<disagg::Landing> landing;
  for (const FetchJob* job : jobs) {
    auto it = requests.find(job->key);
    if (it == requests.end() || it->second->import_generation != job->generation ||
        it->second->seq.kv != SequenceKv::kSparse) {
      continue;
    }
    live.push_back(job);
    for (const disagg::RemoteBlock& b : job->blocks) landing.push_back({job->key, b});
  }
  const std::vector<int32_t> slots = disagg::LandingSlots(m, landing);
  size_t at = 0;
  for (const FetchJob* job : live) {
    RequestState& s = *requests.at(job->key);
    for (size_t i = 0; i < job->blocks.size(); ++i) {
      const disagg::RemoteBlock& b = job->blocks[i];
      const int32_t slot = slots[at++];
      if (slot < 0) {
        // No free host slot: the block stays remote; a later step may ask for it again.
        s.drift_requested.erase(DriftCode(b));
        ++stats.disagg.drift_blocks_dropped_total;
        continue;
      }
      disagg::StoreDriftBlock(*s.import_layout, store, b, slot, *job->buffer, i);
      disagg::MarkLocal(m, s.seq.id, b);
    }
    stats.disagg.drift_blocks_total += static_cast<int64_t>(job->blocks.size());
    stats.disagg.drift_bytes_total += static_cast<int64_t>(job->buffer->size());
  }
}

void Engine::Impl::FinalizeImport(RequestState& s) {
  const uint64_t key = s.seq.id;
  const disagg::HandoffTicket& t = s.request.import->ticket();
  const int64_t P = t.prompt_length, staged = P + 1;
  import_unpackers.at(key).Finish(StagedHome(s));
  if (draft != nullptr) s.draft_head.num_computed = staged;
  // The working sets on the GPU (sparse row, working and tail slots).
  std::vector<std::vector<int32_t>> working;
  working.reserve(t.admission.size());
  for (const auto& list : t.admission) working.emplace_back(list.begin(), list.end());
  const bool partial = !s.request.import->full_transfer() && sparse->config().remote_fetch_cap > 0;
  // Local: the fetched admission set and the blocks adopted from the import cache.
  std::vector<std::vector<int32_t>> local = working;
  const disagg::AdoptedPrefix& adopted = s.import_adopted;
  const int64_t hkv = t.geometry.num_kv_heads, ls = t.geometry.num_layers;
  for (int64_t j = 0; partial && adopted.blocks > 0 && j < ls * hkv; ++j) {
    auto& list = local[static_cast<size_t>(j)];
    for (int64_t b = 0; b < adopted.blocks; ++b) {
      if (adopted.Cell(b, j / hkv, j % hkv, ls, hkv) >= 0 &&
          std::find(list.begin(), list.end(), b) == list.end()) {
        list.push_back(static_cast<int32_t>(b));
      }
    }
  }
  const Status st = sparse->Import(s.seq, staged, working, partial ? &local : nullptr);
  if (!st.ok()) {
    // No sparse row or GPU slots now: the KV is fetched already; fail rather than hold it.
    Fail(s, st);
    return;
  }
  s.seq.always_sparse = true;
  if (import_cache != nullptr && !s.import_block_hashes.empty()) {
    // Its prompt blocks the cache lacks are shared from now on: imports of the same prefix
    // arriving while this one decodes hold them too instead of fetching them.
    stats.disagg.import_prefix_blocks_published_total += disagg::PublishImportPrefix(
        sparse->manager(), key, *import_cache, ImportKeys(s), s.import_adopted);
  }
  EndPendingImport(s);  // (imports that waited for these blocks find them cached now)
  s.import_generation = next_import_generation++;
  s.drift_requested.clear();
  // x1 and x2 as the prefill node sampled them, then decoding from x2 on.
  const HandoffSampling* sampling = &s.import_sampling;
  const auto now = EngineClock::now();
  RequestOutput out;
  for (int i = 0; i < 2; ++i) {
    SampleResult r;
    r.token = static_cast<int32_t>(t.tokens[static_cast<size_t>(i)]);
    r.logprob = sampling->tokens[static_cast<size_t>(i)].logprob;
    r.top_logprobs = sampling->tokens[static_cast<size_t>(i)].top;
    if (static_cast<int>(r.top_logprobs.size()) > s.request.num_top_logprobs) {
      r.top_logprobs.resize(static_cast<size_t>(s.request.num_top_logprobs));
    }
    if (!Emit(s, r, i == 0, now, out))
      return;  // finished (a stop at x1 or x2): Finish released everything
  }
  s.seq.num_computed = staged;  // x1's K/V is here; x2 is the pending token
  if (draft != nullptr && t.tokens.size() == 3)
    s.seq.draft_tokens = {static_cast<int32_t>(t.tokens[2])};
  out.prompt_tokens = s.seq.num_prompt_tokens;
  out.completion_tokens = s.seq.num_generated();
  delivery.Add(s.stream, std::move(out));
  scheduler.AddRunning(&s.seq);
  s.import_phase = RequestState::ImportPhase::kNone;
  ++stats.disagg.imports_total;
}

bool Engine::Impl::AwaitsImportedBlock(const RequestState& s) const {
  if (import_cache == nullptr || pending_import_blocks.empty() || s.import_block_hashes.empty())
    return false;
  // Its first prompt block the cache lacks: another import is fetching it.
  for (const PrefixBlockKey& key : ImportKeys(s)) {
    if (import_cache->Contains(key)) continue;
    return pending_import_blocks.count(key.hash) > 0;
  }
  return false;
}

void Engine::Impl::EndPendingImport(RequestState& s) {
  if (s.import_pending_from < 0) return;
  const auto from = static_cast<size_t>(s.import_pending_from);
  s.import_pending_from = -1;
  for (size_t b = from; b < s.import_block_hashes.size(); ++b) {
    auto it = pending_import_blocks.find(s.import_block_hashes[b]);
    if (it != pending_import_blocks.end() && --it->second == 0) pending_import_blocks.erase(it);
  }
}

std::vector<PrefixBlockKey> Engine::Impl::ImportKeys(const RequestState& s) const {
  std::vector<PrefixBlockKey> keys;
  const auto& hashes = s.import_block_hashes;
  keys.reserve(hashes.size());
  for (size_t b = 0; b < hashes.size(); ++b) {
    keys.push_back(
        {hashes[b],
         b == 0 ? PrefixCacheRoot(std::hash<std::string>{}(s.request.cache_salt)) : hashes[b - 1],
         std::span<const int32_t>(s.seq.tokens.data() + b * kBlockSize, kBlockSize)});
  }
  return keys;
}

void Engine::Impl::AdoptImportPrefix(RequestState& s) {
  s.import_adopted = {};
  if (import_cache == nullptr || s.import_block_hashes.empty()) return;
  for (const PrefixBlockKey& key : ImportKeys(s)) {
    auto cells = import_cache->Acquire(key);
    if (!cells) break;
    s.import_adopted.cells.insert(s.import_adopted.cells.end(), cells->begin(), cells->end());
    ++s.import_adopted.blocks;
  }
}

void Engine::Impl::ReturnImportPrefix(RequestState& s) {
  if (import_cache == nullptr || s.import_adopted.blocks == 0) return;
  const std::vector<PrefixBlockKey> keys = ImportKeys(s);
  for (int64_t b = 0; b < s.import_adopted.blocks; ++b)
    import_cache->Release(keys[static_cast<size_t>(b)], {}, /*held=*/true);
  s.import_adopted = {};
}

void Engine::Impl::ParkImportPrefix(RequestState& s) {
  EndPendingImport(s);  // an import that ends before its fetch landed: others stop waiting
  if (import_cache == nullptr || !s.request.import || s.import_block_hashes.empty()) return;
  const std::vector<PrefixBlockKey> keys = ImportKeys(s);
  // Running sparse, its fetch landed: its local blocks go to the cache; otherwise it only
  // ends its hold of what it adopted.
  const bool ran =
      s.import_phase == RequestState::ImportPhase::kNone && s.seq.kv == SequenceKv::kSparse;
  stats.disagg.import_prefix_cells_cached_total += disagg::ParkImportPrefix(
      sparse->manager(), s.seq.id, *import_cache, keys, s.import_adopted, ran);
  s.import_adopted = {};
}

void Engine::Impl::ReleaseImport(RequestState& s, bool completed) {
  if (!s.request.import || s.import_released) return;
  s.import_released = true;
  try {
    s.request.import->Release(completed);
  } catch (const std::exception& e) {
    spdlog::warn("request {}: releasing its handoff lease: {}", s.request.id, e.what());
  }
}

void Engine::Impl::StopImportThread() {
  for (auto& w : admission_workers) w->Stop();
  if (drift_worker) drift_worker->Stop();
}

void FetchWorker::Push(FetchJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] {
        while (true) {
          FetchJob j;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (stop_) return;
            j = std::move(jobs_.front());
            jobs_.pop_front();
          }
          const auto t0 = EngineClock::now();
          try {
            j.status = j.source->Fetch(j.items);
            // FP8 bytes in other scales than this instance's: mapped into ours here, off the
            // loop thread (the identity otherwise: nothing touched).
            const disagg::KvRequantizer& q = j.source->requantizer();
            if (j.status.ok() && !q.identity()) {
              auto layout = disagg::StagedKvLayout::Create(j.source->ticket().geometry);
              OASIS_CHECK(layout.ok()) << "import layout (checked at Submit)";
              q.ApplyLanded(*layout, j.items);
            }
          } catch (const std::exception& e) {
            j.status = Internal(std::string("fetching handed-off KV: ") + e.what());
          }
          j.seconds = Seconds(EngineClock::now() - t0);
          j.items.clear();
          done_(std::move(j));
        }
      });
    }
  }
  cv_.notify_all();
}

void FetchWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    jobs_.clear();  // not started: nothing writes into their buffers
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace oasis

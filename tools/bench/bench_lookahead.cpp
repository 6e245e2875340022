// bench_lookahead: what lookahead decoding costs and gains, through the real engine loop on
// one GPU (dummy weights at real shapes, CUDA graphs with stacked queries, the EAGLE-3 head
// on the device). For each mode (off, reject, speculate) it submits `--batch` requests of
// `--context` prompt tokens and `--tokens` output tokens (greedy, ignore_eos) and reports
// TPOT (time per output token of a request, over the window where every request is decoding,
// so later requests' prefill chunks do not count), the draft acceptance rate and the tokens
// emitted per request-step.
//
//   bench_lookahead --batch 1  --context 128  --tokens 128
//   bench_lookahead --batch 64 --context 4096 --tokens 64
//   bench_lookahead --batch 1  --context 128  --tokens 128 --repeat
//   bench_lookahead --batch 1  --context 128  --tokens 128 --repeat --num-speculative-tokens 3
//   bench_lookahead --batch 64 --context 4096 --tokens 128 --num-speculative-tokens 3
//                   --speculative-depth adaptive     (chain depth 1..3 picked per step)
// --repeat builds a target whose greedy continuation repeats the last prompt token (o_proj and
// down_proj zeroed — still read every step, so the cost is the real one — and a tied
// lm_head) and a "copy" head that proposes the target's own prediction (fc selects the stream
// leaving the last layer; zero attention/MLP outputs; the target's final norm and lm_head):
// the draft is right by construction, which exercises the speculative gain path end to end.
//
// clang-format off
//   bench_lookahead --batch 32 --context 16384 --tokens 256 --repeat --sparse --num-speculative-tokens 3
//   bench_lookahead --batch 32 --context 16384 --tokens 256 --repeat --sparse --num-speculative-tokens 3 --kv-home host
// clang-format on
// --sparse: every request decodes with sparse KV (docs/sparse.md) from its first decode step:
// the server's SparseConfig (K --topk-blocks 128, --fetch-ratio 0.05, predictor draft, group
// reduce sum, fixed budget, agreement sampled every --sparse-agreement-interval 32 steps) with
// the threshold policy at --sparse-threshold (default the server's (K + 1) x 16; below
// --context). --kv-home hbm (default): the KV stays in the GPU pool (in place); host: in a
// pinned host store sized for batch x (context + tokens) tokens. Off runs with the
// previous-query predictor (no draft head: the server's choice without lookahead). Each mode
// also prints its output tok/s over the decode window (every request decoding, every one
// sparse: checked, the run fails otherwise) and the sparse counters; the RESULT line compares
// speculate with reject.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_shapes.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_error.h"
#include "engine/engine.h"
#include "engine/lookahead.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "kvcache/host_kv_store.h"
#include "kvcache/sparse_kv_manager.h"
#include "loader/weights.h"
#include "models/eagle3.h"
#include "runner/cuda/cuda_draft_runner.h"
#include "runner/cuda/cuda_graph_runner.h"

using namespace oasis;
using namespace std::chrono_literals;

namespace {

Status Zero(Backend& b, Tensor* t, const std::string& name) {
  if (t == nullptr) return Internal("no weight " + name);
  if (t->block_scales() != nullptr) {  // an FP8 weight kept in e4m3: zero scales, zero weight
    Tensor scales = *t->block_scales();
    b.Fill(scales, 0.0f);
    return Status::Ok();
  }
  b.Fill(*t, 0.0f);
  return Status::Ok();
}

// The repeating target: every layer's output projections zeroed (the residual stream stays the
// embedding); with tied embeddings the logits peak at the input token itself.
Status MakeRepeatingTarget(DecoderLM& model, Backend& b) {
  for (int64_t i = 0; i < model.config().num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    OASIS_RETURN_IF_ERROR(Zero(b, model.FindWeight(p + "self_attn.o_proj.weight"), p + "o_proj"));
    OASIS_RETURN_IF_ERROR(Zero(b, model.FindWeight(p + "mlp.down_proj.weight"), p + "down_proj"));
  }
  return Status::Ok();
}

// The copy head: fc = [0 | 0 | I] over aux streams (0, L/2, L), zero o_proj/down, the target's
// final norm and lm_head, d2t = 0 (draft vocabulary = target vocabulary).
StatusOr<std::unique_ptr<Eagle3Head>> MakeCopyHead(DecoderLM& target, CudaBackend& b) {
  const ModelConfig& t = target.config();
  ModelConfig hc = Eagle3Head::ConfigForTarget(t, t.vocab_size);
  const int64_t L = t.num_hidden_layers, H = t.hidden_size;
  hc.aux_hidden_state_layer_ids = {0, L / 2, L};
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<Eagle3Head> head,
                         Eagle3Head::CreateDummy(hc, target, b, 7));
  Tensor fc = Tensor::Zeros({H, 3 * H}, DType::kF32);
  for (int64_t i = 0; i < H; ++i) fc.data<float>()[i * 3 * H + 2 * H + i] = 1.0f;
  Tensor fc_bf16 = Tensor::Empty({H, 3 * H}, DType::kBF16);
  ConvertFromFloat(fc.data<float>(), fc_bf16.raw(), DType::kBF16, static_cast<size_t>(fc.numel()));
  Tensor* dst = head->FindWeight("fc.weight");
  if (dst == nullptr) return Internal("no fc.weight");
  b.UploadBytes(*dst, 0, fc_bf16.raw(), fc_bf16.nbytes());
  OASIS_RETURN_IF_ERROR(
      Zero(b, head->FindWeight("midlayer.self_attn.o_proj.weight"), "head o_proj"));
  OASIS_RETURN_IF_ERROR(
      Zero(b, head->FindWeight("midlayer.mlp.down_proj.weight"), "head down_proj"));
  b.Copy(*target.FindWeight("model.norm.weight"), *head->FindWeight("norm.weight"));
  b.Copy(*target.FindWeight("lm_head.weight"), *head->FindWeight("lm_head.weight"));
  b.Synchronize();
  return head;
}

// --sparse and its knobs (the server's flags of the same names and defaults).
struct SparseFlags {
  bool on = false;
  int64_t threshold = 0;  // 0: the server's (K + 1) x 16
  int64_t topk = 128;
  double fetch_ratio = 0.05;
  int64_t agreement_interval = 32;
  std::string home = "hbm";
};

// The SparseConfig the server resolves for these flags (ResolveSparseConfig), except: the
// threshold policy (every request past the threshold switches at its first decode step; the
// server's default, pressure, keeps requests dense while the pool has room, and this pool
// holds every request), and a host store sized for these requests: batch x (context + tokens)
// tokens with the host home; one request's with hbm (the server always has a store,
// --host-kv-gib; the HBM home leaves it unused). max_seq_len is the engine's to set.
StatusOr<SparseConfig> MakeSparseConfig(const SparseFlags& f, const ModelConfig& c, DType dtype,
                                        int64_t batch, int64_t max_total_tokens) {
  if (f.topk < 1 || f.topk > (int64_t{1} << 20))
    return InvalidArgument("--topk-blocks must be in [1, 2^20]");
  if (f.agreement_interval < 0 || f.agreement_interval > (int64_t{1} << 30))
    return InvalidArgument("--sparse-agreement-interval must be in [0, 2^30]");
  SparseConfig s;
  s.topk_blocks = static_cast<int32_t>(f.topk);
  s.fetch_ratio = f.fetch_ratio;
  s.sparse_threshold = f.threshold > 0 ? f.threshold : (f.topk + 1) * kBlockSize;
  s.predictor = SparsePredictor::kDraft;
  s.max_sparse_seqs = static_cast<int32_t>(batch);
  s.max_seq_len = c.max_position_embeddings;
  s.agreement_interval = static_cast<int32_t>(f.agreement_interval);
  s.switch_on_pressure = false;
  OASIS_ASSIGN_OR_RETURN(s.home, ParseKvHome(f.home));
  if (s.home == KvHome::kAuto) return InvalidArgument("--kv-home must be hbm or host here");
  // Head-blocks of one request (every block it can reach, as the admission reserves them),
  // and one block per KV head more against the rounding of GiB to slots.
  const int64_t hkv = c.num_key_value_heads;
  const int64_t per_request = (max_total_tokens + kBlockSize - 1) / kBlockSize * hkv;
  const int64_t slots = (s.home == KvHome::kHost ? batch : 1) * per_request + hkv;
  const size_t per_slot = HostKvStore::BytesPerSlot(c.num_hidden_layers, c.head_dim, dtype);
  s.host_kv_gib =
      static_cast<double>(slots) * static_cast<double>(per_slot) / (1024.0 * 1024.0 * 1024.0);
  OASIS_RETURN_IF_ERROR(s.Validate(c.num_hidden_layers));
  return s;
}

struct ModeResult {
  double tpot_ms = 0, ttft_ms = 0, acceptance = 0, tokens_per_step = 0;
  int64_t steps = 0;
  // Per engine step over the decode window: wall ms of the target's step and of the head's,
  // of the whole step, and of its host phases (schedule, build the batch, emit the tokens).
  double model_ms = 0, head_ms = 0, step_ms = 0, host_ms = 0;
  double out_tok_s = 0;  // output tokens per second over the decode window, all requests
  EngineStats::Sparse sparse;
  double sparse_tokens_per_step = 0;  // tokens per sparse request-step that verified drafts
  std::array<int64_t, kMaxDraftTokens> depth_steps{};  // speculate: steps by chain depth chosen
};

// Engine counters at a moment (reader 0 samples them at each of its events).
struct Snapshot {
  std::chrono::steady_clock::time_point t;
  int64_t steps;
  double model_s, draft_s, step_s, host_s;  // host_s: schedule + build + emit
  int64_t sparse_requests;                  // requests decoding sparse
  int64_t finished;                         // requests finished
};

// Sparse mode: moves *t0 to the first snapshot in (t0, t1] that comes kSparseWarmSteps engine
// steps after one where every request decodes sparse (a snapshot may trail the last switch by
// a step, and the first sparse steps capture their CUDA graphs), and checks that every request
// stays sparse to t1 (or to the first finish: a reader may stamp t1 late); an error says why
// the requests were not sparse in the window.
constexpr int64_t kSparseWarmSteps = 2;
Status StartSparseWindow(const std::vector<Snapshot>& snapshots, int64_t batch,
                         std::chrono::steady_clock::time_point* t0,
                         std::chrono::steady_clock::time_point t1) {
  const Snapshot* first = nullptr;  // every request sparse
  const Snapshot* start = nullptr;  // kSparseWarmSteps steps later
  int64_t most = 0;
  for (const Snapshot& s : snapshots) {
    if (s.t <= *t0 || s.t > t1 || s.finished > 0) continue;
    most = std::max(most, s.sparse_requests);
    if (first == nullptr) {
      if (s.sparse_requests == batch) first = &s;
      continue;
    }
    if (s.sparse_requests != batch) {
      return Internal("only " + std::to_string(s.sparse_requests) + " of " + std::to_string(batch) +
                      " requests decoded sparse late in the decode window (preempted?)");
    }
    if (start == nullptr && s.steps >= first->steps + kSparseWarmSteps && s.t < t1) start = &s;
  }
  if (first == nullptr) {
    return Internal("the requests did not all decode sparse in the decode window (at most " +
                    std::to_string(most) + " of " + std::to_string(batch) +
                    " at once): check --sparse-threshold and the sparse rows and pool");
  }
  if (start == nullptr)
    return Internal("too few sparse steps in the decode window: raise --tokens");
  *t0 = start->t;
  return Status::Ok();
}

StatusOr<ModeResult> RunMode(CudaGraphRunner& runner, CudaDraftRunner& draft, LookaheadMode mode,
                             int64_t batch, int64_t context, int64_t tokens, int64_t vocab,
                             int64_t num_speculative_tokens, SpeculativeDepth depth,
                             const std::optional<SparseConfig>& sparse) {
  EngineOptions o;
  o.lookahead = mode;
  o.num_speculative_tokens = mode == LookaheadMode::kSpeculate ? num_speculative_tokens : 1;
  o.speculative_depth = depth;
  o.max_num_seqs = batch;
  o.max_num_batched_tokens =
      std::max<int64_t>(16384, 2 * batch);  // short prefill phase: a long decode window
  o.sparse = sparse;
  // Without lookahead there is no draft: the server's predictor is then previous-query.
  if (sparse && mode == LookaheadMode::kOff) o.sparse->predictor = SparsePredictor::kPreviousQuery;
  DraftRunner* head = mode == LookaheadMode::kOff ? nullptr : &draft;
  OASIS_RETURN_IF_ERROR(Engine::CheckOptions(o, runner, head));
  std::unique_ptr<Engine> owned;
  try {  // the engine pins the host KV store: a machine that cannot is an error here
    owned = std::make_unique<Engine>(runner, nullptr, o, head);
  } catch (const StatusError& e) {
    return e.status();
  }
  Engine& engine = *owned;
  engine.Start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int64_t r = 0; r < batch; ++r) {
    EngineRequest req;
    req.id = "r" + std::to_string(r);
    for (int64_t i = 0; i < context; ++i)
      req.prompt.push_back(static_cast<int32_t>((r * 7919 + i * 104729) % vocab));
    req.max_tokens = tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    req.detokenize = false;
    OASIS_ASSIGN_OR_RETURN(std::shared_ptr<RequestStream> s, engine.Submit(std::move(req)));
    streams.push_back(std::move(s));
  }
  // One reader per request stamps every event, so the decode rate can be taken over the
  // window where all requests are decoding (after the last first token, before the first
  // last token): prefill chunks of later requests do not inflate it.
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<std::pair<Clock::time_point, int64_t>>> events(streams.size());
  std::vector<std::string> errors(streams.size());
  std::vector<Snapshot> snapshots;
  std::vector<std::thread> readers;
  for (size_t i = 0; i < streams.size(); ++i) {
    readers.emplace_back([&, i] {
      while (true) {
        auto ev = streams[i]->Next(600s);
        if (!ev) {
          errors[i] = "request timed out";
          return;
        }
        if (!ev->tokens.empty())
          events[i].push_back({Clock::now(), static_cast<int64_t>(ev->tokens.size())});
        if (i == 0) {
          const EngineStats s = engine.Stats();
          snapshots.push_back({Clock::now(), s.loop.steps_total, s.loop.model_step_seconds_total,
                               s.loop.draft_step_seconds_total, s.loop.step_seconds_total,
                               s.loop.schedule_seconds_total + s.loop.build_seconds_total +
                                   s.loop.emit_seconds_total,
                               s.sparse.num_requests, s.requests.finished_total});
        }
        if (ev->finished) {
          if (ev->finish_reason != FinishReasonKind::kLength)
            errors[i] = "ended early: " + ev->error.ToString();
          return;
        }
      }
    });
  }
  for (auto& t : readers) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) return Internal(e);
  Clock::time_point t0 = Clock::time_point::min(), t1 = Clock::time_point::max();
  for (const auto& ev : events) {
    t0 = std::max(t0, ev.front().first);
    t1 = std::min(t1, ev.back().first);
  }
  if (t0 >= t1) return Internal("no step where every request decodes: raise --tokens");
  if (sparse) OASIS_RETURN_IF_ERROR(StartSparseWindow(snapshots, batch, &t0, t1));
  double window_tokens = 0;
  for (const auto& ev : events)
    for (const auto& [t, n] : ev)
      if (t > t0 && t <= t1) window_tokens += static_cast<double>(n);
  const EngineStats st = engine.Stats();
  engine.Stop();
  // A preempted sparse request recomputes densely: not a sparse decode.
  if (sparse && st.requests.preemptions_total > 0) {
    return Internal(std::to_string(st.requests.preemptions_total) +
                    " preemptions: the KV pool ran short");
  }
  ModeResult m;
  m.out_tok_s = window_tokens / std::chrono::duration<double>(t1 - t0).count();
  m.sparse = st.sparse;
  m.sparse_tokens_per_step =
      mode == LookaheadMode::kOff ? 1.0 : st.lookahead.sparse_tokens_per_step();
  m.ttft_ms = st.ttft.sum / st.ttft.count * 1e3;
  // Mean time per output token of a request while every request decodes.
  m.tpot_ms = window_tokens > 0 ? std::chrono::duration<double, std::milli>(t1 - t0).count() *
                                      batch / window_tokens
                                : 0.0;
  m.acceptance = st.lookahead.acceptance_rate();
  m.tokens_per_step = mode == LookaheadMode::kOff ? 1.0 : st.lookahead.tokens_per_step();
  m.steps = st.loop.steps_total;
  m.depth_steps = st.lookahead.depth_steps_total;
  // The first and last snapshots inside the window.
  const Snapshot* a = nullptr;
  const Snapshot* b = nullptr;
  for (const Snapshot& s : snapshots) {
    if (s.t < t0 || s.t > t1) continue;
    if (a == nullptr) a = &s;
    b = &s;
  }
  if (a != nullptr && b->steps > a->steps) {
    const double n = static_cast<double>(b->steps - a->steps);
    m.model_ms = (b->model_s - a->model_s) / n * 1e3;
    m.head_ms = (b->draft_s - a->draft_s) / n * 1e3;
    m.step_ms = (b->step_s - a->step_s) / n * 1e3;
    m.host_ms = (b->host_s - a->host_s) / n * 1e3;
  }
  return m;
}

// --head-only: the draft head's decode step alone (one row per sequence at position `context`,
// the head's KV filled with noise up to it, random aux features), timed with CUDA events
// around DraftRunner::Propose; small enough to run under ncu.
Status RunHeadOnly(Eagle3Head& head, CudaBackend& backend, CudaDraftRunner& draft, int64_t batch,
                   int64_t context, int64_t steps) {
  const int32_t heads = static_cast<int32_t>(head.config().num_key_value_heads);
  BlockAllocator allocator(static_cast<int32_t>(draft.num_kv_slots()));
  std::vector<HeadBlockTable> tables;
  for (int64_t s = 0; s < batch; ++s) {
    tables.emplace_back(heads);
    OASIS_RETURN_IF_ERROR(tables.back().Reserve(context + 1, allocator));
  }
  const int64_t n_aux = static_cast<int64_t>(head.aux_layer_ids().size());
  Tensor aux = backend.Empty({n_aux, batch, head.config().hidden_size}, DType::kBF16);
  backend.FillNormal(aux, 3, 1.0f);
  std::vector<HeadStepSequence> seqs;
  for (int64_t s = 0; s < batch; ++s)
    seqs.push_back(
        {&tables[static_cast<size_t>(s)], context, {static_cast<int32_t>(s + 1)}, s, true});
  const HeadStepInput in = BuildHeadStepInput(seqs);
  cuda::Event start(cuda::EventTiming::kEnabled), stop(cuda::EventTiming::kEnabled);
  std::vector<float> ms;
  for (int64_t i = 0; i < steps + 3; ++i) {
    start.Record(backend.stream());
    const std::vector<int32_t> drafts = draft.Propose(in.input, aux, in.aux_rows);
    stop.Record(backend.stream());
    stop.Synchronize();
    if (i >= 3) ms.push_back(stop.ElapsedMsSince(start));
  }
  for (HeadBlockTable& t : tables) t.Release(allocator);
  std::sort(ms.begin(), ms.end());
  std::printf("RESULT head step b=%lld ctx=%lld: median %.3f ms (min %.3f)\n",
              static_cast<long long>(batch), static_cast<long long>(context), ms[ms.size() / 2],
              ms.front());
  return Status::Ok();
}

Status Run(int argc, char** argv) {
  std::string config_path = "tools/bench/model_configs/qwen3-8b.json";
  int64_t batch = 1, context = 128, tokens = 128, draft_vocab = 32000, spec_tokens = 1;
  bool repeat = false, head_only = false;
  SparseFlags sf;
  std::string depth_name = "fixed";
  FlagParser flags(
      "bench_lookahead: TPOT of lookahead decoding (reject / speculate) vs plain, via the engine");
  flags.AddString("config", &config_path,
                  "HF config.json with the target's shapes (dummy weights)");
  flags.AddInt("batch", &batch, "concurrent requests");
  flags.AddInt("context", &context, "prompt tokens per request");
  flags.AddInt("tokens", &tokens, "output tokens per request");
  flags.AddInt("draft-vocab", &draft_vocab, "draft vocabulary of the dummy head");
  flags.AddBool("repeat", &repeat, "repeating target + copy head: drafts right by construction");
  flags.AddInt("num-speculative-tokens", &spec_tokens,
               "speculate: chains of this many drafts (1..4; graphs of 1 + k query tokens)");
  flags.AddString("speculative-depth", &depth_name,
                  "speculate: fixed (chains of k) or adaptive (the engine picks 1..k per step)");
  flags.AddBool("head-only", &head_only,
                "time the draft head's decode step alone (no engine, no prefill)");
  flags.AddBool("sparse", &sf.on,
                "every request decodes with sparse KV from its first decode step (off with the "
                "previous-query predictor, reject and speculate with draft)");
  flags.AddInt("sparse-threshold", &sf.threshold,
               "sparse: switch past this context (below --context; 0: the server's (K + 1) x 16)");
  flags.AddString("kv-home", &sf.home,
                  "sparse: hbm (the KV stays in the GPU pool) or host (a pinned host store of "
                  "batch x (context + tokens) tokens)");
  flags.AddInt("topk-blocks", &sf.topk, "sparse: K, blocks per (request, layer, KV head)");
  flags.AddDouble("fetch-ratio", &sf.fetch_ratio,
                  "sparse: C = ceil(ratio x K) blocks fetched per KV head per step");
  flags.AddInt("sparse-agreement-interval", &sf.agreement_interval,
               "sparse: sample the top-K agreement every N sparse steps (eager steps; 0 = never)");
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return Status::Ok();
  }
  if (batch < 1 || context < 1 || tokens < 2)
    return InvalidArgument("batch, context >= 1 and tokens >= 2");
  if (spec_tokens < 1 || spec_tokens > kMaxDraftTokens)
    return InvalidArgument("--num-speculative-tokens must be 1 to 4");
  OASIS_ASSIGN_OR_RETURN(const SpeculativeDepth depth, ParseSpeculativeDepth(depth_name));
  OASIS_RETURN_IF_ERROR(InitLogging("warn"));
  OASIS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
  if (repeat) config.tie_word_embeddings = true;
  if (sf.on) OASIS_RETURN_IF_ERROR(CheckCudaSparseShapes(config));
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create());
  std::optional<SparseConfig> sparse;
  int64_t host_blocks = 0;  // the host store's head-blocks: the draft head's pool holds them too
  if (sf.on) {
    OASIS_ASSIGN_OR_RETURN(
        sparse, MakeSparseConfig(sf, config, backend->activation_dtype(), batch, context + tokens));
    if (sparse->sparse_threshold >= context) {
      return InvalidArgument("--sparse-threshold " + std::to_string(sparse->sparse_threshold) +
                             " must be below --context " + std::to_string(context) +
                             " (requests switch to sparse past it)");
    }
    host_blocks =
        HostKvSlotsFor(*sparse,
                       {config.num_hidden_layers, config.num_key_value_heads, config.head_dim},
                       backend->activation_dtype(), 1)
            .total();
  }
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<DecoderLM> model,
                         DecoderLM::CreateDummy(config, *backend, 1));
  std::unique_ptr<Eagle3Head> head;
  if (repeat) {
    OASIS_RETURN_IF_ERROR(MakeRepeatingTarget(*model, *backend));
    OASIS_ASSIGN_OR_RETURN(head, MakeCopyHead(*model, *backend));
  } else {
    const ModelConfig hc =
        Eagle3Head::ConfigForTarget(config, std::min(draft_vocab, config.vocab_size));
    OASIS_ASSIGN_OR_RETURN(head, Eagle3Head::CreateDummy(hc, *model, *backend, 7));
  }
  const int32_t heads = static_cast<int32_t>(config.num_key_value_heads);
  const int64_t max_ctx = context + tokens + 4;
  // Every request whole in the pool (sparse too: prompts prefill densely, the HBM home keeps
  // them there; the host home's working sets come out of the switched tables).
  const int64_t slots = HeadBlockTable::SlotsFor(max_ctx, heads) * batch + 64;
  CudaGraphOptions go;
  go.num_kv_slots = slots;
  go.max_batch = batch;
  go.max_context = max_ctx;
  go.max_query_len = static_cast<int>(std::max<int64_t>(2, 1 + spec_tokens));
  std::unique_ptr<CudaGraphRunner> runner;
  auto make_runner = [&]() -> Status {
    runner.reset();  // its KV pool first: two do not fit
    OASIS_ASSIGN_OR_RETURN(runner, CudaGraphRunner::Create(*model, *backend, go));
    return Status::Ok();
  };
  OASIS_RETURN_IF_ERROR(make_runner());
  CudaDraftRunner draft(
      *head, *backend,
      DraftKvSlotsFor(slots + host_blocks, heads, head->config().num_key_value_heads));
  if (head_only) return RunHeadOnly(*head, *backend, draft, batch, context, tokens);
  std::printf("target %s%s, head: %s; batch %lld, prompt %lld, output %lld tokens\n",
              config_path.c_str(), repeat ? " (repeating)" : "",
              repeat ? "copy head" : "dummy EAGLE-3", static_cast<long long>(batch),
              static_cast<long long>(context), static_cast<long long>(tokens));
  if (sparse) {
    std::printf(
        "sparse KV: home %s, K %d, C %d, threshold %lld, predictor draft (off: previous-query), "
        "agreement every %d steps, host store %.2f GiB\n",
        std::string(KvHomeName(sparse->home)).c_str(), sparse->topk_blocks, sparse->max_fetch(),
        static_cast<long long>(sparse->sparse_threshold), sparse->agreement_interval,
        sparse->host_kv_gib);
  }
  std::printf("%-10s %10s %10s %12s %12s %8s %14s %13s %13s %13s\n", "mode", "TPOT ms", "TTFT ms",
              "acceptance", "tok/step", "steps", "model ms/step", "head ms/step", "step ms",
              "host ms/step");
  double base = 0;
  std::string summary;
  double reject_tok_s = 0, speculate_tok_s = 0, off_tok_s = 0, speculate_tok_step = 0;
  for (LookaheadMode mode :
       {LookaheadMode::kOff, LookaheadMode::kReject, LookaheadMode::kSpeculate}) {
    // The runner keys its sparse graphs on the engine's sparse pipeline, which goes with its
    // engine: a later engine's pipeline at the same address would replay them. A fresh runner.
    if (sparse && mode != LookaheadMode::kOff) OASIS_RETURN_IF_ERROR(make_runner());
    OASIS_ASSIGN_OR_RETURN(ModeResult m, RunMode(*runner, draft, mode, batch, context, tokens,
                                                 config.vocab_size, spec_tokens, depth, sparse));
    if (mode == LookaheadMode::kOff) base = m.tpot_ms;
    std::printf("%-10s %10.3f %10.1f %12.3f %12.3f %8lld %14.3f %13.3f %13.3f %13.3f\n",
                LookaheadModeName(mode), m.tpot_ms, m.ttft_ms, m.acceptance, m.tokens_per_step,
                static_cast<long long>(m.steps), m.model_ms, m.head_ms, m.step_ms, m.host_ms);
    if (sparse) {
      const EngineStats::Sparse& s = m.sparse;
      std::printf(
          "  sparse: %.1f output tok/s in the window (all %lld requests sparse), %.3f tok/step, "
          "%lld switches, hit rate %.3f, %.1f blocks fetched/step, %.1f MB H2D/step, "
          "agreement %.3f\n",
          m.out_tok_s, static_cast<long long>(batch), m.sparse_tokens_per_step,
          static_cast<long long>(s.switches_total), s.hit_rate(), s.fetched_per_step(),
          s.h2d_bytes_per_step() / 1e6, s.topk_agreement());
      if (mode == LookaheadMode::kSpeculate && depth == SpeculativeDepth::kAdaptive) {
        std::printf("  steps by chain depth chosen:");
        for (int64_t n : m.depth_steps) std::printf(" %lld", static_cast<long long>(n));
        std::printf("\n");
      }
      if (mode == LookaheadMode::kOff) off_tok_s = m.out_tok_s;
      if (mode == LookaheadMode::kReject) reject_tok_s = m.out_tok_s;
      if (mode == LookaheadMode::kSpeculate) {
        speculate_tok_s = m.out_tok_s;
        speculate_tok_step = m.sparse_tokens_per_step;
      }
      continue;
    }
    std::string extra;
    if (mode == LookaheadMode::kSpeculate) {
      extra = ", " + std::to_string(m.tokens_per_step).substr(0, 4) + " tok/step";
      if (depth == SpeculativeDepth::kAdaptive) {
        extra += ", steps by depth";
        for (int64_t n : m.depth_steps) extra += " " + std::to_string(n);
      }
    }
    char part[200];
    std::snprintf(part, sizeof part, "%s%s TPOT %.3f ms (%.2fx plain)%s",
                  summary.empty() ? "" : "; ", LookaheadModeName(mode), m.tpot_ms, m.tpot_ms / base,
                  extra.c_str());
    summary += part;
  }
  if (sparse) {
    std::printf(
        "RESULT lookahead sparse b=%lld ctx=%lld%s k=%lld%s home=%s: reject %.1f tok/s; "
        "speculate %.1f tok/s (%.2fx reject), %.2f tok/step; off (previous-query) %.1f tok/s\n",
        static_cast<long long>(batch), static_cast<long long>(context), repeat ? " repeat" : "",
        static_cast<long long>(spec_tokens),
        depth == SpeculativeDepth::kAdaptive ? " adaptive" : "",
        std::string(KvHomeName(sparse->home)).c_str(), reject_tok_s, speculate_tok_s,
        speculate_tok_s / reject_tok_s, speculate_tok_step, off_tok_s);
    return Status::Ok();
  }
  std::printf("RESULT lookahead b=%lld ctx=%lld%s k=%lld%s: %s\n", static_cast<long long>(batch),
              static_cast<long long>(context), repeat ? " repeat" : "",
              static_cast<long long>(spec_tokens),
              depth == SpeculativeDepth::kAdaptive ? " adaptive" : "", summary.c_str());
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Status st = Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_lookahead: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

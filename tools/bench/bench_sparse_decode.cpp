// bench_sparse_decode: one sparse decode step of a whole model (dummy weights, real shapes),
// isolated from the server and the draft head: `--batch` sequences of `--context` tokens
// switched to sparse, decoded with stacked [x_t, draft] queries (a fixed token stands in for
// the draft) through the model runner — on the GPU the CUDA-graph runner with the pipeline's
// own streams (sparse steps as graphs unless --no-graphs), on the CPU the reference runner.
// Reports the median step time beside the step's byte roofline: HBM (weights, each request's
// working set and local block for every layer and KV head, the block summaries the draft
// query scores) and PCIe (the blocks the step really fetched, from the pipeline's counters),
// and, with --transfers both, the same steps with the transfers switched off (issue 8's
// "pipeline vs transfers disabled": the time the transfers add to the critical path).
//
//   bench_sparse_decode --config tools/bench/model_configs/qwen3-8b.json --batch 32 --context 16384
//   bench_sparse_decode ... --transfers both --steps 20
//   bench_sparse_decode ... --no-graphs --timeline      (when each stream worked on each layer)
//   bench_sparse_decode --backend cpu --config models/embedded/config.json --batch 2 --context 512
//   --topk 4 bench_sparse_decode ... --tensor-parallel-size 2   (a rank per GPU: each its own KV
//   heads, host store
//                                                      share, pipeline; roofline per GPU, PCIe per
//                                                      rank's link)
//
// The KV content does not change a step's cost, so the pools are filled with noise instead of
// prefilling; each sequence is switched to sparse on its own (only one dense KV is ever on
// the GPU). With random weights and KV nothing predicts the next step's blocks, so every head
// fetches its cap C = ceil(fetch_ratio · K) nearly every step: the PCIe bound is the worst case.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/flags.h"
#include "common/logging.h"
#include "engine/lookahead.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "runner/batch_builder.h"
#include "runner/model_runner.h"
#include "runner/sparse_ranks.h"
#include "runner/tp/cpu_tp_runner.h"
#if defined(OASIS_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sparse_sync.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "runner/tp/cuda_tp_runner.h"
#endif

using namespace oasis;

namespace {

constexpr double kReadCeilingGBs = 4560.0;  // DESIGN.md §5: read-only streaming kernel
constexpr double kPcieCeilingGBs = 51.0;    // DESIGN.md §5: UVA gather of scattered head-blocks

struct Timing {
  double median_ms = 0, min_ms = 0, plan_ms = 0;  // step; host plan + batch building (median)
  SparseMetrics metrics;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Bytes one decode step must read from HBM: every weight but the input embedding (tied: the
// lm_head, read once) + per sparse request, layer and KV head its resident blocks (K working
// + the local block, K and V) + the summaries (min and max keys) of every block it scores.
// Under tensor parallelism (tp > 1) one GPU's share: the layers' weights, the KV and the
// summaries divided by tp, lm_head (replicated) whole.
double HbmBytesPerStep(const ModelConfig& c, int64_t batch, int64_t context, int32_t k,
                       int64_t tp = 1) {
  double weights = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(c)) {
    if (w.name == "model.embed_tokens.weight" && !c.tie_word_embeddings) continue;
    const bool replicated = w.name == "lm_head.weight" || w.name == "model.embed_tokens.weight";
    weights += 2.0 * static_cast<double>(w.numel()) / (replicated ? 1.0 : static_cast<double>(tp));
  }
  const double kv_token =
      2.0 * static_cast<double>(c.num_key_value_heads * c.head_dim) * 2.0;  // K+V, bf16
  const double resident = std::min<double>(static_cast<double>(context), (k + 1.0) * kBlockSize);
  const double blocks = std::ceil(static_cast<double>(context) / kBlockSize);
  const double summaries =
      static_cast<double>(c.num_key_value_heads) * blocks * 2.0 * c.head_dim * 2.0;
  return weights + static_cast<double>(batch) * c.num_hidden_layers *
                       (kv_token * resident + summaries) / static_cast<double>(tp);
}

#if defined(OASIS_HAVE_CUDA)
// One eager step with the stage sync's timeline on: when each stage worked on each layer.
// "attention" spans the main stream's sparse prologue, the attention and the query snapshot
// of a layer; the projections and MLP run on the main stream between two layers' spans.
template <typename StepFn>
Status PrintTimeline(SparseStageSync* sync, StepFn step) {
  auto* cuda_sync = dynamic_cast<CudaSparseStageSync*>(sync);
  if (cuda_sync == nullptr)
    return FailedPrecondition("--timeline: the runner has no CUDA stage sync");
  cuda_sync->EnableTimeline(true);
  OASIS_RETURN_IF_ERROR(step());
  const std::vector<CudaSparseStageSync::TimelineEntry> entries = cuda_sync->TakeTimeline();
  cuda_sync->EnableTimeline(false);
  int64_t layers = 0;
  for (const auto& e : entries) layers = std::max(layers, e.layer + 1);
  std::vector<std::array<std::pair<float, float>, 4>> at(static_cast<size_t>(layers));
  for (auto& row : at) row.fill({-1.0f, -1.0f});
  std::array<double, 4> busy{};
  float end = 0.0f;
  for (const auto& e : entries) {
    at[static_cast<size_t>(e.layer)][static_cast<size_t>(e.stage)] = {e.start_ms, e.end_ms};
    busy[static_cast<size_t>(e.stage)] += e.end_ms - e.start_ms;
    end = std::max(end, e.end_ms);
  }
  std::printf("timeline of one eager step (ms from its first stage event; start-end per stage):\n");
  std::printf("%5s  %15s  %15s  %15s  %15s  %9s\n", "layer", "attention", "predict", "select",
              "transfer", "xfer lag");
  const auto cell = [](std::pair<float, float> p) {
    char buf[32];
    if (p.first < 0) return std::string("-");
    std::snprintf(buf, sizeof buf, "%7.3f-%7.3f", p.first, p.second);
    return std::string(buf);
  };
  for (int64_t l = 0; l < layers; ++l) {
    const auto& r = at[static_cast<size_t>(l)];
    const float lag = r[3].first >= 0 && r[0].second >= 0 ? r[3].first - r[0].second : 0.0f;
    std::printf("%5lld  %15s  %15s  %15s  %15s  %9.3f\n", static_cast<long long>(l),
                cell(r[0]).c_str(), cell(r[1]).c_str(), cell(r[2]).c_str(), cell(r[3]).c_str(),
                lag);
  }
  const auto& last = at.empty() ? std::array<std::pair<float, float>, 4>{} : at.back();
  std::printf(
      "busy per stream: attention %.3f, predict %.3f, select %.3f, transfer %.3f ms; step's stage "
      "events end "
      "at %.3f ms, the last attention at %.3f ms (transfer tail %.3f ms)\n",
      busy[0], busy[1], busy[2], busy[3], end, last[0].second, end - last[0].second);
  return Status::Ok();
}
#endif

Status Run(int argc, char** argv) {
  std::string config_path = "tools/bench/model_configs/qwen3-8b.json", backend_name = "cuda";
  std::string transfers = "on", predictor_name = "draft", home_name = "host";
  int64_t batch = 32, context = 16384, steps = 20, warmup = 5, topk = 128, threads = 0, tp_size = 1;
  double fetch_ratio = 0.05;
  bool no_graphs = false, timeline = false;
  FlagParser flags(
      "bench_sparse_decode: one sparse decode step of a whole model against its byte roofline");
  flags.AddString("config", &config_path, "HF config.json with the model's shapes (dummy weights)");
  flags.AddString("backend", &backend_name, "cuda or cpu");
  flags.AddInt("batch", &batch, "sparse sequences decoded together");
  flags.AddInt("context", &context, "tokens in each sequence's KV when it switches to sparse");
  flags.AddInt("steps", &steps, "timed decode steps");
  flags.AddInt("warmup", &warmup, "untimed decode steps first");
  flags.AddInt("topk", &topk, "K: selected blocks per (sequence, layer, KV head)");
  flags.AddDouble("fetch-ratio", &fetch_ratio,
                  "C = ceil(fetch_ratio * K) blocks fetched per head per step at most");
  flags.AddString("predictor", &predictor_name,
                  "draft (stacked [x_t, draft] queries) or previous-query (x_t only)");
  flags.AddString("transfers", &transfers,
                  "on, off (predict/select run, nothing is copied) or both (on, then off)");
  flags.AddBool("no-graphs", &no_graphs, "run the sparse steps eagerly (CUDA)");
  flags.AddString("kv-home", &home_name,
                  "host (working sets fetched from the host store) or hbm (the KV stays in the "
                  "GPU pool, selected blocks read in place)");
  flags.AddBool(
      "timeline", &timeline,
      "CUDA, with --no-graphs: one more step with timing events per stage and layer, printed");
  flags.AddInt("threads", &threads, "CPU backend threads (0 = hardware)");
  flags.AddInt("tensor-parallel-size", &tp_size,
               "ranks (GPUs 0..N-1, or CPU ranks as threads): each its own KV heads, host store "
               "share and pipeline");
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return Status::Ok();
  }
  if (batch < 1 || batch > 256) return InvalidArgument("--batch must be 1 to 256");
  if (context < 2 * kBlockSize) return InvalidArgument("--context must be at least 32 tokens");
  if (steps < 1 || warmup < 0)
    return InvalidArgument("--steps must be positive and --warmup not negative");
  if (timeline && (!no_graphs || backend_name != "cuda"))
    return InvalidArgument("--timeline needs --backend cuda --no-graphs");
  if (tp_size < 1 || tp_size > 64) return InvalidArgument("--tensor-parallel-size must be 1 to 64");
  if (timeline && tp_size > 1)
    return InvalidArgument("--timeline runs on one GPU (--tensor-parallel-size 1)");
  if (transfers != "on" && transfers != "off" && transfers != "both") {
    return InvalidArgument("--transfers must be on, off or both");
  }
  OASIS_ASSIGN_OR_RETURN(SparsePredictor predictor, ParseSparsePredictor(predictor_name));
  OASIS_ASSIGN_OR_RETURN(const KvHome home, ParseKvHome(home_name));
  if (home == KvHome::kAuto) return InvalidArgument("--kv-home must be host or hbm here");
  const bool in_place = home == KvHome::kHbm;
  if (in_place && transfers == "both") transfers = "on";  // nothing to transfer in place
  if (predictor == SparsePredictor::kOracle)
    return InvalidArgument("--predictor oracle is for measurement runs only");
  const bool draft = predictor == SparsePredictor::kDraft;
  const int32_t q = draft ? 2 : 1;
  OASIS_RETURN_IF_ERROR(InitLogging("warn"));
  OASIS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
  const int32_t hkv = static_cast<int32_t>(config.num_key_value_heads);
  const int64_t passes = transfers == "both" ? 2 : 1;
  const int64_t max_len = context + passes * (warmup + steps) + 2;

  // Backend, dummy model, runner (or a tensor-parallel group of them).
  OASIS_RETURN_IF_ERROR(CheckTensorParallelSize(config, static_cast<int>(tp_size)));
  const int32_t hkv_local = static_cast<int32_t>(hkv / tp_size);
  // One dense sequence at a time, plus every sparse request's working set and tails (host
  // home), or every request's whole table (HBM home).
  const int64_t slots =
      in_place ? batch * HeadBlockTable::SlotsFor(max_len + 16, hkv_local) + 64
               : HeadBlockTable::SlotsFor(context, hkv_local) + batch * (topk + 4) * hkv_local + 64;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<ModelRunner> runner;
  if (backend_name != "cpu" && backend_name != "cuda")
    return InvalidArgument("--backend must be cuda or cpu");
#if !defined(OASIS_HAVE_CUDA)
  if (backend_name == "cuda")
    return FailedPrecondition("this build has no CUDA backend (use --backend cpu)");
#endif
  if (tp_size > 1) {
    const auto dummy_shard = [&](Backend& b, const TensorParallel& tp) {
      return DecoderLM::CreateDummy(config, b, 1, tp);
    };
    if (backend_name == "cpu") {
      OASIS_ASSIGN_OR_RETURN(
          runner, CreateCpuTpRunner(config,
                                    {.size = static_cast<int>(tp_size),
                                     .threads_per_rank = static_cast<int>(threads / tp_size),
                                     .num_kv_slots = slots},
                                    dummy_shard));
    }
#if defined(OASIS_HAVE_CUDA)
    if (backend_name == "cuda") {
      CudaTpOptions o;
      o.size = static_cast<int>(tp_size);
      o.graph.max_batch = batch;
      o.graph.max_context = max_len + 16;
      o.graph.enabled = !no_graphs;
      o.graph.sparse_graphs = !no_graphs;
      CudaTpHooks h;
      h.load_shard = [&](CudaBackend& b, const TensorParallel& tp) { return dummy_shard(b, tp); };
      h.kv_slots = [&](int, CudaBackend&, DecoderLM&) -> StatusOr<int64_t> { return slots; };
      OASIS_ASSIGN_OR_RETURN(runner, CreateCudaTpRunner(config, o, h));
    }
#endif
  } else {
    if (backend_name == "cpu") backend = std::make_unique<CpuBackend>(static_cast<int>(threads));
#if defined(OASIS_HAVE_CUDA)
    if (backend_name == "cuda") {
      OASIS_ASSIGN_OR_RETURN(auto cuda, CudaBackend::Create());
      backend = std::move(cuda);
    }
#endif
    OASIS_ASSIGN_OR_RETURN(model, DecoderLM::CreateDummy(config, *backend, 1));
#if defined(OASIS_HAVE_CUDA)
    if (backend_name == "cuda") {
      CudaGraphOptions go;
      go.num_kv_slots = slots;
      go.max_batch = batch;
      go.max_context = max_len + 16;
      go.enabled = !no_graphs;
      go.sparse_graphs = !no_graphs;
      OASIS_ASSIGN_OR_RETURN(
          runner, CudaGraphRunner::Create(*model, *static_cast<CudaBackend*>(backend.get()), go));
    }
#endif
    if (runner == nullptr) runner = std::make_unique<ModelRunner>(*model, *backend, slots);
  }
  Backend& backend0 = runner->backend();

  // The sparse pieces, the host store sized for exactly these requests.
  SparseConfig cfg;
  cfg.topk_blocks = static_cast<int32_t>(topk);
  cfg.fetch_ratio = fetch_ratio;
  cfg.predictor = predictor;
  cfg.max_sparse_seqs = static_cast<int32_t>(batch);
  cfg.max_seq_len = max_len;
  cfg.sparse_threshold = kBlockSize;
  cfg.home = home;
  // K + V of one head-block in the backend's KV dtype (bf16 on the GPU, float32 on the CPU).
  const double block_bytes = 2.0 * kBlockSize * static_cast<double>(config.head_dim) *
                             static_cast<double>(DTypeSize(backend0.activation_dtype()));
  const double host_bytes = static_cast<double>(in_place ? 1 : batch) * hkv *
                            std::ceil(static_cast<double>(max_len) / kBlockSize) *
                            static_cast<double>(config.num_hidden_layers) * block_bytes;
  cfg.host_kv_gib = host_bytes * 1.01 / (1024.0 * 1024.0 * 1024.0) + 0.001;
  OASIS_RETURN_IF_ERROR(cfg.Validate(config.num_hidden_layers));
  BlockAllocator allocator(static_cast<int32_t>(slots));
  const auto t_host = std::chrono::steady_clock::now();
  // One device side and one pipeline per rank, each on its rank's thread (a single runner is its
  // own rank 0); the host store is split among the ranks.
  const auto n_ranks = static_cast<size_t>(runner->num_ranks());
  const std::vector<std::vector<LayerKvPool>*> pools = RankKvPools(*runner);
  auto manager = std::make_unique<SparseKvManager>(
      cfg, SparseModelShape{config.num_hidden_layers, hkv_local, config.head_dim},
      RankBackends(*runner), allocator, RankSideRunner(*runner));
  SparseAttachment attachment(
      *runner, *manager);  // the runner's pipelines (after the manager: detached first)
  std::printf("host KV store: %.2f GiB pinned in %.1f s%s\n", cfg.host_kv_gib,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_host).count(),
              n_ranks > 1 ? " (split over the ranks)" : "");

  // Noise KV, then each sequence switched to sparse from its own dense table.
  runner->ForEachRank([&](int r, ModelRunner& rank) {
    for (LayerKvPool& pool : rank.kv_pools()) {
      rank.backend().FillNormal(pool.k, 11 + 2 * static_cast<uint64_t>(r), 1.0f);
      rank.backend().FillNormal(pool.v, 12 + 2 * static_cast<uint64_t>(r), 1.0f);
    }
  });
  std::vector<HeadBlockTable> tables;  // in place: each request keeps (and grows) its own
  for (int64_t s = 0; s < batch; ++s) {
    const uint64_t id = static_cast<uint64_t>(s + 1);
    OASIS_RETURN_IF_ERROR(in_place ? manager->ReserveInPlace(id, max_len)
                                   : manager->Reserve(id, max_len));
    tables.emplace_back(hkv_local);
    HeadBlockTable& table = tables.back();
    OASIS_RETURN_IF_ERROR(table.Reserve(context, allocator));
    OASIS_RETURN_IF_ERROR(manager->SwitchToSparse(
        id, table, context,
        [&](int r) -> std::vector<LayerKvPool>& { return *pools[static_cast<size_t>(r)]; }));
    if (!in_place) table.Release(allocator);  // (empty: the manager took its slots over)
  }

  // Decode steps; positions advance by one real token per step.
  SampleRow greedy;
  greedy.params.temperature = 0.0f;
  const std::vector<SampleRow> rows(static_cast<size_t>(batch), greedy);
  std::vector<int32_t> last(static_cast<size_t>(batch), 7);
  int64_t pos = context;
  bool first_step = true;
  const auto run_steps = [&](int64_t n, bool timed, Timing* t) -> Status {
    std::vector<double> step_ms, plan_ms;
    for (int64_t i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<SparseBatchEntry> entries;
      for (int64_t s = 0; s < batch; ++s) {
        HeadBlockTable* own = in_place ? &tables[static_cast<size_t>(s)] : nullptr;
        if (own != nullptr) OASIS_RETURN_IF_ERROR(own->Reserve(pos + q, allocator));
        entries.push_back({static_cast<uint64_t>(s + 1), pos, q, own});
      }
      SparseStepPlan plan = manager->BuildStepPlan(entries);
      // The very first step runs eagerly (an agreement step never takes a graph), as a server's
      // prefill does before any decode: lazy set-up (RoPE tables, cuBLAS) cannot run in a capture.
      if (first_step) plan.measure_agreement = true;
      first_step = false;
      std::vector<StepSequence> seqs;
      for (int64_t s = 0; s < batch; ++s) {
        std::vector<int32_t> toks = {last[static_cast<size_t>(s)]};
        if (draft) toks.push_back(11);
        seqs.push_back(StepSequence{in_place ? &tables[static_cast<size_t>(s)] : nullptr, pos, toks,
                                    &plan.slots[static_cast<size_t>(s)]});
      }
      const ForwardInput in = BuildLookaheadTargetInput(
          seqs, std::vector<int64_t>(static_cast<size_t>(batch), draft ? 1 : 0), false);
      const auto t1 = std::chrono::steady_clock::now();
      std::vector<SampleResult> out =
          runner->Run({.input = in,
                       .rows = rows,
                       .sparse = SparseStepInputs{&plan, cfg.predictor != SparsePredictor::kOracle,
                                                  manager->config().transfers}});
      const auto t2 = std::chrono::steady_clock::now();
      if (out.size() != rows.size())
        return Internal("the runner returned a wrong number of samples");
      for (size_t s = 0; s < out.size(); ++s) last[s] = out[s].token;
      ++pos;
      if (timed) {
        plan_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      }
    }
    if (t != nullptr) {
      t->median_ms = Median(step_ms);
      t->min_ms = *std::min_element(step_ms.begin(), step_ms.end());
      t->plan_ms = Median(plan_ms);
    }
    return Status::Ok();
  };

  const double hbm = HbmBytesPerStep(config, batch, context, cfg.topk_blocks, tp_size);
  const double hbm_ms = hbm / (kReadCeilingGBs * 1e9) * 1e3;
  std::printf(
      "bench_sparse_decode: %s, %lld x %lld tokens, K %d, C %d, predictor %s, %s, KV home %s\n",
      backend_name.c_str(), static_cast<long long>(batch), static_cast<long long>(context),
      cfg.topk_blocks, cfg.max_fetch(), predictor_name.c_str(),
      backend_name == "cuda" && !no_graphs ? "CUDA graphs" : "eager", home_name.c_str());
#if defined(OASIS_HAVE_CUDA)
  if (backend_name == "cuda") {
    std::printf(
        "gather: %s kernel (OASIS_GATHER_KERNEL), %d CTAs (OASIS_GATHER_CTAS)\n",
        CudaBackend::GatherKernelChoice() == kernels::GatherKernel::kTma ? "tma" : "registers",
        CudaBackend::GatherCtas());
  }
#endif
  std::vector<std::pair<std::string, Timing>> results;
  for (const std::string& mode : {std::string("on"), std::string("off")}) {
    if (transfers != "both" && transfers != mode) continue;
    manager->SetTransfers(mode == "on");
    OASIS_RETURN_IF_ERROR(run_steps(warmup, false, nullptr));
    (void)runner->CollectSparseMetrics();  // (resets the counters)
    Timing t;
    OASIS_RETURN_IF_ERROR(run_steps(steps, true, &t));
    t.metrics = runner->CollectSparseMetrics();
    const double pcie = t.metrics.h2d_bytes_per_step();  // all ranks; each rank's over its own link
    const double pcie_ms = pcie / static_cast<double>(n_ranks) / (kPcieCeilingGBs * 1e9) * 1e3;
    const double floor_ms = std::max(hbm_ms, pcie_ms);
    std::printf(
        "transfers %-3s: step median %.3f ms (min %.3f; host plan %.3f ms), hit rate %.3f, %.0f "
        "blocks "
        "(%.1f MB) fetched per step = %.1f GB/s over the step; step end waited %.3f ms for the "
        "side streams\n",
        mode.c_str(), t.median_ms, t.min_ms, t.plan_ms, t.metrics.hit_rate(),
        t.metrics.fetched_per_step(), pcie / 1e6, pcie / (t.median_ms * 1e-3) / 1e9,
        t.metrics.transfer_wait_seconds * 1e3 / static_cast<double>(steps));
    std::printf(
        "  roofline: HBM %.2f GB = %.3f ms at %.0f GB/s; PCIe %.3f ms at %.0f GB/s; floor %.3f ms; "
        "step / floor %.2f\n",
        hbm / 1e9, hbm_ms, kReadCeilingGBs, pcie_ms, kPcieCeilingGBs, floor_ms,
        t.median_ms / floor_ms);
    results.emplace_back(mode, t);
  }
#if defined(OASIS_HAVE_CUDA)
  if (timeline)
    OASIS_RETURN_IF_ERROR(
        PrintTimeline(runner->sparse_stage_sync(), [&] { return run_steps(1, false, nullptr); }));
#endif
  const Timing& first = results.front().second;
  const double pcie_ms = first.metrics.h2d_bytes_per_step() / static_cast<double>(n_ranks) /
                         (kPcieCeilingGBs * 1e9) * 1e3;
  std::printf(
      "RESULT sparse_decode b%lldx%lld K%d C%d%s%s %s: step %.3f ms, floor %.3f ms (HBM %.3f, PCIe "
      "%.3f), "
      "ratio %.2f (target <= 1.25)",
      static_cast<long long>(batch), static_cast<long long>(context), cfg.topk_blocks,
      cfg.max_fetch(), n_ranks > 1 ? (" tp=" + std::to_string(n_ranks)).c_str() : "",
      in_place ? " in place" : "", results.front().first == "on" ? "transfers on" : "transfers off",
      first.median_ms, std::max(hbm_ms, pcie_ms), hbm_ms, pcie_ms,
      first.median_ms / std::max(hbm_ms, pcie_ms));
  if (results.size() == 2) {
    const double off = results[1].second.median_ms;
    std::printf("; transfers off %.3f ms: overhead %.1f%% (target <= 10%%)", off,
                (first.median_ms / off - 1.0) * 100.0);
  }
  std::printf("\n");
  for (int64_t s = 0; s < batch; ++s) manager->Release(static_cast<uint64_t>(s + 1));
  for (HeadBlockTable& t : tables) t.Release(allocator);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  const Status st = Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_sparse_decode: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

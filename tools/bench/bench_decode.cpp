// bench_decode: decode throughput of a whole model with dummy weights at real shapes on
// one GPU, through the CUDA-graph runner, against the byte roofline of a decode step
// (every weight but the input embedding read once, plus the KV cache of every sequence).
//
//   bench_decode --config tools/bench/model_configs/qwen3-8b.json --batch 1 --context 128
//   bench_decode --config ... --batch 64 --context 4096
// Times `--steps` decode steps after `--warmup` steps (CUDA events around each step's
// Run: host packing, one H2D copy, graph replay, sampling on the GPU, tokens
// D2H); reports the median.
//
//   bench_decode --config ... --prefill 8192
// instead times the prefill of one prompt of that many tokens (eager, tensor-core attention,
// cuBLAS GEMMs) against the bf16 matrix ceiling: tokens/s and TFLOP/s.
//
//   bench_decode --config ... --batch 64 --context 4096 --tensor-parallel-size 2
// runs the same steps on N GPUs (TpModelRunner: a worker thread per GPU, NCCL all-reduces
// inside the graphs; NCCL_NVLS_ENABLE=0). Steps are timed on the host (the call returns once
// every rank has sampled); the roofline is per GPU (its shard of the weights and KV heads plus
// the replicated embedding/lm_head/norms), and tok/s is the group's.
//
// Qwen3-MoE configs (tools/bench/model_configs/qwen3-30b-a3b.json): the roofline counts only the
// experts a step reads, per MoE layer the distinct experts of the batch's tokens — k for one
// token, E·(1 − (1 − k/E)^T) expected for T tokens routed uniformly (dummy weights route close
// to uniformly) — and prefill's FLOPs only the k active experts per token. --moe-path gemv|gemm
// forces the expert path, --moe-path unfused chooses it as auto but without the fused decode
// kernels (router GEMV + top-k, gate/up, grouped down, combine as separate launches; one GPU).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "common/flags.h"
#include "common/logging.h"
#include "engine/lookahead.h"
#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "runner/batch_builder.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "runner/tp/cuda_tp_runner.h"

using namespace oasis;

namespace {

constexpr double kReadCeilingTBs = 4.56;  // DESIGN.md §5: read-only streaming kernel
constexpr double kCopyCeilingTBs = 4.24;  // device-to-device copy

constexpr double kMatmulCeilingTflops = 788.0;  // DESIGN.md §5: bf16 8192³ through cuBLAS

// " moe=ExK" (and the forced expert path) for an MoE model, to tell its RESULT lines apart.
std::string MoeTag(const ModelConfig& c, const std::string& path) {
  if (!c.HasMoeLayers()) return "";
  return " moe=" + std::to_string(c.num_experts) + "x" + std::to_string(c.num_experts_per_tok) +
         (path == "auto" ? "" : " path=" + path);
}

bool IsExpertWeight(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

// The fraction of an MoE layer's experts a step of `tokens` tokens reads: the expected distinct
// experts under uniform routing over E (k of E for one token), divided by E.
double ExpertsReadFraction(const ModelConfig& c, double tokens) {
  if (c.num_experts <= 0) return 1.0;
  const double e = static_cast<double>(c.num_experts),
               k = static_cast<double>(c.num_experts_per_tok);
  return 1.0 - std::pow(1.0 - k / e, tokens);
}

// Prefill of one prompt: FLOPs = 2 × (matrix parameters, without the input embedding) per
// token for the projections and MLP + attention 4·d·Hq per (query, visible key) pair.
// `runner` is a plain runner with at least SlotsFor(n) slots, or a tensor-parallel one (timed
// on the host then).
Status RunPrefill(const ModelConfig& config, CudaBackend& backend, ModelRunner& runner, int64_t n,
                  int64_t runs, int64_t warmup) {
  const int32_t heads = static_cast<int32_t>(runner.model().config().num_key_value_heads);
  const int64_t slots = runner.num_kv_slots();
  const bool host_timed = runner.model().tensor_parallel().size > 1;
  BlockAllocator allocator(static_cast<int32_t>(slots));
  HeadBlockTable table(heads);
  OASIS_RETURN_IF_ERROR(table.Reserve(n, allocator));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % config.vocab_size);
  ForwardInput in =
      BuildHostForwardInput({StepSequence{&table, 0, tokens}}, LogitsFor::kLastTokenOfEachSequence);
  cuda::Event start(cuda::EventTiming::kEnabled), stop(cuda::EventTiming::kEnabled);
  std::vector<float> ms;
  runs = std::min<int64_t>(runs, 10);
  for (int64_t r = 0; r < warmup + runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    start.Record(backend.stream());
    Tensor logits = runner.Execute(in);
    stop.Record(backend.stream());
    stop.Synchronize();
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r >= warmup)
      ms.push_back(host_timed ? static_cast<float>(host_ms) : stop.ElapsedMsSince(start));
  }
  table.Release(allocator);
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  double matrix_params = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(config)) {
    if (w.shape.size() != 2 || w.name == "model.embed_tokens.weight") continue;
    if (w.name == "lm_head.weight") continue;  // logits of the last token only
    // A token runs k of the E experts of an MoE layer.
    const double active = IsExpertWeight(w.name) ? static_cast<double>(config.num_experts_per_tok) /
                                                       static_cast<double>(config.num_experts)
                                                 : 1.0;
    matrix_params += active * static_cast<double>(w.numel());
  }
  const double dn = static_cast<double>(n);
  const double flops = 2.0 * matrix_params * dn + 2.0 * config.hidden_size * config.vocab_size +
                       config.num_hidden_layers * 4.0 * config.head_dim *
                           config.num_attention_heads * dn * (dn + 1) / 2;
  const double tflops = flops / (median * 1e-3) / 1e12;
  std::printf("prefill of %lld tokens: median %.2f ms over %zu runs (min %.2f)\n",
              static_cast<long long>(n), median, ms.size(), ms.front());
  const int tp = runner.model().tensor_parallel().size;
  std::printf(
      "RESULT prefill n=%lld%s%s: %.0f tokens/s, %.1f TFLOP/s%s, ceiling %.0f TFLOP/s, ratio "
      "%.2f\n",
      static_cast<long long>(n), MoeTag(config, "auto").c_str(),
      tp > 1 ? (" tp=" + std::to_string(tp)).c_str() : "", dn / (median * 1e-3), tflops,
      config.HasMoeLayers() ? " (active)" : "", kMatmulCeilingTflops * tp,
      tflops / (kMatmulCeilingTflops * tp));
  return Status::Ok();
}

Status Run(int argc, char** argv) {
  std::string config_path = "tools/bench/model_configs/qwen3-8b.json", model_dir;
  int64_t batch = 1, context = 128, steps = 50, warmup = 5;
  double temperature = 0.0, top_p = 1.0;
  bool no_graphs = false, capture = false;
  int64_t prefill = 0, queries = 1, tensor_parallel = 1;
  std::string moe_path = "auto";
  FlagParser flags("bench_decode: whole-model decode throughput with dummy weights");
  flags.AddString("config", &config_path, "HF config.json with the model's shapes (dummy weights)");
  flags.AddString("model", &model_dir,
                  "load this safetensors checkpoint instead (reports load speed)");
  flags.AddInt("batch", &batch, "sequences decoded together");
  flags.AddInt("context", &context, "tokens already in each sequence's KV cache");
  flags.AddInt("steps", &steps, "timed decode steps");
  flags.AddInt("warmup", &warmup, "untimed decode steps first");
  flags.AddDouble("temperature", &temperature,
                  "sampling temperature of every row (0 = greedy), on the GPU");
  flags.AddDouble("top-p", &top_p, "top-p of every row");
  flags.AddBool("no-graphs", &no_graphs, "run eagerly, without CUDA graphs");
  flags.AddInt("prefill", &prefill, "time the prefill of one prompt of this many tokens instead");
  flags.AddInt("queries", &queries,
               "query tokens per sequence and step (2 = lookahead's stacked [x_t, draft]; logits "
               "of the first)");
  flags.AddBool("capture", &capture,
                "also capture the residual stream at an EAGLE-3 head's aux layers (2, L/2, L-3)");
  flags.AddInt("tensor-parallel-size", &tensor_parallel,
               "split the model over GPUs 0..N-1 (NCCL all-reduces captured in the graphs); "
               "host-timed steps");
  flags.AddString("moe-path", &moe_path,
                  "MoE expert path: auto (by batch size), gemv, gemm, or unfused (auto without "
                  "the fused decode kernels of routing and experts; one GPU only)");
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (moe_path != "auto" && moe_path != "gemv" && moe_path != "gemm" && moe_path != "unfused")
    return InvalidArgument("--moe-path must be auto, gemv, gemm or unfused");
  if (moe_path != "auto" && tensor_parallel != 1)
    return InvalidArgument("--moe-path needs --tensor-parallel-size 1");
  if (queries < 1 || queries > 4) return InvalidArgument("--queries must be 1 to 4");
  if (tensor_parallel < 1 || tensor_parallel > 64)
    return InvalidArgument("--tensor-parallel-size must be 1 to 64");
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return Status::Ok();
  }
  OASIS_RETURN_IF_ERROR(InitLogging("warn"));
  if (!model_dir.empty()) OASIS_RETURN_IF_ERROR(InitLogging("info"));  // weight-loading progress
  OASIS_ASSIGN_OR_RETURN(ModelConfig config,
                         LoadModelConfig(model_dir.empty() ? config_path : model_dir));
  const int tp = static_cast<int>(tensor_parallel);
  const int32_t heads =
      static_cast<int32_t>(config.num_key_value_heads / tp);  // per rank (checked below)
  const int64_t max_ctx = context + (warmup + steps) * queries + 1;
  const int64_t slots = prefill > 0 ? HeadBlockTable::SlotsFor(prefill, heads) + 16
                                    : HeadBlockTable::SlotsFor(max_ctx, heads) * batch + 16;
  CudaGraphOptions go;
  go.num_kv_slots = slots;
  go.max_batch = std::max<int64_t>(batch, 1);
  go.max_context = max_ctx;
  go.enabled = !no_graphs;
  std::unique_ptr<CudaBackend> backend;  // TP = 1 only
  std::unique_ptr<DecoderLM> model;      // TP = 1 only
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<WeightSource> weights;
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = t0;  // when the weights are on the device(s)
  if (!model_dir.empty()) {
    OASIS_ASSIGN_OR_RETURN(weights, OpenSafetensorsWeights(model_dir));
  }
  if (tp > 1) {
    CudaTpOptions o;
    o.size = tp;
    o.graph = go;
    CudaTpHooks hooks;
    hooks.load_shard = [&](CudaBackend& b,
                           const TensorParallel& t) -> StatusOr<std::unique_ptr<DecoderLM>> {
      if (weights == nullptr) return DecoderLM::CreateDummy(config, b, 1, t);
      return DecoderLM::Create(config, *weights, b, t);
    };
    hooks.kv_slots = [&](int, CudaBackend&, DecoderLM&) -> StatusOr<int64_t> { return slots; };
    OASIS_ASSIGN_OR_RETURN(runner,
                           CreateCudaTpRunner(config, o, hooks));  // (its graph runners are cheap)
    loaded = std::chrono::steady_clock::now();
  } else {
    OASIS_ASSIGN_OR_RETURN(backend, CudaBackend::Create());
    if (moe_path != "auto") {
      backend->set_moe_path(moe_path == "gemv"   ? CudaBackend::MoePath::kGemv
                            : moe_path == "gemm" ? CudaBackend::MoePath::kGemm
                                                 : CudaBackend::MoePath::kUnfused);
    }
    if (weights == nullptr) {
      OASIS_ASSIGN_OR_RETURN(model, DecoderLM::CreateDummy(config, *backend, 1));
    } else {
      OASIS_ASSIGN_OR_RETURN(model, DecoderLM::Create(config, *weights, *backend));
    }
    loaded = std::chrono::steady_clock::now();
    if (prefill > 0) {
      runner = std::make_unique<ModelRunner>(*model, *backend, slots);
    } else {
      OASIS_ASSIGN_OR_RETURN(runner, CudaGraphRunner::Create(*model, *backend, go));
    }
  }
  if (weights != nullptr) {
    const double secs = std::chrono::duration<double>(loaded - t0).count();
    double bytes = 0;
    for (const WeightSpec& w : DecoderLM::ExpectedWeights(config))
      bytes += 2.0 * static_cast<double>(w.numel());
    std::printf(
        "RESULT load %s%s: %.2f GB in %.2f s = %.2f GB/s (safetensors mmap -> pinned staging -> "
        "HBM)\n",
        model_dir.c_str(), tp > 1 ? (" tp=" + std::to_string(tp)).c_str() : "", bytes / 1e9, secs,
        bytes / 1e9 / secs);
  }
  // Rank 0's backend: the timing events (and, under tensor parallelism, the host clock).
  CudaBackend& timing = *static_cast<CudaBackend*>(&runner->backend());
  if (prefill > 0) return RunPrefill(config, timing, *runner, prefill, steps, warmup);
  // The KV content does not change the cost of a step: fill the pools with noise instead
  // of prefilling `context` tokens.
  BlockAllocator allocator(static_cast<int32_t>(slots));
  std::vector<HeadBlockTable> tables;
  for (int64_t s = 0; s < batch; ++s) {
    tables.emplace_back(heads);
    OASIS_RETURN_IF_ERROR(tables.back().Reserve(max_ctx, allocator));
  }
  // Bytes one GPU reads per step: its shard of the split projections, the replicated rest.
  const auto sharded = [](const std::string& name) {
    for (const char* leaf :
         {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
      if (name.find(leaf) != std::string::npos) return true;
    }
    return false;
  };
  const double experts_read = ExpertsReadFraction(config, static_cast<double>(batch * queries));
  double weight_bytes = 0;
  for (const WeightSpec& w : DecoderLM::ExpectedWeights(config)) {
    if (w.name == "model.embed_tokens.weight" && !config.tie_word_embeddings)
      continue;  // one row read
    weight_bytes += 2.0 * static_cast<double>(w.numel()) / (sharded(w.name) ? tp : 1) *
                    (IsExpertWeight(w.name) ? experts_read : 1.0);
  }
  const double kv_bytes_per_token = 2.0 * 2 * config.num_hidden_layers * config.kv_size() / tp;

  cuda::Event start(cuda::EventTiming::kEnabled), stop(cuda::EventTiming::kEnabled);
  std::vector<float> ms;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    std::vector<StepSequence> seqs;
    for (int64_t s = 0; s < batch; ++s) {
      std::vector<int32_t> toks;
      for (int64_t j = 0; j < queries; ++j)
        toks.push_back(static_cast<int32_t>((s * 7919 + step + j) % config.vocab_size));
      seqs.push_back({&tables[static_cast<size_t>(s)], context + step * queries, toks});
    }
    ForwardInput in = BuildLookaheadTargetInput(
        seqs, std::vector<int64_t>(static_cast<size_t>(batch), queries - 1), false, nullptr);
    const auto t_step = std::chrono::steady_clock::now();
    start.Record(timing.stream());
    std::vector<SampleRow> rows(static_cast<size_t>(batch));
    for (auto& r : rows) {
      r.params.temperature = static_cast<float>(temperature);
      r.params.top_p = static_cast<float>(top_p);
      r.counter = static_cast<uint64_t>(step);
    }
    ResidualCapture cap;
    if (capture) {
      const int64_t L = config.num_hidden_layers;
      cap.layer_ids = {2, L / 2, L - 3};
    }
    std::vector<SampleResult> sampled =
        runner->Run({.input = in, .rows = rows, .capture = capture ? &cap : nullptr});
    stop.Record(timing.stream());
    stop.Synchronize();
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_step)
            .count();
    if (step >= warmup)
      ms.push_back(tp > 1 ? static_cast<float>(host_ms) : stop.ElapsedMsSince(start));
  }
  for (auto& t : tables) t.Release(allocator);
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  const double avg_ctx = static_cast<double>(context) + (warmup + steps / 2.0) * queries;
  const double bytes = weight_bytes + kv_bytes_per_token * avg_ctx * static_cast<double>(batch);
  const double roofline_ms = bytes / (kReadCeilingTBs * 1e12) * 1e3;
  const double copy_roofline_ms = bytes / (kCopyCeilingTBs * 1e12) * 1e3;
  std::printf(
      "model %s, batch %lld, context %lld, %s%s\n", config_path.c_str(),
      static_cast<long long>(batch), static_cast<long long>(context),
      no_graphs ? "eager" : "CUDA graphs",
      tp > 1 ? (", tensor parallel over " + std::to_string(tp) + " GPUs (host-timed steps)").c_str()
             : "");
  if (config.HasMoeLayers()) {
    std::printf(
        "MoE: %lld experts, %lld per token; the roofline reads %.1f distinct experts per "
        "MoE layer (%s), expert path %s\n",
        static_cast<long long>(config.num_experts),
        static_cast<long long>(config.num_experts_per_tok),
        experts_read * static_cast<double>(config.num_experts),
        batch * queries == 1 ? "the token's k" : "expected under uniform routing",
        moe_path.c_str());
  }
  std::printf("bytes per step%s: weights %.2f GB + KV %.2f GB\n", tp > 1 ? " per GPU" : "",
              weight_bytes / 1e9, kv_bytes_per_token * avg_ctx * batch / 1e9);
  std::printf("step time: median %.3f ms (min %.3f, p90 %.3f) over %zu steps\n", median, ms.front(),
              ms[ms.size() * 9 / 10], ms.size());
  std::printf("roofline: %.3f ms at %.2f TB/s read (%.3f ms at %.2f TB/s copy)\n", roofline_ms,
              kReadCeilingTBs, copy_roofline_ms, kCopyCeilingTBs);
  const std::string tags = MoeTag(config, moe_path) +
                           (tp > 1 ? " tp=" + std::to_string(tp) : std::string()) +
                           (queries > 1 ? " q=" + std::to_string(queries) : std::string()) +
                           (capture ? " +capture" : "");
  std::printf(
      "RESULT decode b=%lld ctx=%lld%s: %.3f ms/step, %.1f tok/s, %.2f TB/s effective%s, "
      "ceiling %.3f ms, ratio %.2f of read roofline (%.2f of copy roofline)\n",
      static_cast<long long>(batch), static_cast<long long>(context), tags.c_str(), median,
      batch * 1e3 / median, bytes / (median * 1e-3) / 1e12, tp > 1 ? " per GPU" : "", roofline_ms,
      roofline_ms / median, copy_roofline_ms / median);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Status st = Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_decode: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

#include "server/model_host.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <sstream>

#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "common/host_memory.h"
#include "common/status_error.h"
#include "kvcache/head_block_table.h"
#include "kvcache/host_kv_store.h"
#include "kvcache/sparse_kv_manager.h"
#include "loader/small_file.h"
#include "runner/kv_calibration.h"
#include "runner/tp/cpu_tp_runner.h"
#include "runner/tp/tp_model_runner.h"

#if OASIS_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "common/cuda_rt.h"
#include "kvcache/kv_memory_plan.h"
#include "runner/cuda/cuda_draft_runner.h"
#include "runner/cuda/cuda_graph_runner.h"
#include "runner/tp/cuda_tp_runner.h"
#endif

namespace oasis::server {
namespace fs = std::filesystem;
namespace {

constexpr size_t kCpuKvBudgetBytes = size_t{256} << 20;  // default CPU pool: at most 256 MiB

// KV head-blocks per layer for the CPU backend: --num-kv-slots, or enough for max_num_seqs
// full-length sequences within kCpuKvBudgetBytes, but at least one full-length sequence (a
// request of the whole context must fit). Refused: a pool without one block per KV head, or one
// larger than the memory available now (instead of a failed allocation).
StatusOr<int64_t> CpuKvSlots(const ServerConfig& sc, const ModelConfig& c, DType dtype) {
  const int64_t heads = c.num_key_value_heads;
  const int64_t per_seq =
      HeadBlockTable::SlotsFor(c.max_position_embeddings, static_cast<int32_t>(heads));
  const double bytes_per_slot = 2.0 * kBlockSize * static_cast<double>(c.head_dim) *
                                static_cast<double>(c.num_hidden_layers) *
                                static_cast<double>(DTypeSize(dtype));
  int64_t slots = sc.num_kv_slots;
  if (slots == 0) {
    const int64_t budget =
        static_cast<int64_t>(static_cast<double>(kCpuKvBudgetBytes) / bytes_per_slot);
    // per_seq * max_num_seqs, saturating at the budget (the product can overflow).
    const int64_t many = per_seq > budget / std::max<int64_t>(1, sc.max_num_seqs)
                             ? budget
                             : per_seq * sc.max_num_seqs;
    slots = std::max(per_seq, std::min(many, budget));
  }
  if (slots < heads) {
    return InvalidArgument("--num-kv-slots " + std::to_string(slots) +
                           " holds no KV block for each of the model's " + std::to_string(heads) +
                           " KV heads (at least " + std::to_string(heads) +
                           "; 0 sizes the pool by itself)");
  }
  const double gib = static_cast<double>(slots) * bytes_per_slot / double(1 << 30);
  const std::optional<double> avail = AvailableHostMemoryGiB();
  if (avail && gib > *avail) {
    char msg[400];
    std::snprintf(msg, sizeof msg,
                  "the CPU KV cache of %lld head-blocks per layer (%s) needs %.2f GiB, more than "
                  "the %.2f GiB this machine has available: lower %s",
                  static_cast<long long>(slots),
                  sc.num_kv_slots > 0 ? "--num-kv-slots" : "one sequence of the whole context", gib,
                  *avail, sc.num_kv_slots > 0 ? "--num-kv-slots" : "--max-model-len");
    return InvalidArgument(msg);
  }
  return slots;
}

Status LoadTokenizerAndTemplate(const ServerConfig& sc, ModelHost* host) {
  // --tokenizer FILE or DIR (its tokenizer.json), checked as a regular file under a cap
  // (loader/small_file.h; oasis-generate resolves it the same way).
  OASIS_ASSIGN_OR_RETURN(const fs::path tok_path,
                         ResolveTokenizerFile(host->model_path, sc.tokenizer));
  if (tok_path.empty()) {
    spdlog::warn("no tokenizer at {}: serving token ids only (text prompts and chat answer 400)",
                 (fs::path(host->model_path) / "tokenizer.json").string());
    return Status::Ok();
  }
  OASIS_ASSIGN_OR_RETURN(host->tokenizer, tokenizer::Tokenizer::FromFile(tok_path));
  const fs::path config_path = tok_path.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    OASIS_RETURN_IF_ERROR(CheckSmallFile(config_path, "tokenizer config", kMaxConfigJsonBytes));
    OASIS_ASSIGN_OR_RETURN(host->template_files,
                           ChatTemplate::LoadFromTokenizerConfig(config_path));
  }
  std::string template_source = config_path.string();
  if (!sc.chat_template.empty()) {
    // Given explicitly, it must be a template: a directory or an empty file is refused (they
    // silently turned chat off).
    OASIS_ASSIGN_OR_RETURN(host->template_files.chat_template,
                           ReadChatTemplateFile(sc.chat_template));
    template_source = "--chat-template " + sc.chat_template;
  }
  if (!host->template_files.chat_template.empty()) {
    auto parsed = ChatTemplate::Parse(host->template_files.chat_template);
    // (Parse's errors say "chat template: ..." already: the context names where it came from.)
    if (!parsed.ok()) return parsed.status().WithContext(template_source);
    host->chat_template = std::move(parsed).value();
  } else {
    spdlog::warn(
        "no chat template (tokenizer_config.json or --chat-template): /v1/chat/completions answers "
        "400");
  }
  return Status::Ok();
}

// The model's weights must fit the memory they live in: refused before any is allocated (a
// dummy config of vocab_size 2^31 - 1 aborted in an allocation). Host memory for the CPU
// backend (its activation dtype, f32, for every weight).
Status CheckHostWeights(const ServerConfig& sc, const ModelConfig& c) {
  return CheckHostMemoryForWeights(WeightBytes(DecoderLM::ExpectedWeights(c), sizeof(float)),
                                   "the model's weights (--load-format " + sc.load_format + ")");
}

Status LoadWeights(const ServerConfig& sc, ModelHost* host) {
  if (sc.load_format == "dummy") {
    OASIS_ASSIGN_OR_RETURN(host->model, DecoderLM::CreateDummy(host->config, *host->backend, 0));
    return Status::Ok();
  }
  OASIS_ASSIGN_OR_RETURN(host->weights, OpenSafetensorsWeights(host->model_path));
  OASIS_ASSIGN_OR_RETURN(host->model,
                         DecoderLM::Create(host->config, *host->weights, *host->backend));
  return Status::Ok();
}

// The EAGLE-3 draft head (--draft-model / --draft-load-format dummy), after the model, on
// `backend` with `target`'s embedding (under tensor parallelism: rank 0's, where the head runs
// replicated: its inputs, the captured residual streams, are the same on every rank).
Status LoadDraftHead(const ServerConfig& sc, ModelHost* host, DecoderLM& target, Backend& backend) {
  const ModelConfig& c = host->config;
  if (sc.draft_load_format == "dummy") {
    ModelConfig hc;
    if (sc.draft_model.empty()) {
      hc = Eagle3Head::ConfigForTarget(c, std::min(sc.draft_vocab_size, c.vocab_size));
      // The EAGLE-3 default aux layers (2, L/2, L-3) need L >= 3; smaller targets (the
      // embedded model) read the embedding, the middle and the last layer's output.
      const int64_t L = c.num_hidden_layers;
      if (L < 3) hc.aux_hidden_state_layer_ids = {0, L / 2, L};
    } else {
      OASIS_ASSIGN_OR_RETURN(hc, LoadModelConfig(sc.draft_model));
    }
    auto head = Eagle3Head::CreateDummy(hc, target, backend, 1);
    if (!head.ok()) return head.status().WithContext("dummy EAGLE-3 draft head");
    host->draft_head = std::move(head).value();
  } else {
    auto head = Eagle3Head::Load(sc.draft_model, target, backend);
    if (!head.ok()) return head.status().WithContext("--draft-model " + sc.draft_model);
    host->draft_head = std::move(head).value();
  }
  return Status::Ok();
}

// Head-blocks of one rank's host KV store (slots and remote summary rows; 0 without sparse
// KV): the tokens running requests may hold beyond the GPU pool, which the draft head's pool
// must hold too (it keeps every running request's tokens whatever the home of its target KV).
int64_t HostKvHeadBlocks(const ModelHost& host, const ModelConfig& local, DType dtype,
                         int64_t num_ranks) {
  if (!host.sparse) return 0;
  return HostKvSlotsFor(*host.sparse,
                        {local.num_hidden_layers, local.num_key_value_heads, local.head_dim}, dtype,
                        num_ranks)
      .total();
}

// The draft head's runner, with a KV pool holding as many tokens as the model's pool and host
// KV store together (Engine::CheckOptions). (Under tensor parallelism the engine counts
// rank-local KV heads and the head runs on rank 0's backend.)
void MakeDraftRunner(ModelHost* host) {
  Backend& backend = host->runner->backend();
  const ModelConfig& local = host->runner->model().config();
  const int64_t host_blocks = HostKvHeadBlocks(
      *host, local, KvCacheDtype(backend, local.kv_cache_fp8), host->runner->num_ranks());
  const int64_t slots =
      DraftKvSlotsFor(host->runner->num_kv_slots() + host_blocks, local.num_key_value_heads,
                      host->draft_head->config().num_key_value_heads);
#if OASIS_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {  // drafts taken on the device
    host->draft_runner = std::make_unique<CudaDraftRunner>(*host->draft_head, *cuda, slots);
  }
#endif
  if (!host->draft_runner)
    host->draft_runner = std::make_unique<DraftRunner>(*host->draft_head, backend, slots);
  std::string ids;
  for (int64_t id : host->draft_head->aux_layer_ids())
    ids += (ids.empty() ? "" : ",") + std::to_string(id);
  spdlog::info("EAGLE-3 draft head: aux layers [{}], draft vocab {}, KV {} head-blocks", ids,
               host->draft_head->draft_vocab_size(), slots);
}

#if OASIS_HAVE_CUDA
// Device memory of sparse KV outside the KV pool: block summaries (1/16 of the host store),
// the per-row state (SparseDeviceState) and the pipeline's query snapshots.
size_t SparseDeviceBytes(const SparseConfig& s, const ModelConfig& c, DType kv_dtype, DType dtype) {
  const size_t per_slot =
      HostKvStore::BytesPerSlot(c.num_hidden_layers - s.dense_layers, c.head_dim, kv_dtype);
  const double host_bytes = s.host_kv_gib * 1024.0 * 1024.0 * 1024.0;
  const double remote_bytes = s.remote_kv_gib * 1024.0 * 1024.0 * 1024.0;  // summary-only rows
  const size_t slots =
      per_slot == 0
          ? 0
          : static_cast<size_t>((host_bytes + remote_bytes) / static_cast<double>(per_slot));
  const size_t layers = static_cast<size_t>(c.num_hidden_layers - s.dense_layers);
  // Summaries: e4m3 with FP8 KV (HostKvStore), else the activation dtype.
  const size_t summaries = slots * layers * 2 * static_cast<size_t>(c.head_dim) *
                           DTypeSize(kv_dtype == DType::kF8E4M3 ? kv_dtype : dtype);
  const size_t rows =
      static_cast<size_t>(s.max_sparse_seqs) * static_cast<size_t>(c.num_key_value_heads);
  const size_t mb = static_cast<size_t>((c.max_position_embeddings + kBlockSize - 1) / kBlockSize);
  const size_t per_layer =
      rows *
      (6 * static_cast<size_t>(s.topk_blocks) + 2 * static_cast<size_t>(s.max_fetch()) + 6 + mb) *
      4;
  const size_t snapshots = layers * static_cast<size_t>(s.max_sparse_seqs * s.chain_queries) *
                           static_cast<size_t>(c.num_attention_heads * c.head_dim) *
                           DTypeSize(dtype);
  return summaries + rows * (mb * 8 + static_cast<size_t>(s.topk_blocks) * 4) + layers * per_layer +
         snapshots;
}

CudaGraphOptions GraphOptions(const ServerConfig& sc, const ModelConfig& c) {
  CudaGraphOptions go;
  go.enabled = !sc.enforce_eager;  // eager: sparse steps too (the runner checks `enabled` first)
  go.max_batch = std::min<int64_t>(sc.max_num_seqs, 256);
  go.max_context = c.max_position_embeddings;
  // Speculate chains stack 1 + k query tokens per sequence: graphs for them too.
  if (sc.ResolvedLookahead() == "speculate")
    go.max_query_len = static_cast<int>(std::max<int64_t>(2, 1 + sc.num_speculative_tokens));
  return go;
}

// KV head-blocks per layer that fit on the current device once `model` (and the draft head,
// when it lives there) are loaded. `model` is the served model or one rank's shard (local
// head counts: each GPU's pools hold its own heads).
StatusOr<int64_t> PlanDeviceKvSlots(const ServerConfig& sc, ModelHost* host, const DecoderLM& model,
                                    CudaBackend& backend, bool with_draft_head,
                                    const std::string& who) {
  backend.Synchronize();
  size_t free_bytes = 0, total_bytes = 0;
  OASIS_RETURN_IF_ERROR(
      cuda::ToStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const ModelConfig& c = model.config();
  const DType kv_dtype = KvCacheDtype(backend, c.kv_cache_fp8);
  const int64_t kv_bytes = static_cast<int64_t>(DTypeSize(kv_dtype)),
                act_bytes = static_cast<int64_t>(DTypeSize(backend.activation_dtype()));
  // Activations of the largest step (residual, QKV, MLP, logits in f32) plus runtime slack. A
  // step never holds more tokens than every running sequence's whole context, whatever
  // --max-num-batched-tokens says; a reserve beyond the device is refused by PlanKvCache.
  const int64_t context = std::max<int64_t>(1, c.max_position_embeddings);
  const int64_t step_tokens = sc.max_num_seqs > std::numeric_limits<int64_t>::max() / context
                                  ? sc.max_num_batched_tokens
                                  : std::min(sc.max_num_batched_tokens, sc.max_num_seqs * context);
  const double step_bytes =
      static_cast<double>(step_tokens) *
      static_cast<double>(4 * c.hidden_size + 3 * c.intermediate_size + c.vocab_size) * 4.0;
  size_t reserve = (size_t{1} << 30) +
                   static_cast<size_t>(std::min(step_bytes, static_cast<double>(total_bytes)));
  // Decode graphs of speculate chains (1 + k query tokens) need a larger activation arena.
  const CudaGraphOptions go = GraphOptions(sc, c);
  if (go.max_query_len > 2) {
    reserve +=
        static_cast<size_t>((go.max_query_len - 2) * go.max_batch *
                            (CudaGraphRunner::ArenaTokenBytes(c) +
                             c.num_hidden_layers * CudaGraphRunner::ArenaLayerTokenBytes(c))) +
        static_cast<size_t>(c.num_hidden_layers) *
            CudaBackend::MoeScratchBytes(c, (go.max_query_len - 2) * go.max_batch);
  }
  if (host->sparse) {
    // Each rank's summaries cover its share of the host store (--host-kv-gib is the total).
    SparseConfig mine = *host->sparse;
    mine.host_kv_gib /= static_cast<double>(std::max<int64_t>(1, sc.tensor_parallel_size));
    if (sc.ResolvedLookahead() == "speculate" && mine.predictor == SparsePredictor::kDraft) {
      // The engine's chain queries (MakeSparse): min(k, 16 / G) query snapshots per row.
      const int64_t group = std::max<int64_t>(1, c.num_attention_heads / c.num_key_value_heads);
      mine.chain_queries = static_cast<int32_t>(
          std::clamp<int64_t>(std::min(sc.num_speculative_tokens, 16 / group), 1, 4));
    }
    const size_t sparse_bytes = SparseDeviceBytes(mine, c, kv_dtype, backend.activation_dtype());
    spdlog::info("sparse KV: {:.2f} GiB of device memory for summaries and state",
                 sparse_bytes / double(1 << 30));
    reserve += sparse_bytes;
  }
  // The draft head's pool (as many tokens as the model's, DraftKvSlotsFor) costs as much as
  // ceil(head KV width / model KV width) extra model layers, and its share for the tokens of
  // the host KV store as many bytes up front.
  ModelConfig plan_config = c;
  if (host->sparse && host->sparse->home != KvHome::kHost) {
    // In-place summaries: min and max of each GPU slot's keys in every sparse layer (1/16 of
    // its K/V there: summaries of FP8 pools are e4m3 too), so as many more layers per slot.
    const int64_t ls = c.num_hidden_layers - host->sparse->dense_layers;
    plan_config.num_hidden_layers += (ls + kBlockSize - 1) / kBlockSize;
  }
  if (with_draft_head && host->draft_head) {
    const ModelConfig& h = host->draft_head->config();
    // (The head's KV keeps the activation dtype.)
    const int64_t width = c.num_key_value_heads * c.head_dim * kv_bytes;
    plan_config.num_hidden_layers +=
        (h.num_key_value_heads * h.head_dim * act_bytes + width - 1) / width;
    const int64_t host_blocks =
        HostKvHeadBlocks(*host, c, kv_dtype, std::max<int64_t>(1, sc.tensor_parallel_size));
    const size_t head_bytes =
        static_cast<size_t>(
            DraftKvSlotsFor(host_blocks, c.num_key_value_heads, h.num_key_value_heads) + 1) *
        2 * kBlockSize * static_cast<size_t>(h.head_dim) * DTypeSize(backend.activation_dtype());
    if (host_blocks > 0) {
      spdlog::info("draft head: {:.2f} GiB of device memory for the host store's tokens",
                   head_bytes / double(1 << 30));
      reserve += head_bytes;
    }
  }
  OASIS_ASSIGN_OR_RETURN(KvMemoryPlan plan,
                         PlanKvCache(plan_config, static_cast<size_t>(kv_bytes),
                                     sc.gpu_memory_utilization, total_bytes, free_bytes, reserve));
  spdlog::info("KV cache{}: {} head-blocks per layer ({:.2f} GiB, {} tokens per KV-head group)",
               who, plan.num_slots, plan.budget_bytes / double(1 << 30),
               plan.max_tokens_per_kv_head_group);
  return plan.num_slots;
}

// The weights (one rank's share of them) must fit the current device's free memory: refused
// before any is allocated, for dummy and checkpoint loads alike (an allocation that fails
// part-way is a CHECK abort in the backend). The bytes are a lower bound (the activation
// dtype, or e4m3 where the config keeps FP8 weights): only a model that cannot fit is refused;
// what remains is planned for the KV cache after loading (PlanDeviceKvSlots).
Status CheckDeviceWeights(const ServerConfig& sc, const ModelConfig& c, CudaBackend& backend,
                          const std::string& who) {
  size_t free_bytes = 0, total_bytes = 0;
  OASIS_RETURN_IF_ERROR(
      cuda::ToStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const double bytes =
      WeightBytes(DecoderLM::ExpectedWeights(c), DTypeSize(backend.activation_dtype()),
                  /*at_most_spec_dtype=*/true) /
      static_cast<double>(std::max<int64_t>(1, sc.tensor_parallel_size));
  if (bytes <= static_cast<double>(free_bytes)) return Status::Ok();
  char msg[400];
  std::snprintf(msg, sizeof msg,
                "the model's weights (--load-format %s) need at least %.2f GiB of device memory%s, "
                "more than the %.2f GiB free of %.2f GiB: use a smaller model or config, more "
                "GPUs (--tensor-parallel-size) or GPUs with more memory",
                sc.load_format.c_str(), bytes / double(1 << 30),
                sc.tensor_parallel_size > 1 ? " per GPU" : "", free_bytes / double(1 << 30),
                total_bytes / double(1 << 30));
  return ResourceExhausted(std::string(msg) + who);
}

Status LoadCuda(const ServerConfig& sc, ModelHost* host) {
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda, CudaBackend::Create());
  CudaBackend& backend = *cuda;
  host->backend = std::move(cuda);
  OASIS_RETURN_IF_ERROR(CheckDeviceWeights(sc, host->config, backend, ""));
  OASIS_RETURN_IF_ERROR(LoadWeights(sc, host));
  if (sc.HasDraftModel()) {  // its weights count as used
    OASIS_RETURN_IF_ERROR(LoadDraftHead(sc, host, *host->model, backend));
  }
  CudaGraphOptions go = GraphOptions(sc, host->config);
  OASIS_ASSIGN_OR_RETURN(go.num_kv_slots,
                         PlanDeviceKvSlots(sc, host, *host->model, backend, true, ""));
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<CudaGraphRunner> runner,
                         CudaGraphRunner::Create(*host->model, backend, go));
  host->runner = std::move(runner);
  return Status::Ok();
}

// --tensor-parallel-size N on GPUs 0..N-1 (docs/parallel.md): one worker thread per GPU owns
// that rank's backend, NCCL communicator, shard, KV pools (local heads) and graph runner. The
// checkpoint is opened once (its mapping is shared; each rank reads only its slices). The
// EAGLE-3 head, if any, is loaded on rank 0 (replicated work: its inputs are identical on
// every rank) before rank 0 plans its KV cache, so its weights and pool are counted there.
Status LoadCudaTensorParallel(const ServerConfig& sc, ModelHost* host) {
  const ModelConfig& c = host->config;
  CudaTpOptions options;
  options.size = static_cast<int>(sc.tensor_parallel_size);
  options.graph = GraphOptions(sc, c);
  OASIS_RETURN_IF_ERROR(CheckCudaTensorParallel(c, options));
  if (sc.load_format != "dummy") {
    OASIS_ASSIGN_OR_RETURN(host->weights, OpenSafetensorsWeights(host->model_path));
  }
  CudaTpHooks hooks;
  hooks.load_shard = [&](CudaBackend& backend,
                         const TensorParallel& tp) -> StatusOr<std::unique_ptr<DecoderLM>> {
    OASIS_RETURN_IF_ERROR(
        CheckDeviceWeights(sc, c, backend, " (rank " + std::to_string(tp.rank) + ")"));
    if (sc.load_format == "dummy") return DecoderLM::CreateDummy(c, backend, 0, tp);
    return DecoderLM::Create(c, *host->weights, backend, tp);
  };
  hooks.kv_slots = [&](int rank, CudaBackend& backend, DecoderLM& shard) -> StatusOr<int64_t> {
    const bool draft_here = rank == 0 && sc.HasDraftModel();
    if (draft_here) OASIS_RETURN_IF_ERROR(LoadDraftHead(sc, host, shard, backend));
    return PlanDeviceKvSlots(sc, host, shard, backend, draft_here,
                             " (rank " + std::to_string(rank) + ")");
  };
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<TpModelRunner> runner,
                         CreateCudaTpRunner(c, options, hooks));
  host->runner = std::move(runner);
  return Status::Ok();
}
#endif

// --backend cpu --tensor-parallel-size N: N CPU-reference ranks as threads (tests, CI).
Status LoadCpuTensorParallel(const ServerConfig& sc, ModelHost* host) {
  const ModelConfig& c = host->config;
  const int n = static_cast<int>(sc.tensor_parallel_size);
  OASIS_RETURN_IF_ERROR(CheckTensorParallelSize(c, n));
  if (sc.load_format != "dummy") {
    OASIS_ASSIGN_OR_RETURN(host->weights, OpenSafetensorsWeights(host->model_path));
  }
  CpuTpOptions options;
  options.size = n;
  options.threads_per_rank =
      sc.threads > 0 ? static_cast<int>(std::max<int64_t>(1, sc.threads / n)) : 0;
  OASIS_ASSIGN_OR_RETURN(options.num_kv_slots,
                         CpuKvSlots(sc, LocalConfig(c, TensorParallel{0, n, nullptr}),
                                    c.kv_cache_fp8 ? DType::kF8E4M3 : DType::kF32));
  OASIS_ASSIGN_OR_RETURN(
      std::unique_ptr<TpModelRunner> runner,
      CreateCpuTpRunner(
          c, options,
          [&](Backend& backend, const TensorParallel& tp) -> StatusOr<std::unique_ptr<DecoderLM>> {
            if (sc.load_format == "dummy") return DecoderLM::CreateDummy(c, backend, 0, tp);
            return DecoderLM::Create(c, *host->weights, backend, tp);
          }));
  spdlog::info("KV cache: {} head-blocks per layer per rank ({} CPU ranks)", options.num_kv_slots,
               n);
  host->runner = std::move(runner);
  if (sc.HasDraftModel()) {
    OASIS_RETURN_IF_ERROR(LoadDraftHead(sc, host, host->runner->model(), host->runner->backend()));
  }
  return Status::Ok();
}

// --role prefill: a UCX staging pool of one head-block per slot, its server, the engine's
// exporter. --role decode: the importer that reads from prefill instances.
Status SetUpDisaggregation(const ServerConfig& sc, ModelHost* host) {
  host->role = sc.role;
  if (sc.role == "both") return Status::Ok();
  auto ctx = disagg::UcxContext::Create({.transports = sc.ucx_tls});
  if (!ctx.ok()) return Unavailable("--role " + sc.role + ": UCX: " + ctx.status().ToString());
  host->ucx = *ctx;
  OASIS_ASSIGN_OR_RETURN(const std::string secret, ResolveStagingSecret(sc));
  if (sc.role == "decode") {
    disagg::RemoteKvImporterOptions importer_options;
    importer_options.reader.secret = secret;  // sent in every hello to a prefill instance
    host->importer = disagg::RemoteKvImporter::Create(host->ucx, importer_options);
    host->full_transfer = sc.rpf == "off";
    spdlog::info(
        "decode instance: {} (remote fetch cap {} blocks per head per step)",
        host->full_transfer ? "full KV transfer at admission (--rpf off)" : "remote partial fetch",
        host->sparse ? host->sparse->remote_fetch_cap : 0);
    return Status::Ok();
  }
  const ModelConfig& c = host->config;
  // One K or V head-block in the KV cache's dtype (e4m3 with --kv-cache-dtype fp8).
  const uint64_t block_bytes = uint64_t{kBlockSize} * static_cast<uint64_t>(c.head_dim) *
                               DTypeSize(KvCacheDtype(host->runner->backend(), c.kv_cache_fp8));
  double gib = sc.staging_pool_gib;
  if (gib <= 0) {
    const double ram =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    gib = ram / 4.0 / (1024.0 * 1024.0 * 1024.0);
  }
  // (--staging-pool-gib is at most kMaxGib (ServerConfig::Validate): the block count fits.)
  const auto blocks =
      static_cast<uint64_t>(gib * 1024.0 * 1024.0 * 1024.0 / static_cast<double>(block_bytes));
  if (blocks == 0)
    return InvalidArgument("--staging-pool-gib " + std::to_string(gib) + " holds no head-block");
  const auto ttl = std::chrono::milliseconds(sc.staging_lease_ttl_ms);
  auto pool = disagg::StagingPool::Create(
      host->ucx, {.block_bytes = block_bytes, .num_blocks = blocks, .default_lease_ttl = ttl});
  if (!pool.ok())
    return Unavailable("staging pool of " + std::to_string(gib) +
                       " GiB: " + pool.status().ToString());
  host->staging_pool = std::move(*pool);
  const std::string listen = sc.ResolvedStagingListen();
  auto server = disagg::StagingServer::Start(host->ucx, host->staging_pool.get(),
                                             {.listen_address = listen, .secret = secret});
  if (!server.ok()) {
    if (server.status().code() == StatusCode::kInvalidArgument) {
      return server.status().WithContext("--staging-listen " + listen);
    }
    return Unavailable("staging server on " + listen + ": " + server.status().ToString());
  }
  host->staging_server = std::move(*server);
  // What decode instances connect to: the advertised host (or the listen host, or this
  // machine's name for a wildcard listener) and the bound port.
  const std::string bound = host->staging_server->address();
  const std::string port = bound.substr(bound.rfind(':') + 1);
  std::string adv = sc.staging_advertise;
  if (adv.empty()) {
    adv = listen.substr(0, listen.rfind(':'));
    if (adv.empty() || adv == "0.0.0.0" || adv == "::" || adv == "[::]") {
      char name[256] = {};
      adv = gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
    }
  }
  const std::string address = adv + ":" + port;
  host->exporter = std::make_unique<disagg::StagingExporter>(*host->staging_pool, address, ttl);
  spdlog::info(
      "prefill instance: staging pool {:.2f} GiB ({} head-blocks of {} B), listening on {}, "
      "tickets name {} (lease TTL {} ms), {}",
      gib, blocks, block_bytes, bound, address, sc.staging_lease_ttl_ms,
      secret.empty() ? "no secret (loopback only)" : "decode instances need the staging secret");
  return Status::Ok();
}

// --generation-config: the request defaults and the extra EOS ids (before the model is built:
// the engine takes its EOS ids from the model's config), with vLLM's start-up notice.
Status ApplyGenerationConfig(const ServerConfig& sc, ModelHost* host) {
  OASIS_ASSIGN_OR_RETURN(host->generation,
                         ResolveGenerationDefaults(sc.generation_config, host->model_path));
  const GenerationDefaults& g = host->generation;
  ModelConfig& c = host->config;
  const std::vector<int64_t> eos = MergeTokenIds(c.eos_token_ids, g.eos_token_ids);
  if (eos.size() > c.eos_token_ids.size()) {
    spdlog::info("EOS token ids {} (config.json and {})", nlohmann::json(eos).dump(), g.source);
  }
  // An EOS id the model cannot produce never ends a generation (the engine skips it): said.
  std::vector<int64_t> outside;
  std::copy_if(eos.begin(), eos.end(), std::back_inserter(outside),
               [&](int64_t id) { return id < 0 || id >= c.vocab_size; });
  if (!outside.empty()) {
    spdlog::warn(
        "EOS token ids {} are outside the vocabulary (vocab_size {}): they never end a "
        "generation and are ignored",
        nlohmann::json(outside).dump(), c.vocab_size);
  }
  c.eos_token_ids = eos;
  if (!g.applied.empty()) {
    std::string list;
    for (const std::string& a : g.applied) list += (list.empty() ? "" : ", ") + a;
    spdlog::warn(
        "Default sampling parameters have been overridden by the model's Hugging Face generation "
        "config ({}): {}. Requests that set a parameter override it; start with "
        "--generation-config vllm for vLLM's neutral defaults.",
        g.source, list);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::optional<SparseConfig>> ResolveSparseConfig(const ServerConfig& sc,
                                                          const ModelConfig& c) {
  if (!sc.SparseEnabled()) return std::optional<SparseConfig>();
  SparseConfig s;
  // A request switches once its context exceeds the threshold: at or past the model's context
  // none ever does. Asked for by --sparse on, that is an error; --sparse auto (a threshold given)
  // turns sparse KV off instead, with no host store. (Prefill and decode instances run every
  // request sparse whatever the threshold.)
  const int64_t context = c.max_position_embeddings;
  if (sc.role == "both" && sc.ResolvedSparseThreshold() >= context) {
    const std::string threshold =
        sc.sparse_threshold > 0
            ? "--sparse-threshold " + std::to_string(sc.sparse_threshold)
            : "--sparse-threshold 0 (with --sparse on: (--topk-blocks + 1) x 16 = " +
                  std::to_string(sc.ResolvedSparseThreshold()) + ")";
    const std::string why = threshold + " is not below the model's context of " +
                            std::to_string(context) +
                            " tokens (--max-model-len, default the model's "
                            "max_position_embeddings): no request can pass it";
    if (sc.sparse == "on") {
      return InvalidArgument(why + ", so sparse KV (--sparse on) would never engage: give a " +
                             "--sparse-threshold below " + std::to_string(context));
    }
    spdlog::warn("{}; sparse KV is off (no host KV store): give a --sparse-threshold below {}", why,
                 context);
    return std::optional<SparseConfig>();
  }
  if (sc.topk_blocks > (int64_t{1} << 20))
    return InvalidArgument("--topk-blocks " + std::to_string(sc.topk_blocks) + " is too large");
  s.topk_blocks = static_cast<int32_t>(sc.topk_blocks);
  s.fetch_ratio = sc.fetch_ratio;
  s.sparse_threshold = sc.ResolvedSparseThreshold();
  if (sc.dense_layers >= c.num_hidden_layers) {
    return InvalidArgument("--dense-layers " + std::to_string(sc.dense_layers) +
                           " must be below the model's " + std::to_string(c.num_hidden_layers) +
                           " layers");
  }
  s.dense_layers = static_cast<int32_t>(sc.dense_layers);
  // Auto (0): half the memory available now (a quarter of RAM if unknown), less the prefix
  // cache's host tier, at least a quarter of that half. The store as sized and the tier must
  // fit together (exit 2 otherwise, as CheckHostMemory's refusals): on CUDA both are pinned.
  const std::optional<double> avail = AvailableHostMemoryGiB();
  s.host_kv_gib = ResolvedHostKvGib(sc, avail, PhysicalHostMemoryGiB());
  if (Status fits = CheckHostKvFits(sc, s.host_kv_gib, avail, PhysicalHostMemoryGiB());
      !fits.ok()) {
    return ResourceExhausted(fits.message());
  }
  OASIS_ASSIGN_OR_RETURN(s.predictor, ParseSparsePredictor(sc.ResolvedSparsePredictor()));
  OASIS_ASSIGN_OR_RETURN(s.group_reduce, ParseGroupReduce(sc.sparse_group_reduce));
  OASIS_ASSIGN_OR_RETURN(s.home, ParseKvHome(sc.kv_home));
  OASIS_ASSIGN_OR_RETURN(s.budget, ParseSparseBudget(sc.sparse_budget));
  s.switch_on_pressure = sc.ResolvedSparseSwitch() == "pressure";
  // (--max-sparse-seqs is at most kMaxSparseSeqs: ServerConfig::Validate.)
  s.max_sparse_seqs = static_cast<int32_t>(std::min<int64_t>(
      sc.max_sparse_seqs > 0 ? sc.max_sparse_seqs : sc.max_num_seqs, kMaxSparseSeqs));
  if (sc.max_sparse_seqs > sc.max_num_seqs) {
    spdlog::info(
        "--max-sparse-seqs {} exceeds --max-num-seqs {}: no more than {} requests run at once, "
        "so no more than that many are sparse",
        sc.max_sparse_seqs, sc.max_num_seqs, sc.max_num_seqs);
  } else if (sc.max_sparse_seqs == 0 && sc.max_num_seqs > kMaxSparseSeqs) {
    spdlog::info(
        "sparse requests at once: {} (the most; --max-sparse-seqs 0 is --max-num-seqs {}): "
        "more stay dense until a row frees",
        kMaxSparseSeqs, sc.max_num_seqs);
  }
  s.max_seq_len = c.max_position_embeddings;  // the engine sets its own context length
  s.agreement_interval =
      static_cast<int32_t>(std::min<int64_t>(sc.sparse_agreement_interval, 1 << 30));
  s.transfers = sc.sparse_transfers == "on";
  if (sc.role == "decode" &&
      sc.rpf == "on") {  // remote blocks: listed by select, fetched by the engine
    s.remote_fetch_cap = static_cast<int32_t>(std::min<int64_t>(
        sc.remote_fetch_cap > 0 ? sc.remote_fetch_cap : s.max_fetch(), s.topk_blocks));
    s.remote_kv_gib = sc.remote_kv_gib < 0 ? s.host_kv_gib : sc.remote_kv_gib;
  }
  if (sc.role != "both") s.sparse_threshold = std::max<int64_t>(s.sparse_threshold, 1);
  OASIS_RETURN_IF_ERROR(s.Validate(c.num_hidden_layers));
  return std::optional<SparseConfig>(s);
}

std::vector<int64_t> CapacityLengths(const ModelHost& host) {
  std::vector<int64_t> out;
  for (int64_t t : {int64_t{16384}, int64_t{32768}}) {
    if (t <= host.max_model_len()) out.push_back(t);
  }
  if (out.empty()) out.push_back(host.max_model_len());
  return out;
}

// Refuses a KV cache that cannot hold one request of the whole context, as vLLM refuses to
// start then: a request of that length could never run. Names the numbers and the flags.
Status CheckFullContextFits(const ServerConfig& sc, const ModelHost& host) {
  const int64_t context = host.max_model_len();
  const KvCapacity k = host.engine->CapacityAt(context);
  if (k.dense > 0 || (host.sparse && k.sparse > 0)) return Status::Ok();
  // The longest request the GPU/CPU pool holds: its head-blocks per KV head, 16 tokens each.
  const int64_t heads = std::max<int64_t>(1, host.runner->model().config().num_key_value_heads);
  const int64_t slots = host.runner->num_kv_slots();
  const int64_t fits = slots / heads * kBlockSize;
  const bool cpu = host.backend_name == "cpu";
  const int64_t need_slots = HeadBlockTable::SlotsFor(context, static_cast<int32_t>(heads));
  std::string raise =
      cpu ? "raise --num-kv-slots to at least " +
                std::to_string(need_slots * std::max<int64_t>(1, sc.tensor_parallel_size)) +
                " (0 sizes the pool by itself)"
          : "raise --gpu-memory-utilization (now " + std::to_string(sc.gpu_memory_utilization) +
                ")";
  return InvalidArgument(
      "the model's context of " + std::to_string(context) +
      " tokens (--max-model-len, default the model's max_position_embeddings) is larger than the " +
      std::to_string(fits) + " tokens the KV cache can hold for one request (" +
      std::to_string(slots) + " head-blocks per layer" + (cpu ? ", --num-kv-slots" : "") +
      (host.sparse ? "; the sparse host store holds none either" : "") + "): " + raise +
      (fits > 0 ? ", or lower --max-model-len to at most " + std::to_string(fits) : ""));
}

ModelHost::~ModelHost() {
  if (engine) engine->Stop();
}

std::string AutoBackend() {
#if OASIS_HAVE_CUDA
  if (cuda::DeviceCount() > 0) return "cuda";
#endif
  return "cpu";
}

// LoadModelHost's work; std::bad_alloc escapes it.
StatusOr<std::unique_ptr<ModelHost>> LoadModelHostOrThrow(const ServerConfig& given);

// --kv-cache-dtype fp8: the per-KV-head scales from the built-in calibration text (or, without
// a tokenizer, pseudo-random ids), before the engine owns the pools (kv_calibration.h).
Status CalibrateFp8Kv(const ServerConfig& sc, ModelHost* host) {
  const ModelConfig& c = host->config;
  std::vector<int32_t> text;
  if (host->tokenizer)
    text = host->tokenizer->Encode(KvCalibrationText(), tokenizer::AddSpecialTokens::kNo);
  std::vector<int32_t> tokens = KvCalibrationTokens(std::move(text), c.vocab_size, 1024);
  // Within the context, and ids the model has (a tokenizer larger than the model).
  if (static_cast<int64_t>(tokens.size()) > c.max_position_embeddings)
    tokens.resize(static_cast<size_t>(c.max_position_embeddings));
  for (int32_t& id : tokens)
    if (id >= c.vocab_size) id = static_cast<int32_t>(id % c.vocab_size);
  auto cal = CalibrateKvScales(*host->runner, tokens, sc.max_num_batched_tokens);
  if (!cal.ok()) return cal.status();
  spdlog::info(
      "KV cache: fp8 e4m3, per-KV-head scales from {} calibration tokens ({}): max |K| {:.4g}, "
      "max |V| {:.4g}; K scales {:.4g}..{:.4g}, V scales {:.4g}..{:.4g}",
      cal->tokens, host->tokenizer ? "the built-in text" : "pseudo-random ids", cal->max_k_amax,
      cal->max_v_amax, cal->min_k_scale, cal->max_k_scale, cal->min_v_scale, cal->max_v_scale);
  return Status::Ok();
}

StatusOr<std::unique_ptr<ModelHost>> LoadModelHost(const ServerConfig& given) {
  // Out of host memory while loading is an error exit, never an abort (bad_alloc from a
  // tensor, a table or the tokenizer on this thread).
  try {
    return LoadModelHostOrThrow(given);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(
        "out of host memory while loading " +
        (given.model.empty() ? EmbeddedModelDir() + " (the embedded model)" : given.model) +
        " (--load-format " + given.load_format + ")");
  }
}

StatusOr<std::unique_ptr<ModelHost>> LoadModelHostOrThrow(const ServerConfig& given) {
  auto host = std::make_unique<ModelHost>();
  // The settings with their "auto" values resolved once the backend is known.
  ServerConfig resolved = given;
  const ServerConfig& sc = resolved;
  host->model_path = sc.model.empty() ? EmbeddedModelDir() : sc.model;
  if (fs::exists(host->model_path) && !fs::is_directory(host->model_path)) {
    return InvalidArgument("--model " + host->model_path +
                           " is a file: give the model's directory (config.json, *.safetensors, "
                           "tokenizer.json)");
  }
  host->model_dir = ModelNameFromPath(host->model_path);
  OASIS_ASSIGN_OR_RETURN(host->config, LoadModelConfig(host->model_path));
  ModelConfig& c = host->config;
  c.kv_cache_fp8 = sc.KvCacheFp8();
  OASIS_RETURN_IF_ERROR(ApplyGenerationConfig(sc, host.get()));
  if (sc.max_model_len > 0) {
    if (sc.max_model_len > c.max_position_embeddings) {
      return InvalidArgument("--max-model-len " + std::to_string(sc.max_model_len) +
                             " exceeds the model's max_position_embeddings " +
                             std::to_string(c.max_position_embeddings));
    }
    c.max_position_embeddings = sc.max_model_len;
  }
  if (c.rope_scaling.type != RopeScalingType::kNone) {
    spdlog::info("RoPE scaling {} (factor {}), context {} tokens",
                 RopeTypeName(c.rope_scaling.type), c.rope_scaling.factor,
                 c.max_position_embeddings);
  }
  host->backend_name = sc.backend == "auto" ? AutoBackend() : sc.backend;
  size_t min_device_bytes = 0;
#if OASIS_HAVE_CUDA
  if (host->backend_name == "cuda")
    min_device_bytes =
        cuda::MinDeviceTotalMemory(static_cast<int>(std::max<int64_t>(1, sc.tensor_parallel_size)));
#endif
  resolved.max_num_batched_tokens =
      sc.ResolvedMaxNumBatchedTokens(host->backend_name, min_device_bytes);
  host->max_num_batched_tokens = sc.max_num_batched_tokens;
  if (given.max_num_batched_tokens == 0)
    spdlog::info("engine steps: up to {} tokens (--max-num-batched-tokens auto, {})",
                 sc.max_num_batched_tokens,
                 min_device_bytes > 0
                     ? fmt::format("{:.0f} GiB GPU", static_cast<double>(min_device_bytes) /
                                                         static_cast<double>(size_t{1} << 30))
                     : host->backend_name + " backend");
  OASIS_ASSIGN_OR_RETURN(host->sparse, ResolveSparseConfig(sc, c));
  OASIS_RETURN_IF_ERROR(LoadTokenizerAndTemplate(sc, host.get()));
  if (host->tokenizer && host->tokenizer->vocab_size() > c.vocab_size) {
    spdlog::warn("tokenizer has {} ids but the model only {}: larger ids are rejected",
                 host->tokenizer->vocab_size(), c.vocab_size);
  }
  // Structured output's token masks walk every token's bytes: sorted once here.
  if (host->tokenizer)
    host->grammar_vocab = structured::TokenVocabulary::Build(*host->tokenizer, c.vocab_size);
  const bool tensor_parallel = sc.tensor_parallel_size > 1;
  if (tensor_parallel) {
    OASIS_RETURN_IF_ERROR(CheckTensorParallelSize(c, static_cast<int>(sc.tensor_parallel_size)));
  }
  if (host->backend_name == "cuda") {
#if OASIS_HAVE_CUDA
    // Sparse KV's scoring kernel has narrower shapes than the dense path (kernel_shapes.h);
    // the dense shapes are checked as the model loads (DecoderLM::Create).
    if (host->sparse) OASIS_RETURN_IF_ERROR(CheckCudaSparseShapes(c));
    OASIS_RETURN_IF_ERROR(tensor_parallel ? LoadCudaTensorParallel(sc, host.get())
                                          : LoadCuda(sc, host.get()));
#else
    return Unimplemented(
        "--backend cuda: this oasis-server was built without CUDA (configure with "
        "-DOASIS_CUDA=ON)");
#endif
  } else if (tensor_parallel) {
    OASIS_RETURN_IF_ERROR(CheckHostWeights(sc, c));  // the ranks' shards together
    OASIS_RETURN_IF_ERROR(LoadCpuTensorParallel(sc, host.get()));
  } else {
    OASIS_RETURN_IF_ERROR(CheckHostWeights(sc, c));
    host->backend = std::make_unique<CpuBackend>(static_cast<int>(sc.threads));
    OASIS_RETURN_IF_ERROR(LoadWeights(sc, host.get()));
    if (sc.HasDraftModel())
      OASIS_RETURN_IF_ERROR(LoadDraftHead(sc, host.get(), *host->model, *host->backend));
    OASIS_ASSIGN_OR_RETURN(const int64_t slots,
                           CpuKvSlots(sc, c, KvCacheDtype(*host->backend, c.kv_cache_fp8)));
    spdlog::info("KV cache: {} head-blocks per layer (CPU)", slots);
    host->runner = std::make_unique<ModelRunner>(*host->model, *host->backend, slots);
  }
  if (host->draft_head) MakeDraftRunner(host.get());
  if (c.kv_cache_fp8) OASIS_RETURN_IF_ERROR(CalibrateFp8Kv(sc, host.get()));
  OASIS_ASSIGN_OR_RETURN(host->lookahead, ParseLookaheadMode(sc.ResolvedLookahead()));
  EngineOptions options;
  options.lookahead = host->lookahead;
  options.num_speculative_tokens =
      host->lookahead == LookaheadMode::kSpeculate ? sc.num_speculative_tokens : 1;
  OASIS_ASSIGN_OR_RETURN(options.speculative_depth, ParseSpeculativeDepth(sc.speculative_depth));
  options.max_num_seqs = sc.max_num_seqs;
  options.max_num_batched_tokens = sc.max_num_batched_tokens;
  options.enable_prefix_caching = sc.ResolvedPrefixCaching();
  options.prefix_cache_host_bytes = sc.prefix_cache_host_gib * 1024.0 * 1024.0 * 1024.0;
  if (options.enable_prefix_caching && sc.role == "decode")
    spdlog::info(
        "prefix caching: imported prompt blocks stay in the host KV store for later "
        "imports of the same prefix");
  options.max_waiting = sc.max_waiting;
  options.seed = static_cast<uint64_t>(sc.seed);
  options.sparse = host->sparse;
  OASIS_RETURN_IF_ERROR(SetUpDisaggregation(sc, host.get()));
  options.handoff_exporter = host->exporter.get();
  OASIS_RETURN_IF_ERROR(Engine::CheckOptions(options, *host->runner, host->draft_runner.get()));
  try {  // the engine pins the host KV store: a machine that cannot is an error, not a crash
    host->engine = std::make_unique<Engine>(*host->runner, host->tokenizer.get(), options,
                                            host->draft_runner.get());
  } catch (const StatusError& e) {
    return e.status();
  } catch (const std::runtime_error& e) {  // TP: a rank's failure, rethrown naming the rank
    return Internal(std::string("starting the engine: ") + e.what());
  }
  if (options.prefix_cache_host_bytes > 0) {
    const int64_t blocks = host->engine->Stats().kv.prefix_cache_host_capacity_blocks;
    spdlog::info("prefix cache host tier: {:.4g} GiB pinned, {} blocks ({} tokens)",
                 sc.prefix_cache_host_gib, blocks, blocks * kBlockSize);
  }
  OASIS_RETURN_IF_ERROR(CheckFullContextFits(sc, *host));
  for (int64_t tokens : CapacityLengths(*host)) {
    const KvCapacity k = host->engine->CapacityAt(tokens);
    if (host->sparse) {
      spdlog::info(
          "capacity at {} tokens per request: dense {} requests, sparse {} (HBM {} + host {})",
          tokens, k.dense, k.sparse, k.hbm, k.host);
    } else {
      spdlog::info("capacity at {} tokens per request: {} requests", tokens, k.dense);
    }
  }
  host->engine->Start();
  return host;
}

}  // namespace oasis::server

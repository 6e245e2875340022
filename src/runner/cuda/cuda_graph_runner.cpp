#include "runner/cuda/cuda_graph_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/logging.h"
#include "common/tuning.h"
#include "kernels/attention_decode.h"

namespace oasis {
namespace {

size_t AlignUp(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

CudaGraphRunner::CudaGraphRunner(DecoderLM& model, CudaBackend& backend, CudaGraphOptions options)
    : ModelRunner(model, backend, options.num_kv_slots),
      cuda_(backend),
      options_(options),
      num_kv_heads_(model.config().num_key_value_heads),
      max_blocks_((options.max_context + kBlockSize - 1) / kBlockSize),
      sparse_sync_(backend, model.config().num_hidden_layers) {
  for (int64_t b :
       {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512}) {
    if (b < options_.max_batch) buckets_.push_back(b);
  }
  buckets_.push_back(options_.max_batch);
}

StatusOr<std::unique_ptr<CudaGraphRunner>> CudaGraphRunner::Create(DecoderLM& model,
                                                                   CudaBackend& backend,
                                                                   CudaGraphOptions options) {
  if (options.max_batch < 1 || options.max_context < 1)
    return InvalidArgument("graph max_batch/max_context < 1");
  if (options.max_query_len < 2 || options.max_query_len > kMaxQueryLenLimit)
    return InvalidArgument("graph max_query_len must be in [2, " +
                           std::to_string(kMaxQueryLenLimit) + "], got " +
                           std::to_string(options.max_query_len));
  const int64_t max_q = options.max_query_len;
  std::unique_ptr<CudaGraphRunner> r(new CudaGraphRunner(model, backend, options));
  const int64_t B = options.max_batch, H = r->num_kv_heads_, Tmax = B * max_q;
  Layout& l = r->layout_;
  size_t off = 0;
  l.ids = off, off = AlignUp(off + Tmax * 4);
  l.pos = off, off = AlignUp(off + Tmax * 4);
  l.slots = off, off = AlignUp(off + Tmax * H * 8);
  l.qstart = off, off = AlignUp(off + (B + 1) * 4);
  l.kv_lens = off, off = AlignUp(off + B * H * 4);
  l.tables = off, off = AlignUp(off + B * H * r->max_blocks_ * 4);
  l.rows = off, off = AlignUp(off + Tmax * 4);
  l.total = off;
  OASIS_ASSIGN_OR_RETURN(r->inputs_, cuda::DeviceBuffer::Allocate(l.total));
  OASIS_ASSIGN_OR_RETURN(r->staging_, cuda::PinnedBuffer::Allocate(l.total));
  // Activation arena for the largest step (max_batch sequences × max_query_len tokens): every
  // per-token tensor of one forward pass (see DecoderLM::Forward), float logits, a residual
  // capture of up to kMaxCaptureLayers layers, and alignment slack.
  const ModelConfig& c = model.config();
  const int64_t per_token = ArenaTokenBytes(c);
  // Plus the decode-attention workspace of the largest bucket (split partials).
  size_t workspace = 0;
  for (int64_t b : r->buckets_) {
    kernels::DecodeAttentionParams p;
    p.tokens = b * max_q;
    p.num_seqs = static_cast<int>(b);
    p.num_q_heads = static_cast<int>(c.num_attention_heads);
    p.num_kv_heads = static_cast<int>(c.num_key_value_heads);
    p.head_dim = static_cast<int>(c.head_dim);
    p.max_blocks = static_cast<int>(r->max_blocks_);
    p.max_query_len = static_cast<int>(max_q);
    p.max_kv_len = static_cast<int>(r->max_blocks_ * kBlockSize);
    // The FP8 kernel plans its own split count (another page size and ring depth).
    if (c.kv_cache_fp8) p.kv_dtype = kernels::KvDtype::kFp8E4M3;
    workspace = std::max(workspace, kernels::DecodeAttentionWorkspaceBytes(p));
  }
  // The arena never frees inside a forward pass, so per-layer temporaries add up: the decode
  // workspace, and the activations an unfused op allocates per layer — the [gate | up]
  // product of the unfused gate/up + SiLU (batches the GEMV does not take), K/V for a backend
  // without the fused QKV op, the normalised rows of the unfused pre-norm + projection (twice)
  // — plus alignment slack.
  const int64_t per_layer =
      static_cast<int64_t>(workspace) + Tmax * ArenaLayerTokenBytes(c) + 4096 +
      static_cast<int64_t>(CudaBackend::MoeScratchBytes(c, Tmax));  // MoE layers' scratch
  OASIS_ASSIGN_OR_RETURN(r->arena_,
                         cuda::DeviceBuffer::Allocate(static_cast<size_t>(
                             Tmax * per_token + c.num_hidden_layers * per_layer + (1 << 20))));
  OASIS_ASSIGN_OR_RETURN(
      r->host_logits_, cuda::PinnedBuffer::Allocate(static_cast<size_t>(Tmax * c.vocab_size) * 4));
  return r;
}

int64_t CudaGraphRunner::ArenaTokenBytes(const ModelConfig& c) {
  constexpr int64_t kMaxCaptureLayers = 8;
  return 2 * (4 * c.hidden_size + 2 * (c.q_size() + 2 * c.kv_size()) + c.q_size() +
              3 * c.intermediate_size + c.hidden_size + kMaxCaptureLayers * c.hidden_size) +
         4 * c.vocab_size;
}

int64_t CudaGraphRunner::ArenaLayerTokenBytes(const ModelConfig& c) {
  return 2 * (2 * c.intermediate_size + 2 * c.kv_size() + 2 * c.hidden_size);
}

CudaGraphRunner::~CudaGraphRunner() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
}

std::optional<CudaGraphRunner::GraphKey> CudaGraphRunner::KeyFor(
    const ForwardInput& in, const std::vector<int64_t>* capture_layers) const {
  if (!options_.enabled) return std::nullopt;
  const int64_t seqs = in.attention.query_start.numel() - 1, T = in.token_ids.numel(),
                R = in.logit_rows.numel();
  const int q = in.attention.max_query_len;
  if (seqs < 1 || seqs > options_.max_batch || q < 1 || q > options_.max_query_len ||
      T != seqs * q || R % seqs != 0 || in.attention.block_tables.dim(2) > max_blocks_ ||
      in.attention.kv_lens.dim(1) != num_kv_heads_) {
    return std::nullopt;
  }
  const int32_t* qs = in.attention.query_start.data<int32_t>();
  for (int64_t i = 0; i <= seqs; ++i) {
    if (qs[i] != i * q) return std::nullopt;  // every sequence has exactly q query tokens
  }
  const int r = static_cast<int>(R / seqs);
  if (r != 1 && r != q) return std::nullopt;
  GraphKey key;
  key.bucket = BucketFor(seqs);
  key.query_len = q;
  key.rows_per_seq = r;
  const int64_t full = max_blocks_ * kBlockSize,
                need = in.attention.max_kv_len > 0 ? in.attention.max_kv_len : full;
  key.kv_bound = full;
  for (int64_t b = 1024; b < full; b *= 2) {
    if (need <= b) {
      key.kv_bound = b;
      break;
    }
  }
  if (capture_layers != nullptr) key.capture_layers = *capture_layers;
  return key;
}

int64_t CudaGraphRunner::BucketFor(int64_t batch) const {
  return *std::lower_bound(buckets_.begin(), buckets_.end(), batch);
}

ForwardInput CudaGraphRunner::StaticInputs(const GraphKey& key) const {
  char* base = static_cast<char*>(inputs_.data());
  const int64_t H = num_kv_heads_, B = key.bucket, T = B * key.query_len;
  ForwardInput in;
  in.token_ids = Tensor(base + layout_.ids, DType::kI32, {T}, Device::kCuda);
  in.positions = Tensor(base + layout_.pos, DType::kI32, {T}, Device::kCuda);
  in.slot_mapping = Tensor(base + layout_.slots, DType::kI64, {T, H}, Device::kCuda);
  in.attention.query_start = Tensor(base + layout_.qstart, DType::kI32, {B + 1}, Device::kCuda);
  in.attention.kv_lens = Tensor(base + layout_.kv_lens, DType::kI32, {B, H}, Device::kCuda);
  in.attention.block_tables =
      Tensor(base + layout_.tables, DType::kI32, {B, H, max_blocks_}, Device::kCuda);
  in.attention.max_query_len = key.query_len;
  in.attention.max_kv_len = static_cast<int32_t>(key.kv_bound);  // fixed for the graph
  in.logit_rows = Tensor(base + layout_.rows, DType::kI32, {B * key.rows_per_seq}, Device::kCuda);
  return in;
}

void CudaGraphRunner::PackInputs(const ForwardInput& in, const GraphKey& key) {
  const int64_t b = in.attention.query_start.numel() - 1, B = key.bucket, q = key.query_len;
  const int64_t t = b * q, T = B * q, R = in.logit_rows.numel(), RB = B * key.rows_per_seq;
  const int64_t H = num_kv_heads_, width = in.attention.block_tables.dim(2);
  char* s = static_cast<char*>(staging_.data());
  auto* ids = reinterpret_cast<int32_t*>(s + layout_.ids);
  auto* pos = reinterpret_cast<int32_t*>(s + layout_.pos);
  auto* slots = reinterpret_cast<int64_t*>(s + layout_.slots);
  auto* qstart = reinterpret_cast<int32_t*>(s + layout_.qstart);
  auto* lens = reinterpret_cast<int32_t*>(s + layout_.kv_lens);
  auto* tables = reinterpret_cast<int32_t*>(s + layout_.tables);
  auto* rows = reinterpret_cast<int32_t*>(s + layout_.rows);
  std::memcpy(ids, in.token_ids.raw(), t * 4);
  std::memcpy(pos, in.positions.raw(), t * 4);
  std::memcpy(slots, in.slot_mapping.raw(), t * H * 8);
  std::memcpy(lens, in.attention.kv_lens.raw(), b * H * 4);
  std::memcpy(rows, in.logit_rows.raw(), R * 4);
  std::memset(tables, 0, B * H * max_blocks_ * 4);
  for (int64_t r = 0; r < b * H; ++r) {
    std::memcpy(tables + r * max_blocks_, in.attention.block_tables.data<int32_t>() + r * width,
                width * 4);
  }
  for (int64_t i = 0; i <= B; ++i) qstart[i] = static_cast<int32_t>(i * q);
  for (int64_t i = t; i < T; ++i) {  // padding tokens: token 0 at position 0, write nothing
    ids[i] = 0;
    pos[i] = 0;
    for (int64_t h = 0; h < H; ++h) slots[i * H + h] = -1;
  }
  for (int64_t i = b * H; i < B * H; ++i)
    lens[i] = static_cast<int32_t>(q);  // padding sequences read slot 0
  for (int64_t i = R; i < RB; ++i) rows[i] = 0;
  OASIS_CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), staging_.data(), layout_.total,
                                   cudaMemcpyHostToDevice, cuda_.stream()));
}

CudaGraphRunner::Graph CudaGraphRunner::Capture(const GraphKey& key,
                                                SparseAttentionPipeline* pipeline) {
  ForwardInput in = StaticInputs(key);
  const ModelConfig& c = model_.config();
  const int64_t T = key.bucket * key.query_len;
  auto forward = [&](Graph& g) {
    cuda_.BeginArena(arena_.data(), arena_.size());
    ResidualCapture capture;
    if (!key.capture_layers.empty()) {
      capture.layer_ids = key.capture_layers;
      capture.out = cuda_.Empty({static_cast<int64_t>(key.capture_layers.size()), T, c.hidden_size},
                                DType::kBF16);
      g.capture = capture.out;
    }
    if (pipeline != nullptr) {
      pipeline->BeginPlannedStep(in.attention, in.slot_mapping);
      try {
        g.logits =
            model_.Forward(in, kv_, key.capture_layers.empty() ? nullptr : &capture, pipeline);
      } catch (...) {
        pipeline->EndStep();
        throw;
      }
      pipeline->EndStep();  // joins the side streams into the capture
    } else {
      g.logits = model_.Forward(in, kv_, key.capture_layers.empty() ? nullptr : &capture);
    }
    cuda_.EndArena();
  };
  Graph g;
  if (pipeline == nullptr) {
    // Warm-up outside capture: cuBLAS heuristics, RoPE tables and any lazy set-up happen here.
    forward(g);
    cuda_.Synchronize();
  }

  cudaGraph_t graph = nullptr;
  OASIS_CUDA_CHECK(cudaStreamBeginCapture(cuda_.stream(), cudaStreamCaptureModeThreadLocal));
  sparse_sync_.SetCapturing(pipeline != nullptr);
  try {
    forward(g);
  } catch (...) {
    sparse_sync_.SetCapturing(false);
    cudaStreamEndCapture(cuda_.stream(), &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    cuda_.FreeDeferred();
    if (pipeline != nullptr) sparse_sync_.AfterCapture();
    throw;
  }
  sparse_sync_.SetCapturing(false);
  OASIS_CUDA_CHECK(cudaStreamEndCapture(cuda_.stream(), &graph));
  cuda_.FreeDeferred();  // what the capture let go of (allocations from before it)
  if (pipeline != nullptr) sparse_sync_.AfterCapture();
  // Node priorities: a captured kernel keeps its stream's priority as a node attribute, but a
  // graph runs every node at the priority of the stream it is launched into unless told to
  // use the nodes' own. Sparse steps need them: the gather (transfer stream, greatest
  // priority) got 13-14 GB/s instead of ~48 beside the step's HBM-bound kernels at equal
  // priority (bench_sparse_kv), and the sparse graphs ran their transfers at the main
  // stream's priority.
  OASIS_CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, cudaGraphInstantiateFlagUseNodePriority));
  OASIS_CUDA_CHECK(cudaGraphDestroy(graph));
  spdlog::debug(
      "captured {}decode graph: bucket {}, {} query tokens, {} logits rows per sequence, KV bound "
      "{}, {} "
      "capture layers",
      key.sparse != nullptr ? "sparse " : "", key.bucket, key.query_len, key.rows_per_seq,
      key.kv_bound, key.capture_layers.size());
  return g;
}

const CudaGraphRunner::Graph& CudaGraphRunner::Replay(const ForwardInput& host_input,
                                                      const GraphKey& key) {
  PackInputs(host_input, key);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) it = graphs_.emplace(key, Capture(key)).first;
  OASIS_CUDA_CHECK(cudaGraphLaunch(it->second.exec, cuda_.stream()));
  return it->second;
}

Tensor CudaGraphRunner::Execute(const ForwardInput& host_input) {
  const std::optional<GraphKey> key = KeyFor(host_input, nullptr);
  if (!key) return ModelRunner::Execute(host_input);
  const Tensor logits = Replay(host_input, *key).logits;
  const int64_t R = host_input.logit_rows.numel(), vocab = logits.dim(1);
  Tensor out(host_logits_.data(), DType::kF32, {R, vocab}, Device::kCpu);
  OASIS_CUDA_CHECK(cudaMemcpyAsync(out.raw(), logits.raw(), out.nbytes(), cudaMemcpyDeviceToHost,
                                   cuda_.stream()));
  cuda_.Synchronize();
  return out;
}

std::vector<SampleResult> CudaGraphRunner::SampleLogits(const Tensor& logits,
                                                        const std::vector<SampleRow>& rows) {
  return sampler_.Sample(logits, rows, cuda_.stream());
}

std::vector<SampleResult> CudaGraphRunner::Run(const StepInputs& step) {
  // Rows that want ranks (prompt logprobs) run eagerly: ModelRunner::Run fills the ranks.
  if (WantsRanks(step.rows)) return ModelRunner::Run(step);
  if (step.sparse) return RunSparse(step);
  const std::optional<GraphKey> key =
      KeyFor(step.input, step.capture != nullptr ? &step.capture->layer_ids : nullptr);
  if (!key) return ModelRunner::Run(step);
  const Graph& g = Replay(step.input, *key);
  if (step.capture != nullptr) step.capture->out = g.capture;
  if (step.while_running) step.while_running();  // the graph is enqueued: host work overlaps it
  if (!step.after_sampling) return SampleLogits(g.logits, step.rows);
  sampler_.Enqueue(g.logits, step.rows, cuda_.stream());
  step.after_sampling(DeviceSamples{sampler_.device_out(),
                                    static_cast<int64_t>(sizeof(kernels::SampleOutputDevice)),
                                    cuda_.stream()});
  return sampler_.Finish(step.rows, cuda_.stream());  // waits for what the hook queued too
}

bool CudaGraphOptions::SparseGraphsFromEnv() { return GetTuning().sparse_graphs; }

std::vector<SampleResult> CudaGraphRunner::RunSparse(const StepInputs& step) {
  const SparseStepPlan& plan = *step.sparse->plan;
  std::optional<GraphKey> key;
  if (options_.sparse_graphs && plan.num_sparse > 0 && !plan.measure_agreement &&
      step.sparse->replayable) {
    key = KeyFor(step.input, step.capture != nullptr ? &step.capture->layer_ids : nullptr);
  }
  if (!key) return ModelRunner::Run(step);
  SparseAttentionPipeline& pipeline = sparse_pipeline();
  if (pipeline.serial() != sparse_serial_) {  // graphs over an earlier engine's pipeline
    for (auto it = graphs_.begin(); it != graphs_.end();) {
      if (it->first.sparse_serial != 0) {
        OASIS_CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
        it = graphs_.erase(it);
      } else {
        ++it;
      }
    }
    sparse_serial_ = pipeline.serial();
  }
  key->sparse = &pipeline;
  key->sparse_serial = pipeline.serial();
  key->sparse_transfers = step.sparse->transfers;
  // Fixed addresses for every bucket before the first capture (never grown afterwards).
  pipeline.ReservePlan(options_.max_batch, options_.max_batch * options_.max_query_len);
  PackInputs(step.input, *key);
  pipeline.UploadPlan(PadStepPlan(plan, key->bucket, key->bucket * key->query_len));
  auto it = graphs_.find(*key);
  if (it == graphs_.end()) it = graphs_.emplace(*key, Capture(*key, &pipeline)).first;
  OASIS_CUDA_CHECK(cudaGraphLaunch(it->second.exec, cuda_.stream()));
  if (step.capture != nullptr) step.capture->out = it->second.capture;
  if (step.while_running) step.while_running();  // the graph is enqueued: host work overlaps it
  std::vector<SampleResult> samples = SampleLogits(it->second.logits, step.rows);  // (synchronises)
  sparse_sync_.StepDone();
  return samples;
}

}  // namespace oasis

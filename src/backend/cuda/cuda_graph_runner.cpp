#include "backend/cuda/cuda_graph_runner.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"
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
      max_blocks_((options.max_context + kBlockSize - 1) / kBlockSize) {
  for (int64_t b : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512}) {
    if (b < options_.max_batch) buckets_.push_back(b);
  }
  buckets_.push_back(options_.max_batch);
}

StatusOr<std::unique_ptr<CudaGraphRunner>> CudaGraphRunner::Create(DecoderLM& model, CudaBackend& backend,
                                                                   CudaGraphOptions options) {
  if (options.max_batch < 1 || options.max_context < 1) return InvalidArgument("graph max_batch/max_context < 1");
  std::unique_ptr<CudaGraphRunner> r(new CudaGraphRunner(model, backend, options));
  const int64_t B = options.max_batch, H = r->num_kv_heads_;
  Layout& l = r->layout_;
  size_t off = 0;
  l.ids = off, off = AlignUp(off + B * 4);
  l.pos = off, off = AlignUp(off + B * 4);
  l.slots = off, off = AlignUp(off + B * H * 8);
  l.qstart = off, off = AlignUp(off + (B + 1) * 4);
  l.kv_lens = off, off = AlignUp(off + B * H * 4);
  l.tables = off, off = AlignUp(off + B * H * r->max_blocks_ * 4);
  l.rows = off, off = AlignUp(off + B * 4);
  l.total = off;
  OASIS_ASSIGN_OR_RETURN(r->inputs_, cuda::DeviceBuffer::Allocate(l.total));
  OASIS_ASSIGN_OR_RETURN(r->staging_, cuda::PinnedBuffer::Allocate(l.total));
  // Activation arena for the largest bucket: every per-token tensor of one forward pass
  // (see DecoderLM::Forward), float logits, and alignment slack.
  const ModelConfig& c = model.config();
  const int64_t per_token = 2 * (4 * c.hidden_size + 2 * (c.q_size() + 2 * c.kv_size()) + c.q_size() +
                                 3 * c.intermediate_size + c.hidden_size) +
                            4 * c.vocab_size;
  // Plus the decode-attention workspace of the largest bucket (split partials).
  size_t workspace = 0;
  for (int64_t b : r->buckets_) {
    kernels::DecodeAttentionParams p;
    p.tokens = b;
    p.num_seqs = static_cast<int>(b);
    p.num_q_heads = static_cast<int>(c.num_attention_heads);
    p.num_kv_heads = static_cast<int>(c.num_key_value_heads);
    p.head_dim = static_cast<int>(c.head_dim);
    p.max_blocks = static_cast<int>(r->max_blocks_);
    p.max_query_len = 1;
    p.max_kv_len = static_cast<int>(r->max_blocks_ * kBlockSize);
    workspace = std::max(workspace, kernels::DecodeAttentionWorkspaceBytes(p));
  }
  // The arena never frees inside a forward pass, so per-layer temporaries add up: the decode
  // workspace, and the activations an unfused op allocates (SiLU·mul for batches the fused
  // GEMV does not take, K/V for a backend without the fused QKV op), plus alignment slack.
  // (and the normalised rows of the unfused pre-norm + projection, twice per layer).
  const int64_t per_layer =
      static_cast<int64_t>(workspace) + B * 2 * (c.intermediate_size + 2 * c.kv_size() + 2 * c.hidden_size) + 4096;
  OASIS_ASSIGN_OR_RETURN(r->arena_, cuda::DeviceBuffer::Allocate(static_cast<size_t>(
                                        B * per_token + c.num_hidden_layers * per_layer + (1 << 20))));
  OASIS_ASSIGN_OR_RETURN(r->host_logits_, cuda::PinnedBuffer::Allocate(static_cast<size_t>(B * c.vocab_size) * 4));
  return r;
}

CudaGraphRunner::~CudaGraphRunner() {
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
}

bool CudaGraphRunner::Eligible(const ForwardInput& in) const {
  if (!options_.enabled) return false;
  const int64_t seqs = in.attention.query_start.numel() - 1;
  return in.attention.max_query_len == 1 && in.token_ids.numel() == seqs && in.logit_rows.numel() == seqs &&
         seqs <= options_.max_batch && in.attention.block_tables.dim(2) <= max_blocks_ &&
         in.attention.kv_lens.dim(1) == num_kv_heads_;
}

int64_t CudaGraphRunner::BucketFor(int64_t batch) const {
  return *std::lower_bound(buckets_.begin(), buckets_.end(), batch);
}

ForwardInput CudaGraphRunner::StaticInputs(int64_t B) const {
  char* base = static_cast<char*>(inputs_.data());
  const int64_t H = num_kv_heads_;
  ForwardInput in;
  in.token_ids = Tensor(base + layout_.ids, DType::kI32, {B}, Device::kCuda);
  in.positions = Tensor(base + layout_.pos, DType::kI32, {B}, Device::kCuda);
  in.slot_mapping = Tensor(base + layout_.slots, DType::kI64, {B, H}, Device::kCuda);
  in.attention.query_start = Tensor(base + layout_.qstart, DType::kI32, {B + 1}, Device::kCuda);
  in.attention.kv_lens = Tensor(base + layout_.kv_lens, DType::kI32, {B, H}, Device::kCuda);
  in.attention.block_tables = Tensor(base + layout_.tables, DType::kI32, {B, H, max_blocks_}, Device::kCuda);
  in.attention.max_query_len = 1;
  in.attention.max_kv_len = static_cast<int32_t>(max_blocks_ * kBlockSize);  // fixed for the graph
  in.logit_rows = Tensor(base + layout_.rows, DType::kI32, {B}, Device::kCuda);
  return in;
}

void CudaGraphRunner::PackInputs(const ForwardInput& in, int64_t B) {
  const int64_t b = in.token_ids.numel(), H = num_kv_heads_, width = in.attention.block_tables.dim(2);
  char* s = static_cast<char*>(staging_.data());
  auto* ids = reinterpret_cast<int32_t*>(s + layout_.ids);
  auto* pos = reinterpret_cast<int32_t*>(s + layout_.pos);
  auto* slots = reinterpret_cast<int64_t*>(s + layout_.slots);
  auto* qstart = reinterpret_cast<int32_t*>(s + layout_.qstart);
  auto* lens = reinterpret_cast<int32_t*>(s + layout_.kv_lens);
  auto* tables = reinterpret_cast<int32_t*>(s + layout_.tables);
  auto* rows = reinterpret_cast<int32_t*>(s + layout_.rows);
  std::memcpy(ids, in.token_ids.raw(), b * 4);
  std::memcpy(pos, in.positions.raw(), b * 4);
  std::memcpy(slots, in.slot_mapping.raw(), b * H * 8);
  std::memcpy(lens, in.attention.kv_lens.raw(), b * H * 4);
  std::memset(tables, 0, B * H * max_blocks_ * 4);
  for (int64_t r = 0; r < b * H; ++r) {
    std::memcpy(tables + r * max_blocks_, in.attention.block_tables.data<int32_t>() + r * width, width * 4);
  }
  for (int64_t i = 0; i <= B; ++i) qstart[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < B; ++i) rows[i] = static_cast<int32_t>(i);
  for (int64_t i = b; i < B; ++i) {  // padding: token 0 at position 0, sees slot 0, writes nothing
    ids[i] = 0;
    pos[i] = 0;
    for (int64_t h = 0; h < H; ++h) {
      slots[i * H + h] = -1;
      lens[i * H + h] = 1;
    }
  }
  OASIS_CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), staging_.data(), layout_.total, cudaMemcpyHostToDevice,
                                   cuda_.stream()));
}

cudaGraphExec_t CudaGraphRunner::Capture(int64_t B) {
  ForwardInput in = StaticInputs(B);
  // Warm-up outside capture: cuBLAS heuristics, RoPE tables and any lazy set-up happen here.
  cuda_.BeginArena(arena_.data(), arena_.size());
  (void)model_.Forward(in, kv_);
  cuda_.EndArena();
  cuda_.Synchronize();

  cudaGraph_t graph = nullptr;
  OASIS_CUDA_CHECK(cudaStreamBeginCapture(cuda_.stream(), cudaStreamCaptureModeThreadLocal));
  cuda_.BeginArena(arena_.data(), arena_.size());
  Tensor logits = model_.Forward(in, kv_);
  cuda_.EndArena();
  OASIS_CUDA_CHECK(cudaStreamEndCapture(cuda_.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  OASIS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  OASIS_CUDA_CHECK(cudaGraphDestroy(graph));
  graph_logits_[B] = logits;
  spdlog::debug("captured decode graph for batch bucket {}", B);
  return exec;
}

Tensor CudaGraphRunner::ForwardLogits(const ForwardInput& host_input) {
  if (!Eligible(host_input)) return ModelRunner::ForwardLogits(host_input);
  const int64_t b = host_input.token_ids.numel(), B = BucketFor(b);
  PackInputs(host_input, B);
  auto it = graphs_.find(B);
  if (it == graphs_.end()) it = graphs_.emplace(B, Capture(B)).first;
  OASIS_CUDA_CHECK(cudaGraphLaunch(it->second, cuda_.stream()));
  return graph_logits_[B];
}

Tensor CudaGraphRunner::Execute(const ForwardInput& host_input) {
  if (!Eligible(host_input)) return ModelRunner::Execute(host_input);
  const int64_t b = host_input.token_ids.numel();
  const Tensor logits = ForwardLogits(host_input);
  const int64_t vocab = logits.dim(1);
  Tensor out(host_logits_.data(), DType::kF32, {b, vocab}, Device::kCpu);
  OASIS_CUDA_CHECK(cudaMemcpyAsync(out.raw(), logits.raw(), out.nbytes(), cudaMemcpyDeviceToHost, cuda_.stream()));
  cuda_.Synchronize();
  return out;
}

std::vector<SampleResult> CudaGraphRunner::ExecuteAndSample(const ForwardInput& host_input,
                                                            const std::vector<SampleRow>& rows) {
  const Tensor logits = ForwardLogits(host_input);
  return sampler_.Sample(logits, rows, cuda_.stream());
}

}  // namespace oasis

// CudaGraphRunner: a ModelRunner that replays CUDA graphs for decode steps — every sequence
// with the same number q of query tokens, q = 1 (plain) or 2 (lookahead: the real token and
// the draft stacked) up to CudaGraphOptions::max_query_len (speculate chains: 1 + k), 1 or q
// logits rows per sequence, with or without the residual capture of
// a draft head — captured lazily per (batch-size bucket, q, rows, capture); other steps
// (prefill, mixed) run eagerly. Graphs are also specialised per context bucket (1K, 2K, 4K,
// 8K, ... up to max_context), so a short request's attention is not cut for the longest
// context a graph could see (the split-K plan is made for the bucket: with ×4 buckets a 4.2K
// batch planned for 16K took two splits and a merge where one split is faster). Inputs are packed
// on the host into one pinned staging buffer and copied with a single cudaMemcpyAsync into static
// device buffers the graphs read; activations come from one arena whose addresses are the same at
// capture and replay. A batch of b sequences runs in the smallest bucket >= b, padded with rows
// that read slot 0 and write nothing.
//
// Owns the graphs, the static buffers, the arena and the staging buffer (plus the KV pools,
// through ModelRunner). Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sparse_sync.h"
#include "common/cuda_rt.h"
#include "runner/cuda/cuda_sampler.h"
#include "runner/model_runner.h"

namespace oasis {

struct CudaGraphOptions {
  int64_t num_kv_slots = 0;
  int64_t max_batch = 256;      // largest decode batch replayed as a graph
  int64_t max_context = 32768;  // longest sequence a graph step supports
  bool enabled = true;          // false: always eager (for comparisons)
  // Query tokens per sequence a decode graph may take: 2 (a stacked draft), or 1 + k for
  // speculate chains of k drafts (--num-speculative-tokens). The activation arena and the
  // static inputs scale with it; steps beyond it run eagerly.
  int max_query_len = 2;
  // Sparse decode steps as graphs too (docs/sparse.md §10); OASIS_SPARSE_GRAPHS=0 turns it off.
  bool sparse_graphs = SparseGraphsFromEnv();
  static bool SparseGraphsFromEnv();
};

class CudaGraphRunner final : public ModelRunner {
 public:
  static StatusOr<std::unique_ptr<CudaGraphRunner>> Create(DecoderLM& model, CudaBackend& backend,
                                                           CudaGraphOptions options);
  ~CudaGraphRunner() override;

  // Decode steps return a view of a pinned host buffer, valid until the next Execute().
  Tensor Execute(const ForwardInput& host_input) override;
  // Decode steps replay a graph, other steps run eagerly (ModelRunner::Run); both sample on
  // the device (CudaSampler). Graph steps return capture->out as a view of the graph's
  // resident buffer [layer_ids.size(), bucket · q, hidden] (rows past T are padding); eager
  // steps allocate it. Graph steps call step.after_sampling; eager and sparse steps do not.
  // Sparse steps run eagerly with the pipeline's side streams (CudaSparseStageSync). With
  // options.sparse_graphs (the default; OASIS_SPARSE_GRAPHS=0 turns it off) a decode step of
  // one query count replays a graph per bucket instead (docs/sparse.md §10): the plan is
  // padded to the bucket and uploaded into the pipeline's persistent buffers, the capture
  // holds the pipeline's stages on their streams. Steps that measure agreement and steps the
  // KV policy marks not replayable (the oracle predictor) stay eager.
  std::vector<SampleResult> Run(const StepInputs& step) override;
  SparseStageSync* sparse_stage_sync() override { return &sparse_sync_; }

  // Arena bytes per decode token of a graph step: its activations, and per layer the
  // temporaries that add up (Create sizes the arena as max_batch x max_query_len tokens of
  // both; the server's KV plan reserves the part beyond two query tokens).
  static int64_t ArenaTokenBytes(const ModelConfig& c);
  static int64_t ArenaLayerTokenBytes(const ModelConfig& c);

  // Number of graphs captured so far (one per bucket used).
  size_t num_graphs() const { return graphs_.size(); }

 protected:
  // Samples on the device (CudaSampler): only tokens and log-probabilities come back.
  std::vector<SampleResult> SampleLogits(const Tensor& logits,
                                         const std::vector<SampleRow>& rows) override;

 private:
  // What a graph is specialised for, besides the batch bucket.
  struct GraphKey {
    int64_t bucket = 0;
    int query_len = 1;                    // tokens per sequence (1, or 2 with a stacked draft)
    int rows_per_seq = 1;                 // logits rows per sequence (1 or query_len)
    int64_t kv_bound = 0;                 // longest KV a sequence may have (a context bucket): the
                                          // decode attention plans its split-K cut for it
    std::vector<int64_t> capture_layers;  // residual capture ids (empty: none)
    const SparseAttentionPipeline* sparse = nullptr;  // a sparse step's pipeline (its buffers)
    uint64_t sparse_serial = 0;  // its serial(): an address a later pipeline may reuse is not a key
    bool sparse_transfers = true;  // SparseStepInputs::transfers when captured
    bool operator<(const GraphKey& o) const {
      return std::tie(bucket, query_len, rows_per_seq, kv_bound, capture_layers, sparse_serial,
                      sparse_transfers) < std::tie(o.bucket, o.query_len, o.rows_per_seq,
                                                   o.kv_bound, o.capture_layers, o.sparse_serial,
                                                   o.sparse_transfers);
    }
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    Tensor logits;   // arena-resident output [bucket · rows_per_seq, vocab]
    Tensor capture;  // arena-resident capture [layers, bucket · query_len, hidden] or undefined
  };

  CudaGraphRunner(DecoderLM& model, CudaBackend& backend, CudaGraphOptions options);
  // The graph shape of a step, or nullopt when it runs eagerly.
  std::optional<GraphKey> KeyFor(const ForwardInput& in,
                                 const std::vector<int64_t>* capture_layers) const;
  int64_t BucketFor(int64_t batch) const;
  // Device views of the static inputs for a graph of this shape.
  ForwardInput StaticInputs(const GraphKey& key) const;
  void PackInputs(const ForwardInput& in, const GraphKey& key);
  // `pipeline`: a sparse step (key.sparse), its plan already in the pipeline's buffers; no
  // eager warm-up then (it would apply the step's selection twice).
  Graph Capture(const GraphKey& key, SparseAttentionPipeline* pipeline = nullptr);
  // Packs the inputs, captures the graph on first use, replays it.
  const Graph& Replay(const ForwardInput& host_input, const GraphKey& key);
  // Run's sparse steps (graph or eager).
  std::vector<SampleResult> RunSparse(const StepInputs& step);

  static constexpr int kMaxQueryLenLimit = 16;  // the decode attention's widest
  CudaBackend& cuda_;
  CudaGraphOptions options_;
  int64_t num_kv_heads_;
  int64_t max_blocks_;
  std::vector<int64_t> buckets_;
  // Static inputs: one device region, laid out like the pinned staging buffer.
  cuda::DeviceBuffer inputs_;
  cuda::PinnedBuffer staging_;
  struct Layout {
    size_t ids, pos, slots, qstart, kv_lens, tables, rows, total;
  } layout_{};
  cuda::DeviceBuffer arena_;
  cuda::PinnedBuffer
      host_logits_;  // [max_batch · max_query_len, vocab] f32, the decode steps' output
  std::map<GraphKey, Graph> graphs_;
  // The pipeline the sparse graphs in graphs_ were captured over (0: none): an engine's
  // pipeline dies with it, so a new one drops the old one's graphs (they name freed buffers).
  uint64_t sparse_serial_ = 0;
  CudaSampler sampler_;
  CudaSparseStageSync sparse_sync_;
};

}  // namespace oasis

// CudaGraphRunner: a ModelRunner that replays CUDA graphs for decode steps (one query token
// per sequence), captured lazily per batch-size bucket; other steps (prefill, mixed) run
// eagerly. Inputs are packed on the host into one pinned staging buffer and copied with a
// single cudaMemcpyAsync into static device buffers the graphs read; activations come from
// one arena whose addresses are the same at capture and replay. A batch of b sequences runs
// in the smallest bucket >= b, padded with rows that read slot 0 and write nothing.
//
// Owns the graphs, the static buffers, the arena and the staging buffer (plus the KV pools,
// through ModelRunner). Not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_sampler.h"
#include "common/cuda_rt.h"
#include "engine/model_runner.h"

namespace oasis {

struct CudaGraphOptions {
  int64_t num_kv_slots = 0;
  int64_t max_batch = 256;           // largest decode batch replayed as a graph
  int64_t max_context = 32768;       // longest sequence a graph step supports
  bool enabled = true;               // false: always eager (for comparisons)
};

class CudaGraphRunner final : public ModelRunner {
 public:
  static StatusOr<std::unique_ptr<CudaGraphRunner>> Create(DecoderLM& model, CudaBackend& backend,
                                                           CudaGraphOptions options);
  ~CudaGraphRunner() override;

  // Decode steps return a view of a pinned host buffer, valid until the next Execute().
  Tensor Execute(const ForwardInput& host_input) override;
  // Samples on the device (CudaSampler): only tokens and log-probabilities come back.
  std::vector<SampleResult> ExecuteAndSample(const ForwardInput& host_input,
                                             const std::vector<SampleRow>& rows) override;

  // Number of graphs captured so far (one per bucket used).
  size_t num_graphs() const { return graphs_.size(); }

 protected:
  // Decode steps replay a graph (the logits are a view of its arena output, rows beyond the
  // batch are padding); other steps run eagerly.
  Tensor ForwardLogits(const ForwardInput& host_input) override;

 private:
  CudaGraphRunner(DecoderLM& model, CudaBackend& backend, CudaGraphOptions options);
  bool Eligible(const ForwardInput& in) const;
  int64_t BucketFor(int64_t batch) const;
  // Device views of the static inputs for a bucket of `bucket` sequences.
  ForwardInput StaticInputs(int64_t bucket) const;
  void PackInputs(const ForwardInput& in, int64_t bucket);
  cudaGraphExec_t Capture(int64_t bucket);

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
  cuda::PinnedBuffer host_logits_;  // [max_batch, vocab] f32, the decode steps' output
  std::map<int64_t, cudaGraphExec_t> graphs_;
  std::map<int64_t, Tensor> graph_logits_;  // arena-resident output of each graph
  CudaSampler sampler_;
};

}  // namespace oasis

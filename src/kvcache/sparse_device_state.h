// SparseDeviceState: the fixed-size device tensors of the sparse pipeline, one row per sparse
// request (R rows), per KV head and (for the per-layer parts) per sparse layer. Every
// per-step op reads and writes these in place, so a decode step needs no host
// synchronisation; the host writes a row only when a request switches to sparse.
//
// Owns the tensors. Not thread-safe: the engine loop thread (and the streams it orders).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace oasis {

// Per sparse layer.
struct SparseLayerState {
  Tensor host_tables;     // [R, Hkv, MB] int32: host slot (= summary row) of each logical block in
                          //   this layer (the same in every layer but for imported requests' cells)
  Tensor ws_blocks;       // [R, Hkv, K] int32: logical block resident in working slot j, -1 = empty
  Tensor ws_age;          // [R, Hkv, K] int32: selects since slot j was last predicted/fetched
  Tensor resident_slots;  // [R, Hkv, K] int32: next step's table (ascending logical block), -1 pad
  Tensor num_resident;    // [R, Hkv] int32
  Tensor topk;            // [R, Hkv, K] int32: prediction for the next step (score order)
  Tensor topk_actual;     // [R, Hkv, K] int32: top-K of the step's real query (measurement)
  Tensor fetch_src;       // [R, Hkv, C] int32: host slots to gather, -1 = none
  Tensor fetch_dst;       // [R, Hkv, C] int32: GPU slots they go to
  Tensor select_stats;    // [R, Hkv, 3] int32: accumulated hits, misses, fetched
  Tensor agree_stats;     // [R, Hkv, 2] int32: accumulated overlap, actual set size
  Tensor fetch_use_stats;  // [R, Hkv, 2] int32: sampled fetched blocks in the real top-K, fetched
  Tensor fetch_cap;        // [Hkv] int32: the adaptive budget's admission cap per head (<= C;
                           //   starts at C; read by select only with --sparse-budget adaptive)
  // Remote blocks (remote_cap > 0 only; host memory the device reads, so the host flips a
  // block to local without a device op once its K/V has landed in the host store):
  Tensor remote;      // [R, Hkv, MB] u8: 1 = the block's K/V is not in the host store yet
  Tensor remote_out;  // [R, Hkv, CR] int32: the step's remote misses (SelectBlocks), -1 pad
};

class SparseDeviceState {
 public:
  SparseDeviceState(Backend& backend, int64_t rows, int64_t kv_heads, int64_t topk,
                    int64_t max_fetch, int64_t max_blocks, int64_t num_layers,
                    int64_t first_sparse_layer, int64_t remote_cap = 0);
  int64_t remote_cap() const { return remote_cap_; }

  int64_t rows() const { return rows_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t topk() const { return topk_; }
  int64_t max_fetch() const { return max_fetch_; }
  int64_t max_blocks() const { return max_blocks_; }
  int64_t first_sparse_layer() const { return first_sparse_layer_; }

  Tensor ws_slots;       // [R, Hkv, K] int32: GPU slot of working slot j (fixed per request)
  Tensor scores;         // [R, Hkv, MB] f32: prediction scratch (the predict stage, layer by layer)
  Tensor scores_actual;  // [R, Hkv, MB] f32: measurement / oracle scratch (main stream)

  SparseLayerState& layer(int64_t l);
  const SparseLayerState& layer(int64_t l) const;

  // Writes row r of an int32 state tensor [R, ...] (values.size() == the row's size).
  void WriteRow(Tensor& t, int64_t r, const std::vector<int32_t>& values);
  // Zeroes every layer's select_stats, agree_stats and fetch_use_stats.
  void ZeroStats();
  // Sets layer l's fetch_cap to `cap` for every head (between steps; the cap is clamped to C
  // by select).
  void SetFetchCap(int64_t l, int32_t cap);

 private:
  Backend& backend_;
  int64_t rows_, kv_heads_, topk_, max_fetch_, max_blocks_, first_sparse_layer_, remote_cap_;
  std::vector<SparseLayerState> layers_;
};

}  // namespace oasis

// A small SparseKvManager on the CPU backend with random KV pools, shared by the tests of the
// manager (tests/unit/kvcache) and of disaggregation's import side (tests/unit/disagg).
// Owns its backend, allocator, pools and manager. Not thread-safe (one test case).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kvcache/sparse_kv_manager.h"

namespace oasis::testing {

inline constexpr int64_t kRigLayers = 3, kRigHeads = 2, kRigDim = 8, kRigGpuSlots = 64;

// K = k, fetch ratio 0.5, threshold 32, two sparse sequences of up to 400 tokens, and a host
// store of 60 slots.
inline SparseConfig RigConfig(int32_t k = 3, int32_t dense_layers = 0) {
  SparseConfig c;
  c.topk_blocks = k;
  c.fetch_ratio = 0.5;
  c.sparse_threshold = 32;
  c.dense_layers = dense_layers;
  c.max_sparse_seqs = 2;
  c.max_seq_len = 400;
  // 60 host slots: 2 * 16 * 8 * (sparse layers) floats each.
  c.host_kv_gib = 60.0 *
                  static_cast<double>(
                      HostKvStore::BytesPerSlot(kRigLayers - dense_layers, kRigDim, DType::kF32)) /
                  (1024.0 * 1024.0 * 1024.0);
  return c;
}

struct SparseKvRig {
  CpuBackend backend{1};
  BlockAllocator alloc{kRigGpuSlots};
  std::vector<LayerKvPool>
      pools;  // [kRigLayers] of [kRigGpuSlots, kBlockSize, kRigDim] f32, random
  std::unique_ptr<SparseKvManager> manager;
  explicit SparseKvRig(const SparseConfig& c) {
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> dist;
    for (int64_t l = 0; l < kRigLayers; ++l) {
      LayerKvPool p{Tensor::Empty({kRigGpuSlots, kBlockSize, kRigDim}, DType::kF32),
                    Tensor::Empty({kRigGpuSlots, kBlockSize, kRigDim}, DType::kF32)};
      for (Tensor* t : {&p.k, &p.v}) {
        for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = dist(rng);
      }
      pools.push_back(p);
    }
    manager = std::make_unique<SparseKvManager>(c, SparseModelShape{kRigLayers, kRigHeads, kRigDim},
                                                backend, alloc);
  }
  // A dense request of `tokens` tokens, switched to sparse.
  HeadBlockTable SwitchNew(uint64_t id, int64_t tokens, int64_t reserve_total) {
    HeadBlockTable t(kRigHeads);
    REQUIRE(manager->Reserve(id, reserve_total).ok());
    REQUIRE(t.Reserve(tokens, alloc).ok());
    return t;
  }
};

}  // namespace oasis::testing

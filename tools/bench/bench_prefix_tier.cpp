// The prefix cache's host tier on the GPU (issue 33, kvcache/host_prefix_tier.h): how fast
// evicted cached blocks spill to pinned host memory and how fast a hit reloads them, at
// Qwen3-8B's KV shape (36 layers, 8 KV heads, head_dim 128, bf16) by default.
//
// Each round caches --blocks blocks in a GPU pool (random K/V), evicts them all with one
// allocation (the tier's spill: one CopyBlocks per layer, device -> pinned host), then
// reloads every one into other GPU slots in shuffled order (host -> device), each timed with
// CUDA events on the backend's stream (host bookkeeping included), and checks the reloaded
// K and V of the first and last layers bit for bit. Prints the median GB/s of both
// directions against DESIGN.md §5's PCIe ceiling (51 GB/s for a UVA gather of scattered
// head-blocks from pinned memory) and the 40 GB/s target, then a RESULT line.
//   bench_prefix_tier [--blocks 1024] [--rounds 5] [--layers 36] [--kv-heads 8] [--head-dim 128]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "common/flags.h"
#include "kvcache/block_allocator.h"
#include "kvcache/host_prefix_tier.h"

using namespace oasis;

namespace {

constexpr double kPcieCeilingGBs = 51.0;  // DESIGN.md §5
constexpr double kTargetGBs = 40.0;       // issue 33

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_prefix_tier: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The bytes of slot `s` in a downloaded pool tensor [slots, 16, D].
const char* SlotBytes(const Tensor& host, int32_t s) {
  return static_cast<const char*>(host.raw()) +
         static_cast<size_t>(s) * (host.nbytes() / host.dim(0));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t blocks = 1024, rounds = 5, layers = 36, heads = 8, head_dim = 128;
  FlagParser flags("bench_prefix_tier: spill and reload bandwidth of the prefix cache's host tier");
  flags.AddInt("blocks", &blocks, "blocks cached, spilled and reloaded per round");
  flags.AddInt("rounds", &rounds, "timed rounds (after one warm-up round)");
  flags.AddInt("layers", &layers, "layers of the KV shape");
  flags.AddInt("kv-heads", &heads, "KV heads of the KV shape");
  flags.AddInt("head-dim", &head_dim, "head_dim of the KV shape");
  if (Status st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "bench_prefix_tier: %s\n%s", st.ToString().c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  for (int64_t v : {blocks, rounds, layers, heads, head_dim}) {
    if (v <= 0) {
      std::fprintf(stderr, "bench_prefix_tier: every flag wants a positive integer\n");
      return 2;
    }
  }
  auto created = CudaBackend::Create();
  if (!created.ok()) {
    std::fprintf(stderr, "bench_prefix_tier: %s\n", created.status().ToString().c_str());
    return 1;
  }
  CudaBackend& b = **created;
  const int32_t H = static_cast<int32_t>(heads);
  const int64_t slots = blocks * heads;
  std::vector<LayerKvPool> pools;
  for (int64_t l = 0; l < layers; ++l) {
    pools.push_back({b.Empty({slots, kBlockSize, head_dim}, DType::kBF16),
                     b.Empty({slots, kBlockSize, head_dim}, DType::kBF16)});
    b.FillNormal(pools.back().k, 2 * l + 1, 1.0f);
    b.FillNormal(pools.back().v, 2 * l + 2, 1.0f);
  }
  BlockAllocator alloc(static_cast<int32_t>(slots));
  alloc.EnablePrefixCache(H);
  const size_t per_block = HostPrefixTier::BytesPerSlot(layers, head_dim, DType::kBF16) * heads;
  HostPrefixTier tier(b, pools, H, per_block * static_cast<size_t>(blocks));
  alloc.set_host_tier(&tier, &tier);
  const double gb = static_cast<double>(per_block) * static_cast<double>(blocks) / 1e9;
  std::printf(
      "bench_prefix_tier: %lld blocks of %lld tokens x %lld KV heads x %lld layers, "
      "head_dim %lld, bf16: %.3f GB each way per round\n",
      static_cast<long long>(blocks), static_cast<long long>(kBlockSize),
      static_cast<long long>(heads), static_cast<long long>(layers),
      static_cast<long long>(head_dim), gb);

  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  std::mt19937_64 rng(7);
  std::vector<double> spill_ms, reload_ms;
  bool exact = true;
  for (int64_t r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    // Cache every block of the pool (new keys each round: the tier evicts the last round's).
    std::vector<std::vector<int32_t>> gpu_of(static_cast<size_t>(blocks));
    std::vector<uint64_t> hash(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) {
      auto s = alloc.Allocate(H);
      if (!s) return 1;
      const std::vector<int32_t> tokens(kBlockSize, static_cast<int32_t>(i));
      hash[static_cast<size_t>(i)] = 1 + static_cast<uint64_t>(r * blocks + i);
      alloc.prefix_cache()->Insert(hash[static_cast<size_t>(i)], 0, tokens, *s);
      gpu_of[static_cast<size_t>(i)] = *s;
    }
    for (const auto& s : gpu_of) alloc.Free(s);
    Tensor k0, vl;
    if (r == 1) {  // the reference: the first and last layers as spilled
      k0 = b.Download(pools.front().k);
      vl = b.Download(pools.back().v);
    }
    // Spill: one allocation of the whole pool evicts every block.
    Check(cudaEventRecord(e0, b.stream()), "record");
    auto all = alloc.Allocate(static_cast<int32_t>(slots));
    Check(cudaEventRecord(e1, b.stream()), "record");
    Check(cudaEventSynchronize(e1), "sync");
    if (!all || tier.num_entries() != blocks) {
      std::fprintf(stderr, "bench_prefix_tier: the tier holds %lld of %lld blocks\n",
                   static_cast<long long>(tier.num_entries()), static_cast<long long>(blocks));
      return 1;
    }
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    if (r > 0) spill_ms.push_back(ms);
    // Scribble over the pool, then reload every block into another block's slots.
    for (auto& p : pools) b.Fill(p.k, 0.0f);
    std::vector<int64_t> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::vector<int32_t>> host, gpu;
    for (int64_t i = 0; i < blocks; ++i) {
      const std::vector<int32_t> tokens(kBlockSize, static_cast<int32_t>(i));
      const std::vector<int32_t>* h = tier.Find(hash[static_cast<size_t>(i)], 0, tokens);
      if (h == nullptr) return 1;
      host.push_back(*h);
      gpu.push_back(gpu_of[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    }
    Check(cudaEventRecord(e0, b.stream()), "record");
    tier.Reload(host, gpu);
    Check(cudaEventRecord(e1, b.stream()), "record");
    Check(cudaEventSynchronize(e1), "sync");
    Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    if (r > 0) reload_ms.push_back(ms);
    if (r == 1) {
      const Tensor k0r = b.Download(pools.front().k), vlr = b.Download(pools.back().v);
      const size_t bytes = k0.nbytes() / static_cast<size_t>(k0.dim(0));
      for (int64_t i = 0; i < blocks && exact; ++i) {
        for (int32_t h = 0; h < H; ++h) {
          const int32_t src = gpu_of[static_cast<size_t>(i)][static_cast<size_t>(h)];
          const int32_t dst = gpu[static_cast<size_t>(i)][static_cast<size_t>(h)];
          exact = exact && std::memcmp(SlotBytes(k0, src), SlotBytes(k0r, dst), bytes) == 0 &&
                  std::memcmp(SlotBytes(vl, src), SlotBytes(vlr, dst), bytes) == 0;
        }
      }
    }
    alloc.Free(*all);
  }
  const double spill = gb / (Median(spill_ms) / 1e3), reload = gb / (Median(reload_ms) / 1e3);
  std::printf("spill  (GPU -> host): median %.3f ms, %.1f GB/s, ceiling %.0f GB/s, ratio %.2f\n",
              Median(spill_ms), spill, kPcieCeilingGBs, spill / kPcieCeilingGBs);
  std::printf(
      "reload (host -> GPU): median %.3f ms, %.1f GB/s, ceiling %.0f GB/s, ratio %.2f; "
      "target >= %.0f GB/s: %s\n",
      Median(reload_ms), reload, kPcieCeilingGBs, reload / kPcieCeilingGBs, kTargetGBs,
      reload >= kTargetGBs ? "met" : "NOT met");
  std::printf("reloaded K/V equal to the spilled ones bit for bit: %s\n", exact ? "yes" : "NO");
  std::printf(
      "RESULT prefix_tier %lld blocks (%lld tokens, %.2f GB): reload %.1f GB/s (%.2f of "
      "%.0f), spill %.1f GB/s, %.1f ms per %lld tokens reloaded%s\n",
      static_cast<long long>(blocks), static_cast<long long>(blocks * kBlockSize), gb, reload,
      reload / kPcieCeilingGBs, kPcieCeilingGBs, spill, Median(reload_ms),
      static_cast<long long>(blocks * kBlockSize), exact ? "" : " MISMATCH");
  return exact ? 0 : 1;
}

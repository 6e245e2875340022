// The sparse-KV ops on the CUDA backend against the CPU reference (backend.h semantics) on
// fresh random inputs: integer outputs identical, summaries exact, scores within float
// tolerance, copies exact (device <-> mapped pinned host).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "common/status_error.h"
#include "gpu_test_util.h"
#include "kernels/sparse_kv.h"

using namespace oasis;
using namespace oasis::testing;

namespace {

std::mt19937 FreshRng() { return std::mt19937(std::random_device{}()); }

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}

Tensor Ints(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

void ExpectSameInts(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  int64_t first = -1, count = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.data<int32_t>()[i] != want.data<int32_t>()[i] && count++ == 0) first = i;
  }
  INFO(count << " differences; first at " << first << ": got " << (first >= 0 ? got.data<int32_t>()[first] : 0)
             << " want " << (first >= 0 ? want.data<int32_t>()[first] : 0));
  CHECK(count == 0);
}

}  // namespace

TEST_CASE("BlockSummaries on the GPU equal the CPU's exactly", "[gpu][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (int d : {64, 128}) {
    const int64_t slots = 40, rows = 50, n = 30;
    Tensor k = RandomBf16Exact({slots, kBlockSize, d}, rng), v = RandomBf16Exact({slots, kBlockSize, d}, rng);
    std::vector<int32_t> src(n), cnt(n), dst(n);
    std::vector<int32_t> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      src[i] = std::uniform_int_distribution<int>(0, slots - 1)(rng);
      cnt[i] = std::uniform_int_distribution<int>(-1, kBlockSize)(rng);
      dst[i] = i % 7 == 3 ? -1 : perm[i];
    }
    Tensor kmin = Tensor::Zeros({rows, d}, DType::kF32), kmax = Tensor::Zeros({rows, d}, DType::kF32);
    LayerKvPool cpool{k, v};
    cpu.BlockSummaries(cpool, Ints({n}, src), Ints({n}, cnt), Ints({n}, dst), kmin, kmax);
    // The GPU reads the pool from mapped pinned host memory (as after the dense->sparse switch).
    LayerKvPool hpool{gpu->EmptyHost({slots, kBlockSize, d}, DType::kBF16), gpu->EmptyHost({slots, kBlockSize, d}, DType::kBF16)};
    Tensor kb = ToBf16Host(k);
    std::memcpy(hpool.k.raw(), kb.raw(), kb.nbytes());
    Tensor gmin = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32)), gmax = UploadBf16(*gpu, Tensor::Zeros({rows, d}, DType::kF32));
    gpu->BlockSummaries(hpool, gpu->Upload(Ints({n}, src)), gpu->Upload(Ints({n}, cnt)), gpu->Upload(Ints({n}, dst)), gmin,
                        gmax);
    ExpectClose(DownloadF32(*gpu, gmin), kmin, 0, 0);
    ExpectClose(DownloadF32(*gpu, gmax), kmax, 0, 0);
  }
}

TEST_CASE("ScoreBlocks on the GPU matches the CPU; TopKBlocks picks the same blocks from the same scores",
          "[gpu][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  struct Shape {
    int hq, hkv, d, mb, k;
  };
  for (const Shape& sh : {Shape{32, 8, 128, 300, 128}, Shape{8, 2, 64, 1100, 64}, Shape{16, 2, 256, 90, 128},
                          Shape{4, 4, 128, 2048, 256}, Shape{4, 2, 32, 40, 16},
                          Shape{32, 8, 128, 1024, 128}, Shape{8, 2, 64, 200, 32},
                          // past the one-warp top-K (2,048 blocks, K 256): the radix select
                          Shape{8, 2, 64, 5000, 128}, Shape{8, 8, 128, 4096, 1024}}) {
    for (GroupReduce reduce : {GroupReduce::kSum, GroupReduce::kMax}) {
      INFO("heads " << sh.hq << "/" << sh.hkv << " d " << sh.d << " MB " << sh.mb << " K " << sh.k);
      const int64_t R = 3, T = 5, summary_rows = 3 * sh.mb;
      Tensor q = RandomBf16Exact({T, sh.hq, sh.d}, rng);
      Tensor lo = RandomBf16Exact({summary_rows, sh.d}, rng), hi = RandomBf16Exact({summary_rows, sh.d}, rng);
      std::vector<int32_t> qrows = {4, -1, 1}, nblocks = {sh.mb, 7, std::max(1, sh.mb / 3)};
      std::vector<int32_t> tables(static_cast<size_t>(R * sh.hkv * sh.mb));
      for (auto& m : tables) m = std::uniform_int_distribution<int>(0, summary_rows - 1)(rng);
      Tensor qr = Ints({R}, qrows), nb = Ints({R}, nblocks), tb = Ints({R, sh.hkv, sh.mb}, tables);
      Tensor want = Tensor::Zeros({R, sh.hkv, sh.mb}, DType::kF32);
      cpu.ScoreBlocks(q, qr, nb, tb, lo, hi, reduce, want);
      Tensor got = gpu->Upload(Tensor::Zeros({R, sh.hkv, sh.mb}, DType::kF32));
      Tensor d_qr = gpu->Upload(qr), d_nb = gpu->Upload(nb);
      gpu->ScoreBlocks(UploadBf16(*gpu, q), d_qr, d_nb, gpu->Upload(tb), UploadBf16(*gpu, lo), UploadBf16(*gpu, hi),
                       reduce, got);
      Tensor got_host = gpu->Download(got);
      ExpectClose(got_host, want, 1e-3 * sh.d, 1e-4);

      // Top-K from identical scores; quantised so that ties occur and must break by block id.
      for (int64_t i = 0; i < got_host.numel(); ++i) got_host.data<float>()[i] = std::round(got_host.data<float>()[i] * 2.0f) / 2.0f;
      got_host.data<float>()[3] = -0.0f;
      got_host.data<float>()[5] = 0.0f;
      Tensor want_topk = Ints({R, sh.hkv, sh.k}, std::vector<int32_t>(R * sh.hkv * sh.k, -7));
      cpu.TopKBlocks(got_host, qr, nb, want_topk);
      Tensor got_topk = gpu->Upload(Ints({R, sh.hkv, sh.k}, std::vector<int32_t>(R * sh.hkv * sh.k, -7)));
      gpu->TopKBlocks(gpu->Upload(got_host), d_qr, d_nb, got_topk);
      ExpectSameInts(gpu->Download(got_topk), want_topk);
    }
  }
}

TEST_CASE("SelectBlocks on the GPU follows the CPU step by step (in-place blocks too); AssembleSparseTables, TopKOverlap and FetchOverlap agree",
          "[gpu][sparse]") {
  auto gpu = MakeBackend();
  CpuBackend cpu;
  auto rng = FreshRng();
  for (auto [k, c, mb] : {std::tuple{128, 7, 600}, std::tuple{16, 3, 40}, std::tuple{64, 64, 64}, std::tuple{256, 13, 2000}}) {
    INFO("K " << k << " C " << c << " MB " << mb);
    const int64_t R = 3, H = 4;
    std::vector<int32_t> rows = {0, -1, 2};
    std::vector<int32_t> table(static_cast<size_t>(R * H * mb)), slots(static_cast<size_t>(R * H * k));
    for (auto& m : table) m = std::uniform_int_distribution<int>(0, 1 << 20)(rng);
    std::iota(slots.begin(), slots.end(), 1000);
    std::shuffle(slots.begin(), slots.end(), rng);
    // Start with some empty slots and random resident blocks (distinct per head) and ages with ties.
    std::vector<int32_t> blocks(static_cast<size_t>(R * H * k)), age(static_cast<size_t>(R * H * k));
    for (int64_t rh = 0; rh < R * H; ++rh) {
      std::vector<int32_t> ids(static_cast<size_t>(mb));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int j = 0; j < k; ++j) {
        blocks[rh * k + j] = j % 5 == 2 ? -1 : ids[j];
        age[rh * k + j] = std::uniform_int_distribution<int>(0, 3)(rng);
      }
    }
    Tensor c_rows = Ints({R}, rows), c_table = Ints({R, H, mb}, table), c_slots = Ints({R, H, k}, slots);
    Tensor c_blocks = Ints({R, H, k}, blocks), c_age = Ints({R, H, k}, age);
    Tensor c_src = Tensor::Zeros({R, H, c}, DType::kI32), c_dst = Tensor::Zeros({R, H, c}, DType::kI32);
    Tensor c_res = Tensor::Zeros({R, H, k}, DType::kI32), c_nres = Tensor::Zeros({R, H}, DType::kI32);
    Tensor c_stats = Tensor::Zeros({R, H, 3}, DType::kI32), c_overlap = Tensor::Zeros({R, H, 2}, DType::kI32);
    Tensor c_fetch_use = Tensor::Zeros({R, H, 2}, DType::kI32);
    Tensor g_rows = gpu->Upload(c_rows), g_table = gpu->Upload(c_table), g_slots = gpu->Upload(c_slots);
    Tensor g_blocks = gpu->Upload(c_blocks), g_age = gpu->Upload(c_age), g_src = gpu->Upload(c_src),
           g_dst = gpu->Upload(c_dst), g_res = gpu->Upload(c_res), g_nres = gpu->Upload(c_nres),
           g_stats = gpu->Upload(c_stats), g_overlap = gpu->Upload(c_overlap), g_fetch_use = gpu->Upload(c_fetch_use);
    // Remote blocks (disaggregation): a random fifth of every row's blocks, in host memory the
    // GPU reads, some turning local between steps; CR = C.
    Tensor remote = gpu->EmptyHost({R, H, mb}, DType::kU8);
    for (int64_t i = 0; i < remote.numel(); ++i) remote.data<uint8_t>()[i] = rng() % 5 == 0;
    Tensor c_rout = Tensor::Zeros({R, H, c}, DType::kI32), g_rout = gpu->Upload(c_rout);
    Tensor prev_topk;
    for (int step = 0; step < 6; ++step) {
      INFO("step " << step);
      // A prediction that drifts: mostly the previous set, some new blocks, sometimes fewer than K.
      std::vector<int32_t> topk(static_cast<size_t>(R * H * k), -1);
      for (int64_t rh = 0; rh < R * H; ++rh) {
        std::vector<int32_t> ids(static_cast<size_t>(mb));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        const int take = step == 3 ? k / 2 : k;
        for (int i = 0; i < take; ++i) {
          const int32_t old = c_blocks.data<int32_t>()[rh * k + i];
          topk[rh * k + i] = (old >= 0 && i % 4 != 0) ? old : ids[i];
        }
        // distinct: drop duplicates
        std::vector<int32_t> seen;
        for (int i = 0; i < k; ++i) {
          int32_t& b = topk[rh * k + i];
          if (b >= 0 && std::find(seen.begin(), seen.end(), b) != seen.end()) b = -1;
          if (b >= 0) seen.push_back(b);
        }
        std::stable_partition(topk.begin() + rh * k, topk.begin() + (rh + 1) * k, [](int32_t b) { return b >= 0; });
      }
      Tensor c_topk = Ints({R, H, k}, topk);
      const bool with_remote = step % 2 == 1;
      if (with_remote) {
        for (int64_t i = 0; i < remote.numel(); ++i) remote.data<uint8_t>()[i] &= rng() % 3 != 0;
      }
      // In-place blocks (KV in the GPU pool) from step 2 on: table entries >= 2^19, about half;
      // at step 4 a tenth of the entries move (between the host store and the GPU pool).
      const int32_t in_place_base = step >= 2 ? (1 << 19) : INT32_MAX;
      if (step == 4) {
        for (int64_t i = 0; i < c_table.numel(); ++i) {
          if (rng() % 10 == 0) c_table.data<int32_t>()[i] = std::uniform_int_distribution<int>(0, 1 << 20)(rng);
        }
        g_table = gpu->Upload(c_table);
      }
      // The adaptive budget's per-head caps (docs/sparse.md §13) at steps 4 and 5: 0, 1, above C
      // (clamped) and about C / 2.
      const bool capped = step >= 4;
      const Tensor c_cap = Ints({H}, {0, 1, c + 5, std::max(1, c / 2)}), g_cap = gpu->Upload(c_cap);
      cpu.SelectBlocks(c_topk, c_rows, c_table, c_slots, c_blocks, c_age, c_src, c_dst, c_res, c_nres, c_stats,
                       with_remote ? &remote : nullptr, with_remote ? &c_rout : nullptr, in_place_base,
                       capped ? &c_cap : nullptr);
      Tensor g_topk = gpu->Upload(c_topk);
      gpu->SelectBlocks(g_topk, g_rows, g_table, g_slots, g_blocks, g_age, g_src, g_dst, g_res, g_nres, g_stats,
                        with_remote ? &remote : nullptr, with_remote ? &g_rout : nullptr, in_place_base,
                        capped ? &g_cap : nullptr);
      for (auto [g, w] : {std::pair{&g_blocks, &c_blocks}, {&g_age, &c_age}, {&g_src, &c_src}, {&g_dst, &c_dst},
                          {&g_res, &c_res}, {&g_nres, &c_nres}, {&g_stats, &c_stats}, {&g_rout, &c_rout}}) {
        ExpectSameInts(gpu->Download(*g), *w);
      }
      if (prev_topk.defined()) {
        cpu.TopKOverlap(prev_topk, c_topk, c_rows, c_overlap);
        gpu->TopKOverlap(gpu->Upload(prev_topk), g_topk, g_rows, g_overlap);
        ExpectSameInts(gpu->Download(g_overlap), c_overlap);
        // The blocks this select fetched, looked up in another set (the previous prediction:
        // some of them are in it, some not).
        cpu.FetchOverlap(c_dst, c_slots, c_blocks, prev_topk, c_rows, c_fetch_use);
        gpu->FetchOverlap(g_dst, g_slots, g_blocks, gpu->Upload(prev_topk), g_rows, g_fetch_use);
        ExpectSameInts(gpu->Download(g_fetch_use), c_fetch_use);
      }
      prev_topk = c_topk;
    }
    // The attention rows of a batch of 4 sequences (two sparse, mapped to rows 2 and 0).
    const int64_t S = 4, width = k + 2;
    std::vector<int32_t> seq_rows = {2, -1, 0, -1}, tail_lens = {17, 5, 16, 1}, tails(S * H * 2);
    std::iota(tails.begin(), tails.end(), 50000);
    AttentionMetadata cm;
    cm.kv_lens = Ints({S, H}, std::vector<int32_t>(S * H, 3));
    cm.block_tables = Ints({S, H, width}, std::vector<int32_t>(S * H * width, -5));
    AttentionMetadata gm;
    gm.kv_lens = gpu->Upload(cm.kv_lens);
    gm.block_tables = gpu->Upload(cm.block_tables);
    cpu.AssembleSparseTables(Ints({S}, seq_rows), c_res, c_nres, Ints({S, H, 2}, tails), Ints({S}, tail_lens), cm);
    gpu->AssembleSparseTables(gpu->Upload(Ints({S}, seq_rows)), g_res, g_nres, gpu->Upload(Ints({S, H, 2}, tails)),
                              gpu->Upload(Ints({S}, tail_lens)), gm);
    ExpectSameInts(gpu->Download(gm.kv_lens), cm.kv_lens);
    ExpectSameInts(gpu->Download(gm.block_tables), cm.block_tables);
  }
}

// Both gather kernels, both directions (host -> device: the sparse transfer; device -> host: the
// switch to sparse), head dims 64/128/256, few CTAs (many entries per CTA: the TMA kernel's ring
// wraps many times) and many, skipped entries (either slot negative).
TEST_CASE("The gather kernels (TMA and registers) copy head-blocks exactly both ways", "[gpu][sparse]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const auto kernel = GENERATE(kernels::GatherKernel::kTma, kernels::GatherKernel::kRegisters);
  const int d = GENERATE(64, 128, 256);
  const int ctas = GENERATE(1, 3, 48);
  const bool to_host = GENERATE(false, true);
  INFO("kernel " << static_cast<int>(kernel) << ", head_dim " << d << ", " << ctas << " CTAs, "
                 << (to_host ? "device -> host" : "host -> device"));
  const int64_t src_slots = 200, dst_slots = 150, n = 137;
  Tensor sk = RandomBf16Exact({src_slots, kBlockSize, d}, rng), sv = RandomBf16Exact({src_slots, kBlockSize, d}, rng);
  LayerKvPool src, dst;
  if (to_host) {
    src = {UploadBf16(*gpu, sk), UploadBf16(*gpu, sv)};
    dst = {gpu->EmptyHost({dst_slots, kBlockSize, d}, DType::kBF16), gpu->EmptyHost({dst_slots, kBlockSize, d}, DType::kBF16)};
    std::memset(dst.k.raw(), 0xFF, dst.k.nbytes());  // NaN poison
    std::memset(dst.v.raw(), 0xFF, dst.v.nbytes());
  } else {
    src = {gpu->EmptyHost({src_slots, kBlockSize, d}, DType::kBF16), gpu->EmptyHost({src_slots, kBlockSize, d}, DType::kBF16)};
    std::memcpy(src.k.raw(), ToBf16Host(sk).raw(), src.k.nbytes());
    std::memcpy(src.v.raw(), ToBf16Host(sv).raw(), src.v.nbytes());
    dst = {PoisonedBf16(*gpu, {dst_slots, kBlockSize, d}), PoisonedBf16(*gpu, {dst_slots, kBlockSize, d})};
  }
  std::vector<int32_t> from(n), to(n), perm(dst_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t i = 0; i < n; ++i) {
    from[i] = i % 11 == 5 ? -1 : std::uniform_int_distribution<int>(0, src_slots - 1)(rng);
    to[i] = i % 13 == 7 ? -1 : perm[i];
  }
  Tensor from_d = gpu->Upload(Ints({n}, from)), to_d = gpu->Upload(Ints({n}, to));
  auto bf = [](const Tensor& t) { return static_cast<const __nv_bfloat16*>(t.raw()); };
  auto bfm = [](Tensor& t) { return static_cast<__nv_bfloat16*>(t.raw()); };
  REQUIRE(kernels::LaunchCopyBlocks(bf(src.k), bf(src.v), static_cast<const int32_t*>(from_d.raw()), bfm(dst.k),
                                    bfm(dst.v), static_cast<const int32_t*>(to_d.raw()), n, d, ctas, gpu->stream(),
                                    kernel) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
  Tensor gk = to_host ? dst.k.ToFloat() : DownloadF32(*gpu, dst.k);
  Tensor gv = to_host ? dst.v.ToFloat() : DownloadF32(*gpu, dst.v);
  const int64_t per = kBlockSize * d;
  std::vector<bool> written(dst_slots, false);
  for (int64_t i = 0; i < n; ++i) {
    if (from[i] < 0 || to[i] < 0) continue;
    INFO("entry " << i);
    written[to[i]] = true;
    CHECK(std::equal(gk.data<float>() + to[i] * per, gk.data<float>() + (to[i] + 1) * per, sk.data<float>() + from[i] * per));
    CHECK(std::equal(gv.data<float>() + to[i] * per, gv.data<float>() + (to[i] + 1) * per, sv.data<float>() + from[i] * per));
  }
  for (int64_t slot = 0; slot < dst_slots; ++slot) {  // nothing else was written
    if (written[slot]) continue;
    INFO("untouched slot " << slot);
    CHECK(std::isnan(gk.data<float>()[slot * per]));
    CHECK(std::isnan(gv.data<float>()[(slot + 1) * per - 1]));
  }
}

TEST_CASE("CopyBlocks and CopyTokens move K and V exactly between device and mapped host pools", "[gpu][sparse]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const int d = 128;
  // 300 slots (1.2 MiB: cudaHostAlloc) and 20,000 (78 MiB: the registered huge-page path of
  // EmptyHost, which the host KV store's pools take).
  const int64_t host_slots = GENERATE(int64_t{300}, int64_t{20000});
  INFO("host slots " << host_slots);
  const int64_t dev_slots = 64, n = 100;
  Tensor hk = RandomBf16Exact({host_slots, kBlockSize, d}, rng), hv = RandomBf16Exact({host_slots, kBlockSize, d}, rng);
  LayerKvPool host{gpu->EmptyHost({host_slots, kBlockSize, d}, DType::kBF16),
                   gpu->EmptyHost({host_slots, kBlockSize, d}, DType::kBF16)};
  std::memcpy(host.k.raw(), ToBf16Host(hk).raw(), host.k.nbytes());
  std::memcpy(host.v.raw(), ToBf16Host(hv).raw(), host.v.nbytes());
  LayerKvPool dev{PoisonedBf16(*gpu, {dev_slots, kBlockSize, d}), PoisonedBf16(*gpu, {dev_slots, kBlockSize, d})};
  // Host -> device gather: 60 distinct destinations, some skipped entries.
  std::vector<int32_t> src(n), dst(n, -1), perm(dev_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t i = 0; i < n; ++i) {
    src[i] = std::uniform_int_distribution<int>(0, host_slots - 1)(rng);
    if (i < 60) dst[i] = perm[i];
  }
  src[3] = -1;
  gpu->CopyBlocks(host, gpu->Upload(Ints({n}, src)), dev, gpu->Upload(Ints({n}, dst)));
  Tensor gk = DownloadF32(*gpu, dev.k), gv = DownloadF32(*gpu, dev.v);
  const int64_t per = kBlockSize * d;
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] < 0 || dst[i] < 0) continue;
    INFO("entry " << i);
    CHECK(std::equal(gk.data<float>() + dst[i] * per, gk.data<float>() + (dst[i] + 1) * per, hk.data<float>() + src[i] * per));
    CHECK(std::equal(gv.data<float>() + dst[i] * per, gv.data<float>() + (dst[i] + 1) * per, hv.data<float>() + src[i] * per));
  }
  CHECK(std::isnan(gk.data<float>()[perm[3] * per]));  // entry 3 was skipped
  // Device -> host token write-through.
  Tensor tk = RandomBf16Exact({dev_slots, kBlockSize, d}, rng), tv = RandomBf16Exact({dev_slots, kBlockSize, d}, rng);
  LayerKvPool dev2{UploadBf16(*gpu, tk), UploadBf16(*gpu, tv)};
  const int64_t m = 40;
  Tensor si = Tensor::Empty({m}, DType::kI64), di = Tensor::Empty({m}, DType::kI64);
  for (int64_t i = 0; i < m; ++i) {
    si.data<int64_t>()[i] = std::uniform_int_distribution<int64_t>(0, dev_slots * kBlockSize - 1)(rng);
    di.data<int64_t>()[i] = i == 7 ? -1 : i * 37 + 5;
  }
  gpu->CopyTokens(dev2, gpu->Upload(si), host, gpu->Upload(di));
  REQUIRE(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
  Tensor hk_after = host.k.ToFloat(), hv_after = host.v.ToFloat();
  for (int64_t i = 0; i < m; ++i) {
    const int64_t s = si.data<int64_t>()[i], t = di.data<int64_t>()[i];
    if (t < 0) continue;
    INFO("token " << i);
    CHECK(std::equal(hk_after.data<float>() + t * d, hk_after.data<float>() + (t + 1) * d, tk.data<float>() + s * d));
    CHECK(std::equal(hv_after.data<float>() + t * d, hv_after.data<float>() + (t + 1) * d, tv.data<float>() + s * d));
  }
}

TEST_CASE("A host KV store the machine cannot hold is a ResourceExhausted error, not a crash", "[gpu][sparse]") {
  auto b = MakeBackend();
  // 1 PiB: refused before a page is touched (the OOM killer would end the process otherwise).
  try {
    (void)b->EmptyHost({int64_t{1} << 40, 1024}, DType::kU8);
    FAIL("a 1 PiB host tensor was allocated");
  } catch (const StatusError& e) {
    CHECK(e.status().code() == StatusCode::kResourceExhausted);
    CHECK(e.status().message().find("--host-kv-gib") != std::string::npos);
  }
  // The backend stays usable: a small pinned tensor still works.
  Tensor small = b->EmptyHost({1024}, DType::kU8);
  std::memset(small.data<uint8_t>(), 7, 1024);
  CHECK(small.data<uint8_t>()[1023] == 7);
}

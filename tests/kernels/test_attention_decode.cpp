// The split-K decode attention kernel (kernels/attention_decode.h) against the CPU reference
// CpuBackend::Attention on fresh random inputs: GQA shapes, q_len 1–4 (and more), contexts up
// to ~5000 tokens, shuffled slots, heads of one sequence with different lengths and tables
// (sparse requests), every split count, short contexts under a large CUDA-graph bound (wide
// tables, large max_kv_len: most split CTAs empty). Unwritten pool entries and outputs are
// NaN-poisoned.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "common/tuning.h"
#include "gpu_test_util.h"
#include "kernels/attention_decode.h"
#include "slow_scatter.h"

using namespace oasis;
using namespace oasis::testing;
using kernels::DecodeAttentionParams;

namespace {

constexpr uint16_t kNanBf16 = 0x7fc0;

std::mt19937 FreshRng() { return std::mt19937(std::random_device{}()); }

int RandInt(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

std::unique_ptr<CudaBackend> MakeBackend() {
  auto b = CudaBackend::Create();
  REQUIRE(b.ok());
  return std::move(*b);
}

// One batch on the host: the CPU reference's inputs (float pools, zeros where unwritten) and the
// GPU's (bf16 pools, NaN where unwritten: slot tails past kv_len and slots no table uses).
struct Problem {
  int hq = 0, hkv = 0, head_dim = 0, max_query_len = 0, max_blocks = 0;
  int64_t tokens = 0;
  Tensor qstart, lens, tables;  // int32 [S + 1], [S, hkv], [S, hkv, max_blocks]
  Tensor q;                     // f32 [tokens, hq, head_dim], bf16-exact
  Tensor k_ref, v_ref;          // f32 [slots, 16, head_dim]
  Tensor k_gpu, v_gpu;          // bf16 [slots, 16, head_dim]
};

// kv_lens[s][h] for each sequence and KV head; shared_tables gives all heads of a sequence
// the same slots (all its heads must then have the same length); table_width > 0 makes the
// tables that wide (as CUDA graphs do), else a little wider than the longest sequence needs.
Problem MakeProblem(std::mt19937& rng, int hq, int hkv, int head_dim, const std::vector<int>& q_lens,
                    const std::vector<std::vector<int>>& kv_lens, float q_std, bool shared_tables = false,
                    int table_width = 0) {
  Problem pr;
  pr.hq = hq, pr.hkv = hkv, pr.head_dim = head_dim;
  const int S = static_cast<int>(q_lens.size());
  int64_t slots = 7;  // a few slots no table uses
  for (int s = 0; s < S; ++s) {
    pr.tokens += q_lens[s];
    pr.max_query_len = std::max(pr.max_query_len, q_lens[s]);
    for (int h = 0; h < hkv; ++h) {
      const int pages = (kv_lens[s][h] + 15) / 16;
      pr.max_blocks = std::max(pr.max_blocks, pages);
      if (!shared_tables || h == 0) slots += pages;
    }
  }
  pr.max_blocks += RandInt(rng, 0, 3);  // the table may be wider than any sequence needs
  if (table_width > 0) {
    REQUIRE(table_width >= pr.max_blocks - 3);
    pr.max_blocks = table_width;
  }
  std::vector<int32_t> free_slots(static_cast<size_t>(slots));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);

  pr.qstart = Tensor::Empty({S + 1}, DType::kI32);
  pr.lens = Tensor::Empty({S, hkv}, DType::kI32);
  pr.tables = Tensor::Empty({S, hkv, pr.max_blocks}, DType::kI32);
  std::fill_n(pr.tables.data<int32_t>(), pr.tables.numel(), -1);  // never read
  pr.k_ref = Tensor::Zeros({slots, 16, head_dim}, DType::kF32);
  pr.v_ref = Tensor::Zeros({slots, 16, head_dim}, DType::kF32);
  pr.k_gpu = Tensor::Empty({slots, 16, head_dim}, DType::kBF16);
  pr.v_gpu = Tensor::Empty({slots, 16, head_dim}, DType::kBF16);
  std::fill_n(pr.k_gpu.data<uint16_t>(), pr.k_gpu.numel(), kNanBf16);
  std::fill_n(pr.v_gpu.data<uint16_t>(), pr.v_gpu.numel(), kNanBf16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto write_token = [&](int32_t slot, int offset) {
    const int64_t base = (int64_t{slot} * 16 + offset) * head_dim;
    for (int d = 0; d < head_dim; ++d) {
      const uint16_t kb = FloatToBf16Bits(normal(rng)), vb = FloatToBf16Bits(normal(rng));
      pr.k_gpu.data<uint16_t>()[base + d] = kb;
      pr.v_gpu.data<uint16_t>()[base + d] = vb;
      pr.k_ref.data<float>()[base + d] = Bf16BitsToFloat(kb);
      pr.v_ref.data<float>()[base + d] = Bf16BitsToFloat(vb);
    }
  };
  size_t next = 0;
  int32_t row = 0;
  for (int s = 0; s < S; ++s) {
    pr.qstart.data<int32_t>()[s] = row;
    row += q_lens[s];
    for (int h = 0; h < hkv; ++h) {
      const int len = kv_lens[s][h];
      REQUIRE(len >= q_lens[s]);
      pr.lens.data<int32_t>()[s * hkv + h] = len;
      int32_t* table = pr.tables.data<int32_t>() + (int64_t{s} * hkv + h) * pr.max_blocks;
      if (shared_tables && h > 0) {
        REQUIRE(len == kv_lens[s][0]);
        std::copy_n(pr.tables.data<int32_t>() + int64_t{s} * hkv * pr.max_blocks, pr.max_blocks, table);
        continue;
      }
      for (int b = 0; b < (len + 15) / 16; ++b) table[b] = free_slots[next++];
      for (int t = 0; t < len; ++t) write_token(table[t / 16], t % 16);
    }
  }
  pr.qstart.data<int32_t>()[S] = row;
  pr.q = RandomBf16Exact({pr.tokens, hq, head_dim}, rng, q_std);
  return pr;
}

struct RunOptions {
  int num_splits = 0;  // 0: the kernel's choice
  int max_kv_len = 0;  // split-count hint, 0: none
};

// The launch parameters of a problem over device copies of its tensors.
struct DeviceProblem {
  Tensor q, k, v, qstart, lens, tables, out;
};
DecodeAttentionParams ParamsOf(const Problem& pr, const DeviceProblem& d, float scale) {
  DecodeAttentionParams p;
  p.q = static_cast<const __nv_bfloat16*>(d.q.raw());
  p.k_pool = static_cast<const __nv_bfloat16*>(d.k.raw());
  p.v_pool = static_cast<const __nv_bfloat16*>(d.v.raw());
  p.query_start = d.qstart.data<int32_t>();
  p.kv_lens = d.lens.data<int32_t>();
  p.block_tables = d.tables.data<int32_t>();
  p.out = static_cast<__nv_bfloat16*>(d.out.raw());
  p.tokens = pr.tokens;
  p.num_seqs = static_cast<int>(pr.qstart.numel() - 1);
  p.num_q_heads = pr.hq;
  p.num_kv_heads = pr.hkv;
  p.head_dim = pr.head_dim;
  p.max_blocks = pr.max_blocks;
  p.max_query_len = pr.max_query_len;
  p.scale = scale;
  return p;
}

// Runs the decode kernel on a NaN-poisoned output; returns it as float, and the split count used.
Tensor RunDecode(CudaBackend& gpu, const Problem& pr, float scale, RunOptions opt, int* splits_used = nullptr) {
  const DeviceProblem d{UploadBf16(gpu, pr.q),          gpu.Upload(pr.k_gpu),  gpu.Upload(pr.v_gpu),
                        gpu.Upload(pr.qstart),          gpu.Upload(pr.lens),   gpu.Upload(pr.tables),
                        PoisonedBf16(gpu, {pr.tokens, pr.hq, pr.head_dim})};
  DecodeAttentionParams p = ParamsOf(pr, d, scale);
  p.max_kv_len = opt.max_kv_len;
  p.num_splits = opt.num_splits;
  const size_t bytes = kernels::DecodeAttentionWorkspaceBytes(p);
  const int splits = kernels::DecodeAttentionNumSplits(p);
  CHECK((splits == 1) == (bytes == 0));
  if (splits_used) *splits_used = splits;
  Tensor workspace = gpu.Empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))}, DType::kU8);
  if (bytes > 0) REQUIRE(kernels::LaunchDecodeAttention(p, workspace.raw(), bytes - 1, gpu.stream()) == cudaErrorInvalidValue);
  REQUIRE(kernels::LaunchDecodeAttention(p, bytes ? workspace.raw() : nullptr, bytes, gpu.stream()) == cudaSuccess);
  return DownloadF32(gpu, d.out);  // synchronises: a kernel fault shows up here
}

// The kernel with after_append, right behind a slow stand-in for the step's append
// (LaunchSlowScatter): the pools hold NaN in the query tokens' rows and q is NaN until the
// stand-in writes them, after letting the kernel launch. Anything the kernel reads before its
// wait that it should have read after shows as NaN in the output.
// `older_row` >= 0 adds a row of an older token (slot · 16 + offset) to what the stand-in
// writes late, which the caller promises not to do: the kernel may read it early (the test of
// the test: it shows that the stand-in does let the kernel start before it writes).
Tensor RunDecodeAfterAppend(CudaBackend& gpu, const Problem& pr, float scale, int num_splits,
                            int64_t older_row = -1) {
  const int units_per_row = pr.head_dim / 8;  // 16-byte units of a token row
  Tensor k_host = pr.k_gpu.Clone(), v_host = pr.v_gpu.Clone();
  std::vector<int64_t> dst_units;
  std::vector<uint16_t> k_rows, v_rows;
  const int S = static_cast<int>(pr.qstart.numel() - 1);
  const int64_t row_elems = pr.head_dim;
  std::vector<int64_t> done_rows;  // rows of heads that share a table are written once
  for (int s = 0; s < S; ++s) {
    const int q_len = pr.qstart.data<int32_t>()[s + 1] - pr.qstart.data<int32_t>()[s];
    for (int h = 0; h < pr.hkv; ++h) {
      const int len = pr.lens.data<int32_t>()[s * pr.hkv + h];
      const int32_t* table = pr.tables.data<int32_t>() + (int64_t{s} * pr.hkv + h) * pr.max_blocks;
      for (int t = len - q_len; t < len; ++t) {
        const int64_t row = int64_t{table[t / 16]} * 16 + t % 16;
        if (std::find(done_rows.begin(), done_rows.end(), row) != done_rows.end()) continue;
        done_rows.push_back(row);
        uint16_t* kr = k_host.data<uint16_t>() + row * row_elems;
        uint16_t* vr = v_host.data<uint16_t>() + row * row_elems;
        k_rows.insert(k_rows.end(), kr, kr + row_elems);
        v_rows.insert(v_rows.end(), vr, vr + row_elems);
        std::fill_n(kr, row_elems, kNanBf16);
        std::fill_n(vr, row_elems, kNanBf16);
        for (int u = 0; u < units_per_row; ++u) dst_units.push_back(row * units_per_row + u);
      }
    }
  }
  if (older_row >= 0) {
    uint16_t* kr = k_host.data<uint16_t>() + older_row * row_elems;
    k_rows.insert(k_rows.end(), kr, kr + row_elems);
    v_rows.insert(v_rows.end(), v_host.data<uint16_t>() + older_row * row_elems,
                  v_host.data<uint16_t>() + (older_row + 1) * row_elems);
    std::fill_n(kr, row_elems, kNanBf16);
    for (int u = 0; u < units_per_row; ++u) dst_units.push_back(older_row * units_per_row + u);
  }
  const int64_t n_units = static_cast<int64_t>(dst_units.size());
  auto host_u16 = [](const std::vector<uint16_t>& v) {
    Tensor t = Tensor::Empty({static_cast<int64_t>(std::max<size_t>(v.size(), 8))}, DType::kBF16);
    std::copy(v.begin(), v.end(), t.data<uint16_t>());
    return t;
  };
  Tensor units_host = Tensor::Empty({std::max<int64_t>(n_units, 1)}, DType::kI64);
  std::copy(dst_units.begin(), dst_units.end(), units_host.data<int64_t>());
  const DeviceProblem d{PoisonedBf16(gpu, {pr.tokens, pr.hq, pr.head_dim}),
                        gpu.Upload(k_host),
                        gpu.Upload(v_host),
                        gpu.Upload(pr.qstart),
                        gpu.Upload(pr.lens),
                        gpu.Upload(pr.tables),
                        PoisonedBf16(gpu, {pr.tokens, pr.hq, pr.head_dim})};
  const Tensor k_src = gpu.Upload(host_u16(k_rows)), v_src = gpu.Upload(host_u16(v_rows));
  const Tensor units = gpu.Upload(units_host);
  const Tensor q_src = UploadBf16(gpu, pr.q);
  DecodeAttentionParams p = ParamsOf(pr, d, scale);
  p.num_splits = num_splits;
  p.after_append = true;
  const size_t bytes = kernels::DecodeAttentionWorkspaceBytes(p);
  Tensor workspace = gpu.Empty({static_cast<int64_t>(std::max<size_t>(bytes, 16))}, DType::kU8);
  using testing::SlowScatterJob;
  const SlowScatterJob jk{static_cast<const uint4*>(k_src.raw()), static_cast<uint4*>(d.k.raw()),
                          units.data<int64_t>(), n_units};
  const SlowScatterJob jv{static_cast<const uint4*>(v_src.raw()), static_cast<uint4*>(d.v.raw()),
                          units.data<int64_t>(), n_units};
  const SlowScatterJob jq{static_cast<const uint4*>(q_src.raw()), static_cast<uint4*>(d.q.raw()), nullptr,
                          pr.tokens * pr.hq * pr.head_dim / 8};
  REQUIRE(testing::LaunchSlowScatter(400000, jk, jv, jq, gpu.stream()) == cudaSuccess);  // ~0.2 ms
  REQUIRE(kernels::LaunchDecodeAttention(p, bytes ? workspace.raw() : nullptr, bytes, gpu.stream()) == cudaSuccess);
  return DownloadF32(gpu, d.out);
}

Tensor RunReference(const Problem& pr, float scale) {
  CpuBackend cpu;
  Tensor want = Tensor::Empty({pr.tokens, pr.hq, pr.head_dim}, DType::kF32);
  cpu.Attention(pr.q, LayerKvPool{pr.k_ref, pr.v_ref}, AttentionMetadata{pr.qstart, pr.lens, pr.tables, pr.max_query_len},
                scale, want);
  return want;
}

float ScaleFor(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

// Same length for every head of a sequence.
std::vector<std::vector<int>> DenseLens(const std::vector<int>& ctx, int hkv) {
  std::vector<std::vector<int>> lens;
  for (int c : ctx) lens.emplace_back(static_cast<size_t>(hkv), c);
  return lens;
}

}  // namespace

TEST_CASE("Decode attention matches the CPU: GQA 32/8, 8/2, 4/1 and MHA, q_len 1-4", "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const std::vector<std::pair<int, int>> heads = {{32, 8}, {8, 2}, {4, 1}, {4, 4}};
  const std::vector<int> batches = {1, 3, 6};
  int round = 0;
  for (auto [hq, hkv] : heads) {
    for (int head_dim : {64, 128}) {
      const int batch = batches[static_cast<size_t>(round++) % batches.size()];
      std::vector<int> q_lens, ctx;
      for (int s = 0; s < batch; ++s) {
        q_lens.push_back(RandInt(rng, 1, 4));
        // Short, block-boundary and long contexts, mostly not multiples of 16.
        const int pick = RandInt(rng, 0, 5);
        ctx.push_back(pick == 0   ? q_lens.back()
                      : pick == 1 ? 16 * RandInt(rng, 1, 40)
                      : pick == 2 ? 16 * RandInt(rng, 1, 40) + 1
                                  : RandInt(rng, q_lens.back(), 5000));
      }
      const bool shared = round % 2 == 0;
      const Problem pr = MakeProblem(rng, hq, hkv, head_dim, q_lens, DenseLens(ctx, hkv), 1.0f, shared);
      const Tensor want = RunReference(pr, ScaleFor(head_dim));
      int splits = 0;
      const Tensor got = RunDecode(*gpu, pr, ScaleFor(head_dim), {}, &splits);
      INFO("hq " << hq << " hkv " << hkv << " head_dim " << head_dim << " batch " << batch << " splits " << splits
                 << " shared tables " << shared);
      ExpectClose(got, want, 1e-2, 2e-2);
    }
  }
}

TEST_CASE("Decode attention after an append (PDL): older tokens read before the wait, the query's after",
          "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const std::vector<std::pair<int, int>> heads = {{32, 4}, {8, 2}, {4, 4}};
  for (int round = 0; round < 12; ++round) {
    const auto [hq, hkv] = heads[static_cast<size_t>(round) % heads.size()];
    const int head_dim = round % 4 == 3 ? 64 : 128;
    const int batch = RandInt(rng, 1, 4);
    std::vector<int> q_lens, ctx;
    for (int s = 0; s < batch; ++s) {
      q_lens.push_back(RandInt(rng, 1, 4));
      // The query run at a head-block's start, end or middle; a context of the query alone.
      const int pick = RandInt(rng, 0, 4);
      ctx.push_back(pick == 0   ? q_lens.back()
                    : pick == 1 ? 16 * RandInt(rng, 1, 20) + q_lens.back() - 1
                    : pick == 2 ? 16 * RandInt(rng, 1, 20)
                                : RandInt(rng, q_lens.back(), 3000));
    }
    const bool shared = round % 2 == 0;
    const Problem pr = MakeProblem(rng, hq, hkv, head_dim, q_lens, DenseLens(ctx, hkv), 1.0f, shared);
    const Tensor want = RunReference(pr, ScaleFor(head_dim));
    for (int splits : {0, 1, 3}) {
      INFO("hq " << hq << " hkv " << hkv << " head_dim " << head_dim << " batch " << batch << " splits " << splits
                 << " shared tables " << shared);
      ExpectClose(RunDecodeAfterAppend(*gpu, pr, ScaleFor(head_dim), splits), want, 1e-2, 2e-2);
    }
  }
  // The test can see an early read: an older token's row (the first of the first head-block,
  // which warp 0 requests before its wait) written late by the stand-in reaches the output as
  // NaN — the kernel did start while the stand-in spun.
  const Problem pr = MakeProblem(rng, 8, 2, 128, {1}, DenseLens({200}, 2), 1.0f);
  const int64_t row = int64_t{pr.tables.data<int32_t>()[0]} * 16;  // sequence 0, KV head 0, token 0
  const Tensor got = RunDecodeAfterAppend(*gpu, pr, ScaleFor(128), 1, row);
  int non_finite = 0;
  for (int64_t i = 0; i < 4 * 128; ++i) non_finite += !std::isfinite(got.data<float>()[i]);  // q heads 0-3
  CHECK(non_finite == 4 * 128);
}

TEST_CASE("Decode attention over sparse heads: each KV head its own length and table", "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  for (int q_len : {1, 2, 4}) {
    const int hq = 32, hkv = 8, head_dim = 128, batch = 4;
    std::vector<int> q_lens(batch, q_len);
    std::vector<std::vector<int>> lens(batch);
    for (int s = 0; s < batch; ++s)
      for (int h = 0; h < hkv; ++h) lens[s].push_back(RandInt(rng, q_len, 3000));
    // One sequence with extreme per-head differences: minimal, block edges, the sparse working set.
    lens[1] = {q_len, 16, 17, 2064, 33, 4097, 15 + q_len, 1000};
    const Problem pr = MakeProblem(rng, hq, hkv, head_dim, q_lens, lens, 1.0f);
    const Tensor want = RunReference(pr, ScaleFor(head_dim));
    for (int forced : {0, 1, 5}) {
      int splits = 0;
      const Tensor got = RunDecode(*gpu, pr, ScaleFor(head_dim), {forced, 0}, &splits);
      INFO("q_len " << q_len << " splits " << splits);
      ExpectClose(got, want, 1e-2, 2e-2);
    }
  }
}

TEST_CASE("Decode attention gives the same answer for every split count", "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  const int hq = 8, hkv = 2, head_dim = 128;
  const std::vector<int> q_lens = {1, 3, 2, 4, 1};
  const std::vector<int> ctx = {4999, 3, 1234, 4, 300};  // every context >= its q_len
  // Scores with a large spread (q ~ N(0, 4²)) exercise the running max and the merge weights.
  for (float q_std : {1.0f, 4.0f}) {
    const Problem pr = MakeProblem(rng, hq, hkv, head_dim, q_lens, DenseLens(ctx, hkv), q_std);
    const Tensor want = RunReference(pr, ScaleFor(head_dim));
    for (RunOptions opt : {RunOptions{0, 0}, RunOptions{1, 0}, RunOptions{2, 0}, RunOptions{3, 0}, RunOptions{7, 0},
                           RunOptions{64, 0}, RunOptions{1000, 0}, RunOptions{0, 100}, RunOptions{0, 5000}}) {
      int splits = 0;
      const Tensor got = RunDecode(*gpu, pr, ScaleFor(head_dim), opt, &splits);
      INFO("q_std " << q_std << " forced " << opt.num_splits << " hint " << opt.max_kv_len << " -> splits " << splits);
      ExpectClose(got, want, 1e-2, 2e-2);
    }
    // OASIS_DECODE_SPLITS forces the count where the caller does not; the caller's count wins.
    const Tuning saved = GetTuning();
    for (int knob : {1, 3, 16}) {
      Tuning t = saved;
      t.decode_splits = knob;
      SetTuningForTesting(t);
      int splits = 0, caller = 0;
      const Tensor got = RunDecode(*gpu, pr, ScaleFor(head_dim), {0, 0}, &splits);
      const Tensor got2 = RunDecode(*gpu, pr, ScaleFor(head_dim), {2, 0}, &caller);
      SetTuningForTesting(saved);
      INFO("q_std " << q_std << " knob " << knob << " -> splits " << splits);
      CHECK(splits == std::min(knob, (4999 + 15) / 16));
      CHECK(caller == 2);
      ExpectClose(got, want, 1e-2, 2e-2);
      ExpectClose(got2, want, 1e-2, 2e-2);
    }
  }
}

TEST_CASE("Decode attention with a CUDA-graph bound: short contexts, wide tables, large max_kv_len",
          "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  // Table width and hint of 16K tokens (1024 head-blocks) over contexts of 1 to ~2000 tokens: the
  // split count comes from the bound, the device cuts the real lengths, empty splits exit, pairs
  // with one used split write directly and the merge skips them.
  for (int batch : {1, 3, 8}) {
    std::vector<int> q_lens, ctx;
    for (int s = 0; s < batch; ++s) {
      q_lens.push_back(RandInt(rng, 1, 2));
      const int pick = RandInt(rng, 0, 3);
      ctx.push_back(pick == 0 ? q_lens.back() : pick == 1 ? RandInt(rng, 17, 200) : RandInt(rng, 200, 2000));
    }
    if (batch == 1) ctx[0] = 1999;  // many used splits: the merge path
    const Problem pr = MakeProblem(rng, 32, 8, 128, q_lens, DenseLens(ctx, 8), 1.0f, batch == 3, 1024);
    const Tensor want = RunReference(pr, ScaleFor(128));
    int splits = 0;
    const Tensor got = RunDecode(*gpu, pr, ScaleFor(128), {0, 16384}, &splits);
    INFO("batch " << batch << " splits " << splits);
    if (batch == 1) CHECK(splits > 1);
    ExpectClose(got, want, 1e-2, 2e-2);
  }
}

TEST_CASE("Decode attention: head_dim 64/128/256 with 16 rows, and groups of more than 16 query rows",
          "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  auto rng = FreshRng();
  // GQA 8/2 with q_len 4: 16 rows (two 8-row n-tiles for 64 and 128; two row chunks for 256).
  for (int head_dim : {64, 128, 256}) {
    const Problem pr = MakeProblem(rng, 8, 2, head_dim, {1, 4, 2}, DenseLens({700, 65, 2049}, 2), 1.0f);
    const Tensor want = RunReference(pr, ScaleFor(head_dim));
    for (int forced : {0, 1, 4}) {
      const Tensor got = RunDecode(*gpu, pr, ScaleFor(head_dim), {forced, 0});
      INFO("head_dim " << head_dim << ", splits " << forced);
      ExpectClose(got, want, 1e-2, 2e-2);
    }
  }
  // GQA 16/1 with 4 tokens: 64 rows in 4 row chunks; GQA 8/2 with 9 tokens: 36 rows.
  for (auto [hq, hkv, q_len] : {std::tuple{16, 1, 4}, std::tuple{8, 2, 9}, std::tuple{4, 1, 16}}) {
    const Problem pr = MakeProblem(rng, hq, hkv, 128, {q_len, 1, q_len}, DenseLens({1500, 40, q_len}, hkv), 1.0f);
    const Tensor want = RunReference(pr, ScaleFor(128));
    const Tensor got = RunDecode(*gpu, pr, ScaleFor(128), {0, 0});
    INFO("hq " << hq << " hkv " << hkv << " q_len " << q_len);
    ExpectClose(got, want, 1e-2, 2e-2);
  }
}

TEST_CASE("Decode attention rejects shapes it does not support", "[gpu][attention][decode]") {
  auto gpu = MakeBackend();
  Tensor buf = gpu->Empty({1 << 16}, DType::kU8);
  auto* ptr = static_cast<__nv_bfloat16*>(buf.raw());
  DecodeAttentionParams p;
  p.q = p.k_pool = p.v_pool = ptr;
  p.out = ptr;
  p.query_start = p.kv_lens = p.block_tables = static_cast<const int32_t*>(buf.raw());
  p.tokens = 1, p.num_seqs = 1, p.num_q_heads = 8, p.num_kv_heads = 2, p.head_dim = 128, p.max_blocks = 1;
  p.max_query_len = 1;
  auto launch = [&](DecodeAttentionParams q) { return kernels::LaunchDecodeAttention(q, nullptr, 0, gpu->stream()); };
  for (int d : {0, 32, 96, 512}) {
    DecodeAttentionParams q = p;
    q.head_dim = d;
    CHECK(launch(q) == cudaErrorInvalidValue);
  }
  DecodeAttentionParams q = p;
  q.num_q_heads = 6, q.num_kv_heads = 4;
  CHECK(launch(q) == cudaErrorInvalidValue);
  q = p, q.max_query_len = 0;
  CHECK(launch(q) == cudaErrorInvalidValue);
  q = p, q.max_query_len = kernels::kDecodeMaxQueryLen + 1;
  CHECK(launch(q) == cudaErrorInvalidValue);
  q = p, q.k_pool = ptr + 1;  // not 16-byte aligned
  CHECK(launch(q) == cudaErrorInvalidValue);
  q = p, q.tokens = 0, q.num_seqs = 0;  // nothing to do
  CHECK(launch(q) == cudaSuccess);
  CHECK(cudaStreamSynchronize(gpu->stream()) == cudaSuccess);
}

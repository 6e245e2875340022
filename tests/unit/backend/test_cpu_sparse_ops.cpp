// The CPU reference of the sparse-KV ops (backend.h): summaries, scoring, top-K with ties,
// select under a cap with LRU victims, copies and table assembly, on hand-made cases and on
// random data checked against brute-force rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "backend/cpu/cpu_backend.h"

using namespace oasis;

namespace {

Tensor I32(std::vector<int32_t> v, std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  REQUIRE(t.numel() == static_cast<int64_t>(v.size()));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor FilledI32(std::vector<int64_t> shape, int32_t value) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kI32);
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), value);
  return t;
}

std::vector<int32_t> Row(const Tensor& t, int64_t row) {
  const int64_t w = t.dim(-1);
  return std::vector<int32_t>(t.data<int32_t>() + row * w, t.data<int32_t>() + (row + 1) * w);
}

void FillRandom(Tensor& t, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
}

LayerKvPool RandomPool(int64_t slots, int64_t d, std::mt19937& rng) {
  LayerKvPool p{Tensor::Empty({slots, kBlockSize, d}, DType::kF32), Tensor::Empty({slots, kBlockSize, d}, DType::kF32)};
  FillRandom(p.k, rng);
  FillRandom(p.v, rng);
  return p;
}

// Working-set state of one row and one head for SelectBlocks tests.
struct SelectFixture {
  int64_t k, c, mb;
  Tensor topk, rows, host_tables, ws_slots, ws_blocks, ws_age, fetch_src, fetch_dst, resident, num_resident, stats;
  SelectFixture(int64_t k_, int64_t c_, int64_t mb_) : k(k_), c(c_), mb(mb_) {
    topk = FilledI32({1, 1, k}, -1);
    rows = I32({0}, {1});
    host_tables = Tensor::Empty({1, 1, mb}, DType::kI32);
    for (int64_t b = 0; b < mb; ++b) host_tables.data<int32_t>()[b] = static_cast<int32_t>(1000 + b);
    ws_slots = Tensor::Empty({1, 1, k}, DType::kI32);
    for (int64_t j = 0; j < k; ++j) ws_slots.data<int32_t>()[j] = static_cast<int32_t>(500 + j);
    ws_blocks = FilledI32({1, 1, k}, -1);
    ws_age = FilledI32({1, 1, k}, 0);
    fetch_src = FilledI32({1, 1, c}, 7);
    fetch_dst = FilledI32({1, 1, c}, 7);
    resident = FilledI32({1, 1, k}, 7);
    num_resident = FilledI32({1, 1}, 7);
    stats = FilledI32({1, 1, 3}, 0);
  }
  void Predict(std::vector<int32_t> blocks) {
    REQUIRE(static_cast<int64_t>(blocks.size()) <= k);
    blocks.resize(static_cast<size_t>(k), -1);
    std::copy(blocks.begin(), blocks.end(), topk.data<int32_t>());
  }
  void Run(CpuBackend& b) {
    b.SelectBlocks(topk, rows, host_tables, ws_slots, ws_blocks, ws_age, fetch_src, fetch_dst, resident, num_resident,
                   stats);
  }
};

}  // namespace

TEST_CASE("BlockSummaries are the min and max over the valid tokens", "[backend][sparse]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend b(1);
  const int64_t d = 8;
  LayerKvPool pool = RandomPool(5, d, rng);
  Tensor kmin = Tensor::Zeros({4, d}, DType::kF32), kmax = Tensor::Zeros({4, d}, DType::kF32);
  // entries: slot 3 (16 tokens) -> row 0; slot 1 (5 tokens) -> row 2; skipped: n=0, dst=-1.
  b.BlockSummaries(pool, I32({3, 1, 0, 4}, {4}), I32({16, 5, 0, 7}, {4}), I32({0, 2, 1, -1}, {4}), kmin, kmax);
  auto check = [&](int slot, int n, int row) {
    for (int64_t x = 0; x < d; ++x) {
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int j = 0; j < n; ++j) {
        float v = pool.k.data<float>()[(slot * kBlockSize + j) * d + x];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      REQUIRE(kmin.data<float>()[row * d + x] == lo);
      REQUIRE(kmax.data<float>()[row * d + x] == hi);
    }
  };
  check(3, 16, 0);
  check(1, 5, 2);
  for (int64_t x = 0; x < d; ++x) {  // rows 1 and 3 untouched
    REQUIRE(kmin.data<float>()[1 * d + x] == 0.0f);
    REQUIRE(kmax.data<float>()[3 * d + x] == 0.0f);
  }
}

TEST_CASE("ScoreBlocks is an upper bound of q.k per block and reduces the GQA group", "[backend][sparse]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend b(1);
  const int64_t hq = 4, hkv = 2, d = 16, group = hq / hkv, R = 3, mb = 6, slots = 12;
  LayerKvPool pool = RandomPool(slots, d, rng);
  Tensor kmin = Tensor::Empty({slots, d}, DType::kF32), kmax = Tensor::Empty({slots, d}, DType::kF32);
  std::vector<int32_t> all(slots), full(slots, kBlockSize);
  std::iota(all.begin(), all.end(), 0);
  b.BlockSummaries(pool, I32(all, {slots}), I32(full, {slots}), I32(all, {slots}), kmin, kmax);
  Tensor q = Tensor::Empty({5, hq, d}, DType::kF32);
  FillRandom(q, rng);
  // Row 0 uses query row 3 and 4 blocks; row 1 inactive; row 2 uses query row 0 and 6 blocks.
  Tensor query_rows = I32({3, -1, 0}, {R}), num_blocks = I32({4, 6, 6}, {R});
  Tensor tables = Tensor::Empty({R, hkv, mb}, DType::kI32);
  std::uniform_int_distribution<int32_t> pick(0, slots - 1);
  for (int64_t i = 0; i < tables.numel(); ++i) tables.data<int32_t>()[i] = pick(rng);
  for (GroupReduce reduce : {GroupReduce::kSum, GroupReduce::kMax}) {
    Tensor scores = Tensor::Empty({R, hkv, mb}, DType::kF32);
    std::fill(scores.data<float>(), scores.data<float>() + scores.numel(), -7.0f);
    b.ScoreBlocks(q, query_rows, num_blocks, tables, kmin, kmax, reduce, scores);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t blk = 0; blk < mb; ++blk) {
          const float got = scores.data<float>()[(r * hkv + h) * mb + blk];
          const int32_t row = query_rows.data<int32_t>()[r];
          if (row < 0 || blk >= num_blocks.data<int32_t>()[r]) {
            REQUIRE(got == -7.0f);
            continue;
          }
          const int32_t slot = tables.data<int32_t>()[(r * hkv + h) * mb + blk];
          // Brute force in double: the bound per head, and the true max of q.k over the keys.
          double expect = 0, best_dot = -1e300;
          for (int64_t j = h * group; j < (h + 1) * group; ++j) {
            const float* qv = q.data<float>() + (row * hq + j) * d;
            double bound = 0;
            for (int64_t x = 0; x < d; ++x) {
              bound += std::max(double(qv[x]) * kmax.data<float>()[slot * d + x],
                                double(qv[x]) * kmin.data<float>()[slot * d + x]);
            }
            double head_max = -1e300;
            for (int t = 0; t < kBlockSize; ++t) {
              double dot = 0;
              for (int64_t x = 0; x < d; ++x) dot += double(qv[x]) * pool.k.data<float>()[(slot * kBlockSize + t) * d + x];
              head_max = std::max(head_max, dot);
            }
            REQUIRE(bound >= head_max - 1e-4);
            if (reduce == GroupReduce::kSum) {
              expect += bound;
              best_dot = (j == h * group ? 0 : best_dot) + head_max;
            } else {
              expect = j == h * group ? bound : std::max(expect, bound);
              best_dot = j == h * group ? head_max : std::max(best_dot, head_max);
            }
          }
          REQUIRE(got == Approx(expect).epsilon(1e-5).margin(1e-4));
          REQUIRE(got >= best_dot - 1e-3);
        }
      }
    }
  }
}

TEST_CASE("TopKBlocks orders by score, ties to the lower block, pads with -1", "[backend][sparse]") {
  CpuBackend b(1);
  // Row 0: 6 candidate blocks (of capacity 8) with ties; row 1: 2 blocks; row 2: inactive.
  Tensor scores = Tensor::FromFloats({1, 3, 3, 0, 3, 2, 9, 9,  //
                                      5, 4, 0, 0, 0, 0, 0, 0,  //
                                      1, 1, 1, 1, 1, 1, 1, 1},
                                     {3, 1, 8});
  Tensor topk = FilledI32({3, 1, 4}, 42);
  b.TopKBlocks(scores, I32({0, 5, -1}, {3}), I32({6, 2, 8}, {3}), topk);
  REQUIRE(Row(topk, 0) == std::vector<int32_t>{1, 2, 4, 5});  // blocks 6, 7 are not candidates
  REQUIRE(Row(topk, 1) == std::vector<int32_t>{0, 1, -1, -1});
  REQUIRE(Row(topk, 2) == std::vector<int32_t>{42, 42, 42, 42});
}

TEST_CASE("TopKBlocks equals a full sort on random scores with many ties", "[backend][sparse]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend b(1);
  const int64_t R = 3, hkv = 4, mb = 200, k = 17;
  Tensor scores = Tensor::Empty({R, hkv, mb}, DType::kF32);
  std::uniform_int_distribution<int> level(-5, 5);
  for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = 0.25f * static_cast<float>(level(rng));
  Tensor num_blocks = I32({200, 9, 150}, {R}), topk = Tensor::Empty({R, hkv, k}, DType::kI32);
  b.TopKBlocks(scores, I32({0, 1, 2}, {R}), num_blocks, topk);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t h = 0; h < hkv; ++h) {
      const float* s = scores.data<float>() + (r * hkv + h) * mb;
      std::vector<std::pair<float, int32_t>> all;
      for (int32_t i = 0; i < num_blocks.data<int32_t>()[r]; ++i) all.push_back({-s[i], i});
      std::sort(all.begin(), all.end());
      std::vector<int32_t> expect(static_cast<size_t>(k), -1);
      for (size_t i = 0; i < std::min<size_t>(all.size(), k); ++i) expect[i] = all[i].second;
      REQUIRE(Row(topk, r * hkv + h) == expect);
    }
  }
}

TEST_CASE("SelectBlocks: hits stay, misses fill empty slots first, capped per step", "[backend][sparse]") {
  CpuBackend b(1);
  SelectFixture f(/*k=*/4, /*c=*/2, /*mb=*/16);
  f.Predict({9, 3, 5, 1});  // all misses, working set empty: only 2 admitted (the best two)
  f.Run(b);
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1009, 1003});
  REQUIRE(Row(f.fetch_dst, 0) == std::vector<int32_t>{500, 501});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{9, 3, -1, -1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{501, 500, -1, -1});  // ascending logical block: 3, 9
  REQUIRE(f.num_resident.data<int32_t>()[0] == 2);
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{0, 4, 2});

  f.Run(b);  // same prediction: 9, 3 hit; 5, 1 fill the two empty slots
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1005, 1001});
  REQUIRE(Row(f.fetch_dst, 0) == std::vector<int32_t>{502, 503});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{9, 3, 5, 1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{503, 501, 502, 500});  // blocks 1, 3, 5, 9
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{2, 6, 4});

  f.Run(b);  // all hits: no traffic
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{-1, -1});
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{6, 6, 4});
}

TEST_CASE("SelectBlocks with an adaptive cap per head: at most min(cap, C) admitted, null = C",
          "[backend][sparse]") {
  CpuBackend b(1);
  // Two heads, caps 1 and 9 (clamped to C = 3): the same misses, 1 and 3 admitted best-first.
  const int64_t hkv = 2, k = 4, c = 3, mb = 16;
  auto state = [&] {
    struct S {
      Tensor topk, rows, host_tables, ws_slots, ws_blocks, ws_age, src, dst, resident, num_res, stats;
    } s;
    s.topk = I32({9, 3, 5, 1, 9, 3, 5, 1}, {1, hkv, k});
    s.rows = I32({0}, {1});
    s.host_tables = Tensor::Empty({1, hkv, mb}, DType::kI32);
    for (int64_t i = 0; i < hkv * mb; ++i) s.host_tables.data<int32_t>()[i] = static_cast<int32_t>(1000 + i);
    s.ws_slots = I32({500, 501, 502, 503, 600, 601, 602, 603}, {1, hkv, k});
    s.ws_blocks = FilledI32({1, hkv, k}, -1);
    s.ws_age = FilledI32({1, hkv, k}, 0);
    s.src = FilledI32({1, hkv, c}, 7);
    s.dst = FilledI32({1, hkv, c}, 7);
    s.resident = FilledI32({1, hkv, k}, 7);
    s.num_res = FilledI32({1, hkv}, 7);
    s.stats = FilledI32({1, hkv, 3}, 0);
    return s;
  };
  auto capped = state();
  const Tensor caps = I32({1, 9}, {hkv});
  b.SelectBlocks(capped.topk, capped.rows, capped.host_tables, capped.ws_slots, capped.ws_blocks, capped.ws_age,
                 capped.src, capped.dst, capped.resident, capped.num_res, capped.stats, nullptr, nullptr, INT32_MAX,
                 &caps);
  REQUIRE(Row(capped.src, 0) == std::vector<int32_t>{1009, -1, -1});
  REQUIRE(Row(capped.src, 1) == std::vector<int32_t>{1016 + 9, 1016 + 3, 1016 + 5});
  REQUIRE(Row(capped.stats, 0) == std::vector<int32_t>{0, 4, 1});
  REQUIRE(Row(capped.stats, 1) == std::vector<int32_t>{0, 4, 3});
  REQUIRE(capped.num_res.data<int32_t>()[0] == 1);
  // A cap of 0 admits nothing (the misses are still counted).
  const Tensor zero = I32({0, 0}, {hkv});
  auto none = state();
  b.SelectBlocks(none.topk, none.rows, none.host_tables, none.ws_slots, none.ws_blocks, none.ws_age, none.src,
                 none.dst, none.resident, none.num_res, none.stats, nullptr, nullptr, INT32_MAX, &zero);
  REQUIRE(Row(none.src, 0) == std::vector<int32_t>{-1, -1, -1});
  REQUIRE(Row(none.stats, 1) == std::vector<int32_t>{0, 4, 0});
  // Caps of C everywhere are bit-identical to no cap tensor, step after step.
  std::mt19937 rng(std::random_device{}());
  auto with_c = state(), without = state();
  const Tensor full = I32({3, 3}, {hkv});
  for (int step = 0; step < 50; ++step) {
    std::vector<int32_t> blocks(mb);
    std::iota(blocks.begin(), blocks.end(), 0);
    for (int64_t h = 0; h < hkv; ++h) {
      std::shuffle(blocks.begin(), blocks.begin() + 10, rng);
      std::copy_n(blocks.begin(), k, with_c.topk.data<int32_t>() + h * k);
    }
    std::copy_n(with_c.topk.data<int32_t>(), hkv * k, without.topk.data<int32_t>());
    b.SelectBlocks(with_c.topk, with_c.rows, with_c.host_tables, with_c.ws_slots, with_c.ws_blocks, with_c.ws_age,
                   with_c.src, with_c.dst, with_c.resident, with_c.num_res, with_c.stats, nullptr, nullptr,
                   INT32_MAX, &full);
    b.SelectBlocks(without.topk, without.rows, without.host_tables, without.ws_slots, without.ws_blocks,
                   without.ws_age, without.src, without.dst, without.resident, without.num_res, without.stats);
    using Pair = std::pair<const Tensor*, const Tensor*>;
    for (const Pair& p : std::initializer_list<Pair>{{&with_c.src, &without.src},
                                                     {&with_c.ws_blocks, &without.ws_blocks},
                                                     {&with_c.ws_age, &without.ws_age},
                                                     {&with_c.resident, &without.resident},
                                                     {&with_c.stats, &without.stats}}) {
      for (int64_t h = 0; h < hkv; ++h) REQUIRE(Row(*p.first, h) == Row(*p.second, h));
    }
  }
}

TEST_CASE("SelectBlocks with remote blocks: listed in score order, never fetched, counted as misses",
          "[backend][sparse]") {
  CpuBackend b(1);
  SelectFixture f(/*k=*/4, /*c=*/2, /*mb=*/16);
  Tensor remote = Tensor::Zeros({1, 1, 16}, DType::kU8), remote_out = FilledI32({1, 1, 2}, 7);
  for (int32_t rb : {9, 5, 1}) remote.data<uint8_t>()[rb] = 1;
  auto run = [&] {
    b.SelectBlocks(f.topk, f.rows, f.host_tables, f.ws_slots, f.ws_blocks, f.ws_age, f.fetch_src, f.fetch_dst,
                   f.resident, f.num_resident, f.stats, &remote, &remote_out);
  };
  f.Predict({9, 3, 5, 1});  // 9, 5, 1 remote: only 3 is admissible; two of the three remote listed (CR = 2)
  run();
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1003, -1});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{3, -1, -1, -1});
  REQUIRE(Row(remote_out, 0) == std::vector<int32_t>{9, 5});
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{0, 4, 1});
  remote.data<uint8_t>()[9] = 0;  // block 9 landed
  run();
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1009, -1});
  REQUIRE(Row(remote_out, 0) == std::vector<int32_t>{5, 1});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{3, 9, -1, -1});
  f.rows.data<int32_t>()[0] = -1;  // inactive: nothing listed
  run();
  REQUIRE(Row(remote_out, 0) == std::vector<int32_t>{-1, -1});
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{-1, -1});
}

TEST_CASE("SelectBlocks with in-place blocks: read where they are, never fetched, no working slot",
          "[backend][sparse]") {
  CpuBackend b(1);
  SelectFixture f(/*k=*/4, /*c=*/2, /*mb=*/16);
  const int32_t base = 100000;
  auto run = [&] {
    b.SelectBlocks(f.topk, f.rows, f.host_tables, f.ws_slots, f.ws_blocks, f.ws_age, f.fetch_src, f.fetch_dst,
                   f.resident, f.num_resident, f.stats, nullptr, nullptr, base);
  };
  // Every block in place (an HBM-home request): block b in GPU slot 40 + b.
  for (int32_t blk = 0; blk < 16; ++blk) f.host_tables.data<int32_t>()[blk] = base + 40 + blk;
  f.Predict({9, 3, 5});
  run();
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{-1, -1});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{-1, -1, -1, -1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{43, 45, 49, -1});  // blocks 3, 5, 9
  REQUIRE(f.num_resident.data<int32_t>()[0] == 3);
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{3, 0, 0});

  // Mixed (a request part-way through a move to the host): blocks 0-7 in the host store.
  for (int32_t blk = 0; blk < 8; ++blk) f.host_tables.data<int32_t>()[blk] = 1000 + blk;
  f.Predict({9, 3, 5, 1});  // 3, 5, 1 miss: two fetched (3, 5); 9 in place
  run();
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1003, 1005});
  REQUIRE(Row(f.fetch_dst, 0) == std::vector<int32_t>{500, 501});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{3, 5, -1, -1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{500, 501, 49, -1});  // blocks 3, 5, 9
  REQUIRE(Row(f.stats, 0) == std::vector<int32_t>{4, 3, 2});

  f.Predict({9, 12, 1});  // 1 fetched; 3 and 5 stale, kept while fewer than K are listed: 3
  run();
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1001, -1});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{3, 5, 1, -1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{502, 500, 49, 52});  // blocks 1, 3, 9, 12
  REQUIRE(f.num_resident.data<int32_t>()[0] == 4);

  // Block 3 moves back to the GPU: its working slot is emptied, the GPU copy read instead.
  f.host_tables.data<int32_t>()[3] = base + 7;
  f.Predict({3, 1});
  run();
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{-1, 5, 1, -1});
  REQUIRE(Row(f.resident, 0) == std::vector<int32_t>{502, 7, 501, -1});  // blocks 1, 3, 5
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{-1, -1});
}

TEST_CASE("SelectBlocks evicts the least recently selected block first", "[backend][sparse]") {
  CpuBackend b(1);
  SelectFixture f(/*k=*/4, /*c=*/1, /*mb=*/16);
  std::copy_n(std::vector<int32_t>{0, 1, 2, 3}.begin(), 4, f.ws_blocks.data<int32_t>());
  f.Predict({0, 1, 2, 3});
  f.Run(b);  // ages 0 0 0 0
  f.Predict({0, 1, 3});
  f.Run(b);  // block 2 (slot 2) not predicted: age 1
  f.Predict({0, 2, 3});
  f.Run(b);  // block 1 (slot 1) age 1, block 2 age 0
  f.Predict({3, 7});  // miss 7; victims by age: slot 1 (block 1, age 2), then slot 0/2 (age 1)
  f.Run(b);
  REQUIRE(Row(f.fetch_src, 0) == std::vector<int32_t>{1007});
  REQUIRE(Row(f.fetch_dst, 0) == std::vector<int32_t>{501});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{0, 7, 2, 3});
  REQUIRE(Row(f.ws_age, 0) == std::vector<int32_t>{1, 0, 1, 0});
  f.Predict({3, 8});  // ages equal (slots 0 and 2): the lower working slot goes first
  f.Run(b);
  REQUIRE(Row(f.fetch_dst, 0) == std::vector<int32_t>{500});
  REQUIRE(Row(f.ws_blocks, 0) == std::vector<int32_t>{8, 7, 2, 3});
}

TEST_CASE("SelectBlocks on random predictions keeps its invariants", "[backend][sparse]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend b(1);
  const int64_t R = 3, hkv = 2, k = 6, c = 2, mb = 30;
  Tensor topk = Tensor::Empty({R, hkv, k}, DType::kI32), host_tables = Tensor::Empty({R, hkv, mb}, DType::kI32);
  for (int64_t i = 0; i < host_tables.numel(); ++i) host_tables.data<int32_t>()[i] = static_cast<int32_t>(i);
  Tensor ws_slots = Tensor::Empty({R, hkv, k}, DType::kI32);
  for (int64_t i = 0; i < ws_slots.numel(); ++i) ws_slots.data<int32_t>()[i] = static_cast<int32_t>(100 + i);
  Tensor ws_blocks = FilledI32({R, hkv, k}, -1), ws_age = FilledI32({R, hkv, k}, 0);
  Tensor src = Tensor::Empty({R, hkv, c}, DType::kI32), dst = Tensor::Empty({R, hkv, c}, DType::kI32);
  Tensor resident = Tensor::Empty({R, hkv, k}, DType::kI32), num_res = Tensor::Empty({R, hkv}, DType::kI32);
  Tensor stats = FilledI32({R, hkv, 3}, 0);
  std::vector<int32_t> blocks(mb);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (int step = 0; step < 200; ++step) {
    const bool active1 = step % 3 != 0;
    Tensor rows = I32({0, active1 ? 1 : -1, 2}, {R});
    for (int64_t rh = 0; rh < R * hkv; ++rh) {
      std::shuffle(blocks.begin(), blocks.begin() + 12, rng);  // predictions drift within 12 blocks
      std::copy_n(blocks.begin(), k, topk.data<int32_t>() + rh * k);
    }
    Tensor before = ws_blocks.Clone();
    b.SelectBlocks(topk, rows, host_tables, ws_slots, ws_blocks, ws_age, src, dst, resident, num_res, stats);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t rh = r * hkv + h;
        const std::vector<int32_t> ws = Row(ws_blocks, rh), old = Row(before, rh), pred = Row(topk, rh);
        std::vector<int32_t> fetched;
        for (int64_t i = 0; i < c; ++i) {
          if (src.data<int32_t>()[rh * c + i] >= 0) fetched.push_back(src.data<int32_t>()[rh * c + i] - static_cast<int32_t>(rh * mb));
        }
        REQUIRE(fetched.size() <= static_cast<size_t>(c));
        if (rows.data<int32_t>()[r] < 0) {
          REQUIRE(ws == old);
          REQUIRE(fetched.empty());
          continue;
        }
        // Exactly the fetched blocks are new; no duplicates; every change is a fetch.
        std::set<int32_t> now(ws.begin(), ws.end()), was(old.begin(), old.end());
        now.erase(-1);
        was.erase(-1);
        REQUIRE(now.size() == static_cast<size_t>(std::count_if(ws.begin(), ws.end(), [](int32_t x) { return x >= 0; })));
        for (int32_t f : fetched) {
          REQUIRE(was.count(f) == 0);
          REQUIRE(now.count(f) == 1);
          REQUIRE(std::find(pred.begin(), pred.end(), f) != pred.end());
        }
        // Predicted-and-resident blocks were never evicted.
        for (int32_t p : pred) {
          if (was.count(p)) REQUIRE(now.count(p) == 1);
        }
        // The resident table lists the working slots in ascending logical block order.
        const int32_t n = num_res.data<int32_t>()[rh];
        REQUIRE(n == static_cast<int32_t>(now.size()));
        int32_t prev = -1;
        for (int32_t i = 0; i < n; ++i) {
          const int32_t slot = resident.data<int32_t>()[rh * k + i];
          const int64_t j = slot - ws_slots.data<int32_t>()[rh * k];
          REQUIRE((j >= 0 && j < k));
          REQUIRE(ws[static_cast<size_t>(j)] > prev);
          prev = ws[static_cast<size_t>(j)];
        }
      }
    }
  }
  // After warm-up the working sets are full (6 slots each).
  for (int64_t i = 0; i < ws_blocks.numel(); ++i) REQUIRE(ws_blocks.data<int32_t>()[i] >= 0);
}

TEST_CASE("CopyBlocks and CopyTokens move K and V between pools", "[backend][sparse]") {
  std::mt19937 rng(std::random_device{}());
  CpuBackend b(1);
  const int64_t d = 4;
  LayerKvPool host = RandomPool(6, d, rng), dev = RandomPool(3, d, rng);
  LayerKvPool host_copy{host.k.Clone(), host.v.Clone()};
  b.CopyBlocks(host, I32({5, 2, -1, 0}, {4}), dev, I32({1, 0, 2, -1}, {4}));
  const size_t block = kBlockSize * d;
  auto same_block = [&](const Tensor& a, int sa, const Tensor& b2, int sb) {
    return std::equal(a.data<float>() + sa * block, a.data<float>() + (sa + 1) * block, b2.data<float>() + sb * block);
  };
  REQUIRE(same_block(dev.k, 1, host.k, 5));
  REQUIRE(same_block(dev.v, 1, host.v, 5));
  REQUIRE(same_block(dev.k, 0, host.k, 2));
  REQUIRE(same_block(dev.v, 0, host.v, 2));
  REQUIRE_FALSE(same_block(dev.k, 2, host.k, 0));
  // Write-through of two tokens; the third entry is skipped.
  Tensor src_idx = Tensor::Empty({3}, DType::kI64), dst_idx = Tensor::Empty({3}, DType::kI64);
  int64_t s[3] = {1 * kBlockSize + 3, 2 * kBlockSize + 15, 0}, t[3] = {4 * kBlockSize + 3, 0, -1};
  std::copy_n(s, 3, src_idx.data<int64_t>());
  std::copy_n(t, 3, dst_idx.data<int64_t>());
  b.CopyTokens(dev, src_idx, host, dst_idx);
  REQUIRE(std::equal(dev.k.data<float>() + s[0] * d, dev.k.data<float>() + (s[0] + 1) * d, host.k.data<float>() + t[0] * d));
  REQUIRE(std::equal(dev.v.data<float>() + s[1] * d, dev.v.data<float>() + (s[1] + 1) * d, host.v.data<float>() + t[1] * d));
  // Nothing else of the host pool changed.
  for (int64_t row = 0; row < 6 * kBlockSize; ++row) {
    if (row == t[0] || row == t[1]) continue;
    REQUIRE(std::equal(host.k.data<float>() + row * d, host.k.data<float>() + (row + 1) * d,
                       host_copy.k.data<float>() + row * d));
  }
}

TEST_CASE("AssembleSparseTables writes resident blocks then the tail, only for sparse rows", "[backend][sparse]") {
  CpuBackend b(1);
  AttentionMetadata meta;
  meta.block_tables = FilledI32({3, 2, 6}, 9);
  meta.kv_lens = I32({5, 5, 40, 40, 7, 7}, {3, 2});
  Tensor resident = I32({10, 11, 12, -1, 20, 21, -1, -1,  // row 0: heads with 3 and 2 resident
                         30, 31, 32, 33, 40, 41, 42, 43},
                        {2, 2, 4});
  Tensor num_res = I32({3, 2, 4, 4}, {2, 2});
  Tensor tails = I32({0, 0, 0, 0, 70, 71, 72, 73, 80, 81, 82, 83}, {3, 2, 2});
  // seq 0 dense; seq 1 -> row 1 with a two-block tail (16 + 1 tokens); seq 2 -> row 0, tail 5.
  b.AssembleSparseTables(I32({-1, 1, 0}, {3}), resident, num_res, tails, I32({0, 17, 5}, {3}), meta);
  REQUIRE(Row(meta.block_tables, 0) == std::vector<int32_t>{9, 9, 9, 9, 9, 9});
  REQUIRE(Row(meta.block_tables, 2) == std::vector<int32_t>{30, 31, 32, 33, 70, 71});
  REQUIRE(Row(meta.block_tables, 3) == std::vector<int32_t>{40, 41, 42, 43, 72, 73});
  REQUIRE(Row(meta.block_tables, 4) == std::vector<int32_t>{10, 11, 12, 80, 9, 9});
  REQUIRE(Row(meta.block_tables, 5) == std::vector<int32_t>{20, 21, 82, 9, 9, 9});
  REQUIRE(Row(meta.kv_lens.Reshape({6}), 0) == std::vector<int32_t>{5, 5, 4 * 16 + 17, 4 * 16 + 17, 3 * 16 + 5, 2 * 16 + 5});
}

TEST_CASE("FetchOverlap counts the fetched blocks found in the real top-K", "[backend][sparse]") {
  CpuBackend b(1);
  // Two rows, one head, K = 4, C = 3. Working slots at GPU slots 100..103 / 200..203.
  Tensor slots = I32({100, 101, 102, 103, 200, 201, 202, 203}, {2, 1, 4});
  Tensor blocks = I32({7, 8, 9, -1, 30, 31, 32, 33}, {2, 1, 4});
  // Row 0 fetched into slots 102 (block 9) and 100 (block 7); row 1 into 203 (block 33),
  // 201 (block 31) and 202 (block 32).
  Tensor dst = I32({102, 100, -1, 203, 201, 202}, {2, 1, 3});
  Tensor actual = I32({9, 1, 2, -1, 33, 5, 32, 31}, {2, 1, 4});
  Tensor counts = FilledI32({2, 1, 2}, 1);
  b.FetchOverlap(dst, slots, blocks, actual, I32({0, 3}, {2}), counts);
  REQUIRE(Row(counts, 0) == std::vector<int32_t>{1 + 1, 1 + 2});  // 9 used, 7 not
  REQUIRE(Row(counts, 1) == std::vector<int32_t>{1 + 3, 1 + 3});  // 33, 31, 32 all used
  // Inactive rows are left alone; nothing fetched counts nothing.
  b.FetchOverlap(I32({-1, -1, -1, 203, -1, -1}, {2, 1, 3}), slots, blocks, actual, I32({-1, 0}, {2}),
                 counts);
  REQUIRE(Row(counts, 0) == std::vector<int32_t>{2, 3});
  REQUIRE(Row(counts, 1) == std::vector<int32_t>{5, 5});
  // A -1 in the real top-K never matches an empty working slot's -1.
  Tensor empty_slot_fetch = I32({103, -1, -1, -1, -1, -1}, {2, 1, 3});
  b.FetchOverlap(empty_slot_fetch, slots, blocks, actual, I32({0, -1}, {2}), counts);
  REQUIRE(Row(counts, 0) == std::vector<int32_t>{2, 4});
}

TEST_CASE("TopKOverlap counts the shared blocks of two top-K sets", "[backend][sparse]") {
  CpuBackend b(1);
  Tensor predicted = I32({1, 2, 3, -1, 4, 5, 6, 7}, {2, 1, 4});
  Tensor actual = I32({3, 9, 1, -1, 7, 6, 5, 4}, {2, 1, 4});
  Tensor counts = FilledI32({2, 1, 2}, 1);
  b.TopKOverlap(predicted, actual, I32({0, 1}, {2}), counts);
  REQUIRE(Row(counts, 0) == std::vector<int32_t>{1 + 2, 1 + 3});
  REQUIRE(Row(counts, 1) == std::vector<int32_t>{1 + 4, 1 + 4});
  b.TopKOverlap(predicted, actual, I32({-1, 1}, {2}), counts);
  REQUIRE(Row(counts, 0) == std::vector<int32_t>{3, 4});
  REQUIRE(Row(counts, 1) == std::vector<int32_t>{9, 9});
}

// Helpers of the sparse-KV engine tests (docs/sparse.md): a runner that checks the per-step
// invariants of every sparse step on the CPU device state, sparse engine options for the
// tiny fixture target, workloads of long and short requests, and running one through an
// engine from several threads.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "runner/draft_runner.h"
#include "runner/model_runner.h"
#include "kvcache/sparse_kv_manager.h"
#include "kvcache/sparse_pipeline.h"
#include "runner/model_runner.h"
#include "test_engine_util.h"

namespace oasis::engine_test {

// Per-step observations of RecordingRunner (read on the test thread after the engine stopped).
struct SparseStepLog {
  int64_t sparse_steps = 0;      // steps run with the sparse pipeline
  int64_t mixed_steps = 0;       // ... that also held dense sequences
  int64_t max_new_per_head = 0;  // most working-set blocks one (row, layer, head) changed in a step
  int64_t new_blocks = 0;        // Σ changed working-set blocks (= blocks fetched)
  int64_t max_tokens_sparse = 0;  // most tokens a sparse sequence ran in one step
  int64_t sparse_drafts = 0;      // Σ sparse sequences that ran a draft after their token
  bool slots_as_expected =
      true;                     // GPU slots held = host-home sparse requests x (K + 2) x Hkv
                                // (dense_layers 0; in-place requests hold their dense table)
  bool sync_is_runners = true;  // the pipeline got the runner's sparse_stage_sync()
  int64_t throw_at_step = -1;   // Run throws at this sparse step (test of failures)
  int64_t max_in_place = 0;     // most sparse requests at once whose KV stayed in the GPU pool
  int64_t max_host_home = 0;    // ... whose KV lived in the host store
  int64_t max_moving = 0;       // ... moving from the GPU pool to the host store
  // After every sparse step, each host-home request's summaries of its final blocks (below
  // SparseKvManager::KvEnd) are the min / max of the keys the host store holds for them.
  bool host_summaries_consistent = true;
  int64_t summaries_checked = 0;  // blocks checked
  // Every (row, layer, head) changed at most the fetch cap its layer had at the step
  // (SparseKvManager::fetch_caps: C, or the adaptive budget's), and the smallest cap seen.
  bool within_fetch_caps = true;
  int32_t min_fetch_cap = INT32_MAX;
};

// Host-home requests' final blocks: summaries equal the min / max over the host store's keys
// (so accepted drafts are written through and summarised, and rejected ones are not).
inline void CheckHostSummariesOf(SparseKvManager& m, SparseStepLog& log) {
  HostKvStore& store = m.host_store();
  const int64_t D = m.shape().head_dim;
  for (uint64_t id : m.SparseIds()) {
    if (m.InPlace(id) || m.Moving(id)) continue;
    const int64_t blocks = m.KvEnd(id) / kBlockSize;
    for (int64_t l = m.config().dense_layers; l < m.shape().num_layers; ++l) {
      const float* k = store.pool(l).k.data<float>();
      const float* kmin = store.kmin(l).data<float>();
      const float* kmax = store.kmax(l).data<float>();
      for (int64_t h = 0; h < m.shape().num_kv_heads; ++h) {
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t slot = m.HostSlotOf(id, l, h, b);
          if (slot < 0) continue;
          for (int64_t d = 0; d < D; ++d) {
            float lo = k[(slot * kBlockSize) * D + d], hi = lo;
            for (int64_t t = 1; t < kBlockSize; ++t) {
              lo = std::min(lo, k[(slot * kBlockSize + t) * D + d]);
              hi = std::max(hi, k[(slot * kBlockSize + t) * D + d]);
            }
            if (lo != kmin[slot * D + d] || hi != kmax[slot * D + d])
              log.host_summaries_consistent = false;
          }
          ++log.summaries_checked;
        }
      }
    }
  }
}

// Simulated PCIe pressure for the adaptive fetch budget (docs/sparse.md §13): a stage sync that
// orders nothing (the CPU runs every op in order) and reports `seconds` of transfer wait at
// every metrics collection, as a CUDA step whose transfers outlast it would.
class WaitingStageSync final : public SparseStageSync {
 public:
  explicit WaitingStageSync(double seconds) : seconds_(seconds) {}
  void Enter(SparseStage, int64_t) override {}
  void Exit(SparseStage, int64_t) override {}
  double TakeTransferWaitSeconds() override { return seconds_; }

 private:
  double seconds_;
};

// The plain runner plus checks around every sparse step: how many working-set blocks per
// (row, layer, KV head) changed (at most C may: those are the fetches), the GPU slots the
// sparse requests hold, the tokens a sparse sequence feeds. CPU backend only (reads the
// device state directly). Not thread-safe: the engine loop thread.
class RecordingRunner final : public ModelRunner {
 public:
  RecordingRunner(DecoderLM& model, Backend& backend, int64_t num_kv_slots)
      : ModelRunner(model, backend, num_kv_slots) {}
  SparseStepLog log;
  // Set before the engine attaches sparse KV: the pipeline's stage sync (null: none).
  std::unique_ptr<SparseStageSync> simulated_sync;
  SparseStageSync* sparse_stage_sync() override { return simulated_sync.get(); }

  std::vector<SampleResult> Run(const StepInputs& step) override {
    if (!step.sparse) return ModelRunner::Run(step);
    const ForwardInput& host_input = step.input;
    const SparseStepPlan& plan = *step.sparse->plan;
    SparseAttentionPipeline& pipeline = sparse_pipeline();
    if (log.throw_at_step == log.sparse_steps) {
      ++log.sparse_steps;
      throw std::runtime_error("injected sparse step failure");
    }
    SparseKvManager& m = pipeline.manager();
    const SparseConfig& cfg = m.config();
    SparseDeviceState& st = m.state();
    std::vector<Tensor> before;
    for (int64_t l = cfg.dense_layers; l < m.shape().num_layers; ++l)
      before.push_back(st.layer(l).ws_blocks.Clone());
    const std::vector<int32_t> caps = m.fetch_caps();  // set between steps
    for (int64_t l = cfg.dense_layers; l < m.shape().num_layers; ++l)
      log.min_fetch_cap = std::min(log.min_fetch_cap, caps[static_cast<size_t>(l)]);
    auto out = ModelRunner::Run(step);
    ++log.sparse_steps;
    const int64_t S = plan.seq_rows.numel();
    if (plan.num_sparse < S) ++log.mixed_steps;
    const int32_t* qs = host_input.attention.query_start.data<int32_t>();
    const int64_t hkv = m.shape().num_kv_heads, k = cfg.topk_blocks;
    for (int64_t s = 0; s < S; ++s) {
      const int32_t r = plan.seq_rows.data<int32_t>()[s];
      if (r < 0) continue;
      log.max_tokens_sparse = std::max<int64_t>(log.max_tokens_sparse, qs[s + 1] - qs[s]);
      log.sparse_drafts += qs[s + 1] - qs[s] > 1 ? 1 : 0;
      for (int64_t l = cfg.dense_layers, i = 0; l < m.shape().num_layers; ++l, ++i) {
        const int32_t* a = before[static_cast<size_t>(i)].data<int32_t>();
        const int32_t* b = st.layer(l).ws_blocks.data<int32_t>();
        for (int64_t h = 0; h < hkv; ++h) {
          int64_t changed = 0;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t x = (r * hkv + h) * k + j;
            if (a[x] != b[x] && b[x] >= 0) ++changed;
          }
          log.max_new_per_head = std::max(log.max_new_per_head, changed);
          if (changed > caps[static_cast<size_t>(l)]) log.within_fetch_caps = false;
          log.new_blocks += changed;
        }
      }
    }
    if (cfg.dense_layers == 0 &&
        m.gpu_slots_held() != (m.num_sparse() - m.num_in_place()) * (k + 2) * hkv)
      log.slots_as_expected = false;
    if (pipeline.stage_sync() != sparse_stage_sync()) log.sync_is_runners = false;
    CheckHostSummariesOf(m, log);
    log.max_in_place = std::max(log.max_in_place, m.num_in_place());
    log.max_moving = std::max(log.max_moving, m.num_moving());
    log.max_host_home = std::max(log.max_host_home, m.num_sparse() - m.num_in_place());
    return out;
  }
};

// Sparse options for qwen3-tiny (3 layers, 2 KV heads of head_dim 32; a host slot is
// 2 x 16 x 32 x 3 layers x 4 bytes = 12 KiB on the CPU): a low threshold so that most
// requests switch, and a host store of `host_slots` head-blocks.
inline SparseConfig TinySparse(int32_t k, double fetch_ratio, SparsePredictor predictor,
                               int64_t host_slots = 4096, int32_t dense_layers = 0) {
  SparseConfig c;
  c.topk_blocks = k;
  c.fetch_ratio = fetch_ratio;
  c.sparse_threshold = 64;
  c.dense_layers = dense_layers;
  const double slot_bytes = 2.0 * 16 * 32 * (3 - dense_layers) * 4;
  c.host_kv_gib = (static_cast<double>(host_slots) + 0.5) * slot_bytes / (1024.0 * 1024.0 * 1024.0);
  c.predictor = predictor;
  c.group_reduce = GroupReduce::kSum;
  c.max_sparse_seqs = 32;
  c.agreement_interval = 2;
  return c;
}

// A draft runner whose pool holds the tokens of `target_slots` head-blocks of `target_kv_heads`
// KV heads (the target's pool, or one rank's) and of the host store `s` describes on each of
// `sides` ranks, as Engine::CheckOptions asks of a draft head beside sparse KV. qwen3-tiny on
// the CPU (f32).
inline std::unique_ptr<DraftRunner> MakeSparseDraftRunner(TinyModel& tm, Eagle3Head& head,
                                                          const SparseConfig& s,
                                                          int64_t target_slots,
                                                          int64_t target_kv_heads,
                                                          int64_t sides = 1) {
  const HostKvSlots host = HostKvSlotsFor(
      s, {tm.config.num_hidden_layers, target_kv_heads, tm.config.head_dim}, DType::kF32, sides);
  return std::make_unique<DraftRunner>(
      head, tm.backend,
      DraftKvSlotsFor(target_slots + host.total(), target_kv_heads,
                      head.config().num_key_value_heads));
}

// `n` requests of different lengths: prompts of 10..260 ids, 20..70 new tokens (so some stay
// below the threshold of 64 and stay dense, most pass it); greedy and seeded sampling,
// logprobs, EOS honoured by some.
inline std::vector<EngineRequest> LongWorkload(int n, uint64_t seed, int64_t max_prompt = 260) {
  std::mt19937_64 rng(seed);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < n; ++i) {
    const int64_t len = i % 5 == 0 ? 10 + static_cast<int64_t>(rng() % 30)
                                   : 40 + static_cast<int64_t>(rng() % (max_prompt - 40));
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 500);
    EngineRequest r = Request("req-" + std::to_string(i), std::move(prompt),
                              20 + static_cast<int64_t>(rng() % 50));
    r.ignore_eos = i % 4 != 0;
    if (i % 3 == 1) {
      r.sampling.temperature = i % 2 == 0 ? 3.0f : 8.0f;
      r.sampling.seed = 500 + static_cast<uint64_t>(i);
    }
    if (i % 4 == 2) r.num_top_logprobs = 2;
    r.logprobs = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Waits until nothing runs or waits and every KV head-block (GPU and host) is free again.
inline EngineStats WaitSparseIdle(const Engine& engine) {
  for (int i = 0; i < 4000; ++i) {
    EngineStats s = engine.Stats();
    if (s.requests.num_running == 0 && s.requests.num_waiting == 0 && s.kv.num_free_slots == s.kv.num_slots &&
        s.sparse.num_free_host_kv_slots == s.sparse.num_host_kv_slots && s.sparse.num_requests == 0) {
      return s;
    }
    std::this_thread::sleep_for(5ms);
  }
  return engine.Stats();
}

struct SparseRun {
  std::vector<Collected> out;
  EngineStats stats;
};

// Queues `reqs` on a fresh engine over `runner` before its loop starts, then collects them:
// the first steps see the whole workload, so what the small-pool variants must show
// (preemptions) does not depend on how the submissions interleave with the steps.
// (Concurrent submission is covered by the plain engine tests.)
inline SparseRun RunEngine(ModelRunner& runner, DraftRunner* draft, EngineOptions opt,
                           const std::vector<EngineRequest>& reqs) {
  Engine engine(runner, nullptr, opt, draft);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& q : reqs) {
    auto s = engine.Submit(q);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  engine.Start();
  SparseRun r;
  for (const auto& s : streams) r.out.push_back(Collect(*s));
  for (const Collected& c : r.out) CheckCollected(c);
  r.stats = WaitSparseIdle(engine);
  engine.Stop();
  return r;
}

// Tokens, logprobs (bit-equal), top-logprob counts and finish reasons equal.
inline void CheckSameOutputs(const std::vector<EngineRequest>& reqs,
                             const std::vector<Collected>& got,
                             const std::vector<Collected>& want) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO(reqs[i].id << " prompt " << reqs[i].prompt.size() << " max_tokens " << reqs[i].max_tokens
                    << " T " << reqs[i].sampling.temperature);
    CHECK(got[i].error.ok());
    CHECK(got[i].tokens == want[i].tokens);
    CHECK(got[i].logprobs == want[i].logprobs);
    CHECK(got[i].top_logprobs == want[i].top_logprobs);
    CHECK(got[i].reason == want[i].reason);
    CHECK(got[i].completion_tokens == want[i].completion_tokens);
  }
}

}  // namespace oasis::engine_test

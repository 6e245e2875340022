// Helpers of the engine tests: a fixture model on the CPU backend, requests, and draining a
// request's stream into one result.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "loader/safetensors.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "test_support.h"

namespace oasis::engine_test {

using namespace std::chrono_literals;


// A fixture model on the CPU backend with a runner of `num_kv_slots` head-blocks.
struct TinyModel {
  explicit TinyModel(int64_t num_kv_slots, const std::string& name = "qwen3-tiny")
      : TinyModel(testing::FixturePath("models/" + name), num_kv_slots) {}
  // Any model directory (config.json + model.safetensors).
  TinyModel(const std::filesystem::path& dir, int64_t num_kv_slots) : backend(2) {
    auto c = LoadModelConfig(dir);
    REQUIRE(c.ok());
    config = *c;
    auto w = OpenSafetensorsWeights(dir);
    REQUIRE(w.ok());
    weights = std::move(*w);
    auto m = DecoderLM::Create(config, *weights, backend);
    REQUIRE(m.ok());
    model = std::move(*m);
    runner = std::make_unique<ModelRunner>(*model, backend, num_kv_slots);
  }
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  CpuBackend backend;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<ModelRunner> runner;
};

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<size_t> top_logprobs;  // entries per token
  std::vector<float> logprobs;       // of each token
  FinishReasonKind reason = FinishReasonKind::kNone;
  std::string stop_reason;
  Status error;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens from the prefix cache (usage)
  std::string handoff_ticket;  // kHandoff: the encoded ticket
  std::vector<PromptTokenLogprob> prompt_logprobs;  // EngineRequest::prompt_logprobs
  int prompt_logprob_events = 0;                    // events that carried them (at most 1)
  int events = 0;
  // Problems seen while collecting (checked by Drain, or later on the test's main thread).
  bool stuck = false;               // no event for a minute
  bool event_after_finish = false;  // the stream gave something after its finished event
  bool positive_logprob = false;
};

// Reads a stream to its finished event without Catch2 assertions (Catch2 is not
// thread-safe: worker threads use this and the main thread checks the result).
inline Collected Collect(RequestStream& stream) {
  Collected c;
  while (true) {
    auto ev = stream.Next(60s);
    if (!ev) {
      c.stuck = true;
      return c;
    }
    ++c.events;
    for (const GeneratedToken& t : ev->tokens) {
      c.tokens.push_back(t.token);
      c.top_logprobs.push_back(t.top_logprobs.size());
      c.logprobs.push_back(t.logprob);
      if (t.logprob > 0.0f) c.positive_logprob = true;
    }
    if (!ev->prompt_logprobs.empty()) {
      c.prompt_logprobs = ev->prompt_logprobs;
      ++c.prompt_logprob_events;
    }
    c.text += ev->text;
    c.prompt_tokens = ev->prompt_tokens;
    c.completion_tokens = ev->completion_tokens;
    c.cached_tokens = ev->cached_tokens;
    if (ev->finished) {
      c.reason = ev->finish_reason;
      c.stop_reason = ev->stop_reason;
      c.error = ev->error;
      c.handoff_ticket = ev->handoff_ticket;
      c.event_after_finish = stream.Next(1ms).has_value();
      return c;
    }
  }
}

inline void CheckCollected(const Collected& c) {
  REQUIRE_FALSE(c.stuck);  // no event for a minute: the engine is stuck
  CHECK_FALSE(c.event_after_finish);
  CHECK_FALSE(c.positive_logprob);
}

// Collect on the test's main thread, checked.
inline Collected Drain(RequestStream& stream) {
  Collected c = Collect(stream);
  CheckCollected(c);
  return c;
}

inline EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.detokenize = false;
  return r;
}

// Submits `reqs` from 3 threads at once to a started engine and collects every stream
// (each checked; every Submit must succeed).
inline std::vector<Collected> SubmitConcurrently(Engine& engine, const std::vector<EngineRequest>& reqs) {
  std::vector<Collected> out(reqs.size());
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 3; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::pair<size_t, std::shared_ptr<RequestStream>>> mine;
      for (size_t i = static_cast<size_t>(t); i < reqs.size(); i += 3) {
        auto s = engine.Submit(reqs[i]);
        if (!s.ok()) {
          ++failures;
          continue;
        }
        mine.emplace_back(i, *s);
      }
      for (auto& [i, s] : mine) out[i] = Collect(*s);
    });
  }
  for (auto& th : pool) th.join();
  REQUIRE(failures == 0);
  for (const Collected& c : out) CheckCollected(c);
  return out;
}

inline EngineStats WaitIdle(const Engine& engine) {
  for (int i = 0; i < 2000; ++i) {
    EngineStats s = engine.Stats();
    if (s.requests.num_running == 0 && s.requests.num_waiting == 0 && s.kv.num_free_slots == s.kv.num_slots) return s;
    std::this_thread::sleep_for(5ms);
  }
  return engine.Stats();
}

}  // namespace oasis::engine_test

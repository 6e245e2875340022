// bench_engine_host: what the engine itself costs on the host per step, beside the device.
// The model is replaced by a runner that computes nothing (it returns a token per sampled row
// at once), so every millisecond measured is the engine's: scheduling, building the step's
// batch (tokens, positions, head-level block tables, sampling rows), committing and emitting
// tokens to the request streams, and under lookahead the draft head's bookkeeping (its
// batch built and its proposals applied; the head itself computes nothing either). On the GPU
// this host time adds to every step that the device does not hide (bench_lookahead shows the
// step split there). CPU only; no GPU needed.
//
//   bench_engine_host --batch 64 --context 4096 --tokens 128 [--lookahead reject] [--device-ms 15]
//
// The model shape only matters through its KV heads (the tables are per KV head): the
// default is Qwen3-8B's 8 KV heads with tiny everything else.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/flags.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "models/eagle3.h"
#include "runner/draft_runner.h"
#include "runner/model_runner.h"

using namespace oasis;
using namespace std::chrono_literals;

namespace {

// Returns a token for every sampled row after `device_ms` (the device's step time, slept: the
// readers see events at a realistic pace); no forward pass.
class NoComputeRunner final : public ModelRunner {
 public:
  NoComputeRunner(DecoderLM& model, Backend& backend, int64_t slots, double device_ms)
      : ModelRunner(model, backend, slots),
        device_(std::chrono::microseconds(static_cast<int64_t>(device_ms * 1e3))) {}
  std::vector<SampleResult> Run(const StepInputs& step) override {
    if (step.capture == nullptr) {
      std::this_thread::sleep_for(device_);
      return Tokens(step.rows);
    }
    const auto until = std::chrono::steady_clock::now() + device_;
    step.capture->out = Tensor();
    if (step.while_running) step.while_running();
    std::this_thread::sleep_until(until);
    return Tokens(step.rows);
  }

 private:
  std::chrono::microseconds device_;
  std::vector<SampleResult> Tokens(const std::vector<SampleRow>& rows) {
    std::vector<SampleResult> out(rows.size());
    for (size_t r = 0; r < rows.size(); ++r)
      out[r].token = static_cast<int32_t>((rows[r].counter * 7 + r) % 997 + 1);
    return out;
  }
};

// Proposes token 1 for every draft row; no forward pass.
class NoComputeDraftRunner final : public DraftRunner {
 public:
  using DraftRunner::DraftRunner;
  std::vector<int32_t> Propose(const ForwardInput& host_input, const Tensor&,
                               std::span<const int32_t>) override {
    return std::vector<int32_t>(static_cast<size_t>(host_input.logit_rows.numel()), 1);
  }
};

struct Snapshot {
  std::chrono::steady_clock::time_point t;
  EngineStats s;
};

Status Run(int argc, char** argv) {
  int64_t batch = 64, context = 4096, tokens = 128, kv_heads = 8;
  double device_ms = 10.0;
  std::string lookahead = "off";
  FlagParser flags(
      "bench_engine_host: the engine's host time per step with a model that computes nothing");
  flags.AddInt("batch", &batch, "concurrent requests");
  flags.AddInt("context", &context, "prompt tokens per request");
  flags.AddInt("tokens", &tokens, "output tokens per request");
  flags.AddInt("kv-heads", &kv_heads, "KV heads of the model (block tables are per KV head)");
  flags.AddString("lookahead", &lookahead,
                  "off, reject or speculate (a draft head that computes nothing)");
  flags.AddDouble("device-ms", &device_ms,
                  "device time of a step, slept by the runner (the model step's floor)");
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return Status::Ok();
  }
  if (batch < 1 || context < 1 || tokens < 4 || kv_heads < 1)
    return InvalidArgument("bad --batch/--context/--tokens/--kv-heads");
  OASIS_ASSIGN_OR_RETURN(LookaheadMode mode, ParseLookaheadMode(lookahead));
  OASIS_RETURN_IF_ERROR(InitLogging("warn"));

  ModelConfig c;
  c.architecture = Architecture::kQwen3;
  c.architecture_name = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.hidden_size = 32;
  c.intermediate_size = 32;
  c.num_hidden_layers = 6;  // the default EAGLE-3 aux layers (2, L/2, L-3) must exist
  c.num_attention_heads = kv_heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 4;
  c.vocab_size = 1000;
  c.max_position_embeddings = context + tokens + 64;
  CpuBackend backend(1);
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<DecoderLM> model, DecoderLM::CreateDummy(c, backend, 1));
  const int64_t slots = (context + tokens + 32) / 16 * kv_heads * batch + 64 * kv_heads;
  NoComputeRunner runner(*model, backend, slots, device_ms);
  std::unique_ptr<Eagle3Head> head;
  std::unique_ptr<NoComputeDraftRunner> draft;
  if (mode != LookaheadMode::kOff) {
    OASIS_ASSIGN_OR_RETURN(
        head,
        Eagle3Head::CreateDummy(Eagle3Head::ConfigForTarget(c, c.vocab_size), *model, backend, 7));
    draft = std::make_unique<NoComputeDraftRunner>(*head, backend, slots);
  }
  EngineOptions o;
  o.lookahead = mode;
  o.max_num_seqs = batch;
  o.max_num_batched_tokens = std::max<int64_t>(16384, 2 * batch);
  Engine engine(runner, nullptr, o, draft.get());
  engine.Start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int64_t r = 0; r < batch; ++r) {
    EngineRequest req;
    req.id = "r" + std::to_string(r);
    for (int64_t i = 0; i < context; ++i)
      req.prompt.push_back(static_cast<int32_t>((r * 31 + i * 17) % 997 + 1));
    req.max_tokens = tokens;
    req.ignore_eos = true;
    req.sampling.temperature = 0;
    req.detokenize = false;
    OASIS_ASSIGN_OR_RETURN(std::shared_ptr<RequestStream> s, engine.Submit(std::move(req)));
    streams.push_back(std::move(s));
  }
  // Engine counters sampled at every event of request 0; the window is where every request decodes.
  using Clock = std::chrono::steady_clock;
  std::vector<Snapshot> snapshots;
  std::vector<Clock::time_point> first(streams.size()), last(streams.size());
  std::vector<std::thread> readers;
  std::vector<std::string> errors(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    readers.emplace_back([&, i] {
      bool seen = false;
      while (true) {
        auto ev = streams[i]->Next(600s);
        if (!ev) {
          errors[i] = "request timed out";
          return;
        }
        if (!ev->tokens.empty()) {
          last[i] = Clock::now();
          if (!seen) first[i] = last[i], seen = true;
        }
        if (i == 0) snapshots.push_back({Clock::now(), engine.Stats()});
        if (ev->finished) return;
      }
    });
  }
  for (auto& t : readers) t.join();
  engine.Stop();
  for (const std::string& e : errors)
    if (!e.empty()) return Internal(e);
  const Clock::time_point t0 = *std::max_element(first.begin(), first.end());
  const Clock::time_point t1 = *std::min_element(last.begin(), last.end());
  const Snapshot* a = nullptr;
  const Snapshot* b = nullptr;
  for (const Snapshot& s : snapshots) {
    if (s.t < t0 || s.t > t1) continue;
    if (a == nullptr) a = &s;
    b = &s;
  }
  if (a == nullptr || b->s.loop.steps_total <= a->s.loop.steps_total)
    return Internal("no decode window: raise --tokens");
  const double n = static_cast<double>(b->s.loop.steps_total - a->s.loop.steps_total);
  const auto per_step = [&](double EngineStats::Loop::*f) {
    return (b->s.loop.*f - a->s.loop.*f) / n * 1e3;
  };
  const double step = per_step(&EngineStats::Loop::step_seconds_total);
  const double wall = std::chrono::duration<double, std::milli>(b->t - a->t).count() / n;
  std::printf(
      "engine host time per decode step, batch %lld, context %lld, %lld KV heads, lookahead %s "
      "(%.0f steps)\n",
      static_cast<long long>(batch), static_cast<long long>(context),
      static_cast<long long>(kv_heads), lookahead.c_str(), n);
  std::printf("  schedule      %8.3f ms\n", per_step(&EngineStats::Loop::schedule_seconds_total));
  std::printf("  build batch   %8.3f ms\n", per_step(&EngineStats::Loop::build_seconds_total));
  std::printf("  model (slept) %8.3f ms (--device-ms %.1f)\n",
              per_step(&EngineStats::Loop::model_step_seconds_total), device_ms);
  std::printf("  emit          %8.3f ms\n", per_step(&EngineStats::Loop::emit_seconds_total));
  std::printf("  draft head    %8.3f ms\n", per_step(&EngineStats::Loop::draft_step_seconds_total));
  std::printf("  whole step    %8.3f ms (host beyond the device: %.3f ms)\n", step,
              step - device_ms);
  std::printf("  loop (wall)   %8.3f ms per step (admission, publishing stats, waking streams)\n",
              wall);
  std::printf(
      "RESULT engine_host b=%lld ctx=%lld lookahead=%s: host %.3f ms per step beyond %.1f ms of "
      "device time "
      "(loop %.3f ms)\n",
      static_cast<long long>(batch), static_cast<long long>(context), lookahead.c_str(),
      wall - device_ms, device_ms, wall);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Status st = Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "bench_engine_host: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

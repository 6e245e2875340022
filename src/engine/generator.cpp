#include "engine/generator.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "kvcache/head_block_table.h"
#include "runner/batch_builder.h"

namespace oasis {
namespace {

// A request in flight.
struct Running {
  size_t index = 0;             // into the request list
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t computed = 0;         // tokens whose KV is cached
  HeadBlockTable table;
  uint64_t seed = 0;
  bool done = false;
  std::shared_ptr<const LogitsProcessing> processing;  // null: none
  explicit Running(int32_t heads) : table(heads) {}
};

}  // namespace

Generator::Generator(DecoderLM& model, Backend& backend, GeneratorOptions options)
    : owned_runner_(std::make_unique<ModelRunner>(model, backend, options.num_kv_slots)),
      runner_(*owned_runner_),
      model_(model),
      options_(options),
      allocator_(static_cast<int32_t>(options.num_kv_slots)) {
  OASIS_CHECK_GT(options_.max_step_tokens, 0) << "max_step_tokens";
}

Generator::Generator(ModelRunner& runner, GeneratorOptions options)
    : runner_(runner),
      model_(runner.model()),
      options_(options),
      allocator_(static_cast<int32_t>(runner.num_kv_slots())) {
  options_.num_kv_slots = runner.num_kv_slots();
  OASIS_CHECK_GT(options_.max_step_tokens, 0) << "max_step_tokens";
}

Status Generator::Validate(const GenerationRequest& r) const {
  const ModelConfig& c = model_.config();
  if (r.prompt.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return InvalidArgument("prompt token id " + std::to_string(id) +
                             " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  if (r.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (c.max_position_embeddings > 0 && total > c.max_position_embeddings) {
    return OutOfRange("prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                      std::to_string(r.max_tokens) + ") exceeds the context length " +
                      std::to_string(c.max_position_embeddings));
  }
  if (HeadBlockTable::SlotsFor(total, static_cast<int32_t>(c.num_key_value_heads)) >
      options_.num_kv_slots) {
    return ResourceExhausted("request needs more KV cache than the engine holds");
  }
  return r.sampling.Validate(c.vocab_size);
}

StatusOr<std::vector<GenerationResult>> Generator::Generate(
    const std::vector<GenerationRequest>& requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    OASIS_RETURN_IF_ERROR(Validate(requests[i]).WithContext("request " + std::to_string(i)));
  }
  const int32_t heads = static_cast<int32_t>(model_.config().num_key_value_heads);
  std::vector<GenerationResult> results(requests.size());
  std::vector<std::unique_ptr<Running>> running;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto r = std::make_unique<Running>(heads);
    r->index = i;
    r->tokens = requests[i].prompt;
    r->seed = requests[i].sampling.seed ? *requests[i].sampling.seed : engine_rng_();
    r->processing = LogitsProcessing::For(requests[i].sampling, 0, {});
    running.push_back(std::move(r));
  }
  Status status = Status::Ok();
  while (status.ok()) {
    // One step: every unfinished sequence runs its pending tokens (prompt chunk or the last
    // sampled token) within the step budget; sequences without budget wait.
    std::vector<Running*> batch;
    std::vector<StepSequence> steps;
    int64_t budget = options_.max_step_tokens;
    for (auto& r : running) {
      if (r->done || budget == 0) continue;
      const int64_t pending = static_cast<int64_t>(r->tokens.size()) - r->computed;
      const int64_t n = std::min(pending, budget);
      status = r->table.Reserve(r->computed + n, allocator_);
      if (!status.ok()) break;
      StepSequence s;
      s.table = &r->table;
      s.start = r->computed;
      s.tokens.assign(r->tokens.begin() + r->computed, r->tokens.begin() + r->computed + n);
      steps.push_back(std::move(s));
      batch.push_back(r.get());
      budget -= n;
    }
    if (!status.ok() || batch.empty()) break;
    std::vector<SampleRow> rows(batch.size());
    for (size_t b = 0; b < batch.size(); ++b) {
      const Running& r = *batch[b];
      const GenerationRequest& req = requests[r.index];
      rows[b].params = req.sampling;
      rows[b].seed = r.seed;
      rows[b].counter = results[r.index].tokens.size();
      rows[b].num_top_logprobs = req.num_top_logprobs;
      rows[b].needed = r.computed + static_cast<int64_t>(steps[b].tokens.size()) ==
                       static_cast<int64_t>(r.tokens.size());
      if (r.processing != nullptr) {
        const std::span<const int32_t> all(r.tokens);
        const size_t prompt = req.prompt.size();
        rows[b].processing = r.processing;
        rows[b].prompt_tokens = all.first(prompt);
        rows[b].output_tokens = all.subspan(prompt);
      }
    }
    const ForwardInput input = BuildHostForwardInput(steps, LogitsFor::kLastTokenOfEachSequence);
    std::vector<SampleResult> samples = runner_.Run({.input = input, .rows = rows});
    for (size_t b = 0; b < batch.size(); ++b) {
      Running& r = *batch[b];
      r.computed += static_cast<int64_t>(steps[b].tokens.size());
      if (r.computed < static_cast<int64_t>(r.tokens.size())) continue;  // prompt not finished
      const GenerationRequest& req = requests[r.index];
      GenerationResult& out = results[r.index];
      SampleResult sample = std::move(samples[b]);
      out.tokens.push_back(sample.token);
      out.samples.push_back(std::move(sample));
      r.tokens.push_back(out.tokens.back());
      const auto& eos = model_.config().eos_token_ids;
      const int32_t tok = out.tokens.back();
      const bool stop = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), tok) !=
                            req.stop_token_ids.end() ||
                        (!req.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end());
      if (stop) {
        out.finish_reason = FinishReason::kStop;
        r.done = true;
      } else if (static_cast<int64_t>(out.tokens.size()) >= req.max_tokens) {
        out.finish_reason = FinishReason::kLength;
        r.done = true;
      }
      if (r.done) r.table.Release(allocator_);
    }
  }
  for (auto& r : running) r->table.Release(allocator_);
  if (!status.ok()) return status;
  return results;
}

StatusOr<Tensor> Generator::PromptLogits(const std::vector<int32_t>& prompt) {
  GenerationRequest probe;
  probe.prompt = prompt;
  probe.max_tokens = 1;
  probe.sampling.temperature = 0;
  OASIS_RETURN_IF_ERROR(Validate(probe));
  const int64_t n = static_cast<int64_t>(prompt.size()), vocab = model_.config().vocab_size;
  HeadBlockTable table(static_cast<int32_t>(model_.config().num_key_value_heads));
  Status st = table.Reserve(n, allocator_);
  if (!st.ok()) return st;
  Tensor out = Tensor::Empty({n, vocab}, DType::kF32);
  for (int64_t start = 0; start < n; start += options_.max_step_tokens) {
    const int64_t len = std::min(options_.max_step_tokens, n - start);
    StepSequence s{&table, start,
                   std::vector<int32_t>(prompt.begin() + start, prompt.begin() + start + len)};
    Tensor logits = runner_.Execute(BuildHostForwardInput({s}, LogitsFor::kEveryToken));
    std::memcpy(out.data<float>() + start * vocab, logits.raw(),
                static_cast<size_t>(len * vocab) * sizeof(float));
  }
  table.Release(allocator_);
  return out;
}

}  // namespace oasis

// GPU: the sampling kernel draws exactly the CPU sampler's tokens (same rule, same
// counter-based noise) on fresh random logits — greedy, temperature, top-k, top-p, min-p
// and their combinations, with exact ties — and reports the same log-probabilities.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "common/cuda_rt.h"
#include "kernels/sampling.h"
#include "runner/cuda/cuda_sampler.h"
#include "runner/sampler.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/token_constraint.h"

using namespace oasis;

namespace {

std::mt19937 FreshRng() { return std::mt19937(std::random_device{}()); }

struct Case {
  SamplingParams params;
  int num_top = 0;
};

std::vector<Case> ParamGrid(std::mt19937& rng) {
  std::vector<Case> cases;
  auto add = [&](float t, int k, float p, float m, int top) {
    Case c;
    c.params.temperature = t;
    c.params.top_k = k;
    c.params.top_p = p;
    c.params.min_p = m;
    c.num_top = top;
    cases.push_back(c);
  };
  add(0, -1, 1, 0, 0);
  add(0, -1, 1, 0, 5);
  add(1, -1, 1, 0, 0);
  add(0.7f, -1, 1, 0, 20);
  add(1, 1, 1, 0, 1);
  add(1, 40, 1, 0, 0);
  add(1.3f, 3, 1, 0, 3);
  add(1, -1, 0.9f, 0, 0);
  add(0.6f, -1, 0.5f, 0, 2);
  add(1, 50, 0.95f, 0, 0);
  add(1, -1, 1, 0.1f, 0);
  add(0.8f, 20, 0.8f, 0.05f, 4);
  std::uniform_real_distribution<float> u(0, 1);
  for (int i = 0; i < 8; ++i) {
    add(0.2f + 1.5f * u(rng), u(rng) < 0.5f ? -1 : 1 + static_cast<int>(u(rng) * 100),
        u(rng) < 0.5f ? 1.0f : 0.05f + 0.95f * u(rng), u(rng) < 0.5f ? 0.0f : 0.3f * u(rng),
        static_cast<int>(u(rng) * 21));
  }
  return cases;
}

}  // namespace

TEST_CASE("GPU sampling draws the CPU sampler's tokens", "[gpu][sampling]") {
  auto rng = FreshRng();
  cuda::Stream stream;
  for (int64_t vocab : {7, 512, 4099, 151936}) {
    for (int dist = 0; dist < 3; ++dist) {
      // dist 0: N(0, 2); dist 1: sharp N(0, 8); dist 2: quantised to 0.5 — many exact ties.
      const std::vector<Case> cases = ParamGrid(rng);
      const int64_t rows = static_cast<int64_t>(cases.size());
      std::vector<float> logits(static_cast<size_t>(rows * vocab));
      std::normal_distribution<float> n(0.0f, dist == 1 ? 8.0f : 2.0f);
      for (float& x : logits) x = dist == 2 ? std::round(n(rng) * 2.0f) / 2.0f : n(rng);
      std::vector<kernels::SampleParamsDevice> params(static_cast<size_t>(rows));
      const uint64_t seed = rng();
      for (int64_t r = 0; r < rows; ++r) {
        const Case& c = cases[static_cast<size_t>(r)];
        params[static_cast<size_t>(r)] = {c.params.temperature,
                                          c.params.top_p,
                                          c.params.min_p,
                                          c.params.top_k,
                                          seed + static_cast<uint64_t>(r),
                                          static_cast<uint64_t>(r * 7),
                                          c.num_top,
                                          1};
        // Teacher forcing on every fifth row: the forced id is the token, log-probs the model's.
        if (r % 5 == 4)
          params[static_cast<size_t>(r)].forced =
              static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      }
      auto d_logits = cuda::DeviceBuffer::Allocate(logits.size() * 4).value();
      auto d_params = cuda::DeviceBuffer::Allocate(params.size() * sizeof(params[0])).value();
      auto d_out =
          cuda::DeviceBuffer::Allocate(params.size() * sizeof(kernels::SampleOutputDevice)).value();
      REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4,
                         cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaMemcpy(d_params.data(), params.data(), params.size() * sizeof(params[0]),
                         cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaMemset(d_out.data(), 0xff, params.size() * sizeof(kernels::SampleOutputDevice)) ==
              cudaSuccess);
      auto d_ws = cuda::DeviceBuffer::Allocate(kernels::SampleWorkspaceBytes(rows)).value();
      const uint32_t stages = kernels::SampleStagesFor(params.data(), rows, vocab);
      REQUIRE(kernels::LaunchSample(static_cast<float*>(d_logits.data()), rows, vocab, vocab,
                                    static_cast<kernels::SampleParamsDevice*>(d_params.data()),
                                    static_cast<kernels::SampleOutputDevice*>(d_out.data()), stages,
                                    d_ws.data(), d_ws.size(), stream.get()) == cudaSuccess);
      std::vector<kernels::SampleOutputDevice> out(params.size());
      REQUIRE(cudaMemcpyAsync(out.data(), d_out.data(), out.size() * sizeof(out[0]),
                              cudaMemcpyDeviceToHost, stream.get()) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream.get()) == cudaSuccess);
      int top_p_mismatches = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const Case& c = cases[static_cast<size_t>(r)];
        const auto& p = params[static_cast<size_t>(r)];
        INFO("vocab " << vocab << " dist " << dist << " row " << r << " T " << c.params.temperature
                      << " k " << c.params.top_k << " p " << c.params.top_p << " min_p "
                      << c.params.min_p);
        const SampleResult want = SampleToken(logits.data() + r * vocab, vocab, c.params, p.seed,
                                              p.counter, c.num_top, p.forced);
        const auto& got = out[static_cast<size_t>(r)];
        REQUIRE(got.token >= 0);
        REQUIRE(got.token < vocab);
        if (p.forced >= 0) REQUIRE(got.token == p.forced);
        if (got.token != want.token) {
          // Only the float top-p mass boundary may differ from the CPU's double sums.
          REQUIRE(c.params.top_p < 1.0f);
          ++top_p_mismatches;
        } else {
          CHECK(std::fabs(got.logprob - want.logprob) < 2e-3f);
        }
        REQUIRE(static_cast<int64_t>(want.top_logprobs.size()) ==
                std::min<int64_t>(c.num_top, vocab));
        for (size_t i = 0; i < want.top_logprobs.size(); ++i) {
          CHECK(got.top_tokens[i] == want.top_logprobs[i].token);
          CHECK(std::fabs(got.top_logprobs[i] - want.top_logprobs[i].logprob) < 2e-3f);
        }
      }
      CHECK(top_p_mismatches <= 1);
    }
  }
}

TEST_CASE("CudaSampler samples only the needed rows", "[gpu][sampling]") {
  auto rng = FreshRng();
  cuda::Stream stream;
  const int64_t rows = 5, vocab = 1000;
  std::vector<float> logits(rows * vocab);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (float& x : logits) x = n(rng);
  auto d_logits = cuda::DeviceBuffer::Allocate(logits.size() * 4).value();
  REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  Tensor t(d_logits.data(), DType::kF32, {rows, vocab}, Device::kCuda);
  std::vector<SampleRow> sample_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    sample_rows[r].params.temperature = 0.9f;
    sample_rows[r].seed = 11;
    sample_rows[r].counter = static_cast<uint64_t>(r);
    sample_rows[r].num_top_logprobs = 2;
    sample_rows[r].needed = r != 2;
  }
  CudaSampler sampler;
  auto got = sampler.Sample(t, sample_rows, stream.get());
  REQUIRE(got.size() == rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (r == 2) {
      CHECK(got[r].token == -1);
      continue;
    }
    const SampleResult want = SampleToken(logits.data() + r * vocab, vocab, sample_rows[r]);
    CHECK(got[r].token == want.token);
    REQUIRE(got[r].top_logprobs.size() == 2);
    CHECK(got[r].top_logprobs[0].token == want.top_logprobs[0].token);
  }
}

namespace {

// One simulated request of the logits-processing test: its parameters, tokens and sampling
// state; rows are made from it every step.
struct ProcRequest {
  SamplingParams params;
  int64_t min_tokens = 0;
  std::vector<int32_t> stops;
  std::shared_ptr<const LogitsProcessing> processing;
  std::vector<int32_t> prompt, output;
  uint64_t seed = 0;
  int num_top = 0;
  bool speculative = false;  // a second row with one draft token
};

ProcRequest MakeProcRequest(int kind, int64_t vocab, std::mt19937& rng) {
  ProcRequest q;
  auto id = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)); };
  std::uniform_real_distribution<float> u(0, 1);
  q.prompt.resize(1 + rng() % 300);
  for (int32_t& t : q.prompt) t = id();
  q.seed = rng();
  q.num_top = static_cast<int>(rng() % 4);
  q.params.temperature = kind % 3 == 0 ? 0.0f : 0.5f + u(rng);
  q.params.top_k = kind % 4 == 1 ? 1 + static_cast<int>(rng() % 100) : -1;
  q.params.top_p = kind % 5 == 2 ? 0.9f : 1.0f;
  q.params.min_p = kind % 7 == 3 ? 0.05f : 0.0f;
  SamplingParams& p = q.params;
  switch (kind % 10) {
    case 0:
      p.presence_penalty = 1.5f;
      break;
    case 1:
      p.frequency_penalty = 0.7f;
      break;
    case 2:
      p.repetition_penalty = 1.8f;
      break;
    case 3:
      p.repetition_penalty = 0.6f, p.presence_penalty = -0.5f;
      break;
    case 4:
      for (int i = 0; i < 20; ++i) p.logit_bias.emplace_back(id(), -100.0f + 200.0f * u(rng));
      p.logit_bias.emplace_back(id(), 100.0f);
      break;
    case 5:
      for (int i = 0; i < 50; ++i) p.allowed_token_ids.push_back(id());
      break;
    case 6:
      for (int i = 0; i < 5; ++i) p.bad_words_token_ids.push_back({id()});
      for (int i = 0; i < 5; ++i) p.bad_words_token_ids.push_back({id(), id(), id()});
      break;
    case 7:
      q.min_tokens = 4;
      for (int i = 0; i < 8; ++i) q.stops.push_back(id());
      break;
    case 8:  // everything at once
      p.presence_penalty = 0.3f, p.frequency_penalty = 0.4f, p.repetition_penalty = 1.3f;
      for (int i = 0; i < 10; ++i) p.logit_bias.emplace_back(id(), -5.0f + 10.0f * u(rng));
      for (int i = 0; i < 400; ++i) p.allowed_token_ids.push_back(id());
      p.bad_words_token_ids = {{id()}, {id(), id()}};
      q.min_tokens = 3;
      q.stops = {id(), id()};
      break;
    default:
      break;  // no processing: a plain row in the same batch
  }
  q.processing = LogitsProcessing::For(p, q.min_tokens, q.stops);
  q.speculative = kind % 3 == 1;
  return q;
}

}  // namespace

// Every parameter of logits processing, several steps of a batch of simulated requests on fresh
// random logits each step: the device's processed logits are the CPU's bit for bit, the draws
// and log-probabilities are the CPU sampler's (the per-request counts live on the device and
// are updated from each step's new tokens: one, or two after an accepted draft), speculative
// rows count their draft, and a finished request's slot is released.
TEST_CASE("CudaSampler's logits processing equals the CPU sampler's", "[gpu][sampling]") {
  auto rng = FreshRng();
  cuda::Stream stream;
  for (int64_t vocab : {1000, 151936}) {
    DYNAMIC_SECTION("vocab " << vocab) {
      CudaSampler sampler;
      std::vector<ProcRequest> reqs;
      for (int k = 0; k < 20; ++k) reqs.push_back(MakeProcRequest(k, vocab, rng));
      int top_p_mismatches = 0, compared = 0, processed_rows = 0;
      for (int step = 0; step < 8; ++step) {
        if (step == 4) {  // two requests finish, two new ones (fresh slots or reused ones)
          reqs.erase(reqs.begin() + 2, reqs.begin() + 4);
          reqs.push_back(MakeProcRequest(8, vocab, rng));
          reqs.push_back(MakeProcRequest(2, vocab, rng));
        }
        std::vector<SampleRow> rows;
        std::vector<size_t> owner;
        for (size_t i = 0; i < reqs.size(); ++i) {
          ProcRequest& q = reqs[i];
          SampleRow row;
          row.params = q.params;
          row.seed = q.seed;
          row.counter = q.output.size();
          row.num_top_logprobs = q.num_top;
          row.processing = q.processing;
          row.prompt_tokens = q.prompt;
          row.output_tokens = q.output;
          rows.push_back(row);
          owner.push_back(i);
          if (q.speculative) {
            // A draft: often the previous token (penalised), else a random one.
            row.draft_tokens = {q.output.empty() || rng() % 2 ? static_cast<int32_t>(rng() % vocab)
                                                              : q.output.back()};
            ++row.counter;
            rows.push_back(row);
            owner.push_back(i);
          }
          if (step == 0 && i == 0) {  // a prompt chunk's row: not needed, not processed
            SampleRow skip = rows.back();
            skip.needed = false;
            rows.push_back(skip);
            owner.push_back(i);
          }
        }
        const int64_t R = static_cast<int64_t>(rows.size());
        std::vector<float> logits(static_cast<size_t>(R * vocab));
        std::normal_distribution<float> n(0.0f, step % 2 ? 4.0f : 2.0f);
        for (float& x : logits) x = step == 3 ? std::round(n(rng) * 2.0f) / 2.0f : n(rng);
        auto d_logits = cuda::DeviceBuffer::Allocate(logits.size() * 4).value();
        REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4,
                           cudaMemcpyHostToDevice) == cudaSuccess);
        const Tensor t(d_logits.data(), DType::kF32, {R, vocab}, Device::kCuda);
        const std::vector<SampleResult> got = sampler.Sample(t, rows, stream.get());
        REQUIRE(got.size() == rows.size());
        const CudaLogitsProcessor& proc = sampler.logits_processor();
        for (int64_t r = 0; r < R; ++r) {
          const SampleRow& row = rows[static_cast<size_t>(r)];
          const float* raw = logits.data() + r * vocab;
          INFO("vocab " << vocab << " step " << step << " row " << r << " kind of request "
                        << owner[r]);
          if (!row.needed) {
            CHECK(proc.processed_index(static_cast<size_t>(r)) == -1);
            continue;
          }
          // The processed logits, bit for bit.
          const int32_t pi = proc.processed_index(static_cast<size_t>(r));
          if (row.processing != nullptr) {
            std::vector<float> want(static_cast<size_t>(vocab)), dev(static_cast<size_t>(vocab));
            ApplyLogitsProcessing(raw, vocab, *row.processing, row.prompt_tokens, row.output_tokens,
                                  row.draft_tokens, want.data());
            if (pi >= 0) {
              ++processed_rows;
              REQUIRE(cudaMemcpy(dev.data(), proc.processed() + pi * vocab, vocab * 4,
                                 cudaMemcpyDeviceToHost) == cudaSuccess);
              int differ = 0;
              for (int64_t i = 0; i < vocab; ++i) differ += std::memcmp(&dev[i], &want[i], 4) != 0;
              CHECK(differ == 0);
            } else {
              // Not processed this step: the CPU's processing changes nothing either.
              CHECK(std::memcmp(want.data(), raw, vocab * 4) == 0);
            }
          } else {
            CHECK(pi == -1);
          }
          const SampleResult want = SampleToken(raw, vocab, row);
          ++compared;
          if (got[r].token != want.token) {
            REQUIRE(row.params.top_p < 1.0f);  // only the float top-p mass boundary may differ
            ++top_p_mismatches;
            continue;
          }
          CHECK(std::fabs(got[r].logprob - want.logprob) < 2e-3f);
          REQUIRE(got[r].top_logprobs.size() == want.top_logprobs.size());
          for (size_t i = 0; i < want.top_logprobs.size(); ++i)
            CHECK(got[r].top_logprobs[i].token == want.top_logprobs[i].token);
        }
        // Commit: each request's first row's token; a speculative request whose draw equals its
        // draft also its second row's (two new tokens for the counts next step).
        for (size_t r = 0; r < rows.size(); ++r) {
          if (!rows[r].needed || (r > 0 && owner[r] == owner[r - 1])) continue;
          ProcRequest& q = reqs[owner[r]];
          q.output.push_back(got[r].token);
          if (q.speculative && (step % 2 == 1 || got[r].token == rows[r + 1].draft_tokens[0])) {
            q.output.back() = rows[r + 1].draft_tokens[0];  // accepted (forced on odd steps)
            q.output.push_back(got[r + 1].token);
          }
        }
      }
      CHECK(top_p_mismatches <= 3);
      CHECK(processed_rows > compared / 2);
      // Constraints held on the device's draws: allowed ids only, no single-token bad word.
      for (const ProcRequest& q : reqs) {
        for (size_t k = 0; k < q.output.size(); ++k) {
          if (q.speculative) break;  // (drafts were committed as given)
          const int32_t t = q.output[k];
          if (!q.params.allowed_token_ids.empty()) {
            CHECK(std::count(q.params.allowed_token_ids.begin(), q.params.allowed_token_ids.end(),
                             t) >= 1);  // (the random list may repeat an id)
          }
          for (const auto& w : q.params.bad_words_token_ids) {
            if (w.size() == 1) CHECK(t != w[0]);
          }
          if (static_cast<int64_t>(k) < q.min_tokens)
            CHECK(std::count(q.stops.begin(), q.stops.end(), t) == 0);
        }
      }
      // Every request still alive holds a slot iff it has penalties or allowed ids; dropping
      // them all releases every slot at the next step.
      size_t stateful = 0;
      for (const ProcRequest& q : reqs) {
        stateful += q.processing &&
                    (q.processing->has_penalties() || !q.processing->allowed_token_ids.empty());
      }
      CHECK(sampler.logits_processor().num_slots() == stateful);
      reqs.clear();
      std::vector<SampleRow> plain(1);
      std::vector<float> one(static_cast<size_t>(vocab), 0.0f);
      auto d_one = cuda::DeviceBuffer::Allocate(one.size() * 4).value();
      REQUIRE(cudaMemcpy(d_one.data(), one.data(), one.size() * 4, cudaMemcpyHostToDevice) ==
              cudaSuccess);
      sampler.Sample(Tensor(d_one.data(), DType::kF32, {1, vocab}, Device::kCuda), plain,
                     stream.get());
      CHECK(sampler.logits_processor().num_slots() == 0);
    }
  }
}

// Structured output on the device: rows whose processing carries a grammar constraint (a JSON
// schema over a made-up byte vocabulary of Qwen3's 151,936 ids, next to penalties, speculative
// rows with drafts the grammar may refuse) — the device's processed logits are the CPU's bit for
// bit, its draws the CPU sampler's, every committed draw is allowed by the grammar, and the
// generations that end with EOS complete it and parse.
TEST_CASE("CudaSampler keeps structured output's grammar", "[gpu][sampling][structured]") {
  auto rng = FreshRng();
  const int64_t vocab = 151936;
  const int32_t eos = 151645;
  const std::string alphabet = "{}[]\":,. -+0123456789abcdeEflnrstu\\\n\"\"";
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  for (int c = 32; c < 127; ++c)
    bytes[static_cast<size_t>(c)] = std::string(1, static_cast<char>(c));
  bytes['\n'] = "\n";
  for (int64_t i = 256; i < 151643; ++i) {  // (the ids above are special: no bytes)
    std::string& s = bytes[static_cast<size_t>(i)];
    for (size_t n = 1 + rng() % 5; n > 0; --n) s += alphabet[rng() % alphabet.size()];
  }
  auto vocabulary = structured::TokenVocabulary::FromBytes(bytes, vocab);
  const auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":8},"n":{"type":"integer"},"ok":{"type":"boolean"},
      "tags":{"type":"array","items":{"enum":["a","b",1.5]},"maxItems":3}},"required":["name","ok"]})");
  auto grammar = structured::JsonSchemaGrammar(schema);
  REQUIRE(grammar.ok());
  struct Req {
    SamplingParams params;
    std::shared_ptr<const structured::GrammarConstraint> constraint;
    std::shared_ptr<const LogitsProcessing> processing;
    std::vector<int32_t> prompt, output;
    uint64_t seed = 0;
    bool speculative = false, done = false;
  };
  std::vector<Req> reqs(12);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Req& q = reqs[i];
    q.params.temperature = i % 3 == 0 ? 0.0f : 1.0f;
    if (i % 4 == 1) q.params.frequency_penalty = 0.5f;
    if (i % 4 == 2) q.params.top_p = 0.9f;
    q.constraint = std::make_shared<structured::GrammarConstraint>(*grammar, vocabulary,
                                                                   std::vector<int32_t>{eos});
    q.params.constraint = q.constraint;
    q.processing = LogitsProcessing::For(q.params, 0, {});
    REQUIRE(q.processing != nullptr);
    q.prompt.resize(1 + rng() % 100);
    for (int32_t& t : q.prompt) t = static_cast<int32_t>(rng() % 151643);
    q.seed = rng();
    q.speculative = i % 2 == 1;
  }
  cuda::Stream stream;
  CudaSampler sampler;
  int compared = 0, mismatches = 0;
  for (int step = 0; step < 96; ++step) {
    std::vector<SampleRow> rows;
    std::vector<size_t> owner;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Req& q = reqs[i];
      if (q.done) continue;
      SampleRow row;
      row.params = q.params;
      row.seed = q.seed;
      row.counter = q.output.size();
      row.processing = q.processing;
      row.prompt_tokens = q.prompt;
      row.output_tokens = q.output;
      rows.push_back(row);
      owner.push_back(i);
      if (q.speculative) {  // a draft the grammar allows (even steps) or a random one
        const std::vector<int32_t> allowed = q.constraint->Allowed(q.output);
        REQUIRE(!allowed.empty());
        row.draft_tokens = {step % 2 == 0 ? allowed[rng() % allowed.size()]
                                          : static_cast<int32_t>(rng() % vocab)};
        ++row.counter;
        rows.push_back(row);
        owner.push_back(i);
      }
    }
    if (rows.empty()) break;
    const int64_t R = static_cast<int64_t>(rows.size());
    std::vector<float> logits(static_cast<size_t>(R * vocab));
    std::normal_distribution<float> n(0.0f, 2.0f);
    for (float& x : logits) x = n(rng);
    for (int64_t r = 0; r < R; ++r)
      logits[static_cast<size_t>(r * vocab + eos)] += 6.0f;  // (ends when it may)
    auto d_logits = cuda::DeviceBuffer::Allocate(logits.size() * 4).value();
    REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice) ==
            cudaSuccess);
    const std::vector<SampleResult> got = sampler.Sample(
        Tensor(d_logits.data(), DType::kF32, {R, vocab}, Device::kCuda), rows, stream.get());
    REQUIRE(got.size() == rows.size());
    const CudaLogitsProcessor& proc = sampler.logits_processor();
    for (int64_t r = 0; r < R; ++r) {
      const SampleRow& row = rows[static_cast<size_t>(r)];
      INFO("step " << step << " row " << r << " request " << owner[static_cast<size_t>(r)]);
      const float* raw = logits.data() + r * vocab;
      std::vector<float> want(static_cast<size_t>(vocab)), dev(static_cast<size_t>(vocab));
      ApplyLogitsProcessing(raw, vocab, *row.processing, row.prompt_tokens, row.output_tokens,
                            row.draft_tokens, want.data());
      // -1: nothing to process this step (a draft the grammar refuses leaves no state to
      // constrain the row after it; that row is discarded with its draft): the raw logits,
      // which the CPU must leave as they are too.
      const int32_t pi = proc.processed_index(static_cast<size_t>(r));
      if (pi >= 0) {
        REQUIRE(cudaMemcpy(dev.data(), proc.processed() + pi * vocab, vocab * 4,
                           cudaMemcpyDeviceToHost) == cudaSuccess);
      } else {
        std::copy(raw, raw + vocab, dev.begin());
      }
      int differ = 0;
      for (int64_t i = 0; i < vocab; ++i) differ += std::memcmp(&dev[i], &want[i], 4) != 0;
      CHECK(differ == 0);
      const SampleResult w = SampleToken(raw, vocab, row);
      ++compared;
      if (got[static_cast<size_t>(r)].token != w.token) {
        REQUIRE(row.params.top_p < 1.0f);  // only the float top-p mass boundary may differ
        ++mismatches;
      }
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      if (r > 0 && owner[r] == owner[r - 1]) continue;  // (drafts are not committed)
      Req& q = reqs[owner[r]];
      const int32_t t = got[r].token;
      const std::vector<int32_t> allowed = q.constraint->Allowed(q.output);
      INFO("request " << owner[r] << " step " << step << " token " << t);
      REQUIRE(std::binary_search(allowed.begin(), allowed.end(), t));
      q.output.push_back(t);
      q.done = t == eos;
    }
  }
  CHECK(mismatches <= 3);
  int complete = 0;
  for (const Req& q : reqs) {
    if (!q.done) continue;
    ++complete;
    CHECK(q.constraint->Complete(q.output));
    std::string text;
    for (int32_t t : q.output) {
      if (t != eos) text += std::string(vocabulary->bytes(t));
    }
    INFO(text);
    const auto v = nlohmann::ordered_json::parse(text, nullptr, false);
    REQUIRE(!v.is_discarded());
    CHECK(v.contains("name"));
    CHECK(v.contains("ok"));
  }
  CHECK(complete >= 6);
  INFO("compared " << compared);
  CHECK(compared > 200);
}

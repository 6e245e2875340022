// GPU: the sampling kernel draws exactly the CPU sampler's tokens (same rule, same
// counter-based noise) on fresh random logits — greedy, temperature, top-k, top-p, min-p
// and their combinations, with exact ties — and reports the same log-probabilities.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "runner/cuda/cuda_sampler.h"
#include "common/cuda_rt.h"
#include "runner/sampler.h"
#include "kernels/sampling.h"

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
    add(0.2f + 1.5f * u(rng), u(rng) < 0.5f ? -1 : 1 + static_cast<int>(u(rng) * 100), u(rng) < 0.5f ? 1.0f : 0.05f + 0.95f * u(rng),
        u(rng) < 0.5f ? 0.0f : 0.3f * u(rng), static_cast<int>(u(rng) * 21));
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
        params[static_cast<size_t>(r)] = {c.params.temperature, c.params.top_p, c.params.min_p, c.params.top_k,
                                          seed + static_cast<uint64_t>(r), static_cast<uint64_t>(r * 7), c.num_top, 1};
        // Teacher forcing on every fifth row: the forced id is the token, log-probs the model's.
        if (r % 5 == 4) params[static_cast<size_t>(r)].forced = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      }
      auto d_logits = cuda::DeviceBuffer::Allocate(logits.size() * 4).value();
      auto d_params = cuda::DeviceBuffer::Allocate(params.size() * sizeof(params[0])).value();
      auto d_out = cuda::DeviceBuffer::Allocate(params.size() * sizeof(kernels::SampleOutputDevice)).value();
      REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
      REQUIRE(cudaMemcpy(d_params.data(), params.data(), params.size() * sizeof(params[0]), cudaMemcpyHostToDevice) ==
              cudaSuccess);
      REQUIRE(cudaMemset(d_out.data(), 0xff, params.size() * sizeof(kernels::SampleOutputDevice)) == cudaSuccess);
      auto d_ws = cuda::DeviceBuffer::Allocate(kernels::SampleWorkspaceBytes(rows)).value();
      const uint32_t stages = kernels::SampleStagesFor(params.data(), rows, vocab);
      REQUIRE(kernels::LaunchSample(static_cast<float*>(d_logits.data()), rows, vocab, vocab,
                                    static_cast<kernels::SampleParamsDevice*>(d_params.data()),
                                    static_cast<kernels::SampleOutputDevice*>(d_out.data()), stages, d_ws.data(),
                                    d_ws.size(), stream.get()) == cudaSuccess);
      std::vector<kernels::SampleOutputDevice> out(params.size());
      REQUIRE(cudaMemcpyAsync(out.data(), d_out.data(), out.size() * sizeof(out[0]), cudaMemcpyDeviceToHost,
                              stream.get()) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(stream.get()) == cudaSuccess);
      int top_p_mismatches = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const Case& c = cases[static_cast<size_t>(r)];
        const auto& p = params[static_cast<size_t>(r)];
        INFO("vocab " << vocab << " dist " << dist << " row " << r << " T " << c.params.temperature << " k "
                      << c.params.top_k << " p " << c.params.top_p << " min_p " << c.params.min_p);
        const SampleResult want =
            SampleToken(logits.data() + r * vocab, vocab, c.params, p.seed, p.counter, c.num_top, p.forced);
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
        REQUIRE(static_cast<int64_t>(want.top_logprobs.size()) == std::min<int64_t>(c.num_top, vocab));
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
  REQUIRE(cudaMemcpy(d_logits.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
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

// ComputeRopeParams for linear, dynamic and yarn scaling against values derived by hand in
// this file (the closed forms of the ramp and the NTK base, not the implementation's code), and
// the CPU backend's RoPE applying YaRN's attention scaling.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/rope.h"
#include "oasis/model_config.h"

using namespace oasis;

namespace {

// head_dim 16, theta 1e4: the unscaled inv_freq[i] = 1e4^(-i/8).
ModelConfig Small() {
  ModelConfig c;
  c.head_dim = 16;
  c.rope_theta = 10000;
  return c;
}

double Plain(int i) { return std::pow(10000.0, -i / 8.0); }

RopeScaling Yarn(double factor, int64_t original) {
  RopeScaling s;
  s.type = RopeScalingType::kYarn;
  s.factor = factor;
  s.original_max_position_embeddings = original;
  return s;
}

}  // namespace

TEST_CASE("linear scaling divides every frequency by the factor", "[rope]") {
  ModelConfig c = Small();
  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = 2.5;
  const RopeParams p = ComputeRopeParams(c);
  REQUIRE(p.inv_freq.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(p.inv_freq[i] == Approx(Plain(i) / 2.5).epsilon(1e-6));
  CHECK(p.attention_scaling == 1.0f);
}

TEST_CASE("dynamic scaling: vLLM's fixed NTK base at max_position_embeddings × factor", "[rope]") {
  ModelConfig c = Small();
  c.rope_scaling.type = RopeScalingType::kDynamic;
  c.rope_scaling.factor = 2;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.max_position_embeddings = 128;  // the scaled context; the base uses the original 64
  // base' = base · (factor · (64·factor)/64 − (factor − 1))^(d/(d−2)) = 1e4 · 3^(16/14)
  const double base = 10000.0 * std::pow(3.0, 16.0 / 14.0);
  const RopeParams p = ComputeRopeParams(c);
  for (int i = 0; i < 8; ++i) CHECK(p.inv_freq[i] == Approx(std::pow(base, -i / 8.0)).epsilon(1e-6));
  CHECK(p.attention_scaling == 1.0f);
  c.rope_scaling.factor = 1;  // factor 1: the plain table
  const RopeParams same = ComputeRopeParams(c);
  for (int i = 0; i < 8; ++i) CHECK(same.inv_freq[i] == Approx(Plain(i)).epsilon(1e-6));
}

TEST_CASE("yarn: ramp between extrapolated and interpolated pairs, attention scaling", "[rope]") {
  // head_dim 16, theta 1e4, original context 64, factor 4. The pair whose wavelength turns
  // r times in 64 positions is d(r) = 16·ln(64 / (2πr)) / (2·ln 1e4): d(32) = −0.994,
  // d(1) = 2.016. Truncated to [floor, ceil] = [−1, 3] → [0, 3]: pair i keeps the weight
  // w = 1 − clamp(i / 3, 0, 1) of its own frequency and 1 − w of the interpolated one (÷ 4):
  // multipliers 1, 3/4, 1/2, then 1/4.
  ModelConfig c = Small();
  c.rope_scaling = Yarn(4, 64);
  const double mult[8] = {1, 0.75, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25};
  RopeParams p = ComputeRopeParams(c);
  for (int i = 0; i < 8; ++i) CHECK(p.inv_freq[i] == Approx(Plain(i) * mult[i]).epsilon(1e-6));
  // mscale = 0.1 · ln(4) + 1
  CHECK(p.attention_scaling == Approx(1.1386294361));

  SECTION("without truncation the ramp runs over [0, 2.016]") {
    c.rope_scaling.truncate = false;
    p = ComputeRopeParams(c);
    const double high = 16 * std::log(64 / (2 * M_PI)) / (2 * std::log(10000.0));
    REQUIRE(high == Approx(2.016).margin(1e-3));
    for (int i = 0; i < 8; ++i) {
      const double w = 1 - std::min(1.0, i / high);
      CHECK(p.inv_freq[i] == Approx(Plain(i) * (w + (1 - w) / 4)).epsilon(1e-5));
    }
  }
  SECTION("beta_fast / beta_slow move the ramp") {
    // d(4) = 16·ln(64/(8π))/18.42 = 0.812 → floor 0; d(0.5) = 16·ln(64/π)/18.42 = 2.618 → ceil 3
    c.rope_scaling.beta_fast = 4;
    c.rope_scaling.beta_slow = 0.5;
    p = ComputeRopeParams(c);
    for (int i = 0; i < 8; ++i) CHECK(p.inv_freq[i] == Approx(Plain(i) * mult[i]).epsilon(1e-6));
    // d(2) = 16·ln(64/(4π))/18.42 = 1.414 → floor 1; d(1) → 3: weights 1, 1, 1/2, 0
    c.rope_scaling.beta_fast = 2;
    c.rope_scaling.beta_slow = 1;
    p = ComputeRopeParams(c);
    const double m2[4] = {1, 1, 0.625, 0.25};
    for (int i = 0; i < 4; ++i) CHECK(p.inv_freq[i] == Approx(Plain(i) * m2[i]).epsilon(1e-6));
  }
  SECTION("attention_factor, or mscale over mscale_all_dim") {
    c.rope_scaling.attention_factor = 1.5;
    CHECK(ComputeRopeParams(c).attention_scaling == 1.5f);
    c.rope_scaling.attention_factor = 0;
    c.rope_scaling.mscale = 0.7;
    c.rope_scaling.mscale_all_dim = 0.5;
    // (0.07·ln 4 + 1) / (0.05·ln 4 + 1)
    CHECK(ComputeRopeParams(c).attention_scaling == Approx(1.0970406 / 1.0693147));
    c.rope_scaling.mscale_all_dim = 0;  // only one of them: the plain formula
    CHECK(ComputeRopeParams(c).attention_scaling == Approx(1.1386294361));
  }
  SECTION("factor 1: no interpolation and no scaling") {
    c.rope_scaling.factor = 1;
    p = ComputeRopeParams(c);
    for (int i = 0; i < 8; ++i) CHECK(p.inv_freq[i] == Approx(Plain(i)).epsilon(1e-6));
    CHECK(p.attention_scaling == 1.0f);
  }
}

TEST_CASE("the CPU RoPE multiplies cos and sin by yarn's attention scaling", "[backend][rope]") {
  ModelConfig c;
  c.head_dim = 4;
  c.rope_theta = 10000;
  c.rope_scaling = Yarn(4, 64);  // d(1) = 4·ln(64/2π)/18.42 = 0.504 → [0, 1]: pair 0 kept
  const RopeParams rope = ComputeRopeParams(c);
  REQUIRE(rope.inv_freq[0] == 1.0f);
  REQUIRE(rope.inv_freq[1] == Approx(0.01 / 4));
  const double m = 1.1386294361;
  CpuBackend b;
  Tensor q = Tensor::FromFloats({1, 2, 0, 0}, {1, 1, 4});
  Tensor k = Tensor::FromFloats({0, 0, 1, 0}, {1, 1, 4});
  Tensor pos = Tensor::Empty({1}, DType::kI32);
  pos.data<int32_t>()[0] = 100;
  b.QkNormRope(q, k, nullptr, nullptr, 1e-6f, pos, rope);
  const double a0 = 100.0, a1 = 100.0 * 0.0025;
  CHECK(q.data<float>()[0] == Approx(m * std::cos(a0)).margin(1e-5));
  CHECK(q.data<float>()[2] == Approx(m * std::sin(a0)).margin(1e-5));
  CHECK(q.data<float>()[1] == Approx(2 * m * std::cos(a1)).margin(1e-5));
  CHECK(q.data<float>()[3] == Approx(2 * m * std::sin(a1)).margin(1e-5));
  CHECK(k.data<float>()[0] == Approx(-m * std::sin(a0)).margin(1e-5));
  CHECK(k.data<float>()[2] == Approx(m * std::cos(a0)).margin(1e-5));
}

TEST_CASE("config.json → rope tables: Qwen3's documented yarn", "[rope][loader]") {
  auto c = ParseModelConfig(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rope_theta": 1000000, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 32768}})",
                            "config.json");
  REQUIRE(c.ok());
  CHECK(c->max_position_embeddings == 131072);
  const RopeParams p = ComputeRopeParams(*c);
  // d(r) = 128·ln(32768/(2πr)) / (2·ln 1e6): d(32) = 23.60 → 23, d(1) = 39.65 → 40.
  for (int i = 0; i < 64; ++i) {
    const double plain = std::pow(1e6, -i / 64.0);
    const double w = 1 - std::clamp((i - 23) / 17.0, 0.0, 1.0);
    INFO("pair " << i);
    CHECK(p.inv_freq[i] == Approx(plain * (w + (1 - w) / 4)).epsilon(1e-5));
  }
  CHECK(p.attention_scaling == Approx(1.1386294361));
}

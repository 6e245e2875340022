#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/check.h"

namespace oasis {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (top_k < -1) return InvalidArgument("top_k must be -1 (disabled) or >= 0, got " + std::to_string(top_k));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  return Status::Ok();
}

namespace {

// log-softmax of the raw logits (double accumulation).
std::vector<float> LogSoftmax(const float* logits, int64_t vocab) {
  float max_l = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) max_l = std::max(max_l, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_l);
  const double log_z = max_l + std::log(sum);
  std::vector<float> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[static_cast<size_t>(i)] = static_cast<float>(logits[i] - log_z);
  return out;
}

int32_t Argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;  // first maximum wins, like torch.argmax
  }
  return static_cast<int32_t>(best);
}

}  // namespace

SampleResult SampleToken(const float* logits, int64_t vocab, const SamplingParams& p, std::mt19937_64& rng,
                         int num_top_logprobs) {
  OASIS_CHECK_GT(vocab, 0) << "empty logits";
  SampleResult result;
  if (p.greedy()) {
    result.token = Argmax(logits, vocab);
  } else {
    // Candidates sorted by logit, best first (ties: lower id first), then truncated.
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    int64_t keep = vocab;
    if (p.top_k > 0 && p.top_k < vocab) keep = p.top_k;
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
    order.resize(static_cast<size_t>(keep));
    // Probabilities at this temperature over the top-k candidates.
    const double inv_t = 1.0 / p.temperature;
    const double max_l = logits[order[0]];
    std::vector<double> prob(order.size());
    double z = 0;
    for (size_t i = 0; i < order.size(); ++i) z += prob[i] = std::exp((logits[order[i]] - max_l) * inv_t);
    for (double& x : prob) x /= z;
    // top-p: smallest prefix whose mass reaches top_p (always at least one token).
    size_t n = order.size();
    if (p.top_p < 1.0f) {
      double mass = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        mass += prob[i];
        if (mass >= p.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    // min-p: drop tokens below min_p × the top probability.
    if (p.min_p > 0.0f) {
      const double floor = p.min_p * prob[0];
      size_t m = 1;
      while (m < n && prob[m] >= floor) ++m;
      n = m;
    }
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += prob[i];
    std::uniform_real_distribution<double> uniform(0.0, total);
    double u = uniform(rng), cum = 0;
    result.token = order[n - 1];
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (u < cum) {
        result.token = order[i];
        break;
      }
    }
  }
  std::vector<float> lp = LogSoftmax(logits, vocab);
  result.logprob = lp[static_cast<size_t>(result.token)];
  if (num_top_logprobs > 0) {
    const int64_t k = std::min<int64_t>(num_top_logprobs, vocab);
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return lp[static_cast<size_t>(a)] > lp[static_cast<size_t>(b)] || (lp[static_cast<size_t>(a)] == lp[static_cast<size_t>(b)] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) result.top_logprobs.push_back({idx[static_cast<size_t>(i)], lp[static_cast<size_t>(idx[static_cast<size_t>(i)])]});
  }
  return result;
}

}  // namespace oasis

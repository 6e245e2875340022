#include "runner/sampler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "common/check.h"
#include "oasis/sampling_noise.h"

namespace oasis {

Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return InvalidArgument("temperature must be a finite number >= 0, got " +
                           std::to_string(temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  if (top_k < -1)
    return InvalidArgument("top_k must be -1 (disabled) or >= 0, got " + std::to_string(top_k));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return InvalidArgument("min_p must be in [0, 1], got " + std::to_string(min_p));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " +
                           std::to_string(presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " +
                           std::to_string(frequency_penalty));
  }
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f)) {
    return InvalidArgument("repetition_penalty must be in (0, 2], got " +
                           std::to_string(repetition_penalty));
  }
  auto bad_id = [vocab_size](int32_t id) { return id < 0 || (vocab_size > 0 && id >= vocab_size); };
  auto outside = [vocab_size](const char* what, int32_t id) {
    return InvalidArgument(std::string(what) + " token id " + std::to_string(id) +
                           " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
  };
  for (const auto& [id, bias] : logit_bias) {
    if (bad_id(id)) return outside("logit_bias", id);
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidArgument("logit_bias values must be in [-100, 100], got " +
                             std::to_string(bias) + " for token " + std::to_string(id));
    }
  }
  for (int32_t id : allowed_token_ids) {
    if (bad_id(id)) return outside("allowed_token_ids", id);
  }
  for (const std::vector<int32_t>& word : bad_words_token_ids) {
    if (word.empty()) return InvalidArgument("bad_words: a bad word has no tokens");
    for (int32_t id : word) {
      if (bad_id(id)) return outside("bad_words", id);
    }
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
  for (int64_t i = 0; i < vocab; ++i)
    out[static_cast<size_t>(i)] = static_cast<float>(logits[i] - log_z);
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

SampleResult SampleToken(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t seed,
                         uint64_t counter, int num_top_logprobs, int32_t forced_token) {
  return SampleToken(logits, logits, vocab, p, seed, counter, num_top_logprobs, forced_token);
}

SampleResult SampleToken(const float* raw_logits, const float* logits, int64_t vocab,
                         const SamplingParams& p, uint64_t seed, uint64_t counter,
                         int num_top_logprobs, int32_t forced_token) {
  OASIS_CHECK_GT(vocab, 0) << "empty logits";
  OASIS_CHECK_LT(forced_token, vocab) << "forced token";
  SampleResult result;
  // (Every token masked by logits processing: the first one, as the device's argmax.)
  const int32_t arg = Argmax(logits, vocab);
  if (forced_token >= 0) {
    result.token = forced_token;
  } else if (p.greedy() || logits[arg] == -std::numeric_limits<float>::infinity()) {
    result.token = arg;
  } else {
    const float max_l = logits[arg];
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    const int64_t keep = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
    const bool truncate = keep < vocab || p.top_p < 1.0f || p.min_p > 0.0f;
    const uint64_t key = NoiseKey(seed, counter);
    auto score = [&](int32_t id) {
      const double g = -std::log(-std::log(NoiseUniform(key, id)));
      return static_cast<double>(logits[id] - max_l) * inv_t + g;
    };
    auto pick = [&](const int32_t* ids, int64_t n) {
      int32_t best = ids[0];
      double best_s = score(best);
      for (int64_t i = 1; i < n; ++i) {
        const double s = score(ids[i]);
        if (s > best_s || (s == best_s && ids[i] < best)) best = ids[i], best_s = s;
      }
      return best;
    };
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    if (!truncate) {
      result.token = pick(order.data(), vocab);
    } else {
      // Candidates sorted by logit, best first (ties: lower id first), then truncated.
      auto better = [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      };
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
      std::vector<double> q(static_cast<size_t>(keep));
      double z = 0;
      for (int64_t i = 0; i < keep; ++i) {
        z += q[static_cast<size_t>(i)] =
            std::exp(static_cast<double>(logits[order[static_cast<size_t>(i)]] - max_l) * inv_t);
      }
      int64_t n = keep;
      if (p.top_p < 1.0f) {  // shortest prefix whose mass reaches top_p (at least one token)
        const double target = static_cast<double>(p.top_p) * z;
        double mass = 0;
        for (int64_t i = 0; i < keep; ++i) {
          mass += q[static_cast<size_t>(i)];
          if (mass >= target) {
            n = i + 1;
            break;
          }
        }
      }
      if (p.min_p > 0.0f) {  // q_0 = 1 is the top probability's scale
        int64_t m = 1;
        while (m < n && q[static_cast<size_t>(m)] >= static_cast<double>(p.min_p)) ++m;
        n = m;
      }
      result.token = pick(order.data(), n);
    }
  }
  // Log-probabilities of the raw logits.
  logits = raw_logits;
  std::vector<float> lp = LogSoftmax(logits, vocab);
  result.logprob = lp[static_cast<size_t>(result.token)];
  if (num_top_logprobs > 0) {
    const int64_t k = std::min<int64_t>(num_top_logprobs, vocab);
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) {
      const int32_t id = idx[static_cast<size_t>(i)];
      result.top_logprobs.push_back({id, lp[static_cast<size_t>(id)]});
    }
  }
  return result;
}

std::vector<std::vector<LogitsEntry>> RowEntriesOf(const std::vector<SampleRow>& rows,
                                                   size_t max_threads) {
  std::vector<std::vector<LogitsEntry>> out(rows.size());
  std::vector<size_t> todo;
  size_t constrained = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].needed || rows[r].processing == nullptr) continue;
    todo.push_back(r);
    if (rows[r].processing->constraint != nullptr) ++constrained;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < todo.size(); i = next.fetch_add(1)) {
      const SampleRow& row = rows[todo[i]];
      out[todo[i]] = RowEntries(*row.processing, row.output_tokens, row.draft_tokens);
    }
  };
  const size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min({constrained, max_threads, cores});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return out;
}

SampleResult SampleToken(const float* logits, int64_t vocab, const SampleRow& row) {
  if (row.processing == nullptr) {
    return SampleToken(logits, vocab, row.params, row.seed, row.counter, row.num_top_logprobs,
                       row.forced_token);
  }
  std::vector<float> processed(static_cast<size_t>(vocab));
  ApplyLogitsProcessing(logits, vocab, *row.processing, row.prompt_tokens, row.output_tokens,
                        row.draft_tokens, processed.data());
  return SampleToken(logits, processed.data(), vocab, row.params, row.seed, row.counter,
                     row.num_top_logprobs, row.forced_token);
}

}  // namespace oasis

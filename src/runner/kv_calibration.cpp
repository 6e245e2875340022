#include "runner/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "kvcache/block_allocator.h"
#include "kvcache/head_block_table.h"
#include "runner/batch_builder.h"

namespace oasis {
namespace {

void SetAll(Backend& backend, Tensor& t, const std::vector<float>& values) {
  backend.UploadBytes(t, 0, values.data(), values.size() * sizeof(float));
}

std::vector<float> Read(Backend& backend, const Tensor& t) {
  const Tensor host = backend.Download(t);
  return std::vector<float>(host.data<float>(), host.data<float>() + host.numel());
}

float ScaleFor(float amax) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  return amax * kKvScaleMargin / kFp8E4M3Max;
}

// One dense prefill of `tokens` into borrowed slots (released after).
Status RunPass(ModelRunner& runner, const std::vector<int32_t>& tokens, int64_t max_step_tokens) {
  BlockAllocator allocator(static_cast<int32_t>(runner.num_kv_slots()));
  HeadBlockTable table(static_cast<int32_t>(runner.model().config().num_key_value_heads));
  const int64_t n = static_cast<int64_t>(tokens.size());
  Status st = table.Reserve(n, allocator);
  if (!st.ok()) {
    return InvalidArgument("FP8 KV calibration: the KV pool cannot hold its " + std::to_string(n) +
                           " tokens (" + st.message() + ")");
  }
  for (int64_t start = 0; start < n; start += max_step_tokens) {
    const int64_t len = std::min(max_step_tokens, n - start);
    StepSequence s{&table, start,
                   std::vector<int32_t>(tokens.begin() + start, tokens.begin() + start + len)};
    (void)runner.Execute(BuildHostForwardInput({s}, LogitsFor::kLastTokenOfEachSequence));
  }
  table.Release(allocator);
  return Status::Ok();
}

}  // namespace

StatusOr<KvCalibration> CalibrateKvScales(ModelRunner& runner, const std::vector<int32_t>& tokens,
                                          int64_t max_step_tokens) {
  KvCalibration out;
  if (runner.kv_pools().empty() || !runner.kv_pools().front().fp8()) return out;
  if (tokens.empty()) return InvalidArgument("FP8 KV calibration needs tokens");
  max_step_tokens = std::max<int64_t>(1, max_step_tokens);
  std::mutex mu;
  // Sets every rank's scales from its maxima (or to one) and clears the maxima.
  auto apply = [&](bool from_amax) {
    runner.ForEachRank([&](int, ModelRunner& rank) {
      Backend& b = rank.backend();
      for (LayerKvPool& p : rank.kv_pools()) {
        const size_t heads = static_cast<size_t>(p.k_scale.numel());
        std::vector<float> ks(heads, 1.0f), vs(heads, 1.0f);
        if (from_amax) {
          const std::vector<float> ka = Read(b, p.k_amax), va = Read(b, p.v_amax);
          std::lock_guard<std::mutex> lock(mu);
          for (size_t h = 0; h < heads; ++h) {
            ks[h] = ScaleFor(ka[h]);
            vs[h] = ScaleFor(va[h]);
            out.max_k_amax = std::max(out.max_k_amax, static_cast<double>(ka[h]));
            out.max_v_amax = std::max(out.max_v_amax, static_cast<double>(va[h]));
            const bool first = out.min_k_scale == 0;
            out.min_k_scale = first ? ks[h] : std::min(out.min_k_scale, double{ks[h]});
            out.max_k_scale = std::max(out.max_k_scale, double{ks[h]});
            out.min_v_scale = first ? vs[h] : std::min(out.min_v_scale, double{vs[h]});
            out.max_v_scale = std::max(out.max_v_scale, double{vs[h]});
          }
        }
        SetAll(b, p.k_scale, ks);
        SetAll(b, p.v_scale, vs);
        const std::vector<float> zeros(heads, 0.0f);
        SetAll(b, p.k_amax, zeros);
        SetAll(b, p.v_amax, zeros);
      }
    });
  };
  apply(false);
  OASIS_RETURN_IF_ERROR(RunPass(runner, tokens, max_step_tokens));
  apply(true);
  out = KvCalibration{};
  OASIS_RETURN_IF_ERROR(RunPass(runner, tokens, max_step_tokens));
  apply(true);
  out.tokens = static_cast<int64_t>(tokens.size());
  return out;
}

std::vector<int32_t> KvCalibrationTokens(std::vector<int32_t> text_tokens, int64_t vocab_size,
                                         int64_t length) {
  if (text_tokens.size() >= 64) return text_tokens;
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(1, length)));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int32_t& id : ids) {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    id = static_cast<int32_t>(z % static_cast<uint64_t>(std::max<int64_t>(1, vocab_size)));
  }
  return ids;
}

const std::string& KvCalibrationText() {
  static const std::string text =
      R"TXT(The lighthouse keeper wrote in his log every evening, a habit he had kept for thirty-one years. "Wind from the north-east, force six," he noted on the fourteenth of March, "visibility poor, two fishing boats returned before dark." He never wrote about himself; the sea was the only subject worth the ink.

User: Can you explain why the sky is blue during the day but red at sunset?
Assistant: Sunlight contains every colour. Air molecules scatter short wavelengths (blue and violet) far more strongly than long ones, roughly in proportion to 1/lambda^4, so blue light reaches your eyes from every direction of the sky. At sunset the light crosses much more atmosphere; most of the blue is scattered away before it arrives, and the remaining reds and oranges dominate.
User: And why not violet, if it scatters even more?
Assistant: Three reasons: the Sun emits less violet than blue, some violet is absorbed high in the atmosphere, and our eyes are less sensitive to it.

def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals; returns a sorted list."""
    if not intervals:
        return []
    intervals.sort(key=lambda iv: iv[0])
    merged = [list(intervals[0])]
    for start, end in intervals[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged

#include <stdio.h>
int main(void) {
  for (int i = 1; i <= 15; ++i) printf(i % 15 == 0 ? "FizzBuzz\n" : i % 5 == 0 ? "Buzz\n" : i % 3 == 0 ? "Fizz\n" : "%d\n", i);
  return 0;
}

Quarterly results (in thousands): revenue 48,213.7; cost of sales 29,904.2; gross margin 38.0%; operating expenses 11,250.9; net income 5,118.4. Headcount rose from 1,204 to 1,377. Year-over-year growth: 12.4%, 9.8%, 15.1% and 7.3% across the four regions.

Shopping list: 2 kg flour, 12 eggs, 500 ml milk, butter, yeast (7 g sachets x 3), sea salt, olive oil, tomatoes, basil, mozzarella.

Die Geschichte der Stadt beginnt im zwölften Jahrhundert, als Händler am Fluss einen Markt gründeten. La ville a grandi rapidement au dix-neuvième siècle grâce au chemin de fer. 東京は日本の首都であり、世界最大の都市圏の一つです。 El río atraviesa la ciudad de norte a sur.

Theorem. For every integer n >= 1, the sum 1 + 2 + ... + n equals n(n + 1)/2. Proof by induction: the case n = 1 holds since 1 = 1*2/2. If it holds for n, then 1 + ... + n + (n + 1) = n(n + 1)/2 + (n + 1) = (n + 1)(n + 2)/2, which is the claim for n + 1.

{"id": 4721, "name": "sensor-07", "readings": [21.4, 21.9, 22.3, 22.1], "status": "ok", "tags": ["roof", "north"]}

The committee met on Tuesday. After a long discussion of the budget, the chair proposed postponing the vote until the auditors had reviewed the figures; the motion passed seven to two, with one abstention. Minutes were approved without changes, and the meeting closed at 9:47 p.m.)TXT";
  return text;
}

}  // namespace oasis

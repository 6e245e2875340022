// The ticket's sampling state (engine/kv_handoff.h): seed and x1's / x2's log-probabilities.
#include "engine/kv_handoff.h"

#include <cstring>

#include "runner/sampler.h"

namespace oasis {
namespace {

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <typename T>
bool Get(std::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

}  // namespace

// Layout (little-endian): u64 seed, u8 count (≤ 2), per token: f32 logprob, u8 n (≤ 20),
// n × (i32 id, f32 logprob).
std::string EncodeHandoffSampling(const HandoffSampling& s) {
  std::string out;
  Put<uint64_t>(out, s.seed);
  Put<uint8_t>(out, static_cast<uint8_t>(s.tokens.size()));
  for (const HandoffSampling::Token& t : s.tokens) {
    Put<float>(out, t.logprob);
    Put<uint8_t>(out, static_cast<uint8_t>(t.top.size()));
    for (const TokenLogprob& lp : t.top) {
      Put<int32_t>(out, lp.token);
      Put<float>(out, lp.logprob);
    }
  }
  return out;
}

StatusOr<HandoffSampling> ParseHandoffSampling(std::string_view in) {
  HandoffSampling s;
  uint8_t count = 0;
  if (!Get(in, &s.seed) || !Get(in, &count))
    return InvalidArgument("handoff sampling state: truncated header");
  if (count > 2)
    return InvalidArgument("handoff sampling state: " + std::to_string(count) +
                           " tokens (at most 2)");
  for (uint8_t i = 0; i < count; ++i) {
    HandoffSampling::Token t;
    uint8_t n = 0;
    if (!Get(in, &t.logprob) || !Get(in, &n))
      return InvalidArgument("handoff sampling state: truncated token");
    if (n > kMaxTopLogprobs) {
      return InvalidArgument("handoff sampling state: " + std::to_string(n) +
                             " top log-probabilities (at most " + std::to_string(kMaxTopLogprobs) +
                             ")");
    }
    for (uint8_t j = 0; j < n; ++j) {
      TokenLogprob lp;
      if (!Get(in, &lp.token) || !Get(in, &lp.logprob)) {
        return InvalidArgument("handoff sampling state: truncated top log-probabilities");
      }
      t.top.push_back(lp);
    }
    s.tokens.push_back(std::move(t));
  }
  if (!in.empty())
    return InvalidArgument("handoff sampling state: " + std::to_string(in.size()) +
                           " trailing bytes");
  return s;
}

}  // namespace oasis

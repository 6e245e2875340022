// The handoff ticket's sampling state (engine/kv_handoff.h): random round trips with a fresh
// seed each run, and every truncation or overflow rejected (it arrives from the network).
#include <catch2/catch.hpp>

#include <random>

#include "engine/kv_handoff.h"

using namespace oasis;

TEST_CASE("handoff sampling state round-trips and rejects malformed bytes", "[engine][disagg]") {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    HandoffSampling s;
    s.seed = rng();
    for (int t = 0; t < static_cast<int>(rng() % 3); ++t) {
      HandoffSampling::Token tok;
      tok.logprob = -static_cast<float>(rng() % 1000) / 37.0f;
      for (int j = 0; j < static_cast<int>(rng() % (kMaxTopLogprobs + 1)); ++j) {
        tok.top.push_back({static_cast<int32_t>(rng() % 150000), -static_cast<float>(rng() % 999) / 13.0f});
      }
      s.tokens.push_back(tok);
    }
    const std::string bytes = EncodeHandoffSampling(s);
    auto back = ParseHandoffSampling(bytes);
    REQUIRE(back.ok());
    CHECK(back->seed == s.seed);
    REQUIRE(back->tokens.size() == s.tokens.size());
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      CHECK(back->tokens[t].logprob == s.tokens[t].logprob);
      REQUIRE(back->tokens[t].top.size() == s.tokens[t].top.size());
      for (size_t j = 0; j < s.tokens[t].top.size(); ++j) {
        CHECK(back->tokens[t].top[j].token == s.tokens[t].top[j].token);
        CHECK(back->tokens[t].top[j].logprob == s.tokens[t].top[j].logprob);
      }
    }
    // Every truncation is an error, and so is a trailing byte.
    for (size_t cut = 0; cut < bytes.size(); ++cut) CHECK_FALSE(ParseHandoffSampling(bytes.substr(0, cut)).ok());
    CHECK_FALSE(ParseHandoffSampling(bytes + "x").ok());
  }
  // Counts beyond the limits.
  std::string three(8, '\0');
  three += '\3';
  CHECK_THAT(std::string(ParseHandoffSampling(three).status().message()), Catch::Contains("at most 2"));
  std::string many(8, '\0');
  many += '\1';
  many.append(4, '\0');
  many += static_cast<char>(kMaxTopLogprobs + 1);
  CHECK_THAT(std::string(ParseHandoffSampling(many).status().message()), Catch::Contains("top log-probabilities"));
}

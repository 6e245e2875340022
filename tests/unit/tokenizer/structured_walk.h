// Shared by the structured-output tests: whole matches, and random walks over the bytes a
// grammar allows.
#pragma once

#include <catch2/catch.hpp>

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/structured/grammar.h"

namespace oasis::structured::testing {

// Whether the whole text is a match.
inline bool Matches(GrammarMatcher& m, const std::string& text) {
  const int32_t s = m.Next(m.start(), text);
  return s >= 0 && m.Accepting(s);
}
// Whether the text can still be continued into a match.
inline bool Alive(GrammarMatcher& m, const std::string& text) {
  return m.Next(m.start(), text) >= 0;
}

// A random walk over the bytes the grammar allows: every state reached must be completable
// (accepting or with a byte that continues it). Returns the text when it stopped at an
// accepting state within `limit` bytes, else nullopt. Half the time a byte of `prefer` is taken
// when one is allowed (closing brackets and quotes, so that walks end).
inline std::optional<std::string> Walk(GrammarMatcher& m, std::mt19937_64& rng, int limit,
                                       double stop, std::string_view prefer = {}) {
  std::string text;
  int32_t s = m.start();
  for (int i = 0; i < limit; ++i) {
    std::vector<int> next, preferred;
    for (int b = 0; b < 256; ++b) {
      if (m.Next(s, static_cast<uint8_t>(b)) < 0) continue;
      next.push_back(b);
      if (prefer.find(static_cast<char>(b)) != std::string_view::npos) preferred.push_back(b);
    }
    INFO(text);
    REQUIRE((m.Accepting(s) || !next.empty()));  // no dead end
    if (m.Accepting(s) && (next.empty() || std::uniform_real_distribution<>(0, 1)(rng) < stop))
      return text;
    const bool take_preferred =
        !preferred.empty() && std::uniform_real_distribution<>(0, 1)(rng) < 0.5;
    const auto& from = take_preferred ? preferred : next;
    const int b = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
    text += static_cast<char>(b);
    s = m.Next(s, static_cast<uint8_t>(b));
    REQUIRE(s >= 0);
  }
  return std::nullopt;
}

}  // namespace oasis::structured::testing

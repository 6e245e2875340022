// Random test strings drawn from a mix of scripts, emoji, marks, whitespace and specials.
// Stateless apart from the caller's generator.
#pragma once

#include <random>
#include <string>

namespace oasis::tokenizer::testing {

// Well-formed UTF-8 of up to `max_chars` code points (no surrogates).
std::string RandomText(std::mt19937& rng, int max_chars);

}  // namespace oasis::tokenizer::testing

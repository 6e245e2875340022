// Shared access to the real tokenizers of the test-data cache (tools/fetch_test_data.sh), each
// loaded once per test process. Thread-safe (function-local statics).
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace oasis::tokenizer::testing {

// "qwen3" or "llama3_1". nullptr (after a Catch2 WARN naming the missing file) when the cache does
// not hold it; a file that exists but fails to load fails the test.
const Tokenizer* RealTokenizer(const std::string& name);

// Returns a printable form of ids for failure messages: "[1, 2, 3]".
std::string FormatIds(const std::vector<int32_t>& ids);

}  // namespace oasis::tokenizer::testing

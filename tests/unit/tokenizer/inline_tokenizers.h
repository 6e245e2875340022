// Builders of small tokenizer.json documents for tests: a byte-level BPE over all 256 bytes plus
// the given merges, in the shape of Qwen's files. Stateless helpers.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace oasis::tokenizer::testing {

using Json = nlohmann::json;

// Qwen2/3's split pattern.
inline constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Raw-byte merges (left, right), in rank order.
using RawMerges = std::vector<std::pair<std::string, std::string>>;

// {"model": BPE over the 256 byte-level chars (ids 0..255) + one token per merge (ids from 256),
//  "pre_tokenizer": Sequence[Split(kQwenPattern), ByteLevel], "decoder": ByteLevel}.
Json ByteLevelTokenizerJson(const RawMerges& merges);

// A pre_tokenizer Split stage.
Json SplitStage(const Json& pattern, const std::string& behavior, bool invert);

// An added token entry.
Json AddedTokenJson(int id, const std::string& content, bool special, bool lstrip = false,
                    bool rstrip = false, bool single_word = false, bool normalized = false);

}  // namespace oasis::tokenizer::testing

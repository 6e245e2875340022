// The request defaults oasis-server takes from a generation_config.json, as vLLM's
// --generation-config does (docs/server.md "Generation config"):
//   auto (default)  the model directory's file: its sampling parameters become the defaults of
//                   requests that leave them out, max_new_tokens the default max_tokens
//   vllm            the neutral defaults (temperature 1, top_p 1, no top_k / min_p, max_tokens
//                   up to the context); the model directory's file still names the EOS ids
//   DIR             DIR/generation_config.json (which must exist) as with auto, and its
//                   max_new_tokens also caps requests' max_tokens (vLLM's override)
// In every mode the file's eos_token_id (an int or a list) adds to config.json's EOS ids.
// Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oasis/sampling.h"
#include "oasis/status.h"

namespace oasis::server {

struct GenerationDefaults {
  std::string mode = "auto";  // "auto", "vllm" or the directory given
  std::string source;         // the generation_config.json read; empty: none
  // Defaults of requests that leave a parameter out (neutral where the file sets nothing).
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;   // max_new_tokens: the default max_tokens
  bool max_tokens_is_cap = false;      // DIR mode: max_tokens above it are lowered to it
  std::vector<int64_t> eos_token_ids;  // the file's EOS ids
  // What was taken from the file, e.g. {"temperature=0.6", "top_k=20", "max_tokens=512"}.
  std::vector<std::string> applied;

  // The request's max_tokens (nullopt: unset) for a prompt of `prompt_tokens` in a context of
  // `context` tokens: the default when unset (at most the room left), capped in DIR mode;
  // -1 for "until the context is full".
  int64_t ResolveMaxTokens(std::optional<int64_t> requested, int64_t prompt_tokens,
                           int64_t context) const;
  // For --check-config: mode, source, the applied values and EOS ids.
  nlohmann::ordered_json ToJson() const;
};

// Reads the file `flag` selects for the model in `model_dir`. Errors name the file (malformed
// JSON, a value out of range) or the flag (a DIR without generation_config.json).
StatusOr<GenerationDefaults> ResolveGenerationDefaults(const std::string& flag,
                                                       const std::string& model_dir);

// `ids` with the ids of `more` not yet in it appended (config.json's EOS ids first).
std::vector<int64_t> MergeTokenIds(std::vector<int64_t> ids, const std::vector<int64_t>& more);

}  // namespace oasis::server

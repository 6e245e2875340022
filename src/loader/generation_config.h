// generation_config.json (Hugging Face) → the values vLLM takes from it: the sampling defaults
// (temperature, top_p, top_k, min_p, repetition_penalty), max_new_tokens and the EOS ids. Every
// other key (do_sample, bos/pad ids, transformers' bookkeeping) is ignored, as vLLM ignores it.
// A JSON null counts as absent. Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "oasis/status.h"

namespace oasis {

struct GenerationConfig {
  std::optional<double> temperature;         // >= 0
  std::optional<double> top_p;               // (0, 1]
  std::optional<int64_t> top_k;              // >= -1 (0 and -1: off)
  std::optional<double> min_p;               // [0, 1]
  std::optional<double> repetition_penalty;  // > 0
  std::optional<int64_t> max_new_tokens;     // >= 1: vLLM's default max_tokens
  std::vector<int64_t> eos_token_ids;        // `eos_token_id`: an int or a list (empty: absent)

  // Whether any sampling default (or max_new_tokens) is set: what makes vLLM log that the
  // defaults were overridden.
  bool has_sampling_defaults() const {
    return temperature || top_p || top_k || min_p || repetition_penalty || max_new_tokens;
  }
};

inline constexpr char kGenerationConfigFile[] = "generation_config.json";

// Parses the file's text; `source` names it in errors (InvalidArgument naming the field).
StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& source);
// Reads `<dir>/generation_config.json`. nullopt when the file does not exist; an error when it
// cannot be read or parsed.
StatusOr<std::optional<GenerationConfig>> LoadGenerationConfig(const std::filesystem::path& dir);

}  // namespace oasis

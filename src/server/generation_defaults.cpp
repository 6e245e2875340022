#include "server/generation_defaults.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "loader/generation_config.h"

namespace oasis::server {
namespace {

std::string Text(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

int64_t GenerationDefaults::ResolveMaxTokens(std::optional<int64_t> requested,
                                             int64_t prompt_tokens, int64_t context) const {
  if (!max_tokens) return requested.value_or(-1);
  if (requested) return max_tokens_is_cap ? std::min(*requested, *max_tokens) : *requested;
  const int64_t room = context - prompt_tokens;
  // No room at all: leave it unset so that the prompt-length check reports it.
  return room >= 1 ? std::min(*max_tokens, room) : -1;
}

nlohmann::ordered_json GenerationDefaults::ToJson() const {
  nlohmann::ordered_json out;
  out["mode"] = mode;
  out["source"] = source.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(source);
  out["applied"] = applied;
  out["eos_token_ids"] = eos_token_ids;
  return out;
}

StatusOr<GenerationDefaults> ResolveGenerationDefaults(const std::string& flag,
                                                       const std::string& model_dir) {
  GenerationDefaults d;
  d.mode = flag;
  const bool from_dir = flag != "auto" && flag != "vllm";
  const std::filesystem::path dir = from_dir ? flag : model_dir;
  OASIS_ASSIGN_OR_RETURN(std::optional<GenerationConfig> file, LoadGenerationConfig(dir));
  if (!file) {
    if (from_dir) {
      return InvalidArgument("--generation-config " + flag + ": no " + kGenerationConfigFile +
                             " in that directory");
    }
    return d;
  }
  d.source = (dir / kGenerationConfigFile).string();
  d.eos_token_ids = file->eos_token_ids;
  if (flag == "vllm") return d;  // neutral sampling defaults; the EOS ids still count
  if (file->temperature) {
    d.sampling.temperature = static_cast<float>(*file->temperature);
    d.applied.push_back("temperature=" + Text(*file->temperature));
  }
  if (file->top_p) {
    d.sampling.top_p = static_cast<float>(*file->top_p);
    d.applied.push_back("top_p=" + Text(*file->top_p));
  }
  if (file->top_k) {
    d.sampling.top_k = static_cast<int32_t>(*file->top_k);
    d.applied.push_back("top_k=" + std::to_string(*file->top_k));
  }
  if (file->min_p) {
    d.sampling.min_p = static_cast<float>(*file->min_p);
    d.applied.push_back("min_p=" + Text(*file->min_p));
  }
  if (file->max_new_tokens) {
    d.max_tokens = *file->max_new_tokens;
    d.max_tokens_is_cap = from_dir;
    d.applied.push_back((from_dir ? "max_tokens<=" : "max_tokens=") +
                        std::to_string(*file->max_new_tokens));
  }
  if (file->repetition_penalty) {
    const double v = *file->repetition_penalty;
    if (!(v > 0.0 && v <= 2.0)) {
      return InvalidArgument(d.source + ": repetition_penalty must be in (0, 2], got " + Text(v));
    }
    d.sampling.repetition_penalty = static_cast<float>(v);
    d.applied.push_back("repetition_penalty=" + Text(v));
  }
  return d;
}

std::vector<int64_t> MergeTokenIds(std::vector<int64_t> ids, const std::vector<int64_t>& more) {
  for (int64_t id : more) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace oasis::server

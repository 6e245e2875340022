#include "loader/generation_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_depth.h"
#include "loader/small_file.h"

namespace oasis {
namespace {

using json = nlohmann::json;

// Typed reads of one object's fields; errors name the field and the file.
class Fields {
 public:
  Fields(const json& obj, const std::string& source) : obj_(obj), source_(source) {}

  Status Bad(const char* key, const std::string& what) const {
    return InvalidArgument(source_ + ": field '" + key + "' " + what);
  }

  // A finite number in [lo, hi]; `lo_open`: lo itself excluded.
  Status Number(const char* key, double lo, bool lo_open, double hi,
                std::optional<double>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number() || !std::isfinite(v->get<double>()))
      return Bad(key, "must be a number, got " + v->dump());
    const double x = v->get<double>();
    if (x < lo || (lo_open && x == lo) || x > hi) {
      const std::string range = std::string(lo_open ? "(" : "[") + Text(lo) + ", " +
                                (std::isinf(hi) ? "inf)" : Text(hi) + "]");
      return Bad(key, "must be in " + range + ", got " + v->dump());
    }
    *out = x;
    return Status::Ok();
  }

  Status Int(const char* key, int64_t lo, std::optional<int64_t>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      return Bad(key, "must be an integer, got " + v->dump());
    if (v->get<int64_t>() < lo)
      return Bad(key, "must be >= " + std::to_string(lo) + ", got " + v->dump());
    *out = v->get<int64_t>();
    return Status::Ok();
  }

  // An int or a list of ints, each >= 0.
  Status IntList(const char* key, std::vector<int64_t>* out) const {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    const json list = v->is_array() ? *v : json::array({*v});
    for (const json& x : list) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))
        return Bad(key, "must be a token id or a list of token ids, got " + v->dump());
      out->push_back(x.get<int64_t>());
    }
    return Status::Ok();
  }

 private:
  const json* Find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  static std::string Text(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  }

  const json& obj_;
  const std::string& source_;
};

}  // namespace

StatusOr<GenerationConfig> ParseGenerationConfig(const std::string& json_text,
                                                 const std::string& source) {
  if (JsonNestedDeeperThan(json_text))
    return InvalidArgument(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  if (!root.is_object()) return InvalidArgument(source + ": not a JSON object");
  const double inf = std::numeric_limits<double>::infinity();
  Fields f(root, source);
  GenerationConfig g;
  OASIS_RETURN_IF_ERROR(f.Number("temperature", 0, false, inf, &g.temperature));
  OASIS_RETURN_IF_ERROR(f.Number("top_p", 0, true, 1, &g.top_p));
  OASIS_RETURN_IF_ERROR(f.Int("top_k", -1, &g.top_k));
  OASIS_RETURN_IF_ERROR(f.Number("min_p", 0, false, 1, &g.min_p));
  OASIS_RETURN_IF_ERROR(f.Number("repetition_penalty", 0, true, inf, &g.repetition_penalty));
  OASIS_RETURN_IF_ERROR(f.Int("max_new_tokens", 1, &g.max_new_tokens));
  OASIS_RETURN_IF_ERROR(f.IntList("eos_token_id", &g.eos_token_ids));
  if (g.top_k && *g.top_k > INT32_MAX) return f.Bad("top_k", "is too large");
  return g;
}

StatusOr<std::optional<GenerationConfig>> LoadGenerationConfig(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kGenerationConfigFile;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<GenerationConfig>();
  OASIS_ASSIGN_OR_RETURN(const std::string text,
                         ReadSmallFile(path, "generation config", kMaxConfigJsonBytes));
  OASIS_ASSIGN_OR_RETURN(GenerationConfig g, ParseGenerationConfig(text, path.string()));
  return std::optional<GenerationConfig>(std::move(g));
}

}  // namespace oasis

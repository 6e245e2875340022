// config.json's "quantization_config": block-scaled FP8 (transformers' FineGrainedFP8 layout)
// is read; every other method is refused by name. Rules in docs/loader.md#fp8-checkpoints.
#include "loader/quantization_config.h"

#include <cstdint>

namespace oasis {
namespace {

using json = nlohmann::json;

constexpr const char* kSupported = "OasisKV loads bf16/f16/f32 and fp8 block-scaled checkpoints";

Status Bad(const std::string& source, const std::string& field, const std::string& what) {
  return InvalidArgument(source + ": field 'quantization_config." + field + "' " + what);
}

// A string field; absent or null leaves *out empty.
Status OptionalString(const json& q, const std::string& source, const char* key, std::string* out) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return Bad(source, key, "must be a string, got " + it->dump());
  *out = it->get<std::string>();
  return Status::Ok();
}

Status ParseBlockSize(const json& q, const std::string& source, QuantizationConfig* out) {
  auto it = q.find("weight_block_size");
  if (it == q.end() || it->is_null()) {
    return Bad(source, "weight_block_size",
               "is required for quant_method 'fp8' (per-tensor FP8 scales are not supported)");
  }
  if (!it->is_array() || it->size() != 2) {
    return Bad(source, "weight_block_size",
               "must be a list of two positive integers [rows, cols], got " + it->dump());
  }
  int64_t dims[2] = {0, 0};
  for (size_t i = 0; i < 2; ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 ||
        v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
      return Bad(source, "weight_block_size",
                 "must be a list of two positive integers [rows, cols], got " + it->dump());
    }
    dims[i] = v.get<int64_t>();
  }
  out->block_out = dims[0];
  out->block_in = dims[1];
  return Status::Ok();
}

}  // namespace

Status ParseQuantizationConfig(const json& root, const std::string& source,
                               QuantizationConfig* out) {
  *out = QuantizationConfig{};
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) {
    return InvalidArgument(source + ": field 'quantization_config' must be an object, got " +
                           it->dump());
  }
  const json& q = *it;
  std::string method;
  OASIS_RETURN_IF_ERROR(OptionalString(q, source, "quant_method", &method));
  if (method.empty()) return Bad(source, "quant_method", "is missing");
  if (method != "fp8") {
    return InvalidArgument(source + ": quantization_config.quant_method '" + method +
                           "' is not supported (" + kSupported + ")");
  }
  std::string fmt;
  OASIS_RETURN_IF_ERROR(OptionalString(q, source, "fmt", &fmt));
  if (!fmt.empty() && fmt != "e4m3") {
    return Bad(source, "fmt",
               "'" + fmt + "' is not supported (only e4m3 FP8 weights, float8_e4m3fn)");
  }
  std::string activations;
  OASIS_RETURN_IF_ERROR(OptionalString(q, source, "activation_scheme", &activations));
  if (!activations.empty() && activations != "dynamic") {
    return Bad(source, "activation_scheme",
               "'" + activations + "' is not supported (only dynamic: no activation scales)");
  }
  OASIS_RETURN_IF_ERROR(ParseBlockSize(q, source, out));
  auto skip = q.find("modules_to_not_convert");
  if (skip != q.end() && !skip->is_null()) {
    if (!skip->is_array()) {
      return Bad(source, "modules_to_not_convert",
                 "must be a list of module names, got " + skip->dump());
    }
    for (const json& name : *skip) {
      if (!name.is_string()) {
        return Bad(source, "modules_to_not_convert",
                   "must be a list of module names, got " + name.dump());
      }
      out->modules_to_not_convert.push_back(name.get<std::string>());
    }
  }
  out->method = WeightQuantization::kFp8Block;
  return Status::Ok();
}

}  // namespace oasis

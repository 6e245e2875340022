// config.json's "quantization_config" -> QuantizationConfig (include/oasis/model_config.h).
// Internal to the loader: ParseModelConfig calls it. Stateless; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "oasis/model_config.h"
#include "oasis/status.h"

namespace oasis {

// Reads root["quantization_config"] (absent or null: no quantization). Accepts quant_method
// "fp8" with fmt "e4m3" (or absent), activation_scheme "dynamic" (or absent), weight_block_size
// [rows, cols] of positive integers (required) and modules_to_not_convert (a list of strings).
// InvalidArgument naming `source` and the field for everything else, including every other
// quant_method by name.
Status ParseQuantizationConfig(const nlohmann::json& root, const std::string& source,
                               QuantizationConfig* out);

}  // namespace oasis

// RoPE frequencies from a ModelConfig, exactly as Hugging Face computes them (default and
// llama3 scaling), shared by all backends.
#pragma once

#include "backend/backend.h"
#include "oasis/model_config.h"

namespace oasis {

RopeParams ComputeRopeParams(const ModelConfig& config);

}  // namespace oasis

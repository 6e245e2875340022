// Logging: thin set-up around spdlog. Use spdlog's functions (spdlog::info, ...) directly;
// this header only configures the default logger once per process. Thread-safe (spdlog's
// default logger is a multi-threaded sink).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "oasis/status.h"

namespace oasis {

// Sets the default logger to stderr with the given level ("trace", "debug", "info",
// "warn", "error", "off"). Unknown names are an InvalidArgument error.
Status InitLogging(std::string_view level);

}  // namespace oasis

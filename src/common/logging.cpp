#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace oasis {

Status InitLogging(std::string_view level) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgument("unknown log level '" + std::string(level) +
                           "' (expected trace, debug, info, warn, error or off)");
  }
  auto logger = spdlog::get("oasis");
  if (!logger) logger = spdlog::stderr_color_mt("oasis");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %v");
  spdlog::set_level(lvl);
  return Status::Ok();
}

}  // namespace oasis

#include "common/settings.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/json_depth.h"

namespace oasis {

std::string FlagName(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

StatusOr<std::vector<std::string>> ConfigPaths(int argc, char** argv) {
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string path;
    if (arg == "--config") {
      if (i + 1 >= argc) return InvalidArgument("--config needs a value");
      path = argv[i + 1];
    } else if (arg.rfind("--config=", 0) == 0) {
      path = arg.substr(9);
      if (path.empty()) return InvalidArgument("--config needs a value");
    }
    if (!path.empty()) paths.push_back(std::move(path));
  }
  return paths;
}

StatusOr<nlohmann::json> ReadConfigJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open --config " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return ParseConfigJson(text.str(), path);
}

StatusOr<nlohmann::json> ParseConfigJson(const std::string& text, const std::string& path,
                                         const nlohmann::json::parser_callback_t& callback) {
  if (JsonNestedDeeperThan(text))
    return InvalidArgument(path + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  nlohmann::json json = nlohmann::json::parse(text, callback, /*allow_exceptions=*/false,
                                              /*ignore_comments=*/true);
  if (json.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  return json;
}

}  // namespace oasis

#include "test_support.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace oasis::testing {

std::filesystem::path SourceDir() { return OASIS_SOURCE_DIR; }

std::optional<std::filesystem::path> SharedDir() {
  if (const char* env = std::getenv("OASIS_SHARED_DIR")) {
    if (std::filesystem::is_directory(env)) return std::filesystem::path(env);
    return std::nullopt;
  }
  std::filesystem::path p = SourceDir().parent_path() / "shared";
  if (std::filesystem::is_directory(p)) return p;
  return std::nullopt;
}

std::filesystem::path CacheDir() {
  if (const char* env = std::getenv("OASIS_TEST_CACHE")) return env;
  return OASIS_DEFAULT_CACHE_DIR;
}

std::filesystem::path FixturePath(const std::string& relative) {
  return SourceDir() / "tests" / "fixtures" / relative;
}

std::string ReadFileOrFail(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot open " << path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::filesystem::path MakeTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::filesystem::path p = std::filesystem::temp_directory_path() /
                            ("oasis-test-" + tag + "-" + std::to_string(getpid()) + "-" +
                             std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace oasis::testing

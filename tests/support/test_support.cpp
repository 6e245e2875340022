#include "test_support.h"

#include <catch2/catch.hpp>

#include <unistd.h>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace oasis::testing {

// The checkout the test was built from, unless OASIS_SOURCE_DIR names another (test binaries run
// from a bundle in another checkout, e.g. on the GPU machine: tools/bundle_env.sh sets it).
std::filesystem::path SourceDir() {
  if (const char* env = std::getenv("OASIS_SOURCE_DIR"); env != nullptr && *env != '\0') return env;
  return OASIS_SOURCE_DIR;
}

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

std::vector<ModelFixture> ModelFixtures() {
  std::vector<ModelFixture> v;
  for (const char* name :
       {"qwen3-tiny", "qwen3-tiny-untied", "llama-tiny-rope-scaling", "llama-tiny-tied"}) {
    const auto dir = FixturePath(std::string("models/") + name);
    v.push_back({name, dir, dir / "reference.safetensors"});
  }
  v.push_back({"trained embedded default", SourceDir() / "models" / "embedded",
               FixturePath("trained/model_reference.safetensors")});
  return v;
}

std::vector<Eagle3Fixture> Eagle3Fixtures() {
  std::vector<Eagle3Fixture> v;
  for (const char* name : {"qwen3-tiny", "llama-tiny-rope-scaling"}) {
    const auto head = FixturePath(std::string("eagle3/") + name);
    v.push_back(
        {name, FixturePath(std::string("models/") + name), head, head / "reference.safetensors"});
  }
  v.push_back({"trained embedded default", SourceDir() / "models" / "embedded",
               SourceDir() / "models" / "embedded-eagle3",
               FixturePath("trained/eagle_reference.safetensors")});
  return v;
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
  std::filesystem::path p =
      std::filesystem::temp_directory_path() /
      ("oasis-test-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace oasis::testing

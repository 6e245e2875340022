// Paths and helpers shared by the test suites.
#pragma once

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace oasis::testing {

// The repository root (committed fixtures live under tests/fixtures/): the checkout the test
// was built from, or the one env OASIS_SOURCE_DIR names (a bundle run elsewhere).
std::filesystem::path SourceDir();
// `../shared` beside the checkout (env OASIS_SHARED_DIR overrides); nullopt when absent.
std::optional<std::filesystem::path> SharedDir();
// The test-data cache filled by tools/fetch_test_data.sh (env OASIS_TEST_CACHE overrides).
std::filesystem::path CacheDir();
// Committed fixtures: SourceDir()/tests/fixtures/<relative>.
std::filesystem::path FixturePath(const std::string& relative);
// Models with transformers' reference outputs: the tiny fixtures of tests/fixtures/models
// (tools/gen_model_fixtures.py) and the trained embedded default, models/embedded, with
// tests/fixtures/trained/model_reference.safetensors (tools/train/export_check.py).
struct ModelFixture {
  std::string name;
  std::filesystem::path dir, reference;
};
std::vector<ModelFixture> ModelFixtures();
// EAGLE-3 heads with their PyTorch reference: tests/fixtures/eagle3/<name> on the tiny
// targets (tools/eagle3_reference.py), and models/embedded-eagle3 on the trained default.
struct Eagle3Fixture {
  std::string name;
  std::filesystem::path target, head, reference;
};
std::vector<Eagle3Fixture> Eagle3Fixtures();
// Reads a whole file; fails the current test (Catch2 FAIL) when it cannot.
std::string ReadFileOrFail(const std::filesystem::path& path);
// A fresh, empty temporary directory for the calling test.
std::filesystem::path MakeTempDir(const std::string& tag);

// The elements of tensor `name` of a safetensors file (SafetensorsFile or anything with
// TensorBytes(name) -> StatusOr<span>), copied out as T; fails the test when it is absent.
template <typename T, typename File>
std::vector<T> TensorVector(const File& file, const std::string& name) {
  auto bytes = file.TensorBytes(name);
  REQUIRE(bytes.ok());
  std::vector<T> out(bytes->size() / sizeof(T));
  std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

}  // namespace oasis::testing

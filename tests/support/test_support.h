// Paths and helpers shared by the test suites.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace oasis::testing {

// The repository root (committed fixtures live under tests/fixtures/).
std::filesystem::path SourceDir();
// `../shared` beside the checkout (env OASIS_SHARED_DIR overrides); nullopt when absent.
std::optional<std::filesystem::path> SharedDir();
// The test-data cache filled by tools/fetch_test_data.sh (env OASIS_TEST_CACHE overrides).
std::filesystem::path CacheDir();
// Committed fixtures: SourceDir()/tests/fixtures/<relative>.
std::filesystem::path FixturePath(const std::string& relative);
// Reads a whole file; fails the current test (Catch2 FAIL) when it cannot.
std::string ReadFileOrFail(const std::filesystem::path& path);
// A fresh, empty temporary directory for the calling test.
std::filesystem::path MakeTempDir(const std::string& tag);

}  // namespace oasis::testing

#include "real_tokenizers.h"

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <mutex>

#include "test_support.h"

namespace oasis::tokenizer::testing {

const Tokenizer* RealTokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded.find(name);
  if (it != loaded.end()) return it->second.get();
  const auto path = oasis::testing::CacheDir() / name / "tokenizer.json";
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path.string() << " is absent (run tools/fetch_test_data.sh)");
    return nullptr;
  }
  auto tokenizer = Tokenizer::FromFile(path);
  if (!tokenizer.ok()) FAIL("cannot load " << path.string() << ": " << tokenizer.status().ToString());
  const Tokenizer* raw = tokenizer.value().get();
  loaded.emplace(name, std::move(tokenizer).value());
  return raw;
}

std::string FormatIds(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

}  // namespace oasis::tokenizer::testing

// The quadratic and heap merge loops must agree on every word (the heap one is HF's algorithm).
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "tokenizer/bpe_merge.h"

namespace oasis::tokenizer {
namespace {

// A random but consistent BPE: merged ids are the ids of the concatenated strings, as in a real
// vocabulary (so two pairs with the same merged id spell the same string).
struct RandomBpe {
  std::map<std::string, int32_t> vocab;
  std::vector<std::string> strings;
  MergeTable merges;

  explicit RandomBpe(std::mt19937& rng) {
    for (char c : std::string("abcde")) Add(std::string(1, c));
    std::uniform_int_distribution<int> count(20, 200);
    const int n = count(rng);
    merges.Reserve(n);
    for (int rank = 0; rank < n; ++rank) {
      std::uniform_int_distribution<size_t> pick(0, strings.size() - 1);
      const std::string a = strings[pick(rng)];
      const std::string b = strings[pick(rng)];
      const int32_t merged = Add(a + b);
      merges.Insert(vocab.at(a), vocab.at(b), MergeRule{rank, merged});
    }
  }
  int32_t Add(const std::string& s) {
    auto [it, inserted] = vocab.emplace(s, static_cast<int32_t>(strings.size()));
    if (inserted) strings.push_back(s);
    return it->second;
  }
};

TEST_CASE("quadratic and heap BPE merges agree", "[tokenizer][bpe]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int table = 0; table < 30; ++table) {
    RandomBpe bpe(rng);
    for (int word = 0; word < 200; ++word) {
      std::uniform_int_distribution<int> length(1, word % 10 == 0 ? 400 : 24);
      std::uniform_int_distribution<int32_t> symbol(0, 4);
      std::vector<int32_t> ids(length(rng));
      for (auto& id : ids) id = symbol(rng);
      std::vector<int32_t> a = ids, b = ids;
      ApplyMergesQuadratic(bpe.merges, &a);
      ApplyMergesHeap(bpe.merges, &b);
      REQUIRE(a == b);
      // The merged symbols still spell the word.
      std::string spelled, original;
      for (int32_t id : a) spelled += bpe.strings[id];
      for (int32_t id : ids) original += bpe.strings[id];
      REQUIRE(spelled == original);
    }
  }
}

}  // namespace
}  // namespace oasis::tokenizer

// Base64 (common/base64.h): RFC 4648's test vectors, random round trips with a fresh seed each
// run, and every malformed input rejected.
#include <catch2/catch.hpp>

#include <random>

#include "common/base64.h"

using namespace oasis;

TEST_CASE("base64 matches RFC 4648's vectors", "[common][base64]") {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"}};
  for (auto [plain, coded] : vectors) {
    CHECK(Base64Encode(plain) == coded);
    auto d = Base64Decode(coded);
    REQUIRE(d.ok());
    CHECK(*d == plain);
  }
}

TEST_CASE("base64 round-trips random bytes", "[common][base64]") {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 300; ++i) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string coded = Base64Encode(bytes);
    CHECK(coded.size() % 4 == 0);
    auto d = Base64Decode(coded);
    REQUIRE(d.ok());
    CHECK(*d == bytes);
  }
}

TEST_CASE("base64 rejects malformed text", "[common][base64]") {
  for (const char* bad : {"Zm9", "Zm9v!A==", "Z===", "Zg==Zm9v", "Zm=v", "Zm9v\n"}) {
    INFO(bad);
    auto d = Base64Decode(bad);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == StatusCode::kInvalidArgument);
  }
}

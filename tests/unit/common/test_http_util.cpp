// KeyMatches: the API key comparison both front ends and the gRPC service use.
#include <catch2/catch.hpp>

#include <string>

#include "common/http_util.h"

using namespace oasis;

TEST_CASE("KeyMatches: only the exact key matches, whatever the lengths", "[common][http]") {
  const std::string key = "s3cret-key";
  CHECK(KeyMatches(key, key));
  for (size_t i = 0; i < key.size(); ++i) {
    std::string other = key;
    other[i] ^= 1;
    CHECK_FALSE(KeyMatches(other, key));
  }
  CHECK_FALSE(KeyMatches("", key));
  CHECK_FALSE(KeyMatches("s3cret", key));              // a prefix
  CHECK_FALSE(KeyMatches(key + "x", key));             // longer
  CHECK_FALSE(KeyMatches(key + key, key));             // the key repeated
  CHECK_FALSE(KeyMatches(std::string(1000, 's'), key));
  CHECK(KeyMatches("", ""));
  CHECK_FALSE(KeyMatches("x", ""));
  CHECK_FALSE(KeyMatches(std::string("s3cret-ke\0", 10), key));
}

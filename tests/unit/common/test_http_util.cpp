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

TEST_CASE("Clip: bounded quotes of client strings, cut between UTF-8 characters", "[common][http]") {
  CHECK(Clip("short", 10) == "short");
  CHECK(Clip("exactly10!", 10) == "exactly10!");
  CHECK(Clip("0123456789ab", 10) == "0123456...");
  CHECK(Clip(std::string(100000, 'm'), 256).size() == 256);
  // "\xc3\xa9" (two bytes) would be split at byte 7: the cut moves before it.
  CHECK(Clip("abcdef\xc3\xa9xyz", 10) == "abcdef...");
  CHECK(Clip("abcdefg\xc3\xa9xyz", 10) == "abcdefg...");
  CHECK(Clip("abcdef", 2) == "...");
}

TEST_CASE("IsListenAddress: IP literals (IPv6 also bracketed) and localhost", "[common][http]") {
  for (const char* ok : {"127.0.0.1", "0.0.0.0", "::", "::1", "[::1]", "fe80::1", "localhost"}) {
    INFO(ok);
    CHECK(IsListenAddress(ok));
  }
  for (const char* bad : {"999.1.1.1", "", "example.com", "[127.0.0.1]", "[::1", "1.2.3", "::1]"}) {
    INFO(bad);
    CHECK_FALSE(IsListenAddress(bad));
  }
  CHECK(UnbracketHost("[::1]") == "::1");
  CHECK(UnbracketHost("::1") == "::1");
  CHECK(UnbracketHost("127.0.0.1") == "127.0.0.1");
}

// JsonNestedDeeperThan: the nesting check every untrusted JSON text passes before a parse.
#include <catch2/catch.hpp>

#include <string>

#include "common/json_depth.h"

using namespace oasis;

namespace {
std::string Nested(int n, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(n), open) + std::string(static_cast<size_t>(n), close);
}
}  // namespace

TEST_CASE("JSON nesting: counted on arrays and objects, not inside strings", "[common][json]") {
  CHECK_FALSE(JsonNestedDeeperThan("{}", 1));
  CHECK(JsonNestedDeeperThan("{\"a\":[]}", 1));
  CHECK_FALSE(JsonNestedDeeperThan("{\"a\":[1,{\"b\":2}]}", 3));
  CHECK(JsonNestedDeeperThan("{\"a\":[1,{\"b\":2}]}", 2));
  CHECK_FALSE(JsonNestedDeeperThan(Nested(kMaxJsonDepth)));
  CHECK(JsonNestedDeeperThan(Nested(kMaxJsonDepth + 1)));
  CHECK(JsonNestedDeeperThan("{\"tokens\":" + Nested(60000) + "}"));
  CHECK(JsonNestedDeeperThan(std::string(100000, '{')));  // unterminated: still refused
  // Brackets in strings, with escaped quotes and backslashes, are text.
  const std::string text = "{\"s\":\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') +
                           "\\\\\",\"t\":[]}";
  CHECK_FALSE(JsonNestedDeeperThan(text, 2));
  CHECK(JsonNestedDeeperThan(text, 1));
  // Siblings do not add up: depth is the deepest path.
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += (i ? "," : "") + Nested(3);
  wide += "]";
  CHECK_FALSE(JsonNestedDeeperThan(wide, 4));
  CHECK(JsonNestedDeeperThan(wide, 3));
}

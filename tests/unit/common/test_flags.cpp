#include <catch2/catch.hpp>

#include "common/flags.h"

using namespace oasis;

namespace {
Status ParseArgs(FlagParser& p, std::vector<std::string> args) {
  std::vector<char*> argv = {const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  return p.Parse(static_cast<int>(argv.size()), argv.data());
}
}  // namespace

TEST_CASE("flags parse values, defaults and errors", "[flags]") {
  std::string model = "default";
  int64_t n = 1;
  double t = 0.5;
  bool b = false;
  FlagParser p("test");
  p.AddString("model", &model, "m");
  p.AddInt("n", &n, "n");
  p.AddDouble("temperature", &t, "t");
  p.AddBool("ignore-eos", &b, "b");
  REQUIRE(ParseArgs(p, {"--model", "dir", "--n=3", "--temperature", "0.25", "--ignore-eos"}).ok());
  CHECK(model == "dir");
  CHECK(n == 3);
  CHECK(t == 0.25);
  CHECK(b);
  CHECK(p.WasSet("n"));
  CHECK(p.Usage().find("--temperature") != std::string::npos);

  FlagParser q("test");
  q.AddInt("n", &n, "n");
  q.AddBool("x", &b, "x");
  CHECK_THAT(ParseArgs(q, {"--n", "abc"}).message(), Catch::Contains("--n expects an integer"));
  CHECK_THAT(ParseArgs(q, {"--bogus"}).message(), Catch::Contains("unknown flag --bogus"));
  CHECK_THAT(ParseArgs(q, {"--n"}).message(), Catch::Contains("needs a value"));
  CHECK_THAT(ParseArgs(q, {"positional"}).message(), Catch::Contains("unexpected argument"));
  CHECK_THAT(ParseArgs(q, {"--x=maybe"}).message(), Catch::Contains("true or false"));
}

TEST_CASE("boolean flags: --no-NAME turns one off; other kinds have no --no- form", "[flags]") {
  bool on = true;
  int64_t n = 1;
  FlagParser p("test");
  p.AddBool("enable-prefix-caching", &on, "b");
  p.AddInt("n", &n, "n");
  REQUIRE(ParseArgs(p, {"--no-enable-prefix-caching"}).ok());
  CHECK_FALSE(on);
  CHECK(p.WasSet("enable-prefix-caching"));
  REQUIRE(ParseArgs(p, {"--no-enable-prefix-caching", "--enable-prefix-caching"}).ok());
  CHECK(on);  // the last one wins
  CHECK_THAT(ParseArgs(p, {"--no-n"}).message(), Catch::Contains("unknown flag --no-n"));
  CHECK_THAT(ParseArgs(p, {"--no-enable-prefix-caching=1"}).message(),
             Catch::Contains("unknown flag"));
}

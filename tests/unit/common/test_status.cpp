#include <catch2/catch.hpp>

#include "oasis/status.h"

using namespace oasis;

namespace {
StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}
StatusOr<int> Quarter(int x) {
  OASIS_ASSIGN_OR_RETURN(int h, Half(x));
  OASIS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}
Status Validate(int x) {
  OASIS_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}
}  // namespace

TEST_CASE("Status carries code and message", "[status]") {
  Status ok;
  CHECK(ok.ok());
  CHECK(ok.ToString() == "OK");
  Status e = NotFound("no such model 'x'");
  CHECK_FALSE(e.ok());
  CHECK(e.code() == StatusCode::kNotFound);
  CHECK(e.ToString() == "NOT_FOUND: no such model 'x'");
  CHECK(e.WithContext("loading").message() == "loading: no such model 'x'");
}

TEST_CASE("StatusOr propagates errors through the macros", "[status]") {
  CHECK(Quarter(8).value() == 2);
  auto r = Quarter(6);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "odd: 3");
  CHECK(Validate(4).ok());
  CHECK(Validate(5).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("StatusOr from an OK status is an internal error", "[status]") {
  StatusOr<int> r(Status::Ok());
  CHECK(r.status().code() == StatusCode::kInternal);
}

// Status and StatusOr: values, errors, context, and the two macros.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "support/Status.h"

using namespace piper;

namespace {

StatusOr<int> half(int n) {
  if (n % 2 != 0)
    return Status::error(std::to_string(n) + " is odd");
  return n / 2;
}

/// n / 4 through two halvings, or the first one's error.
StatusOr<int> quarter(int n) {
  PIPER_ASSIGN_OR_RETURN(int h, half(n));
  PIPER_ASSIGN_OR_RETURN(h, half(h));
  return h;
}

Status quarterInto(int n, int &out) {
  PIPER_ASSIGN_OR_RETURN(out, quarter(n));
  return Status::ok();
}

} // namespace

TEST_CASE("StatusOr holds a value or the error why there is none",
          "[support]") {
  StatusOr<int> v = half(8);
  REQUIRE(v.isOk());
  CHECK(static_cast<bool>(v));
  CHECK(v.status().isOk());
  CHECK(*v == 4);

  StatusOr<int> e = half(3);
  REQUIRE_FALSE(e.isOk());
  CHECK(e.status().message() == "3 is odd");
  CHECK(std::move(e).withContext("n").status().message() == "n: 3 is odd");
  CHECK(*half(6).withContext("unused") == 3);

  // An ok Status carries no value: an error, not an empty value.
  StatusOr<std::string> none = Status::ok();
  REQUIRE_FALSE(none.isOk());
  CHECK(none.status().message().find("no value") != std::string::npos);

  // Move-only values move out.
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  std::unique_ptr<int> taken = std::move(p).value();
  CHECK(*taken == 7);
}

TEST_CASE("PIPER_ASSIGN_OR_RETURN assigns or returns the first error",
          "[support]") {
  CHECK(*quarter(12) == 3);
  CHECK(quarter(6).status().message() == "3 is odd");
  CHECK(quarter(5).status().message() == "5 is odd");
  int out = -1;
  CHECK(quarterInto(20, out).isOk());
  CHECK(out == 5);
  out = -1;
  Status st = quarterInto(10, out);
  CHECK(st.message() == "5 is odd");
  CHECK(out == -1);
}

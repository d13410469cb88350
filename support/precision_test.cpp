// Unit tests of bfloat16 rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "support/Precision.h"

using namespace piper;

TEST_CASE("bf16 keeps 8 significant bits and rounds to nearest even") {
  CHECK(roundToBf16(1.0f) == 1.0f);
  CHECK(roundToBf16(-2.5f) == -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even (1).
  CHECK(roundToBf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
  CHECK(roundToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) ==
        1.0f + std::ldexp(1.0f, -6));
  // Just above the halfway point rounds up.
  CHECK(roundToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) ==
        1.0f + std::ldexp(1.0f, -7));
  CHECK(floatToBf16(1.0f) == 0x3F80);
  CHECK(bf16ToFloat(0x4049) == 3.140625f);
}

TEST_CASE("bf16 rounding keeps infinities, signed zeros and NaN") {
  float inf = std::numeric_limits<float>::infinity();
  CHECK(roundToBf16(inf) == inf);
  CHECK(roundToBf16(-inf) == -inf);
  CHECK(std::signbit(roundToBf16(-0.0f)));
  CHECK(std::isnan(roundToBf16(std::nanf(""))));
  // The largest float rounds up to infinity, as in torch.
  CHECK(roundToBf16(std::numeric_limits<float>::max()) == inf);
}

TEST_CASE("bf16 rounding error is at most half an ulp") {
  for (float x = -3.0f; x < 3.0f; x += 0.0137f) {
    float r = roundToBf16(x);
    float ulp = std::ldexp(1.0f, std::ilogb(x == 0 ? 1.0f : x) - 7);
    CHECK(std::fabs(r - x) <= 0.5f * ulp);
  }
  float data[3] = {1.001f, -7.77f, 0.1f};
  roundToBf16(data, 3);
  CHECK(data[0] == roundToBf16(1.001f));
  CHECK(data[2] == roundToBf16(0.1f));
}

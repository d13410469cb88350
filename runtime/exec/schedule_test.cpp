// Unit tests of the learning-rate schedule (warmup + cosine decay).
#include <catch2/catch.hpp>

#include <cmath>

#include "runtime/exec/Executor.h"

using namespace piper;
using piper::runtime::scheduleScale;

namespace {
plan::TrainingConfig config(double lr, double minLr, int64_t warmup,
                            int64_t decay) {
  plan::TrainingConfig t;
  t.set_lr(lr);
  t.set_min_lr(minLr);
  t.set_warmup_steps(warmup);
  t.set_decay_steps(decay);
  return t;
}
} // namespace

TEST_CASE("no warmup and no decay keeps the peak rate") {
  plan::TrainingConfig t = config(1e-3, 1e-4, 0, 0);
  for (int64_t step : {1, 2, 100, 100000})
    CHECK(scheduleScale(t, step) == 1.0);
}

TEST_CASE("warmup is linear and reaches the peak at warmup_steps") {
  plan::TrainingConfig t = config(1e-3, 1e-4, 10, 0);
  CHECK(scheduleScale(t, 1) == Approx(0.1));
  CHECK(scheduleScale(t, 5) == Approx(0.5));
  CHECK(scheduleScale(t, 10) == Approx(1.0));
  CHECK(scheduleScale(t, 11) == 1.0);
}

TEST_CASE("cosine decay goes from lr to min_lr and stays there") {
  plan::TrainingConfig t = config(1e-3, 1e-4, 10, 110);
  CHECK(scheduleScale(t, 10) == Approx(1.0));
  // Halfway through the decay the rate is the mean of lr and min_lr.
  CHECK(scheduleScale(t, 60) * 1e-3 == Approx(0.5 * (1e-3 + 1e-4)));
  CHECK(scheduleScale(t, 110) * 1e-3 == Approx(1e-4));
  CHECK(scheduleScale(t, 500) * 1e-3 == Approx(1e-4));
  // Monotone after warmup.
  for (int64_t s = 11; s < 110; ++s)
    CHECK(scheduleScale(t, s + 1) <= scheduleScale(t, s));
}

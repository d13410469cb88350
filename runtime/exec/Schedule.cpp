// The learning-rate schedule: linear warmup, then cosine decay (see
// plan.proto TrainingConfig).
#include <algorithm>
#include <cmath>

#include "runtime/exec/Executor.h"

namespace piper::runtime {

double scheduleScale(const plan::TrainingConfig &t, int64_t step) {
  const double peak = t.lr();
  if (t.warmup_steps() > 0 && step <= t.warmup_steps())
    return double(step) / double(t.warmup_steps());
  if (peak <= 0 || t.decay_steps() <= t.warmup_steps())
    return 1.0;
  double progress = double(step - t.warmup_steps()) /
                    double(t.decay_steps() - t.warmup_steps());
  progress = std::min(1.0, std::max(0.0, progress));
  const double pi = 3.14159265358979323846;
  double lr =
      t.min_lr() + 0.5 * (1.0 + std::cos(pi * progress)) * (peak - t.min_lr());
  return lr / peak;
}

double Executor::lrScale(int64_t step) const {
  return scheduleScale(plan().training(), step);
}

} // namespace piper::runtime

// --profile=gpu's sums: see LaunchTimes.h.
#include "runtime/hal/LaunchTimes.h"

#include <algorithm>

namespace piper::runtime::hal {

void LaunchTimeTotals::endBatch() {
  std::sort(spans.begin(), spans.end());
  double busyMs = 0;
  bool any = false;
  double at = 0;
  for (const auto &[from, to] : spans) {
    double start = any ? std::max(from, at) : from;
    if (to > start)
      busyMs += to - start;
    at = any ? std::max(at, to) : to;
    any = true;
  }
  busySeconds += busyMs / 1e3;
  spans.clear();
}

LaunchTimes LaunchTimeTotals::times() const {
  LaunchTimes out;
  for (const auto &[name, t] : totals)
    out.rows.push_back(t);
  std::stable_sort(out.rows.begin(), out.rows.end(),
                   [](const LaunchTime &a, const LaunchTime &b) {
                     return a.seconds > b.seconds;
                   });
  out.busySeconds = busySeconds;
  return out;
}

} // namespace piper::runtime::hal

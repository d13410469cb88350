// --profile=gpu's sums (Hal.h LaunchTimes): each launch's name and interval,
// added up per name, and the union of the intervals (the time the device
// was busy). The CUDA backend measures the intervals with CUDA events, the
// emulation with the host clock.
#ifndef PIPER_RUNTIME_HAL_LAUNCHTIMES_H
#define PIPER_RUNTIME_HAL_LAUNCHTIMES_H

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/hal/Hal.h"

namespace piper::runtime::hal {

class LaunchTimeTotals {
public:
  /// One launch of `name` from `fromMs` to `toMs` (any common origin within
  /// one addStep).
  void add(const std::string &name, double fromMs, double toMs) {
    LaunchTime &t = totals[name];
    t.name = name;
    ++t.count;
    t.seconds += (toMs > fromMs ? toMs - fromMs : 0) / 1e3;
    spans.emplace_back(fromMs, toMs);
  }
  /// Ends a batch of add()s (one step's launches): their union joins the
  /// busy time.
  void endBatch();
  LaunchTimes times() const;
  void reset() {
    totals.clear();
    spans.clear();
    busySeconds = 0;
  }

private:
  std::map<std::string, LaunchTime> totals;
  std::vector<std::pair<double, double>> spans;
  double busySeconds = 0;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_LAUNCHTIMES_H

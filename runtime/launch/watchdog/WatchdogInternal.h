// What Watchdog.cpp (heartbeats, the watchdog's thread, its exits) and
// WatchdogVerdict.cpp (plan positions, verdicts, the report) share.
#ifndef PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOGINTERNAL_H
#define PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOGINTERNAL_H

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace piper::runtime::watchdog_detail {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration<double>(now - t).count();
}

inline int64_t millisSince(Clock::time_point t, Clock::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t)
      .count();
}

/// "0,2,5": a heartbeat's list of ranks.
inline std::string rankList(const std::vector<int> &ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

} // namespace piper::runtime::watchdog_detail

#endif // PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOGINTERNAL_H

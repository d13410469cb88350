// Progress lines and the end-of-run summary of piper-run (rank 0, stdout).
#include "runtime/launch/rank/Progress.h"

#include "proto/PlanShards.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace piper::runtime {

namespace {

/// Steps a..b as "step 3" or "steps 2-10".
std::string stepRange(int64_t a, int64_t b) {
  return a == b ? fmt::format("step {}", a) : fmt::format("steps {}-{}", a, b);
}

/// The time of a step in ms, with one decimal.
std::string millis(double seconds) {
  return fmt::format("{:.1f} ms/step", 1e3 * seconds);
}

} // namespace

std::string formatClock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  int64_t s = std::llround(seconds);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024)
    return fmt::format("{} B", bytes);
  double value = double(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, units[unit]);
}

double modelFlopsPerStep(const std::vector<plan::Plan> &plans,
                         double tokensPerStep) {
  std::set<std::string> seen;
  double params = 0;
  for (const plan::Plan &plan : plans)
    for (const plan::Parameter &p : plan.params()) {
      if (!seen.insert(p.name()).second)
        continue;
      // An expert weight's type is one member's block of its experts.
      std::vector<int64_t> shape = plan::globalShape(p);
      double n = 1;
      for (int64_t d : shape)
        n *= double(d);
      params += n;
    }
  return 6 * params * tokensPerStep;
}

Progress::Progress(int64_t firstStep, int64_t lastStep, int64_t logEvery,
                   double tokensPerStep)
    : firstStep(firstStep), lastStep(lastStep),
      logEvery(std::max<int64_t>(1, logEvery)), tokensPerStep(tokensPerStep) {}

void Progress::setFlops(double flops, double peakFlopsPerSecond) {
  flopsPerStep = flops;
  peakFlops = peakFlopsPerSecond;
}

double Progress::meanStepSeconds() const {
  if (steps == 0)
    return 0;
  if (steps == 1)
    return seconds;
  return (seconds - firstSeconds) / double(steps - 1);
}

std::string Progress::mfu(double stepSeconds) const {
  if (flopsPerStep <= 0 || peakFlops <= 0 || stepSeconds <= 0)
    return "";
  return fmt::format("MFU {:.1f}%",
                     100 * flopsPerStep / stepSeconds / peakFlops);
}

std::string Progress::record(const StepReport &r) {
  if (steps == 0)
    firstSeconds = r.stepSeconds;
  ++steps;
  seconds += r.stepSeconds;
  ++intervalSteps;
  intervalSeconds += r.stepSeconds;
  if (r.step % logEvery != 0 && r.step != lastStep)
    return "";

  double mean = intervalSeconds / double(intervalSteps);
  std::string line =
      fmt::format("step {}/{} | loss {:.9g}", r.step, lastStep, r.loss);
  if (r.gradNorm >= 0 || !std::isfinite(r.gradNorm))
    line += fmt::format(" | grad_norm {:.4g}", r.gradNorm);
  line += fmt::format(" | {:.0f} tokens/s | {}",
                      mean > 0 ? tokensPerStep / mean : 0.0, millis(mean));
  std::string utilization = mfu(mean);
  if (!utilization.empty())
    line += " | " + utilization;
  line +=
      " | ETA " + formatClock(meanStepSeconds() * double(lastStep - r.step));
  intervalSteps = 0;
  intervalSeconds = 0;
  return line;
}

std::string Progress::summary(const std::vector<int64_t> &peakBytesPerRank,
                              double wallSeconds) const {
  if (steps == 0)
    return "";
  int64_t last = firstStep + steps - 1;
  std::string out = fmt::format("summary: {} step{} ({}) in {:.1f} s wall time",
                                steps, steps == 1 ? "" : "s",
                                stepRange(firstStep, last), wallSeconds);
  if (wallSeconds >= 60)
    out += " (" + formatClock(wallSeconds) + ")";
  out += "\n";

  double mean = meanStepSeconds();
  out += fmt::format("summary: mean {:.0f} tokens/s, {}",
                     mean > 0 ? tokensPerStep / mean : 0.0, millis(mean));
  std::string utilization = mfu(mean);
  if (!utilization.empty())
    out += ", " + utilization;
  if (steps == 1)
    out += fmt::format(" over step {} (the only step: warm-up included)\n",
                       firstStep);
  else
    out += fmt::format(" over {} (first step excluded: warm-up)\n",
                       stepRange(firstStep + 1, last));

  const auto &peaks = peakBytesPerRank;
  if (peaks.empty())
    return out;
  out += "summary: peak arena memory per rank: ";
  if (peaks.size() <= 8) {
    for (size_t r = 0; r < peaks.size(); ++r)
      out +=
          fmt::format("{}rank {} {}", r ? ", " : "", r, formatBytes(peaks[r]));
  } else {
    auto [lo, hi] = std::minmax_element(peaks.begin(), peaks.end());
    out += fmt::format("min {} (rank {}), max {} (rank {}) over {} ranks",
                       formatBytes(*lo), lo - peaks.begin(), formatBytes(*hi),
                       hi - peaks.begin(), peaks.size());
  }
  return out + "\n";
}

} // namespace piper::runtime

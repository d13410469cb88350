// --metrics JSON lines (nlohmann/json), the --profile table and the memory
// summary of a rank.
#include "runtime/launch/rank/Reporting.h"

#include <cerrno>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/kernels/Kernels.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

namespace {

using Json = nlohmann::ordered_json;

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

/// "1234.5 MiB", or "unknown" for 0 (a plan from a compiler that does not
/// predict memory).
std::string predictedMiB(int64_t bytes) {
  if (bytes <= 0)
    return "unknown";
  return fmt::format("{:.1f} MiB", mib(bytes));
}

/// `x` to `digits` significant digits, so that its JSON text (the shortest
/// that reads back as the same double) has no more.
double significant(double x, int digits) {
  if (!std::isfinite(x))
    return x;
  return std::stod(fmt::format("{:.{}g}", x, digits));
}

/// `x` rounded to `decimals` places after the point.
double rounded(double x, int decimals) {
  if (!std::isfinite(x))
    return x;
  return std::stod(fmt::format("{:.{}f}", x, decimals));
}

/// `object` on one line with ", " and ": " between its members, the
/// layout the metrics file has always had (Python's json.dumps default).
std::string jsonLine(const Json &object) {
  std::string out = "{";
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it != object.begin())
      out += ", ";
    out += Json(it.key()).dump() + ": " + it.value().dump();
  }
  return out + "}";
}

} // namespace

int64_t maxRssBytes() {
  struct rusage usage;
  if (::getrusage(RUSAGE_SELF, &usage) != 0)
    return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024; // Linux: KiB
}

std::string metricsLine(const StepReport &r) {
  // nlohmann/json writes a non-finite double as null.
  Json gradNorm = nullptr;
  if (r.gradNorm >= 0 && std::isfinite(r.gradNorm))
    gradNorm = significant(r.gradNorm, 9);
  return jsonLine(Json{{"step", r.step},
                       {"loss", r.loss},
                       {"tokens_per_s", rounded(r.tokensPerS, 3)},
                       {"step_time_s", rounded(r.stepSeconds, 6)},
                       {"lr", significant(r.lr, 9)},
                       {"grad_norm", gradNorm},
                       {"peak_bytes", r.peakBytes},
                       {"max_rss_bytes", r.maxRssBytes}});
}

MetricsFile::~MetricsFile() {
  if (file)
    std::fclose(file);
}

Status MetricsFile::open(const std::string &filePath, bool append) {
  path = filePath;
  file = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file)
    return Status::error(fmt::format("cannot open --metrics file '{}': {}",
                                     path, errnoMessage(errno)));
  return Status::ok();
}

Status MetricsFile::write(const StepReport &report) {
  if (!file)
    return Status::ok();
  std::string line = metricsLine(report) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file) != line.size() ||
      std::fflush(file) != 0)
    return Status::error(fmt::format("cannot write --metrics file '{}': {}",
                                     path, errnoMessage(errno)));
  return Status::ok();
}

Status MetricsFile::close() {
  if (!file)
    return Status::ok();
  int rc = std::fclose(file);
  file = nullptr;
  if (rc != 0)
    return Status::error(fmt::format("cannot write --metrics file '{}'", path));
  return Status::ok();
}

std::string profileTable(const std::string &who, const Executor &exec,
                         int64_t firstStep, int64_t steps, double stepSeconds) {
  std::vector<ProfileEntry> rows = exec.profile();
  int streams = exec.plan().streams_size();
  auto perStep = [&](double seconds) {
    return steps > 0 ? 1e3 * seconds / double(steps) : 0.0;
  };
  auto percent = [&](double seconds) {
    return stepSeconds > 0 ? 100.0 * seconds / stepSeconds : 0.0;
  };
  std::string out = fmt::format(
      "profile of {}: steps {}-{} ({} step{}{}), {} stream{}, {:.3f} "
      "ms/step, {}\n",
      who, firstStep, firstStep + steps - 1, steps, steps == 1 ? "" : "s",
      firstStep > 1 ? ", warm-up excluded" : ", warm-up included", streams,
      streams == 1 ? "" : "s", perStep(stepSeconds), blasDescription());
  if (streams > 1)
    out += "  (streams run concurrently: their times overlap, so the "
           "percentages may add up to more than 100)\n";
  out += fmt::format("  {:<32} {:>9} {:>11} {:>10} {:>7}\n",
                     "kernel / instruction", "count", "total ms", "ms/step",
                     "% step");
  double kernels = 0, all = 0;
  std::set<std::string> ops;
  for (const std::string &op : kernelNames())
    ops.insert(op);
  for (const ProfileEntry &e : rows) {
    out += fmt::format("  {:<32} {:>9} {:>11.3f} {:>10.3f} {:>7.2f}\n", e.name,
                       e.count, 1e3 * e.seconds, perStep(e.seconds),
                       percent(e.seconds));
    all += e.seconds;
    if (ops.count(e.name))
      kernels += e.seconds;
  }
  auto total = [&](const char *name, double seconds) {
    out += fmt::format("  {:<32} {:>9} {:>11.3f} {:>10.3f} {:>7.2f}\n", name,
                       "", 1e3 * seconds, perStep(seconds), percent(seconds));
  };
  total("(all kernels)", kernels);
  total("(all rows)", all);
  total("(step wall time)", stepSeconds);
  // --profile=gpu: the device's own time of every launch.
  hal::LaunchTimes device = exec.launchTimes();
  if (!device.rows.empty()) {
    out += fmt::format("  device time per launch (--profile=gpu; launches "
                       "of concurrent streams overlap):\n");
    out += fmt::format("  {:<32} {:>9} {:>11} {:>10} {:>7}\n", "launch",
                       "count", "total ms", "ms/step", "% step");
    double launched = 0;
    for (const hal::LaunchTime &t : device.rows) {
      out += fmt::format("  {:<32} {:>9} {:>11.3f} {:>10.3f} {:>7.2f}\n",
                         t.name, t.count, 1e3 * t.seconds, perStep(t.seconds),
                         percent(t.seconds));
      launched += t.seconds;
    }
    total("(all launches)", launched);
    total("(device busy)", device.busySeconds);
    total("(device idle)", std::max(0.0, stepSeconds - device.busySeconds));
  }
  return out;
}

std::string memoryReport(const std::string &who, const Executor &exec) {
  // The executor places every tensor in one arena laid out by the plan's
  // memory plan: its peak is the plan's arena_bytes (laid out again where
  // the device stores values packed: then also the plan file's).
  const plan::Plan &plan = exec.plan();
  std::string relaid;
  if (exec.fileArenaBytes() != plan.arena_bytes())
    relaid =
        fmt::format("; laid out again for the values this device "
                    "stores packed: the plan file's {} bytes, {}",
                    exec.fileArenaBytes(), predictedMiB(exec.fileArenaBytes()));
  return fmt::format(
      "piper-run: {}: peak memory: {} bytes, {:.1f} MiB (memory plan arena {} "
      "bytes, {}{}); state {} bytes, {:.1f} MiB (memory plan state {} "
      "bytes); max RSS {:.1f} MiB\n",
      who, exec.peakBytes(), mib(exec.peakBytes()), plan.arena_bytes(),
      predictedMiB(plan.arena_bytes()), relaid, exec.stateBytes(),
      mib(exec.stateBytes()), plan.state_bytes(), mib(maxRssBytes()));
}

std::string packedReport(const std::string &who, const Executor &exec) {
  const Executor::PackedCounts c = exec.packedCounts();
  if (c.results + c.values + c.arguments + c.paramCopies == 0)
    return "";
  return fmt::format(
      "piper-run: {}: stored as packed bf16 (over the plan's segments): {} "
      "results written packed, {} other values, {} arguments read as "
      "stored, {} parameter copies\n",
      who, c.results, c.values, c.arguments, c.paramCopies);
}

} // namespace piper::runtime

// piper-run --trace: rank parts, their merge and the measured bubble (see
// Trace.h).
#include "runtime/launch/rank/Trace.h"

#include <algorithm>
#include <limits>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/launch/watchdog/Watchdog.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

namespace {

using nlohmann::json;

/// Microseconds from `originNs` to `ns`.
double micros(int64_t ns, int64_t originNs) { return double(ns - originNs) / 1e3; }

/// The instruction's event name: its plan label, else its kind.
std::string eventName(const plan::Instruction &inst) {
  return inst.label().empty() ? plan::Instruction::Kind_Name(inst.kind())
                              : inst.label();
}

/// The metadata events naming rank `rank`'s process and its streams.
void addNames(json &events, int rank, int deviceClass,
              const json &streamNames) {
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", fmt::format("rank {}", rank)}}}});
  events.push_back({{"name", "process_labels"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"labels", fmt::format("class {}", deviceClass)}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"sort_index", rank}}}});
  for (size_t s = 0; s < streamNames.size(); ++s)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", s},
                      {"args", {{"name", streamNames[s]}}}});
}

std::string percent(double fraction) {
  return fmt::format("{:.2f}%", 100 * fraction);
}

/// Checks the type of every field of a traced rank's part that the merge
/// reads: a part from another process is input, and nlohmann/json throws
/// (SIGABRT) on a field of another type.
Status checkPart(const json &part) {
  using Is = bool (*)(const json &);
  struct Field {
    const char *key;
    Is is;
    const char *kind;
  };
  static const Field fields[] = {
      {"step", [](const json &v) { return v.is_number_integer(); },
       "an integer"},
      {"start_ns", [](const json &v) { return v.is_number_integer(); },
       "an integer"},
      {"host", [](const json &v) { return v.is_string(); }, "a string"},
      {"class", [](const json &v) { return v.is_number_integer(); },
       "an integer"},
      {"step_seconds", [](const json &v) { return v.is_number(); }, "a number"},
      {"compute_busy_seconds", [](const json &v) { return v.is_number(); },
       "a number"},
      {"bubble_fraction", [](const json &v) { return v.is_number(); },
       "a number"},
      {"streams", [](const json &v) { return v.is_array(); }, "an array"},
      {"events", [](const json &v) { return v.is_array(); }, "an array"}};
  for (const Field &f : fields) {
    auto it = part.find(f.key);
    if (it == part.end())
      return Status::error(fmt::format("missing \"{}\"", f.key));
    if (!f.is(*it))
      return Status::error(fmt::format("\"{}\" is a {}, expected {}", f.key,
                                       it->type_name(), f.kind));
  }
  for (const json &e : part["events"])
    if (!e.is_object() || !e.contains("ts") || !e["ts"].is_number())
      return Status::error("an event without a numeric \"ts\"");
  return Status::ok();
}

} // namespace

MeasuredBubble measuredBubble(const plan::Plan &plan, const StepTrace &trace) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  for (size_t s = 0; s < trace.streams.size() &&
                     int(s) < plan.streams_size();
       ++s)
    for (size_t i = 0; i < trace.streams[s].size(); ++i) {
      const StepTrace::Span &span = trace.streams[s][i];
      if (span.startNs < 0 ||
          plan.streams(s).instructions(i).kind() != plan::Instruction::CALL)
        continue;
      calls.push_back({std::max(span.startNs, trace.startNs),
                       std::min(span.endNs, trace.endNs)});
    }
  std::sort(calls.begin(), calls.end());
  int64_t busy = 0, reached = std::numeric_limits<int64_t>::min();
  for (auto [start, end] : calls) {
    start = std::max(start, reached);
    if (end > start)
      busy += end - start;
    reached = std::max(reached, end);
  }
  MeasuredBubble b;
  b.stepSeconds = double(trace.endNs - trace.startNs) * 1e-9;
  b.computeBusySeconds = double(busy) * 1e-9;
  b.fraction = b.stepSeconds > 0
                   ? (b.stepSeconds - b.computeBusySeconds) / b.stepSeconds
                   : 0.0;
  return b;
}

std::string traceRankPart(const plan::Plan &plan, int rank,
                          const std::string &host, const StepTrace &trace) {
  if (trace.step == 0)
    return json{{"rank", rank}, {"step", 0}}.dump();
  json streams = json::array();
  json events = json::array();
  for (int s = 0; s < plan.streams_size(); ++s) {
    streams.push_back(plan.streams(s).name());
    for (int i = 0; i < plan.streams(s).instructions_size(); ++i) {
      const StepTrace::Span &span = trace.streams[s][i];
      if (span.startNs < 0)
        continue;
      const plan::Instruction &inst = plan.streams(s).instructions(i);
      events.push_back({{"name", eventName(inst)},
                        {"cat", plan::Instruction::Kind_Name(inst.kind())},
                        {"ph", "X"},
                        {"pid", rank},
                        {"tid", s},
                        {"ts", micros(span.startNs, trace.startNs)},
                        {"dur", micros(span.endNs, span.startNs)},
                        {"args", {{"instruction", i}}}});
    }
  }
  MeasuredBubble bubble = measuredBubble(plan, trace);
  return json{{"rank", rank},
              {"class", plan.device_class()},
              {"host", host},
              {"step", trace.step},
              {"start_ns", trace.startNs},
              {"end_ns", trace.endNs},
              {"step_seconds", bubble.stepSeconds},
              {"compute_busy_seconds", bubble.computeBusySeconds},
              {"bubble_fraction", bubble.fraction},
              {"streams", streams},
              {"events", events}}
      .dump();
}

Status mergeTraceParts(const std::vector<std::string> &parts,
                       std::string &traceJson, std::string &summary,
                       int64_t &tracedStep) {
  std::vector<json> ranks(parts.size());
  std::vector<int> missing;
  int64_t step = 0, origin = std::numeric_limits<int64_t>::max();
  bool oneHost = true;
  std::string host;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].empty()) {
      try {
        ranks[r] = json::parse(parts[r]);
      } catch (const json::exception &e) {
        return Status::error(
            fmt::format("the trace part of rank {} is malformed: {}", r,
                        e.what()));
      }
    }
    // An empty part, or one of a rank that ran no traced step.
    if (!ranks[r].is_object() || !ranks[r].contains("step") ||
        ranks[r]["step"] == 0) {
      missing.push_back(int(r));
      ranks[r] = nullptr;
      continue;
    }
    PIPER_RETURN_IF_ERROR(checkPart(ranks[r]).withContext(
        fmt::format("the trace part of rank {} is malformed", r)));
    if (step != 0 && ranks[r]["step"] != step)
      return Status::error(fmt::format(
          "the ranks traced different steps: {} and {} (rank {})", step,
          ranks[r]["step"].get<int64_t>(), r));
    step = ranks[r]["step"];
    origin = std::min(origin, ranks[r]["start_ns"].get<int64_t>());
    std::string h = ranks[r]["host"];
    oneHost = oneHost && (host.empty() || h == host);
    host = h;
  }
  if (step == 0)
    return Status::error("no rank recorded its step");
  // One host: CLOCK_MONOTONIC is the same clock in every process, so the
  // ranks' steps are placed where they really ran relative to each other.
  json events = json::array();
  json bubbles = json::array(), steps = json::array(), busy = json::array(),
       offsets = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].is_null()) {
      for (json *a : {&bubbles, &steps, &busy, &offsets})
        a->push_back(nullptr);
      continue;
    }
    const json &part = ranks[r];
    double offset =
        oneHost ? micros(part["start_ns"].get<int64_t>(), origin) : 0.0;
    addNames(events, int(r), part["class"], part["streams"]);
    for (json e : part["events"]) {
      e["ts"] = e["ts"].get<double>() + offset;
      events.push_back(std::move(e));
    }
    bubbles.push_back(part["bubble_fraction"]);
    steps.push_back(part["step_seconds"]);
    busy.push_back(part["compute_busy_seconds"]);
    offsets.push_back(offset);
    summary += fmt::format(
        "  rank {}: step {:.3f} ms, compute busy {:.3f} ms, bubble {}\n", r,
        part["step_seconds"].get<double>() * 1e3,
        part["compute_busy_seconds"].get<double>() * 1e3,
        percent(part["bubble_fraction"].get<double>()));
  }
  for (int r : missing)
    summary += fmt::format("  rank {}: not traced (its part is missing)\n", r);
  json trace = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"metadata",
       {{"source", "measured"},
        {"step", step},
        {"world_size", parts.size()},
        {"clock", oneHost ? "steady_clock of one host: time 0 is the "
                            "earliest rank's step start"
                          : "several hosts: each rank's time 0 is its own "
                            "step start"},
        {"start_offset_us", offsets},
        {"step_seconds", steps},
        {"compute_busy_seconds", busy},
        {"bubble_fraction", bubbles}}}};
  traceJson = trace.dump(1) + "\n";
  tracedStep = step;
  return Status::ok();
}

std::string traceKey(int rank) { return fmt::format("trace-rank-{}", rank); }

Status writeMeasuredTrace(const std::string &path, WatchStore *store,
                          int worldSize, const std::string &ownPart) {
  std::vector<std::string> parts(worldSize);
  parts[0] = ownPart;
  for (int r = 1; r < worldSize && store; ++r) {
    bool present = false;
    PIPER_RETURN_IF_ERROR(store->get(traceKey(r), parts[r], present).withContext(
        fmt::format("--trace: reading the part of rank {}", r)));
    if (!present)
      parts[r].clear();
  }
  std::string text, summary;
  int64_t step = 0;
  PIPER_RETURN_IF_ERROR(
      mergeTraceParts(parts, text, summary, step).withContext("--trace"));
  AtomicFile file;
  PIPER_RETURN_IF_ERROR(file.open(path));
  PIPER_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  PIPER_RETURN_IF_ERROR(file.commit());
  fmt::print(stderr,
             "piper-run: trace of step {} written to '{}' (measured "
             "compute bubble per rank):\n{}",
             step, path, summary);
  return Status::ok();
}

std::string hostName() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0)
    return "";
  return name;
}

} // namespace piper::runtime

// PIPER_FAULT, the fault injection of the tests (declared in Watchdog.h):
// crash, stall or hang a rank at a step and instruction, or fail its
// device's next operation.
#include "runtime/launch/watchdog/Watchdog.h"

#include "proto/PlanGroups.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace piper::runtime {

using plan::Instruction;

// --- PIPER_FAULT -----------------------------------------------------------

namespace {
constexpr const char *kFaultSyntax =
    "expected rank=R,action=crash|stall|hang_comm|hang_inside|device_error|"
    "hang_data"
    "[,step=S]"
    "[,stream=NAME]"
    "[,inst=I][,at=step|checkpoint][,attempt=A]";

bool parseInt(const std::string &text, long long &value) {
  if (text.empty())
    return false;
  char *end = nullptr;
  errno = 0;
  value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}
} // namespace

Status parseFault(const std::string &text, FaultSpec &fault) {
  auto bad = [&](const std::string &what) {
    return Status::error(
        fmt::format("PIPER_FAULT='{}': {} ({})", text, what, kFaultSyntax));
  };
  fault = FaultSpec();
  bool haveRank = false, haveAction = false;
  std::stringstream in(text);
  std::string item;
  std::vector<std::string> seen;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return bad(fmt::format("'{}' is not key=value", item));
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      return bad(fmt::format("'{}' is given twice", key));
    seen.push_back(key);
    long long n = 0;
    if (key == "rank" || key == "step" || key == "inst" || key == "attempt") {
      if (!parseInt(value, n))
        return bad(fmt::format("{} '{}' is not an integer", key, value));
      if (key == "rank") {
        if (n < 0 || n > 1 << 30)
          return bad(fmt::format("rank {} is out of range", n));
        fault.rank = static_cast<int>(n);
        haveRank = true;
      } else if (key == "attempt") {
        if (n < 0 || n > 1 << 30)
          return bad(fmt::format("attempt {} is out of range", n));
        fault.attempt = static_cast<int>(n);
      } else if (key == "step") {
        if (n < 1)
          return bad(fmt::format("step {} must be at least 1", n));
        fault.step = n;
      } else {
        if (n < 0 || n > 1 << 30)
          return bad(fmt::format("inst {} is out of range", n));
        fault.instruction = static_cast<int>(n);
      }
    } else if (key == "at") {
      if (value == "step")
        fault.atCheckpoint = false;
      else if (value == "checkpoint")
        fault.atCheckpoint = true;
      else
        return bad(
            fmt::format("unknown place '{}' (step or checkpoint)", value));
    } else if (key == "stream") {
      if (value.empty())
        return bad("stream needs a name");
      fault.stream = value;
    } else if (key == "action") {
      if (value == "crash")
        fault.action = FaultSpec::kCrash;
      else if (value == "stall")
        fault.action = FaultSpec::kStall;
      else if (value == "hang_comm")
        fault.action = FaultSpec::kHangComm;
      else if (value == "hang_inside")
        fault.action = FaultSpec::kHangInside;
      else if (value == "device_error")
        fault.action = FaultSpec::kDeviceError;
      else if (value == "hang_data")
        fault.action = FaultSpec::kHangData;
      else
        return bad(fmt::format("unknown action '{}'", value));
      haveAction = true;
    } else {
      return bad(fmt::format("unknown key '{}'", key));
    }
  }
  if (!haveRank)
    return bad("rank is missing");
  if (!haveAction)
    return bad("action is missing");
  if (fault.action == FaultSpec::kHangData &&
      (fault.atCheckpoint ||
       std::find(seen.begin(), seen.end(), "stream") != seen.end() ||
       std::find(seen.begin(), seen.end(), "inst") != seen.end()))
    // The batches are filled on the thread running the steps, not by an
    // instruction.
    return bad("hang_data takes no stream, inst or at");
  if (fault.atCheckpoint) {
    // Inside the checkpoint write of the step: no instruction runs there.
    if (std::find(seen.begin(), seen.end(), "stream") != seen.end() ||
        std::find(seen.begin(), seen.end(), "inst") != seen.end())
      return bad("at=checkpoint takes no stream or inst");
    if (fault.action != FaultSpec::kCrash && fault.action != FaultSpec::kStall)
      return bad("at=checkpoint takes action crash or stall");
  }
  return Status::ok();
}

Status faultFromEnv(FaultSpec &fault, bool &set) {
  const char *text = std::getenv("PIPER_FAULT");
  set = text && *text;
  if (!set)
    return Status::ok();
  return parseFault(text, fault);
}

namespace {
/// What a fault does when it acts: says so on stderr, publishes the
/// heartbeat (which then shows exactly where it acts), then acts.
std::function<void()> faultAction(int rank, const std::string &where,
                                  FaultSpec::Action action) {
  return [rank, where, action] {
    const char *what =
        action == FaultSpec::kCrash        ? "crashing (SIGKILL)"
        : action == FaultSpec::kStall      ? "stalling (SIGSTOP)"
        : action == FaultSpec::kHangComm   ? "hanging (hang_comm)"
        : action == FaultSpec::kHangInside ? "hanging inside (hang_inside)"
        : action == FaultSpec::kHangData
            ? "hanging its data source (hang_data)"
            : "failing the device's next operation (device_error)";
    std::fprintf(stderr, "piper-run: rank %d: PIPER_FAULT: %s at %s\n", rank,
                 what, where.c_str());
    std::fflush(stderr);
    // The heartbeat shows exactly where the fault acts (a real failure
    // leaves a position up to one poll old).
    Watchdog::publishActive();
    if (action == FaultSpec::kDeviceError)
      // The instruction runs on and meets the error, which takes the path
      // of any device error: the stream's failure, the watchdog's verdict.
      hal::injectEmulatedDeviceError();
    else if (action == FaultSpec::kCrash)
      ::raise(SIGKILL);
    else if (action == FaultSpec::kStall)
      ::raise(SIGSTOP);
    else
      while (true)
        std::this_thread::sleep_for(std::chrono::seconds(1));
  };
}
} // namespace

Status checkFaultCheckpoint(const FaultSpec &fault, int64_t checkpointEvery) {
  if (!fault.atCheckpoint ||
      (checkpointEvery > 0 && fault.step % checkpointEvery == 0))
    return Status::ok();
  return Status::error(fmt::format(
      "PIPER_FAULT: at=checkpoint, step {}: no checkpoint is written after "
      "step {} (--checkpoint-every {})",
      fault.step, fault.step, checkpointEvery));
}

std::function<void()> checkpointFault(const FaultSpec &fault, int rank,
                                      int64_t step) {
  if (fault.rank != rank || !fault.atCheckpoint || fault.step != step)
    return nullptr;
  return faultAction(
      rank, fmt::format("the checkpoint of step {}, its files written", step),
      fault.action);
}

Status applyFault(const FaultSpec &fault, const plan::Plan &plan, int rank,
                  const std::string &backend, ExecutorOptions &options) {
  if (fault.rank != rank || fault.atCheckpoint)
    return Status::ok(); // checkpointFault's
  // Only the emulated GPU can be told to fail (a real device fails by
  // itself; the CPU backend's memory cannot).
  if (fault.action == FaultSpec::kDeviceError && backend != "cuda-emulation")
    return Status::error(fmt::format(
        "PIPER_FAULT: device_error needs --backend cuda-emulation (rank {} "
        "runs on '{}')",
        rank, backend));
  if (fault.action == FaultSpec::kHangData) {
    options.faultDataStep = fault.step;
    options.onDataFault = faultAction(
        rank, fmt::format("filling the batches of step {}", fault.step),
        fault.action);
    return Status::ok();
  }
  int s = 0;
  if (!fault.stream.empty()) {
    s = -1;
    std::string names;
    for (int i = 0; i < plan.streams_size(); ++i) {
      if (plan.streams(i).name() == fault.stream)
        s = i;
      names += (i ? ", '" : "'") + plan.streams(i).name() + "'";
    }
    if (s < 0)
      return Status::error(fmt::format(
          "PIPER_FAULT: rank {}'s plan has no stream '{}' (it has {})", rank,
          fault.stream, names));
  }
  if (s >= plan.streams_size())
    return Status::error(
        fmt::format("PIPER_FAULT: rank {}'s plan has no stream", rank));
  const plan::Stream &stream = plan.streams(s);
  if (fault.instruction >= stream.instructions_size())
    return Status::error(fmt::format(
        "PIPER_FAULT: stream '{}' of rank {} has {} instructions, no inst {}",
        stream.name(), rank, stream.instructions_size(), fault.instruction));
  const Instruction &inst = stream.instructions(fault.instruction);
  const bool hangs = fault.action == FaultSpec::kHangComm ||
                     fault.action == FaultSpec::kHangInside;
  if (hangs && !plan::isCommunication(inst.kind()))
    return Status::error(fmt::format(
        "PIPER_FAULT: {} needs a communication instruction; "
        "instruction {} of stream '{}' on rank {} is {} '{}'",
        fault.action == FaultSpec::kHangComm ? "hang_comm" : "hang_inside",
        fault.instruction, stream.name(), rank,
        Instruction::Kind_Name(inst.kind()), inst.label()));
  options.faultStep = fault.step;
  options.faultStream = s;
  options.faultInstruction = fault.instruction;
  options.faultInside = fault.action == FaultSpec::kHangInside;
  std::string where =
      fmt::format("step {}, stream '{}', instruction {} ({} '{}')", fault.step,
                  stream.name(), fault.instruction,
                  Instruction::Kind_Name(inst.kind()), inst.label());
  options.onFault = faultAction(rank, where, fault.action);
  return Status::ok();
}

} // namespace piper::runtime

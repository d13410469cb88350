// Hot spares (--standby), the ranks' side: parking a spare until it is
// promoted, the step-boundary snapshots every rank hands off when a peer
// fails, and opening the state a recovered rank starts from.
#include "runtime/launch/rank/Standby.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/formats/Integrity.h"
#include "runtime/launch/checkpoints/Checkpoints.h"
#include "runtime/launch/checkpoints/StrategyFiles.h"
#include "runtime/launch/rank/RunRank.h"
#include "runtime/launch/rendezvous/Rendezvous.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

using plan::Operand;

namespace {

constexpr Operand::Kind kSnapshotKinds[3] = {Operand::PARAM, Operand::ADAM_M,
                                             Operand::ADAM_V};

/// PyTorch AdamW's names of a parameter's moments, as checkpoints use.
std::string momentName(const std::string &param, Operand::Kind kind) {
  return param + (kind == Operand::ADAM_M ? ".exp_avg" : ".exp_avg_sq");
}

/// Reads the promotion message from `fd`: "NAME=value" lines ended by an
/// empty line. False at end of file first (the launcher released the spare).
bool readPromotion(int fd, std::vector<std::string> &vars) {
  std::string text;
  char buf[1024];
  while (text.find("\n\n") == std::string::npos) {
    ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    text.append(buf, static_cast<size_t>(got));
  }
  text.erase(text.find("\n\n"));
  size_t start = 0;
  while (start <= text.size()) {
    size_t eol = text.find('\n', start);
    if (eol == std::string::npos)
      eol = text.size();
    if (eol > start)
      vars.push_back(text.substr(start, eol - start));
    start = eol + 1;
  }
  return true;
}

} // namespace

// --- snapshots
// ------------------------------------------------------------------

Status StepSnapshots::take(const Executor &exec, int64_t step) {
  std::lock_guard<std::mutex> lock(mu);
  if (specs.empty())
    specs = exec.heldParamSpecs();
  runId = exec.runId();
  Slot &slot = slots[1 - newest];
  slot.tensors.resize(specs.size() * 3);
  for (size_t p = 0; p < specs.size(); ++p)
    for (int k = 0; k < 3; ++k) {
      Status copied = exec.stateToHost(static_cast<int>(p), kSnapshotKinds[k],
                                       slot.tensors[p * 3 + k]);
      if (!copied) {
        slot.step = -1; // half overwritten: never written out
        return copied;
      }
    }
  slot.step = step;
  newest = 1 - newest;
  return Status::ok();
}

Status StepSnapshots::write(const std::string &dir) const {
  std::lock_guard<std::mutex> lock(mu);
  for (const Slot &slot : slots) {
    if (slot.step < 0)
      continue;
    std::string stepDir = fmt::format("{}/step-{}", dir, slot.step);
    PIPER_RETURN_IF_ERROR(makeDirectories(stepDir));
    std::vector<SafetensorsTensor> model, moments;
    for (size_t p = 0; p < specs.size(); ++p) {
      model.push_back(SafetensorsTensor{specs[p].name, "F32", specs[p].shape,
                                        slot.tensors[p * 3].data()});
      for (int k = 1; k < 3; ++k)
        moments.push_back(SafetensorsTensor{
            momentName(specs[p].name, kSnapshotKinds[k]), "F32", specs[p].shape,
            slot.tensors[p * 3 + k].data()});
    }
    SafetensorsMetadata modelMeta = checkpointMetadata(slot.step, runId);
    SafetensorsMetadata momentsMeta = modelMeta;
    addCrc32s(modelMeta, model);
    addCrc32s(momentsMeta, moments);
    PIPER_RETURN_IF_ERROR(writeSafetensors(stepDir + "/" + kCheckpointModelFile,
                                           model, modelMeta));
    PIPER_RETURN_IF_ERROR(writeSafetensors(
        stepDir + "/" + kCheckpointOptimizerFile, moments, momentsMeta));
    std::string marker = stepDir + "/" + kHandoffCompleteFile;
    std::ofstream out(marker);
    out << slot.step << "\n";
    out.close();
    if (!out)
      return Status::error(fmt::format("cannot write '{}'", marker));
  }
  return Status::ok();
}

// --- spares
// ---------------------------------------------------------------------

bool isStandby() {
  const char *v = std::getenv(kStandbyVar);
  return v && *v;
}

int runStandby(const RunOptions &options) {
  long long index = -1, fd = -1;
  std::string error;
  if (!envInt(kStandbyVar, index, error) || !envInt(kStandbyFdVar, fd, error) ||
      index < 0 || fd < 0) {
    fmt::print(stderr, "piper-run: a standby needs {} and {}{}\n", kStandbyVar,
               kStandbyFdVar, error.empty() ? "" : ": " + error);
    return 1;
  }
  const std::string who = fmt::format("standby {}", index);
  // Everything a rank of any class needs before it can start: the
  // manifest and every plan, read and validated now.
  LoadedStrategy strategy;
  Status st = loadManifest(options, strategy.manifest);
  if (st)
    st = loadPlans(options, strategy.manifest, strategy.plans);
  if (!st) {
    fmt::print(stderr, "piper-run: {}: {}\n", who, st.message());
    return 1;
  }
  if (!options.logDir.empty())
    fmt::print(stderr,
               "piper-run: {}: strategy loaded ({} device classes), parked\n",
               who, strategy.plans.size());
  std::fflush(stderr);

  std::vector<std::string> vars;
  bool promoted = readPromotion(static_cast<int>(fd), vars);
  ::close(static_cast<int>(fd));
  if (!promoted)
    return 0; // released at the end of the run
  bool resume = false;
  for (const std::string &var : vars) {
    size_t eq = var.find('=');
    if (eq == std::string::npos || eq == 0)
      continue;
    std::string name = var.substr(0, eq), value = var.substr(eq + 1);
    if (name == kPromoteResumeVar)
      resume = value == "1";
    else
      ::setenv(name.c_str(), value.c_str(), 1);
  }
  ::unsetenv(kStandbyVar);
  ::unsetenv(kStandbyFdVar);

  RankEnv env;
  bool isRank = false;
  st = readRankEnv(options.nproc, isRank, env);
  if (st && !isRank)
    st = Status::error("the promotion names no rank");
  if (!st) {
    fmt::print(stderr, "piper-run: {}: {}\n", who, st.message());
    return 1;
  }
  fmt::print(stderr, "piper-run: {}: promoted to rank {}\n", who, env.rank);
  // From here on this process is that rank: its messages go to its log.
  if (!options.logDir.empty()) {
    std::string log = fmt::format("{}/rank-{}.log", options.logDir, env.rank);
    int logFd =
        ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logFd >= 0) {
      ::dup2(logFd, STDERR_FILENO);
      ::close(logFd);
      fmt::print(stderr, "piper-run: rank {}: this is {}, promoted\n", env.rank,
                 who);
    }
  }
  RunOptions rankOptions = options;
  rankOptions.resume = rankOptions.resume || resume;
  return runRank(rankOptions, env, &strategy);
}

bool handsOffState(const plan::Plan &plan) {
  for (const plan::Parameter &param : plan.params())
    if (param.has_sharding() || plan::expertMembers(param) >= 2)
      return false;
  return true;
}

// --- recovered state
// ------------------------------------------------------------

Status openRecoveredState(const std::string &dir, int cls, int64_t member,
                          RecoveredState &out) {
  std::string classDir = dir + "/" + recoveryStateName(cls, member);
  Status st;
  out.model =
      SafetensorsReader::open(classDir + "/" + kCheckpointModelFile, st);
  if (!out.model)
    return st;
  out.optimizer =
      SafetensorsReader::open(classDir + "/" + kCheckpointOptimizerFile, st);
  if (!out.optimizer)
    return st;
  int64_t optimizerStep = 0;
  PIPER_RETURN_IF_ERROR(checkpointStep(*out.model, out.step));
  PIPER_RETURN_IF_ERROR(checkpointStep(*out.optimizer, optimizerStep));
  if (optimizerStep != out.step)
    return Status::error(fmt::format(
        "recovery state '{}': the model is of step {}, the optimizer of "
        "step {}",
        classDir, out.step, optimizerStep));
  // Written by a peer moments ago: still, its bytes must match the CRC-32s
  // it records, and be finite.
  PIPER_RETURN_IF_ERROR(verifyTensors(*out.model));
  PIPER_RETURN_IF_ERROR(verifyTensors(*out.optimizer));
  return recordedRunId(*out.model, out.runId);
}

} // namespace piper::runtime

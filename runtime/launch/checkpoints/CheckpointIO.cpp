// Strategy-wide checkpoint reading (--load) and writing (--save,
// --save-grads, the files of --checkpoint-dir), with one part per device
// class merged by rank 0.
#include "runtime/launch/checkpoints/CheckpointIO.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/formats/Integrity.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

namespace {

/// Where replica 0 of device class `deviceClass` writes its parameters
/// before rank 0 merges them into `savePath`.
std::string checkpointPartPath(const std::string &savePath, int deviceClass) {
  return fmt::format("{}.class{}.part", savePath, deviceClass);
}

} // namespace

std::vector<ParamSpec> strategyParams(const std::vector<plan::Plan> &plans) {
  std::vector<ParamSpec> specs;
  std::set<std::string> seen;
  for (const plan::Plan &p : plans)
    for (const plan::Parameter &param : p.params())
      if (seen.insert(param.name()).second)
        specs.push_back(ParamSpec{param.name(), plan::globalShape(param)});
  return specs;
}

Status openCheckpoint(const std::string &path,
                      const std::vector<plan::Plan> &plans,
                      std::unique_ptr<SafetensorsReader> &out, int64_t &step) {
  Status st;
  out = SafetensorsReader::open(path, st);
  if (!out)
    return st;
  PIPER_RETURN_IF_ERROR(checkpointStep(*out, step));
  PIPER_RETURN_IF_ERROR(checkCheckpointParams(*out, strategyParams(plans),
                                              /*rejectExtra=*/true));
  // A well-formed run id and the CRC-32s the file records (a file piper
  // wrote), and finite values.
  std::string runId;
  PIPER_RETURN_IF_ERROR(recordedRunId(*out, runId));
  return verifyTensors(*out);
}

Status checkStepRange(const std::string &path, int64_t step, int64_t steps) {
  // The loop counts one past the last step, so that must fit too.
  if (steps < 0 || step > INT64_MAX - 1 - steps)
    return Status::error(fmt::format(
        "checkpoint '{}': its step {} plus --steps {} is past the largest "
        "step number, {}",
        path, step, steps, INT64_MAX));
  return Status::ok();
}

void removeCheckpointLeftovers(const std::string &path) {
  std::string dir = parentDirectory(path);
  std::string base = path.substr(path.find_last_of('/') + 1);
  auto startsWith = [](const std::string &s, const std::string &prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
  };
  auto isLeftover = [&](const std::string &name) {
    if (startsWith(name, base + ".tmp-"))
      return name.size() == base.size() + 11;
    static const std::regex part(R"(\.class\d+\.part(\.tmp-......)?)");
    return startsWith(name, base + ".class") &&
           std::regex_match(name.substr(base.size()), part);
  };
  std::error_code ec;
  for (const auto &entry : std::filesystem::directory_iterator(dir, ec))
    if (isLeftover(entry.path().filename().string()))
      std::filesystem::remove(entry.path(), ec);
}

Status
writeCheckpoint(const std::string &path, CheckpointContent what,
                const plan::Manifest &manifest, Executor &exec,
                Communicator *comm, int rank, int64_t step,
                const std::function<void(const Status &)> &collectiveFailed) {
  std::string who = fmt::format("rank {}", rank);
  // Only ranks that write create the folder: another rank, late, would
  // re-create a checkpoint directory rank 0 has already renamed.
  if (exec.replicaIndex() == 0 || rank == 0)
    PIPER_RETURN_IF_ERROR(
        makeDirectories(parentDirectory(path)).withContext(who + ": --save"));
  bool merge = manifest.classes_size() > 1;
  // Should this rank fail before the merge, its part (and, on rank 0, every
  // part) is removed: a failed --save leaves nothing behind.
  std::vector<int> slots;
  if (merge && exec.replicaIndex() == 0)
    slots.push_back(
        rememberTempFile(checkpointPartPath(path, exec.plan().device_class())));
  if (merge && rank == 0)
    for (const plan::Manifest::Class &c : manifest.classes())
      slots.push_back(
          rememberTempFile(checkpointPartPath(path, c.device_class())));
  // On an error the files stay remembered: exitRank removes them.
  auto forget = [&] {
    for (int slot : slots)
      forgetTempFile(slot);
  };
  Status written = Status::ok();
  // Under ZeRO every replica contributes its shards; replica 0 writes.
  if (exec.replicaIndex() == 0 || exec.shardsState()) {
    std::string target =
        merge ? checkpointPartPath(path, exec.plan().device_class()) : path;
    written = what == CheckpointContent::Gradients
                  ? exec.saveGradients(target, step)
              : what == CheckpointContent::Optimizer
                  ? exec.saveOptimizerState(target, step)
                  : exec.saveCheckpoint(target, step);
  }
  if (!written)
    return written;
  if (!merge)
    return Status::ok();
  if (comm) {
    // A barrier: every part is complete once all ranks are past it. A rank
    // that failed to write has exited, which fails the sum on the others.
    double done = 1;
    Status st = comm->allReduceSumWorld(&done, 1).withContext(
        who + ": waiting for every class to write its checkpoint part");
    if (!st && collectiveFailed)
      collectiveFailed(st);
    PIPER_RETURN_IF_ERROR(st);
  }
  if (rank != 0) {
    // Rank 0 merges and removes the part.
    forget();
    return Status::ok();
  }
  std::vector<std::string> parts;
  for (const plan::Manifest::Class &c : manifest.classes())
    parts.push_back(checkpointPartPath(path, c.device_class()));
  Status merged =
      mergeSafetensors(parts, path, checkpointMetadata(step, exec.runId()))
          .withContext(who + ": merging checkpoint parts");
  for (const std::string &part : parts)
    std::remove(part.c_str());
  forget();
  return merged;
}

} // namespace piper::runtime

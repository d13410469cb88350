// Strategy-wide checkpoint reading (--load) and writing (--save,
// --save-grads), with one part per device class merged by rank 0.
#include "runtime/launch/CheckpointIO.h"

#include <cstdio>
#include <set>

#include <fmt/format.h>

#include "runtime/data/AtomicFile.h"

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
        specs.push_back(ParamSpec{
            param.name(), std::vector<int64_t>(param.type().shape().begin(),
                                               param.type().shape().end())});
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
  return checkCheckpointParams(*out, strategyParams(plans),
                               /*rejectExtra=*/true);
}

Status writeCheckpoint(const std::string &path, bool gradients,
                       const plan::Manifest &manifest, Executor &exec,
                       Communicator *comm, int rank, int64_t step) {
  std::string who = fmt::format("rank {}", rank);
  PIPER_RETURN_IF_ERROR(
      makeDirectories(parentDirectory(path)).withContext(who + ": --save"));
  bool merge = manifest.classes_size() > 1;
  if (exec.replicaIndex() == 0) {
    std::string target =
        merge ? checkpointPartPath(path, exec.plan().device_class()) : path;
    PIPER_RETURN_IF_ERROR(gradients ? exec.saveGradients(target, step)
                                    : exec.saveCheckpoint(target, step));
  }
  if (!merge)
    return Status::ok();
  if (comm) {
    // A barrier: every part is complete once all ranks are past it. A rank
    // that failed to write has exited, which fails the sum on the others.
    double done = 1;
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(&done, 1).withContext(
        who + ": waiting for every class to write its checkpoint part"));
  }
  if (rank != 0)
    return Status::ok();
  std::vector<std::string> parts;
  for (const plan::Manifest::Class &c : manifest.classes())
    parts.push_back(checkpointPartPath(path, c.device_class()));
  PIPER_RETURN_IF_ERROR(mergeSafetensors(parts, path, checkpointMetadata(step))
                            .withContext(who + ": merging checkpoint parts"));
  for (const std::string &part : parts)
    std::remove(part.c_str());
  return Status::ok();
}

} // namespace piper::runtime

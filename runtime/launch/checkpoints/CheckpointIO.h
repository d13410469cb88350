// Checkpoints of a whole strategy: --load checked against every class, and
// --save / --save-grads written by each class and merged by rank 0.
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTIO_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTIO_H

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/formats/Safetensors.h"
#include "support/Status.h"

namespace piper::runtime {

/// Every parameter of the strategy, each name once, in class order (a tied
/// parameter held by several classes is one tensor of the checkpoint).
std::vector<ParamSpec> strategyParams(const std::vector<plan::Plan> &plans);

/// Opens the checkpoint at `path` and checks it against the parameters of
/// every plan (a tensor that no class holds is an error too), against the
/// CRC-32s it records (if any) and for NaNs and infinities; sets `step` to
/// its "step". Reads the whole file.
Status openCheckpoint(const std::string &path,
                      const std::vector<plan::Plan> &plans,
                      std::unique_ptr<SafetensorsReader> &out, int64_t &step);

/// Checks that `steps` more steps after a checkpoint's `step` stay within
/// int64 (a step near 2^63 would otherwise wrap and run nothing).
Status checkStepRange(const std::string &path, int64_t step, int64_t steps);

/// Removes what an interrupted writeCheckpoint(`path`) may leave next to
/// `path`: its parts ("<path>.class<N>.part") and the temporary files of
/// the parts and of `path` ("….tmp-XXXXXX").
void removeCheckpointLeftovers(const std::string &path);

/// What writeCheckpoint writes of each parameter.
enum class CheckpointContent {
  Params,    ///< its value (--save, a checkpoint's model.safetensors)
  Gradients, ///< its gradient accumulator (--save-grads)
  Optimizer, ///< its AdamW moments (a checkpoint's optimizer.safetensors)
};

/// Between or after steps: replica 0 of every class writes `what` of its
/// parameters to `path`; with several classes they write parts that rank 0
/// merges, in manifest order, once every rank has passed a barrier on
/// `comm`.
/// `collectiveFailed`, if given, is called with the error of a failed
/// barrier (most likely a peer failed: piper-run's watchdog waits there for
/// its verdict) and need not return.
Status writeCheckpoint(
    const std::string &path, CheckpointContent what,
    const plan::Manifest &manifest, Executor &exec, Communicator *comm,
    int rank, int64_t step,
    const std::function<void(const Status &)> &collectiveFailed = nullptr);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTIO_H

// Periodic checkpoints of a run (--checkpoint-dir): writing DIR/step-<N>/
// atomically, keeping the last K, and finding the newest complete one to
// --resume from.
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTS_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTS_H

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/launch/checkpoints/ShardedCheckpoints.h"
#include "runtime/launch/options/RunOptions.h"
#include "support/Status.h"

namespace piper::runtime {

/// The files of a checkpoint directory (docs/operations.md).
inline constexpr const char *kCheckpointModelFile = "model.safetensors";
inline constexpr const char *kCheckpointOptimizerFile = "optimizer.safetensors";
/// Written last: a step-<N> directory without it is incomplete.
inline constexpr const char *kCheckpointStateFile = "state.json";

/// "DIR/step-<N>".
std::string checkpointStepDir(const std::string &dir, int64_t step);

/// What makes a run's data stream and its continuation the same: checked
/// when resuming, recorded in state.json.
struct RunIdentity {
  uint64_t seed = 0;
  /// --data's path, or "synthetic".
  std::string data;
  /// Global microbatches per step (replicas x microbatches), sequences per
  /// microbatch and tokens per sequence: the data windows of a step.
  int64_t microbatches = 0;
  int64_t microbatchSize = 0;
  int64_t seqLen = 0;
  /// Informative only (a checkpoint loads under any strategy of the model).
  int worldSize = 0;
};

/// The identity of this run, from its options and manifest (and the plan of
/// its own class, when the manifest has no training config).
RunIdentity runIdentity(const RunOptions &options,
                        const plan::Manifest &manifest, const plan::Plan &plan);

/// The checkpoint a resumed run starts from.
struct ResumePoint {
  /// 0 and no readers: none was found (start fresh).
  int64_t step = 0;
  std::string dir;
  std::unique_ptr<SafetensorsReader> model, optimizer;
  /// A sharded checkpoint (ZeRO, expert parallelism): every rank's slices,
  /// instead of `model` and `optimizer`.
  std::unique_ptr<ShardIndex> shards;
  /// The run that wrote it; "" before checkpoints carried run ids.
  std::string runId;
  /// One line per newer checkpoint that was passed over, and why.
  std::vector<std::string> skipped;
  /// Lines to print about the one chosen (one written before checkpoints
  /// carried checksums).
  std::vector<std::string> warnings;
};

/// Finds the newest checkpoint of `dir` that is complete and verifies
/// (docs/operations.md, "Checkpoint integrity"). Incomplete ones are
/// skipped (and listed): step-<N> directories without state.json, with a
/// state.json that does not parse (every field is type-checked), or whose
/// files are missing or not of the size written. One that is complete but
/// fails verification (a CRC-32, a run id, a step, a NaN or infinity) is an
/// error naming the file and tensor, unless `fallback` (--resume-fallback),
/// which skips it too. The one chosen must match `plans` (every parameter,
/// with its moments) and `identity` (seed, data, global batch), else an
/// error says how it differs. No checkpoint directory at all is not an
/// error (`out.step` stays 0); step directories none of which can be used
/// are.
Status findResumePoint(const std::string &dir,
                       const std::vector<plan::Plan> &plans,
                       const RunIdentity &identity, bool fallback,
                       ResumePoint &out);

/// Makes `runId` rank 0's on every rank of `comm` (null: one rank, nothing
/// to do); rank 0's must have newRunId's form.
Status shareRunId(Communicator *comm, int rank, std::string &runId);

/// Removes what a run cut off while writing a checkpoint left: the
/// "step-<N>.tmp" directories of `dir`. Rank 0 calls it before the first
/// step; the launcher after a failure.
void removeIncompleteCheckpoints(const std::string &dir);

/// How long writing a checkpoint took and how big it is (rank 0).
struct CheckpointStats {
  double seconds = 0;
  int64_t bytes = 0;
};

/// After step `step`, on every rank: writes DIR/step-<step>.tmp/ (model and
/// optimizer files, merged by rank 0 as --save's are), then rank 0 writes
/// state.json (every file's size and CRC-32s, and `exec`'s run id),
/// renames the directory to DIR/step-<step> and keeps the newest `keep`
/// complete checkpoints up to this step, removing the others.
///
/// `hooks.filesWritten`, if given, runs once this rank's files are written,
/// before the barrier that completes the checkpoint (PIPER_FAULT
/// at=checkpoint); `hooks.collectiveFailed` is called with the error of a
/// failed world collective (most likely a peer failed) and need not return.
struct CheckpointHooks {
  std::function<void()> filesWritten;
  std::function<void(const Status &)> collectiveFailed;
};
Status writeStepCheckpoint(const std::string &dir, int keep,
                           const RunIdentity &identity,
                           const plan::Manifest &manifest, Executor &exec,
                           Communicator *comm, int rank, int64_t step,
                           CheckpointStats &stats,
                           const CheckpointHooks &hooks = {});

/// Keeps the lines of the --metrics file at `path` for steps up to `step`
/// (a resumed run appends the steps after), rewriting it atomically; a
/// missing file is fine.
Status keepMetricsUpTo(const std::string &path, int64_t step);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTS_H

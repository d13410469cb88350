// piper-run's command line: the options of a run and their parsing.
#ifndef PIPER_RUNTIME_LAUNCH_OPTIONS_RUNOPTIONS_H
#define PIPER_RUNTIME_LAUNCH_OPTIONS_RUNOPTIONS_H

#include <cstdint>
#include <string>

namespace piper::runtime {

/// The command line of piper-run (docs/piper-run.md).
struct RunOptions {
  /// The compiled strategy folder (manifest.textproto and plan files).
  std::string outDir;
  /// Number of ranks to spawn; must equal the manifest's world_size.
  int nproc = 0;
  std::string backend = "cpu";
  /// The communicator of a multi-rank run: "auto" (Gloo; NCCL on --backend
  /// cuda), "gloo" (on cuda: staged through host memory, so ranks may
  /// share a GPU) or "nccl" (cuda only).
  std::string comm = "auto";
  /// How --backend cuda runs attention: "auto" (cuDNN's fused attention in
  /// bf16 plans where cuDNN takes the shape, else the SIMT kernels),
  /// "cudnn" (cuDNN or an error) or "simt" (docs/gpu.md).
  std::string attention = "auto";
  /// Mixed precision: unpack every packed bf16 step buffer to fp32 before
  /// its readers and pack every result from fp32, also where a GPU kernel
  /// reads or writes it packed (ExecutorOptions::packedStepBuffers off):
  /// the same bits, for comparing.
  bool unpackStepBuffers = false;
  /// Whether steps run as captured graphs (ExecutorOptions::stepGraphs):
  /// "off", "auto" (where the plan and backend can, else as usual, said
  /// once) or "on" (or an error).
  std::string stepGraph = "off";
  int64_t steps = 1;
  uint64_t seed = 0;
  /// Rank 0 writes one JSON object per step here; empty means none.
  std::string metricsPath;
  /// Seconds any communication may wait before it fails.
  int timeoutS = 120;
  /// After the last step, replica 0 of each class writes its parameters
  /// here as DIR/<name>.bin; empty means none.
  std::string saveParamsDir;
  /// Each spawned rank's stderr goes to DIR/rank-<R>.log; empty means the
  /// launcher's stderr.
  std::string logDir;
  /// A token file to train on (docs/data.md); empty means synthetic data.
  std::string dataPath;
  /// The width of --data's tokens: "uint16", "uint32" or empty (the file's
  /// header, else uint16).
  std::string dataDType;
  /// After the last step, the parameters of every class are written here as
  /// one safetensors file; empty means none.
  std::string savePath;
  /// --save-grads: the gradient accumulators after the last step.
  std::string saveGradsPath;
  /// Before the first step, parameters are read from this safetensors file
  /// instead of being initialized, and steps continue after its "step";
  /// empty means none.
  std::string loadPath;
  /// After the last step, the parameters are written to this folder as a
  /// Hugging Face model (docs/hugging-face.md); empty means none.
  std::string saveHfDir;
  /// --hf-dtype: the safetensors dtype of --save-hf, "F32" or "BF16".
  std::string hfDType = "F32";
  /// --hf-shard-size: the most tensor bytes of one --save-hf file, as
  /// given ("5GB") and in bytes.
  std::string hfShardSize = "5GB";
  uint64_t hfShardBytes = 5'000'000'000;
  /// --device-memory: a cap on each rank's device memory, as given ("80GiB")
  /// and in bytes (-1: none); a plan whose arena exceeds it, or what the
  /// device reports free, is refused before anything is allocated.
  std::string deviceMemory;
  int64_t deviceMemoryBytes = -1;
  /// --profile (or PIPER_PROFILE=1): time every kernel op and instruction
  /// kind, excluding the first step, and print a table at the end (rank 0 on
  /// stderr; with --log-dir every rank into its log). --profile=gpu (or
  /// PIPER_PROFILE=gpu) also times every device launch with device events
  /// (--backend cuda; the host clock on cuda-emulation).
  bool profile = false;
  /// "" (no --profile), "host" or "gpu".
  std::string profileMode;
  /// --trace: rank 0 writes the measured timeline of one step (every
  /// instruction of every stream of every rank) here as a Chrome / Perfetto
  /// trace; empty means none.
  std::string tracePath;
  /// --trace-step: the 1-based step to trace; 0 means the last step run.
  int64_t traceStep = 0;

  // --- Checkpoints, resume and restarts (docs/operations.md) ---
  /// Periodic checkpoints go to DIR/step-<N>/, and --resume reads the newest
  /// complete one; empty means none.
  std::string checkpointDir;
  /// A checkpoint after every step divisible by N; 0 means none.
  int64_t checkpointEvery = 0;
  /// How many complete checkpoints to keep (the newest).
  int keepCheckpoints = 2;
  /// Start from the newest complete checkpoint of --checkpoint-dir (fresh
  /// when there is none); --steps is then the total step count.
  bool resume = false;
  /// When resuming, a checkpoint that fails verification (a CRC-32, a run
  /// id, a NaN) is skipped for the newest older one that verifies, instead
  /// of being an error.
  bool resumeFallback = false;
  /// The local launcher relaunches every rank with --resume after a failure,
  /// up to N times.
  int maxRestarts = 0;
  /// --standby K: the local launcher starts K spare ranks that load the
  /// strategy and park; a failed rank's place goes to one of them, its state
  /// from a surviving data-parallel replica or the newest checkpoint.
  int standby = 0;

  // --- Progress output (docs/piper-run.md#output) ---
  /// Rank 0 prints a progress line for every step divisible by this, and for
  /// the last step; at least 1.
  int64_t logEvery = 1;
};

/// Parses piper-run's `argv` into `options`. Returns false when the process
/// should exit now with `exitCode`: after --help (0) or a usage error, which
/// has been printed (non-zero).
bool parseRunOptions(int argc, char **argv, RunOptions &options, int &exitCode);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_OPTIONS_RUNOPTIONS_H

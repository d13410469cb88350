// piper-run's command-line flags (CLI11), with their help texts.
#include "runtime/launch/options/RunOptions.h"

#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "support/ByteSize.h"

namespace piper::runtime {
namespace {

/// A decimal integer from `lo` to `hi`. CLI11 2.1 converts 64-bit options
/// with strtoll/strtoull and no range check: 2^64 saturated, -1 wrapped to
/// 2^64-1 and 010 was octal 8.
template <typename T> CLI::Validator integerFrom(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string &text) -> std::string {
        T value{};
        const char *end = text.data() + text.size();
        auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec == std::errc() && ptr == end && value >= lo && value <= hi)
          return "";
        return fmt::format("must be an integer from {} to {}, got '{}'", lo, hi,
                           text);
      },
      fmt::format("INT in [{} - {}]", lo, hi));
}

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The add*Options helpers define the options in the order --help lists them.

/// The strategy folder and how to run it: ranks, backend, communicator,
/// steps, seed, the metrics file, the communication timeout, and where
/// parameters and the ranks' logs go.
void addRunOptions(CLI::App &app, RunOptions &options) {
  app.add_option("out", options.outDir,
                 "compiled strategy folder (manifest.textproto + plans)")
      ->required();
  app.add_option("--nproc", options.nproc,
                 "number of ranks to spawn; must equal the strategy's "
                 "world size");
  app.add_option("--backend", options.backend,
                 "execution backend: cpu, cuda, or cuda-emulation (the CUDA "
                 "backend's kernels run on the host, for tests; docs/gpu.md)")
      ->capture_default_str();
  app.add_option("--comm", options.comm,
                 "communicator of a multi-rank run: auto (gloo; nccl on "
                 "--backend cuda), gloo (on cuda staged through host memory, "
                 "so ranks may share one GPU), or nccl (cuda only)")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}))
      ->capture_default_str();
  app.add_option("--attention", options.attention,
                 "how --backend cuda runs attention: auto (cuDNN's fused "
                 "attention in bf16 plans where cuDNN takes the shape, else "
                 "the SIMT kernels, said once), cudnn (cuDNN or an error; "
                 "bf16 plans on cuda only), or simt")
      ->check(CLI::IsMember({"auto", "cudnn", "simt"}))
      ->capture_default_str();
  app.add_flag("--unpack-step-buffers", options.unpackStepBuffers,
               "bf16 plans: unpack every packed bf16 step buffer to fp32 "
               "before the kernels that read it and pack every result "
               "after its kernel, also where a GPU kernel would read or "
               "write it packed (the same results, more memory passes; "
               "for comparing)");
  app.add_option("--step-graph", options.stepGraph,
                 "run steps as captured graphs (a CUDA graph on --backend "
                 "cuda; docs/runtime.md, \"Steps as graphs\"): off, auto "
                 "(where the plan and backend can, else as usual, said "
                 "once), or on (or an error saying why not)")
      ->check(CLI::IsMember({"off", "auto", "on"}))
      ->capture_default_str();
  app.add_option("--device-memory", options.deviceMemory,
                 "the most device memory each rank may use (80GiB, 141GB, "
                 "bytes): a plan that needs more, or more than the device "
                 "reports free (the host's available memory on cpu), is "
                 "refused before anything is allocated");
  app.add_option("--steps", options.steps,
                 "training steps to run (0: only --load/--save)")
      ->check(integerFrom<int64_t>(0, kInt64Max))
      ->capture_default_str();
  app.add_option("--seed", options.seed,
                 "seed of parameter init and of the data (synthetic "
                 "sequences or token-file windows)")
      ->check(integerFrom<uint64_t>(0, std::numeric_limits<uint64_t>::max()))
      ->capture_default_str();
  app.add_option("--metrics", options.metricsPath,
                 "JSON-lines file rank 0 writes one object per step to");
  app.add_option("--timeout-s", options.timeoutS,
                 "seconds a communication may wait before failing")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--save-params", options.saveParamsDir,
                 "after the last step, write DIR/<param>.bin (fp32)");
  app.add_option("--log-dir", options.logDir,
                 "write each spawned rank's stderr to DIR/rank-<R>.log");
}

/// The training data (--data, --data-dtype) and the files parameters and
/// gradients are saved to or loaded from.
void addDataOptions(CLI::App &app, RunOptions &options) {
  CLI::Option *data = app.add_option(
      "--data", options.dataPath,
      "train on windows of this token file instead of synthetic data "
      "(docs/data.md)");
  app.add_option("--data-dtype", options.dataDType,
                 "token width of --data: uint16 or uint32 (default: the "
                 "file's header, else uint16)")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->needs(data);
  app.add_option("--save-grads", options.saveGradsPath,
                 "after the last step, write the gradient accumulators to "
                 "this safetensors file (meaningful for plans compiled with "
                 "piperc --no-optimizer, whose gradients are never cleared)");
  app.add_option("--save", options.savePath,
                 "after the last step, write all parameters to this "
                 "safetensors file");
  app.add_option("--load", options.loadPath,
                 "before the first step, read all parameters from this "
                 "safetensors file, or from this Hugging Face model folder "
                 "for models built with piperc model --hf (instead of "
                 "initializing them)");
  CLI::Option *saveHf = app.add_option(
      "--save-hf", options.saveHfDir,
      "after the last step, write the parameters to this folder as a "
      "Hugging Face model (config.json and safetensors; models built with "
      "piperc model --hf)");
  app.add_option("--hf-dtype", options.hfDType,
                 "the dtype of --save-hf's tensors: fp32 or bf16")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, std::string>{{"fp32", "F32"}, {"bf16", "BF16"}},
          CLI::ignore_case))
      ->needs(saveHf);
  app.add_option("--hf-shard-size", options.hfShardSize,
                 "the most tensor data of one --save-hf file, as "
                 "save_pretrained's max_shard_size: bytes, or a number with "
                 "KB, MB, GB (powers of 1000) or KiB, MiB, GiB; more makes "
                 "shards and an index")
      ->needs(saveHf)
      ->capture_default_str();
}

/// Measurements: --profile, and the --trace of one step.
void addProfilingOptions(CLI::App &app, RunOptions &options) {
  app.add_flag("--profile{host}", options.profileMode,
               "time every kernel op and instruction kind (first step "
               "excluded) and print a table at the end; --profile=gpu also "
               "times every device launch on the device (cuda; the host "
               "clock on cuda-emulation); also PIPER_PROFILE=1 or =gpu")
      ->check(CLI::IsMember({"host", "gpu"}));
  CLI::Option *trace = app.add_option(
      "--trace", options.tracePath,
      "write the measured timeline of one step (every instruction of every "
      "stream of every rank) to this Chrome/Perfetto trace file");
  app.add_option("--trace-step", options.traceStep,
                 "the step --trace records (default: the last step run)")
      ->check(integerFrom<int64_t>(1, kInt64Max))
      ->needs(trace);
}

/// Checkpoints, resume and restarts (docs/operations.md).
void addCheckpointOptions(CLI::App &app, RunOptions &options) {
  CLI::Option *checkpointDir = app.add_option(
      "--checkpoint-dir", options.checkpointDir,
      "periodic checkpoints (parameters, AdamW moments, step) go to "
      "DIR/step-<N>/; --resume reads the newest complete one");
  app.add_option("--checkpoint-every", options.checkpointEvery,
                 "write a checkpoint after every N-th step")
      ->check(integerFrom<int64_t>(1, kInt64Max))
      ->needs(checkpointDir);
  app.add_option("--keep-checkpoints", options.keepCheckpoints,
                 "keep the newest K complete checkpoints, remove older ones")
      ->check(CLI::PositiveNumber)
      ->needs(checkpointDir)
      ->capture_default_str();
  app.add_flag(
      "--resume", options.resume,
      "start from the newest complete checkpoint of --checkpoint-dir (fresh "
      "if none); --steps is then the total step count");
  app.add_flag("--resume-fallback", options.resumeFallback,
               "when resuming (--resume, restarts), skip checkpoints that "
               "fail verification (a CRC-32, a run id, a NaN) for the newest "
               "older one that verifies, instead of refusing to start")
      ->needs(checkpointDir);
  app.add_option("--max-restarts", options.maxRestarts,
                 "after a rank fails, relaunch all ranks from the newest "
                 "checkpoint, up to N times (local launcher)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--standby", options.standby,
                 "start K spare ranks that load the strategy and park; a "
                 "failed rank's place goes to one of them (local launcher)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

/// Progress output (docs/piper-run.md#output).
void addProgressOptions(CLI::App &app, RunOptions &options) {
  app.add_option("--log-every", options.logEvery,
                 "print a progress line every N steps (and the last step)")
      ->check(integerFrom<int64_t>(kInt64Min, kInt64Max)) // < 1: below
      ->capture_default_str();
}

/// An empty file name means "none" inside, so `--save ''` (an unset shell
/// variable) would silently save nothing. Returns false, with `exitCode` 2,
/// after printing the first file option given an empty name.
bool checkFileNames(const CLI::App &app, const RunOptions &options,
                    int &exitCode) {
  const std::pair<const char *, const std::string *> files[] = {
      {"--metrics", &options.metricsPath},
      {"--save-params", &options.saveParamsDir},
      {"--log-dir", &options.logDir},
      {"--data", &options.dataPath},
      {"--save-grads", &options.saveGradsPath},
      {"--save", &options.savePath},
      {"--load", &options.loadPath},
      {"--save-hf", &options.saveHfDir},
      {"--trace", &options.tracePath}};
  for (const auto &[flag, value] : files)
    if (app.count(flag) > 0 && value->empty()) {
      std::fprintf(stderr, "piper-run: %s needs a file name, not ''\n", flag);
      exitCode = 2;
      return false;
    }
  return true;
}

/// The usage errors of option combinations and values CLI11 cannot check:
/// resume, restarts and standbys against --checkpoint-dir and --load, the
/// traced step, --log-every and --nproc. Returns false, with `exitCode` 2,
/// after printing the first.
bool checkOptionCombinations(const CLI::App &app, const RunOptions &options,
                             int &exitCode) {
  auto usage = [&](const char *message) {
    std::fprintf(stderr, "piper-run: %s\n", message);
    exitCode = 2;
    return false;
  };
  if (options.checkpointDir.empty() && app.count("--checkpoint-dir") > 0)
    return usage("--checkpoint-dir needs a directory name, not ''");
  if (options.resume && options.checkpointDir.empty())
    return usage("--resume needs --checkpoint-dir (the directory to resume "
                 "from)");
  if (options.maxRestarts > 0 && options.checkpointDir.empty())
    return usage("--max-restarts needs --checkpoint-dir (restarts resume "
                 "from its newest checkpoint)");
  if (options.maxRestarts > 0 && !options.loadPath.empty())
    return usage("--max-restarts cannot restart a run from --load; start "
                 "it with --checkpoint-dir and --resume instead");
  if (options.standby > 0 && !options.loadPath.empty())
    return usage("--standby cannot continue a run from --load; start it "
                 "with --checkpoint-dir and --resume instead");
  if (options.resume && !options.loadPath.empty())
    return usage("--resume and --load both choose the starting parameters; "
                 "give one");
  // --trace: a fresh run's steps are known now (resumed ones: in the rank).
  if (!options.tracePath.empty() && !options.resume &&
      options.loadPath.empty()) {
    if (options.steps == 0)
      return usage("--trace: this run has no step to trace (--steps 0)");
    if (options.traceStep > options.steps) {
      std::fprintf(stderr,
                   "piper-run: --trace-step %lld is not a step of this run "
                   "(it runs steps 1 to %lld)\n",
                   static_cast<long long>(options.traceStep),
                   static_cast<long long>(options.steps));
      exitCode = 2;
      return false;
    }
  }
  // --- Progress output ---
  if (options.logEvery < 1) {
    std::fprintf(stderr,
                 "piper-run: --log-every must be at least 1, not %lld\n",
                 static_cast<long long>(options.logEvery));
    exitCode = 2;
    return false;
  }
  if (app.count("--nproc") > 0 && options.nproc < 1) {
    std::fprintf(stderr, "piper-run: --nproc must be at least 1, not %d\n",
                 options.nproc);
    exitCode = 2;
    return false;
  }
  return true;
}

} // namespace

bool parseRunOptions(int argc, char **argv, RunOptions &options,
                     int &exitCode) {
  CLI::App app{"piper-run: runs a compiled Piper strategy on local CPU "
               "processes (docs/piper-run.md)",
               "piper-run"};
  addRunOptions(app, options);
  addDataOptions(app, options);
  addProfilingOptions(app, options);
  addCheckpointOptions(app, options);
  addProgressOptions(app, options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    // A malformed command line exits 2 (CLI11's own codes are 100+).
    exitCode = app.exit(e) == 0 ? 0 : 2;
    return false;
  }
  options.profile = !options.profileMode.empty();
  // Sizes as save_pretrained's max_shard_size and nvidia-smi write them.
  StatusOr<int64_t> shard = parseByteSize(options.hfShardSize);
  if (!shard || *shard < 1) {
    std::fprintf(stderr,
                 "piper-run: --hf-shard-size must be a positive size such as "
                 "5GB or 500MiB, not '%s'\n",
                 options.hfShardSize.c_str());
    exitCode = 2;
    return false;
  }
  options.hfShardBytes = static_cast<uint64_t>(*shard);
  if (!options.deviceMemory.empty()) {
    StatusOr<int64_t> cap = parseByteSize(options.deviceMemory);
    if (!cap) {
      std::fprintf(stderr, "piper-run: --device-memory %s\n",
                   cap.status().message().c_str());
      exitCode = 2;
      return false;
    }
    options.deviceMemoryBytes = *cap;
  }
  return checkFileNames(app, options, exitCode) &&
         checkOptionCombinations(app, options, exitCode);
}

} // namespace piper::runtime

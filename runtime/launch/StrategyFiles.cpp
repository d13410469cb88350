// Loading and checking the manifest, plans and data file of a run.
#include "runtime/launch/StrategyFiles.h"

#include <set>
#include <string>
#include <utility>

#include "proto/PlanFile.h"
#include "runtime/checkpoint/Safetensors.h"
#include "runtime/data/AtomicFile.h"
#include "runtime/exec/Validate.h"
#include "runtime/launch/CheckpointIO.h"
#include "runtime/launch/Checkpoints.h"

namespace piper::runtime {

namespace {

/// `file` inside `dir`, unless it is absolute.
std::string joinPath(const std::string &dir, const std::string &file) {
  if (!file.empty() && file[0] == '/')
    return file;
  return dir + "/" + file;
}

} // namespace

Status loadManifest(const RunOptions &options, plan::Manifest &manifest) {
  std::string path = joinPath(options.outDir, plan::kManifestFileName);
  // The readers read to the end: /dev/zero or a FIFO would never return.
  PIPER_RETURN_IF_ERROR(checkRegularFile(path, "manifest '" + path + "'"));
  std::string err = plan::readManifest(path, manifest);
  if (!err.empty())
    return Status::error(err);
  if (options.backend != "cpu")
    return Status::error("backend '" + options.backend +
                         "' is not available in this build (available: cpu)");
  return Status::ok();
}

Status loadPlan(const RunOptions &options, const plan::Manifest &manifest,
                int index, plan::Plan &plan) {
  std::string path =
      joinPath(options.outDir, manifest.classes(index).plan_file());
  PIPER_RETURN_IF_ERROR(checkRegularFile(path, "plan file '" + path + "'"));
  std::string err = plan::readPlanFile(path, plan);
  return err.empty() ? Status::ok() : Status::error(err);
}

Status loadPlans(const RunOptions &options, const plan::Manifest &manifest,
                 std::vector<plan::Plan> &plans) {
  plans.assign(manifest.classes_size(), plan::Plan());
  for (int c = 0; c < manifest.classes_size(); ++c) {
    PIPER_RETURN_IF_ERROR(loadPlan(options, manifest, c, plans[c]));
    PIPER_RETURN_IF_ERROR(validatePlan(plans[c]).withContext(
        "plan file '" +
        joinPath(options.outDir, manifest.classes(c).plan_file()) +
        "': invalid plan"));
  }
  return Status::ok();
}

bool loadsBatches(const plan::Plan &plan) {
  for (const plan::Stream &stream : plan.streams())
    for (const plan::Instruction &inst : stream.instructions())
      if (inst.kind() == plan::Instruction::LOAD_BATCH)
        return true;
  return false;
}

Status openData(const RunOptions &options, const plan::TrainingConfig &training,
                uint64_t seed, std::unique_ptr<TokenFileData> &out) {
  out.reset();
  if (options.dataPath.empty())
    return Status::ok();
  TokenDType dtype;
  PIPER_RETURN_IF_ERROR(parseTokenDType(options.dataDType, dtype));
  Status st;
  out = openTokenFileData(options.dataPath, dtype, training.vocab_size(),
                          training.seq_len(), seed, st);
  return st;
}

Status checkStrategy(const RunOptions &options,
                     const plan::Manifest &manifest) {
  std::vector<plan::Plan> plans;
  PIPER_RETURN_IF_ERROR(loadPlans(options, manifest, plans));
  PIPER_RETURN_IF_ERROR(
      validateStrategy(manifest, plans).withContext("invalid strategy"));
  if (!options.dataPath.empty()) {
    // Classes normally share one training config; check each distinct one.
    std::set<std::pair<int64_t, int64_t>> checked;
    for (const plan::Plan &p : plans) {
      const plan::TrainingConfig &t = p.training();
      if (!loadsBatches(p) ||
          !checked.insert({t.vocab_size(), t.seq_len()}).second)
        continue;
      std::unique_ptr<TokenFileData> data;
      PIPER_RETURN_IF_ERROR(openData(options, t, options.seed, data));
    }
  }
  if (!options.loadPath.empty()) {
    std::unique_ptr<SafetensorsReader> reader;
    int64_t step = 0;
    PIPER_RETURN_IF_ERROR(
        openCheckpoint(options.loadPath, plans, reader, step));
    PIPER_RETURN_IF_ERROR(
        checkStepRange(options.loadPath, step, options.steps));
  }
  if (options.resume && !plans.empty()) {
    // A checkpoint of another model or run fails here, once.
    ResumePoint resume;
    PIPER_RETURN_IF_ERROR(
        findResumePoint(options.checkpointDir, plans,
                        runIdentity(options, manifest, plans.front()), resume));
  }
  return checkOutputTargets(options);
}

Status checkOutputTargets(const RunOptions &options) {
  if (!options.savePath.empty())
    PIPER_RETURN_IF_ERROR(checkWritableTarget(options.savePath, "--save"));
  if (!options.saveGradsPath.empty())
    PIPER_RETURN_IF_ERROR(
        checkWritableTarget(options.saveGradsPath, "--save-grads"));
  if (!options.metricsPath.empty())
    PIPER_RETURN_IF_ERROR(
        checkWritableTarget(options.metricsPath, "--metrics"));
  if (!options.saveParamsDir.empty())
    PIPER_RETURN_IF_ERROR(checkWritableDirectory(
        options.saveParamsDir,
        "--save-params '" + options.saveParamsDir + "'"));
  if (!options.logDir.empty())
    PIPER_RETURN_IF_ERROR(checkWritableDirectory(
        options.logDir, "--log-dir '" + options.logDir + "'"));
  if (!options.checkpointDir.empty())
    PIPER_RETURN_IF_ERROR(checkWritableDirectory(
        options.checkpointDir,
        "--checkpoint-dir '" + options.checkpointDir + "'"));
  return Status::ok();
}

} // namespace piper::runtime

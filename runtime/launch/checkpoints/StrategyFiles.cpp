// Loading and checking the manifest, plans and data file of a run.
#include "runtime/launch/checkpoints/StrategyFiles.h"

#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "proto/PlanFile.h"
#include "runtime/exec/Validate.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/launch/checkpoints/CheckpointIO.h"
#include "runtime/launch/checkpoints/Checkpoints.h"
#include "runtime/launch/checkpoints/HfFolders.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

namespace {

/// `file` inside `dir`, unless it is absolute.
std::string joinPath(const std::string &dir, const std::string &file) {
  if (!file.empty() && file[0] == '/')
    return file;
  return dir + "/" + file;
}

using google::protobuf::FieldDescriptor;

/// Field `f` of `training` as text ("0.0006", "BF16"), and whether it
/// holds a value (is not the default). Every scalar type is handled, so a
/// field added to TrainingConfig later is checked too.
std::string fieldText(const plan::TrainingConfig &training,
                      const FieldDescriptor *f, bool &set) {
  const google::protobuf::Reflection *r = training.GetReflection();
  if (f->is_repeated()) {
    // The field alone, as text.
    plan::TrainingConfig only = training;
    const google::protobuf::Descriptor *d = only.GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i)
      if (d->field(i) != f)
        r->ClearField(&only, d->field(i));
    set = r->FieldSize(training, f) > 0;
    return "[" + only.ShortDebugString() + "]";
  }
  auto text = [&set](auto value) {
    set = value != decltype(value){};
    return fmt::format("{}", value);
  };
  switch (f->cpp_type()) {
  case FieldDescriptor::CPPTYPE_INT32:
    return text(r->GetInt32(training, f));
  case FieldDescriptor::CPPTYPE_INT64:
    return text(r->GetInt64(training, f));
  case FieldDescriptor::CPPTYPE_UINT32:
    return text(r->GetUInt32(training, f));
  case FieldDescriptor::CPPTYPE_UINT64:
    return text(r->GetUInt64(training, f));
  case FieldDescriptor::CPPTYPE_DOUBLE:
    return text(r->GetDouble(training, f));
  case FieldDescriptor::CPPTYPE_FLOAT:
    return text(r->GetFloat(training, f));
  case FieldDescriptor::CPPTYPE_BOOL:
    return text(r->GetBool(training, f));
  case FieldDescriptor::CPPTYPE_ENUM:
    set = r->GetEnumValue(training, f) != 0;
    return r->GetEnum(training, f)->name();
  case FieldDescriptor::CPPTYPE_STRING:
    return "'" + text(r->GetString(training, f)) + "'";
  case FieldDescriptor::CPPTYPE_MESSAGE:
    set = r->HasField(training, f);
    return "{" + r->GetMessage(training, f).ShortDebugString() + "}";
  }
  set = false;
  return "";
}

/// `training` with an unset compute_dtype written as F32, which it means.
plan::TrainingConfig normalized(const plan::TrainingConfig &training) {
  plan::TrainingConfig t = training;
  if (t.compute_dtype() == plan::DTYPE_UNSPECIFIED)
    t.set_compute_dtype(plan::F32);
  return t;
}

/// "manifest '<path>'".
std::string manifestName(const RunOptions &options) {
  return "manifest '" + joinPath(options.outDir, plan::kManifestFileName) + "'";
}

/// Checks the manifest's training config against the plan of manifest class
/// `index`: every field the plan sets must have the same value in the
/// manifest. (The compiler writes the manifest's config as the merge of its
/// plans': a field a plan leaves unset may come from another class.)
Status checkPlanTraining(const RunOptions &options,
                         const plan::Manifest &manifest, int index,
                         const plan::Plan &plan) {
  if (!manifest.has_training())
    return Status::ok(); // nothing to disagree with; tokens/s uses the plan's
  plan::TrainingConfig ours = normalized(plan.training());
  plan::TrainingConfig theirs = normalized(manifest.training());
  const google::protobuf::Descriptor *d = plan::TrainingConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor *f = d->field(i);
    bool inPlan = false, inManifest = false;
    std::string planValue = fieldText(ours, f, inPlan);
    std::string manifestValue = fieldText(theirs, f, inManifest);
    if (inPlan && planValue != manifestValue)
      return Status::error(fmt::format(
          "{} disagrees with its plans: training.{} is {} in the manifest "
          "but {} in plan file '{}' (device class {})",
          manifestName(options), f->name(),
          inManifest ? manifestValue : "unset", planValue,
          joinPath(options.outDir, manifest.classes(index).plan_file()),
          manifest.classes(index).device_class()));
  }
  return Status::ok();
}

/// Checks that every training field the manifest sets is set by some plan
/// (checkPlanTraining checked that they agree).
Status checkManifestTraining(const RunOptions &options,
                             const plan::Manifest &manifest,
                             const std::vector<plan::Plan> &plans) {
  if (!manifest.has_training())
    return Status::ok();
  plan::TrainingConfig theirs = normalized(manifest.training());
  const google::protobuf::Descriptor *d = plan::TrainingConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor *f = d->field(i);
    bool inManifest = false, inPlans = false;
    std::string value = fieldText(theirs, f, inManifest);
    for (const plan::Plan &p : plans) {
      bool set = false;
      (void)fieldText(normalized(p.training()), f, set);
      inPlans = inPlans || set;
    }
    if (inManifest && !inPlans)
      return Status::error(fmt::format(
          "{} disagrees with its plans: training.{} is {} in the manifest "
          "but unset in every plan",
          manifestName(options), f->name(), value));
  }
  return Status::ok();
}

} // namespace

Status loadManifest(const RunOptions &options, plan::Manifest &manifest) {
  std::string path = joinPath(options.outDir, plan::kManifestFileName);
  // The readers read to the end: /dev/zero or a FIFO would never return.
  PIPER_RETURN_IF_ERROR(checkRegularFile(path, "manifest '" + path + "'"));
  std::string err = plan::readManifest(path, manifest);
  if (!err.empty())
    return Status::error(err);
  if (options.comm == "nccl" && options.backend != "cuda")
    return Status::error("--comm nccl needs --backend cuda (NCCL runs on "
                         "GPUs)");
  if (options.profileMode == "gpu" && options.backend == "cpu")
    return Status::error("--profile=gpu needs --backend cuda or "
                         "cuda-emulation (the cpu backend has no device "
                         "launches: --profile times its kernels)");
  if (options.attention == "cudnn" && options.backend == "cpu")
    return Status::error("--attention cudnn needs --backend cuda (cuDNN's "
                         "fused attention runs on GPUs; the cpu backend runs "
                         "its own kernels), or cuda-emulation (its host "
                         "model)");
  if (options.backend == "cuda") {
    // Fails here, before any rank starts, when this build or machine cannot
    // run CUDA (runtime/hal/cuda/CudaBackend.h).
    Status cuda = hal::checkCudaBackend();
    if (!cuda)
      return Status::error("backend 'cuda': " + cuda.message());
  } else if (options.backend != "cpu" && options.backend != "cuda-emulation") {
    return Status::error("backend '" + options.backend +
                         "' is not available in this build (available: cpu" +
                         (hal::cudaBackendBuilt() ? ", cuda" : "") +
                         ", cuda-emulation)");
  }
  if (options.attention == "cudnn" &&
      manifest.training().compute_dtype() != plan::BF16)
    return Status::error("--attention cudnn: cuDNN's fused attention runs "
                         "bf16 plans only, and this strategy is fp32 "
                         "(compile it with piperc compile --dtype bf16, or "
                         "use --attention auto: fp32 plans run the SIMT "
                         "kernels)");
  return Status::ok();
}

Status loadPlan(const RunOptions &options, const plan::Manifest &manifest,
                int index, plan::Plan &plan) {
  std::string path =
      joinPath(options.outDir, manifest.classes(index).plan_file());
  PIPER_RETURN_IF_ERROR(checkRegularFile(path, "plan file '" + path + "'"));
  std::string err = plan::readPlanFile(path, plan);
  if (!err.empty())
    return Status::error(err);
  return checkPlanTraining(options, manifest, index, plan);
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
  return checkManifestTraining(options, manifest, plans);
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
  PIPER_ASSIGN_OR_RETURN(TokenDType dtype, parseTokenDType(options.dataDType));
  PIPER_ASSIGN_OR_RETURN(out, openTokenFileData(options.dataPath, dtype,
                                                training.vocab_size(),
                                                training.seq_len(), seed));
  return Status::ok();
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
  if (!options.loadPath.empty() && isDirectory(options.loadPath)) {
    Status st;
    if (!HfStateSource::open(options.loadPath, manifest, plans, st))
      return st;
  } else if (!options.loadPath.empty()) {
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
                        runIdentity(options, manifest, plans.front()),
                        options.resumeFallback, resume));
  }
  if (!options.saveHfDir.empty())
    PIPER_RETURN_IF_ERROR(checkHfExport(options.saveHfDir, manifest));
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
  if (!options.tracePath.empty())
    PIPER_RETURN_IF_ERROR(checkWritableTarget(options.tracePath, "--trace"));
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

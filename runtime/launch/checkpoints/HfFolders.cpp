// Hugging Face folders for a whole strategy: see HfFolders.h.
#include "runtime/launch/checkpoints/HfFolders.h"

#include <algorithm>
#include <set>

#include "proto/PlanShards.h"
#include "runtime/launch/checkpoints/Checkpoints.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

namespace {

Status notFromHf(const std::string &what) {
  return Status::error(
      what + ": the model was not built from a Hugging Face configuration "
             "(piperc model --hf DIR); its parameters have no Hugging Face "
             "names");
}

} // namespace

std::vector<HfParam> strategyHfParams(const std::vector<plan::Plan> &plans) {
  std::vector<HfParam> out;
  std::set<std::string> seen;
  for (const plan::Plan &plan : plans)
    for (const plan::Parameter &p : plan.params()) {
      if (!seen.insert(p.name()).second)
        continue;
      HfParam param{p.name(), plan::globalShape(p), {}};
      for (const plan::HfSource &s : p.hf_sources())
        param.sources.push_back(
            HfPlacement{s.name(),
                        {s.shape().begin(), s.shape().end()},
                        s.transpose(),
                        s.index(),
                        s.offset()});
      out.push_back(std::move(param));
    }
  return out;
}

std::unique_ptr<HfStateSource>
HfStateSource::open(const std::string &dir, const plan::Manifest &manifest,
                    const std::vector<plan::Plan> &plans, Status &status) {
  const std::string what = "--load '" + dir + "'";
  if (isRegularFile(dir + "/" + kCheckpointStateFile)) {
    status = Status::error(
        what +
        ": a checkpoint directory of --checkpoint-dir, not a Hugging "
        "Face folder: continue it with --checkpoint-dir <its parent> "
        "--resume, or --load its " +
        kCheckpointModelFile + " (unsharded checkpoints)");
    return nullptr;
  }
  if (manifest.hf_config().empty()) {
    status = notFromHf(what);
    return nullptr;
  }
  std::unique_ptr<HfStateSource> s(new HfStateSource());
  s->folder = HfFolder::open(dir, status);
  if (!s->folder)
    return nullptr;
  if (s->folder->configText().empty()) {
    status = Status::error("Hugging Face folder '" + dir + "' has no " +
                           kHfConfigFile);
    return nullptr;
  }
  status =
      checkHfConfigsMatch(s->folder->configText(), manifest.hf_config(), dir);
  if (!status)
    return nullptr;
  s->params = strategyHfParams(plans);
  status = checkHfFolder(*s->folder, s->params);
  if (!status)
    return nullptr;
  return s;
}

Status HfStateSource::read(const std::string &name, int64_t start,
                           int64_t count, float *out) const {
  if (cached < 0 || params[cached].name != name) {
    auto it = std::find_if(params.begin(), params.end(),
                           [&](const HfParam &p) { return p.name == name; });
    if (it == params.end())
      return Status::error("Hugging Face folder '" + folder->dir() +
                           "': no parameter '" + name + "'");
    sources.clear();
    cached = static_cast<int>(it - params.begin());
  }
  return readHfParamRange(*folder, params[cached], start, count, out, sources);
}

Status checkHfExport(const std::string &dir, const plan::Manifest &manifest) {
  const std::string what = "--save-hf '" + dir + "'";
  if (manifest.hf_config().empty())
    return notFromHf(what);
  return checkWritableDirectory(dir, what);
}

Status exportHfFolder(const std::string &dir, const std::string &checkpoint,
                      const plan::Manifest &manifest,
                      const std::vector<plan::Plan> &plans,
                      const std::string &dtype, uint64_t maxShardBytes) {
  Status st;
  std::unique_ptr<SafetensorsReader> reader =
      SafetensorsReader::open(checkpoint, st);
  if (!reader)
    return st;
  auto read = [&](const HfParam &p, std::vector<float> &out) -> Status {
    const SafetensorsEntry *e = reader->find(p.name);
    if (!e || e->dtype != "F32" || e->shape != p.shape)
      return Status::error("checkpoint '" + checkpoint +
                           "': internal: no F32 tensor '" + p.name +
                           "' of the parameter's shape");
    out.resize((e->end - e->begin) / 4);
    return reader->read(*e, out.data());
  };
  return writeHfFolder(dir, manifest.hf_config(), strategyHfParams(plans), read,
                       dtype, maxShardBytes)
      .withContext("--save-hf '" + dir + "'");
}

} // namespace piper::runtime

// Hugging Face model folders (docs/hugging-face.md): reading the weights of
// `model.safetensors` or of a sharded `model.safetensors.index.json` into
// Piper's parameters, one parameter at a time, and writing parameters back
// as such a folder.
#ifndef PIPER_RUNTIME_FORMATS_HFCHECKPOINT_H
#define PIPER_RUNTIME_FORMATS_HFCHECKPOINT_H

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/formats/Safetensors.h"
#include "support/RegularFile.h"
#include "support/Status.h"

namespace piper::runtime {

inline constexpr const char *kHfConfigFile = "config.json";
inline constexpr const char *kHfWeightsFile = "model.safetensors";
inline constexpr const char *kHfIndexFile = "model.safetensors.index.json";

/// Whether `path` names a directory (`--load DIR`: a Hugging Face folder).
bool isDirectory(const std::string &path);
// isRegularFile: support/RegularFile.h.

/// One checkpoint tensor of a parameter (plan.proto HfSource): `name` of
/// `shape`, transposed first when `transpose`, placed at element `offset`
/// of the parameter's last dimension, and at `index` of its first when the
/// parameter has one dimension more.
struct HfPlacement {
  std::string name;
  std::vector<int64_t> shape;
  bool transpose = false;
  int64_t index = 0;
  int64_t offset = 0;
};

/// A parameter (its global shape) and the tensors that make it up.
struct HfParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<HfPlacement> sources;
};

/// The weights of a Hugging Face model folder, validated when opened: the
/// index (if any) parses, every file it names opens as a valid safetensors
/// file (a missing or truncated shard is an error naming it), every tensor
/// it maps is in its file and no file holds a tensor the index does not
/// map to it.
class HfFolder {
public:
  /// Opens `dir`: its model.safetensors.index.json, else its
  /// model.safetensors. Errors start with "Hugging Face folder '<dir>': ".
  static std::unique_ptr<HfFolder> open(const std::string &dir, Status &status);

  const std::string &dir() const { return folder; }
  /// config.json's text ("" when the folder has none).
  const std::string &configText() const { return config; }
  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  /// The name under which the folder holds tensor `name`: `name`, or,
  /// for a checkpoint of the base model (GPT-2's original files hold
  /// "wte.weight", not "transformer.wte.weight"), `name` without its
  /// "transformer." or "model." prefix, as from_pretrained accepts; ""
  /// when it holds neither.
  std::string resolve(const std::string &name) const;
  /// The tensor `name`'s header entry (resolved), or null.
  const SafetensorsEntry *find(const std::string &name) const;
  /// Reads tensor `name` (F32, BF16 or F16) as float32.
  Status readFloat(const std::string &name, std::vector<float> &out) const;

private:
  HfFolder() = default;
  std::string folder, config;
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  /// Tensor name -> index into `files`.
  std::map<std::string, size_t> where;
};

/// Checks `folder` against `params` before anything is read: every source
/// tensor is present with its shape and a dtype Piper reads (F32, BF16,
/// F16), and no tensor is left over but those `transformers` ignores too
/// (rotary `inv_freq` buffers, and `lm_head.weight` when the model ties its
/// head to the embedding). One error lists every problem.
Status checkHfFolder(const HfFolder &folder,
                     const std::vector<HfParam> &params);

/// The global float32 tensor of `param`, assembled from its sources.
Status readHfParam(const HfFolder &folder, const HfParam &param,
                   std::vector<float> &out);

/// Source tensors read, by name (readHfParamRange).
using HfSourceCache = std::map<std::string, std::vector<float>>;

/// Elements [start, start + count) of `param`'s global tensor (row-major),
/// reading only the source tensors whose elements lie in that range (an
/// expert-parallel rank's block of experts reads those experts' tensors
/// alone). Sources read are kept in `cache` for further ranges of the same
/// parameter: clear it before another parameter.
Status readHfParamRange(const HfFolder &folder, const HfParam &param,
                        int64_t start, int64_t count, float *out,
                        HfSourceCache &cache);

/// Checks that `folderConfig` (a folder's config.json) describes the same
/// model as `modelConfig` (the one the strategy was compiled from): every
/// key but the neutral ones (names, versions, the stored dtype) has the same
/// value. An error names each key that differs.
Status checkHfConfigsMatch(const std::string &folderConfig,
                           const std::string &modelConfig,
                           const std::string &folderName);

/// Reads parameter `param`'s global float32 tensor into `out`.
using HfParamReader =
    std::function<Status(const HfParam &param, std::vector<float> &out)>;

/// Writes a Hugging Face folder to `dir`: config.json (`configText`), and
/// every source tensor of `params` (each parameter's global tensor read
/// with `read`, one at a time) in `dtype` ("F32" or "BF16"), in files
/// of at most `maxShardBytes` of tensor data (a tensor larger than that
/// gets a file of its own): one model.safetensors, or
/// model-0000K-of-0000N.safetensors and model.safetensors.index.json. The
/// export is all or nothing: it is written into a temporary folder beside
/// `dir` (`.<name>.piper-export-<pid>`), which then takes `dir`'s place in
/// one atomic exchange (renameat2 RENAME_EXCHANGE), so that `dir` holds
/// either the complete earlier export or the complete new one, never a mix
/// and no shard of another layout. Files of `dir` that are not an export's
/// (a tokenizer, a README) are carried over. A temporary folder a killed
/// export left behind is removed by the next export to `dir`.
Status writeHfFolder(const std::string &dir, const std::string &configText,
                     const std::vector<HfParam> &params,
                     const HfParamReader &read, const std::string &dtype,
                     uint64_t maxShardBytes);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_HFCHECKPOINT_H

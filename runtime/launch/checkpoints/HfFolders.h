// Hugging Face folders for a whole strategy (docs/hugging-face.md):
// `piper-run --load DIR` reads one into every rank's parameters (each rank
// assembling, one parameter at a time, what it holds of it), and
// `--save-hf DIR` writes the trained parameters back as one.
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_HFFOLDERS_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_HFFOLDERS_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/exec/Executor.h"
#include "runtime/formats/HfCheckpoint.h"
#include "support/Status.h"

namespace piper::runtime {

/// Every parameter of the strategy with its Hugging Face tensors, each name
/// once, in class order.
std::vector<HfParam> strategyHfParams(const std::vector<plan::Plan> &plans);

/// A Hugging Face folder as the parameters of a strategy: read(name, start,
/// count) places the elements of parameter `name` in that range from the
/// tensors that hold them, reading no other (an expert-parallel rank reads
/// its experts' tensors, a ZeRO rank those its range overlaps); the tensors
/// read for the last parameter are kept for its further ranges (a
/// tensor-parallel slice is many).
class HfStateSource : public StateSource {
public:
  /// Opens `dir` for the strategy of `manifest` and `plans` and checks it:
  /// the model was built from a Hugging Face configuration, the folder's
  /// config.json describes the same model, and its tensors are the
  /// model's (checkHfFolder).
  static std::unique_ptr<HfStateSource>
  open(const std::string &dir, const plan::Manifest &manifest,
       const std::vector<plan::Plan> &plans, Status &status);

  Status read(const std::string &name, int64_t start, int64_t count,
              float *out) const override;

private:
  HfStateSource() = default;
  std::unique_ptr<HfFolder> folder;
  std::vector<HfParam> params;
  mutable int cached = -1;
  mutable HfSourceCache sources;
};

/// Checks, before any work, that `--save-hf dir` can be written: the model
/// was built from a Hugging Face configuration and `dir` is writable.
Status checkHfExport(const std::string &dir, const plan::Manifest &manifest);

/// Writes the Hugging Face folder `dir` from `checkpoint` (a --save file of
/// the same strategy), with the manifest's config.json, in `dtype` ("F32"
/// or "BF16"), in shards of at most `maxShardBytes`.
Status exportHfFolder(const std::string &dir, const std::string &checkpoint,
                      const plan::Manifest &manifest,
                      const std::vector<plan::Plan> &plans,
                      const std::string &dtype, uint64_t maxShardBytes);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_HFFOLDERS_H

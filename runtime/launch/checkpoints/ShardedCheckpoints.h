// Sharded checkpoints: one safetensors file per rank holding the slices of
// parameters and AdamW moments it alone holds (Executor::saveShards), read
// back by flat ranges under any strategy.
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_SHARDEDCHECKPOINTS_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_SHARDEDCHECKPOINTS_H

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/PlanShards.h"
#include "runtime/exec/Executor.h"
#include "runtime/formats/Safetensors.h"

namespace piper::runtime {

/// "rank-<R>.safetensors".
std::string shardFileName(int rank);

/// Every slice of a sharded checkpoint's files, by tensor name.
class ShardIndex : public StateSource {
public:
  /// Indexes `files` (open, and verified to be of one checkpoint) by
  /// their piper.slices metadata, and keeps them.
  Status open(std::vector<std::unique_ptr<SafetensorsReader>> files);
  /// Every parameter of `params`, and both its moments, is held whole
  /// (with that global shape) by the union of the slices.
  Status check(const std::vector<ParamSpec> &params) const;
  Status read(const std::string &name, int64_t start, int64_t count,
              float *out) const override;

private:
  /// A tensor's elements in one file: runs of the global tensor, in the
  /// entry's order (one run for a flat range).
  struct Piece {
    int reader;
    const SafetensorsEntry *entry;
    std::vector<plan::SliceRun> runs;
  };
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;
  };
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  std::map<std::string, Tensor> tensors;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_SHARDEDCHECKPOINTS_H

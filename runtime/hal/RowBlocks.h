// The blocks of a captured step's all-to-all (hal::Device::packRowBlocks,
// docs/runtime.md "Steps as graphs"): their shape and the fault codes the
// device leaves for the executor. No dependencies: the GPU kernel layer
// (runtime/hal/gpu, compiled by nvcc too) and the HAL share it.
#ifndef PIPER_RUNTIME_HAL_ROWBLOCKS_H
#define PIPER_RUNTIME_HAL_ROWBLOCKS_H

#include <cstdint>

namespace piper::runtime::hal {

/// `members` blocks of `blockRows` rows of `rowBytes`; `rows`: the input's
/// rows (packing) or the output's (unpacking).
struct RowBlocks {
  int64_t members = 0, blockRows = 0, rows = 0, rowBytes = 0;
};

/// Why an all-to-all's counts did not fit its blocks (0: they did).
enum class RowBlockFault : int32_t {
  kNone = 0,
  /// A count negative or above the block.
  kCount = 1,
  /// Send counts summing past the input's rows.
  kInput = 2,
  /// A member sent -1 (its own counts did not fit).
  kPeer = 3,
  /// Received counts summing past the output's rows.
  kOutput = 4,
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_ROWBLOCKS_H

// Internal to runtime/exec: views of the executor's tensors (persistent
// state, step buffers) in its one arena from the device's HAL allocator.
#ifndef PIPER_RUNTIME_EXEC_TENSOR_H
#define PIPER_RUNTIME_EXEC_TENSOR_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/exec/Validate.h"
#include "runtime/hal/Hal.h"
#include "runtime/kernels/Kernels.h"

namespace piper::runtime {

/// A dense tensor of the executor: a view at its planned offset in the
/// executor's one arena (docs/memory-plan.md). It owns nothing; the arena
/// outlives every view. Views are shared: a SEND keeps its view until the
/// send completes.
struct DeviceTensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  void *data = nullptr;

  TensorRef ref() const { return TensorRef{dtype, shape, data}; }
};
using TensorPtr = std::shared_ptr<DeviceTensor>;

/// A view of `bytes` at `data` (inside the arena) typed as `dtype` with the
/// shape of `type`.
inline TensorPtr viewTensor(plan::DType dtype, const plan::TensorType &type,
                            int64_t bytes, void *data) {
  auto t = std::make_shared<DeviceTensor>();
  t->dtype = dtype;
  t->shape.assign(type.shape().begin(), type.shape().end());
  t->bytes = bytes;
  t->data = data;
  return t;
}

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_TENSOR_H

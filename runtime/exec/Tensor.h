// Internal to runtime/exec: tensors the executor owns, with storage from the
// device's HAL allocator (persistent state, step buffers, segment values).
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

/// Owned, 64-byte aligned device storage of one dense tensor. Tensors are
/// shared: a SEND keeps its tensor alive until the send completes, even after
/// the buffer's last reader has let go of it.
struct DeviceTensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  void *data = nullptr;
  hal::Allocator *allocator = nullptr; // must outlive the tensor

  DeviceTensor() = default;
  DeviceTensor(const DeviceTensor &) = delete;
  DeviceTensor &operator=(const DeviceTensor &) = delete;
  ~DeviceTensor() {
    if (data)
      allocator->deallocate(data, static_cast<size_t>(bytes));
  }
  TensorRef ref() const { return TensorRef{dtype, shape, data}; }
};
using TensorPtr = std::shared_ptr<DeviceTensor>;

/// Allocates a zeroed tensor of `type` (already validated) from `allocator`,
/// or returns an error naming what `describe()` returns (called only then:
/// segment values are allocated hundreds of times per step).
template <typename Describe>
Status allocateTensorAs(const plan::TensorType &type, const Describe &describe,
                        hal::Allocator &allocator, TensorPtr &out) {
  auto t = std::make_shared<DeviceTensor>();
  t->dtype = type.dtype();
  t->shape.assign(type.shape().begin(), type.shape().end());
  t->bytes = tensorBytes(type);
  if (t->bytes < 0)
    return Status::error(describe() + " has an invalid shape");
  t->data = allocator.allocate(static_cast<size_t>(t->bytes));
  if (!t->data)
    return Status::error("out of memory allocating " + describe() + " (" +
                         std::to_string(t->bytes) + " bytes)");
  t->allocator = &allocator;
  allocator.zero(t->data, static_cast<size_t>(t->bytes));
  out = std::move(t);
  return Status::ok();
}

/// allocateTensorAs with a fixed description.
inline Status allocateTensor(const plan::TensorType &type,
                             const std::string &what, hal::Allocator &allocator,
                             TensorPtr &out) {
  return allocateTensorAs(
      type, [&] { return what; }, allocator, out);
}

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_TENSOR_H

// CPU kernels of the runtime: forward and backward of every op a plan can
// call, in a registry that resolves op names once, when a plan loads.
#ifndef PIPER_RUNTIME_KERNELS_KERNELS_H
#define PIPER_RUNTIME_KERNELS_KERNELS_H

#include <cstdint>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/support/Status.h"

namespace piper::runtime {

/// A view of a dense row-major tensor. The storage is owned elsewhere.
struct TensorRef {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  void *data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  float *f32() const { return static_cast<float *>(data); }
  int32_t *i32() const { return static_cast<int32_t *>(data); }
};

/// What a kernel may read or write besides its operands.
struct KernelContext {
  /// Step-loss accumulator; `loss_accumulate` adds `scale * loss` to it.
  double *lossAccumulator = nullptr;
  /// 1-based optimizer step (AdamW bias correction).
  int64_t step = 1;
  /// Learning-rate schedule multiplier of this step; `adamw` uses
  /// lr * lrScale.
  double lrScale = 1.0;
  /// Mixed precision: this kernel computes in bf16 (its operands hold bf16
  /// values). The CPU kernels ignore it (the executor rounds their results);
  /// the GPU kernels run their GEMMs on bf16 tensor cores.
  bool lowPrecision = false;
};

namespace detail {
struct KernelArgs;
} // namespace detail

/// A kernel implementation: reads its operands and attributes from `args`.
using KernelFn = Status (*)(const detail::KernelArgs &args);

/// One entry of the kernel registry. Executors resolve every kernel of a
/// plan to its KernelInfo once, at load, and call through it.
struct KernelInfo {
  const char *name;
  KernelFn fn;
  /// Position in kernelNames(), e.g. to index per-op tables.
  int index;
};

/// The registry entry of op `name`, or null when no kernel has that name.
/// A string lookup: call it when a plan loads, not per call.
const KernelInfo *findKernel(const std::string &name);

/// Runs the resolved kernel `info` (which must be findKernel(kernel.op())) on
/// `inputs` and `outputs`; see the overload below.
Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                 const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx);

/// Looks up `kernel.op()` and runs it on `inputs` and `outputs`, which the
/// caller has resolved from the kernel's operands, in order. Output tensors are allocated by the caller
/// with the shapes the plan declares; kernels overwrite them unless the kernel
/// is documented to update in place. Checks operand counts, dtypes and shapes,
/// and returns an error naming the op on any mismatch.
Status runKernel(const plan::Kernel &kernel,
                 const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx);

/// Names of all kernels runKernel knows.
std::vector<std::string> kernelNames();

/// The BLAS behind the GEMMs, for performance reports: OpenBLAS's kernel
/// core (e.g. "Haswell", "SkylakeX"; "Prescott" is its slow generic fallback
/// for CPUs it does not recognize, see docs/performance.md) and its thread
/// count.
std::string blasDescription();

/// Vectorized, multithreaded helpers for the executor's gradient clipping:
/// the sum of x[i]^2 in double (in a fixed order: interleaved accumulators
/// per fixed-size chunk, chunks added in order; the same for any thread
/// count), and x[i] *= scale.
double sumOfSquares(const float *x, int64_t n);
void scaleFloats(float *x, float scale, int64_t n);
/// memset(data, 0, bytes) on the kernels' threads (large step buffers).
void zeroBytes(void *data, int64_t bytes);

/// Reads integer attribute `name` of `kernel`, or `dflt` when absent.
int64_t attrInt(const plan::Kernel &kernel, const std::string &name,
                int64_t dflt);
/// Reads float attribute `name` of `kernel`, or `dflt` when absent.
double attrFloat(const plan::Kernel &kernel, const std::string &name,
                 double dflt);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_KERNELS_KERNELS_H

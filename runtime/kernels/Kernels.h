// CPU kernels of the runtime: forward and backward of every op a plan can
// call, in a registry that resolves op names once, when a plan loads.
#ifndef PIPER_RUNTIME_KERNELS_KERNELS_H
#define PIPER_RUNTIME_KERNELS_KERNELS_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "support/Status.h"

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
  /// Step-loss accumulator, one double in device memory (the calling
  /// stream's slot of hal::LossSums); `loss_accumulate` adds `scale * loss`
  /// to it.
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
  /// This rank's member of its tensor-parallel group (plan::Plan's
  /// replica mod training.tensor_parallel): `sp_split` keeps that member's
  /// rows. The plan is one per device class; the member is the rank's.
  int64_t tensorMember = 0;
  /// This rank's member of its context-parallel group
  /// (plan::contextMember): which two chunks of every sequence it holds,
  /// and whose key/value shard a ring attention step reads.
  int64_t contextMember = 0;
  /// The clip factor CLIP_GRADS left in device memory (hal::SquareSums::
  /// factor), or null: `adamw` updates with its gradient times the factor
  /// (a float product, as scaling the gradient first would give: the
  /// clipping costs no pass of its own), and leaves its parameter and
  /// moments as they are where the factor is not finite (a diverged step
  /// updates nothing).
  const float *clipFactor = nullptr;
  /// Mixed precision: the parameter's bf16 copy (fp32 storage holding
  /// bf16 values, as many elements as the parameter), or null: `adamw`
  /// writes the updated parameter rounded to bf16 there, in the pass that
  /// updates it, so that the next step's kernels read it as it is.
  float *bf16Copy = nullptr;
  /// Or, where the next step's kernels read the copy packed (GEMM weights
  /// on the GPU backends: hal::Device::readsPackedInput), the packed bf16
  /// copy (as many uint16 as the parameter's elements) it is written to
  /// instead; at most one of the two is set.
  uint16_t *bf16PackedCopy = nullptr;
};

/// Every attribute name a kernel reads, as a compile-time id: kernels read
/// their attributes by id from a KernelAttrs, never by name from the
/// protobuf. Adding an attribute: an id here (in name order, before kCount),
/// its name at the same position of kAttrNames (Kernels.cpp) and in the
/// spelling test of kernels_test.
enum class KernelAttr : uint8_t {
  kAccumulate,              // "accumulate"
  kBeta1,                   // "beta1"
  kBeta2,                   // "beta2"
  kCapacity,                // "capacity"
  kCp,                      // "cp"
  kEps,                     // "eps"
  kExperts,                 // "experts"
  kHeads,                   // "heads"
  kKvHeads,                 // "kv_heads"
  kLr,                      // "lr"
  kMembers,                 // "members"
  kNormTopk,                // "norm_topk"
  kQuery,                   // "query"
  kRopeFactor,              // "rope_factor"
  kRopeHighFreqFactor,      // "rope_high_freq_factor"
  kRopeLowFreqFactor,       // "rope_low_freq_factor"
  kRopeOriginalMaxPosition, // "rope_original_max_position"
  kRopeTheta,               // "rope_theta"
  kScale,                   // "scale"
  kSeq,                     // "seq"
  kStart,                   // "start"
  kStep,                    // "step"
  kTopK,                    // "top_k"
  kTransposeW,              // "transpose_w"
  kValidCols,               // "valid_cols"
  kVocab,                   // "vocab"
  kWeightDecay,             // "weight_decay"
  kCount,
};

/// The plan's name of attribute `id`, e.g. "kv_heads".
const char *kernelAttrName(KernelAttr id);

/// One kernel's attributes, decoded from plan::Kernel.attrs once, when a
/// plan loads (decodeKernelAttrs), and read by id on every call: no string
/// lookup and no protobuf access per call. A slot keeps the attribute as the
/// plan stores it (absent, an integer, a double, or something else, e.g. a
/// string): decoding never fails, and a kernel's reader (readInt, readFloat,
/// ... in KernelUtil.h) judges the value when the kernel runs, with the
/// kernel's default and the same error messages as reading the protobuf.
/// Attributes no kernel reads (names without a KernelAttr) are dropped.
class KernelAttrs {
public:
  struct Value {
    enum Kind : uint8_t { kAbsent, kInt, kFloat, kOther };
    Kind kind = kAbsent;
    int64_t i = 0; // kInt
    double f = 0;  // kFloat
  };

  const Value &operator[](KernelAttr id) const {
    return values_[static_cast<size_t>(id)];
  }
  Value &operator[](KernelAttr id) { return values_[static_cast<size_t>(id)]; }

private:
  std::array<Value, static_cast<size_t>(KernelAttr::kCount)> values_{};
};

/// Decodes `kernel`'s attributes (a string lookup per attribute: call it
/// when a plan loads, not per call).
KernelAttrs decodeKernelAttrs(const plan::Kernel &kernel);

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

/// One `adamw` call of a group (hal::Device::runAdamwCalls): what
/// runKernel would get.
struct AdamwCall {
  const plan::Kernel *kernel = nullptr;
  const KernelAttrs *attrs = nullptr;
  std::vector<TensorRef> inputs, outputs;
  /// KernelContext::bf16Copy and bf16PackedCopy of this call (null: none).
  float *bf16Copy = nullptr;
  uint16_t *bf16PackedCopy = nullptr;
};

/// Whether kernel `op` reads its outputs (updates them in place: accumulate,
/// adamw). Every other kernel writes every element of every output, so an
/// output it is the first to touch needs no zeroing (the executor skips
/// it); //runtime/hal/gpu:gpu_kernels_test checks both on every kernel case.
bool kernelReadsOutputs(const std::string &op);
/// The same for a kernel call: also linear_grad_weight(_bias) with the
/// `accumulate` flag, which adds the weight gradient to its output.
bool kernelReadsOutputs(const plan::Kernel &kernel);

/// The registry entry of op `name`, or null when no kernel has that name.
/// A string lookup: call it when a plan loads, not per call.
const KernelInfo *findKernel(const std::string &name);

/// Runs the resolved kernel `info` (which must be findKernel(kernel.op())),
/// with `attrs` = decodeKernelAttrs(kernel), on `inputs` and `outputs`; see
/// the overload below.
Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                 const KernelAttrs &attrs, const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &ctx);

/// Looks up `kernel.op()`, decodes its attributes and runs it on `inputs`
/// and `outputs`, which the caller has resolved from the kernel's operands,
/// in order (a convenience for tests and one-off calls: executors resolve
/// and decode once, at load, and call the overload above). Output tensors are
/// allocated by the caller with the shapes the plan declares; kernels overwrite
/// them unless the kernel is documented to update in place. Checks operand
/// counts, dtypes and shapes, and returns an error naming the op on any
/// mismatch.
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

/// A vectorized, multithreaded helper for the gradient norm: the sum of
/// x[i]^2 in double (in a fixed order: interleaved accumulators per
/// fixed-size chunk, chunks added in order; the same for any thread count).
double sumOfSquares(const float *x, int64_t n);
/// memset(data, 0, bytes) on the kernels' threads (large step buffers).
void zeroBytes(void *data, int64_t bytes);

/// Reads integer attribute `name` of `kernel`, or `dflt` when absent (a
/// string lookup in the protobuf; kernels read a KernelAttrs instead).
int64_t attrInt(const plan::Kernel &kernel, const std::string &name,
                int64_t dflt);
/// Reads float attribute `name` of `kernel`, or `dflt` when absent.
double attrFloat(const plan::Kernel &kernel, const std::string &name,
                 double dflt);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_KERNELS_KERNELS_H

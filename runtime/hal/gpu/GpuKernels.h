// The GPU kernel registry: every op of the CPU registry, implemented on the
// GPU kernel layer (Simt.h, GpuApi.h). Both GPU backends use it: CUDA
// (runtime/hal/cuda) and the host emulation (runtime/hal/gpu/host). Each
// kernel checks its operands with the CPU kernel's own check function
// (runtime/kernels/*Checks.h), then queues its launchers on ctx.stream.
//
// Adding a kernel: its check in the CPU kernel's file, its math in a
// *Math.h (host and device), its launcher in a *Launch.inl, its wrapper in
// the group's *Kernels.cpp, and its test in gpu_kernels_test (against the
// CPU kernel, on the emulation everywhere and on CUDA on a GPU).
#ifndef PIPER_RUNTIME_HAL_GPU_GPUKERNELS_H
#define PIPER_RUNTIME_HAL_GPU_GPUKERNELS_H

#include <string>
#include <vector>

#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

using KernelFn = Status (*)(const detail::KernelArgs &args, const Context &ctx);

struct KernelEntry {
  const char *name;
  KernelFn fn;
  /// What the kernel's calls need prepared before the first step, run by
  /// prepareKernel when a plan loads (the operands' data are null: only
  /// their shapes, the attributes and the context count); null: nothing.
  KernelFn prepare = nullptr;
  /// Called with KernelContext::lowPrecision, the kernel stores its fp32
  /// outputs rounded to bf16 (as the executor's rounding pass would, which
  /// it then skips: Device::roundsOutputs): every output of at least one
  /// dimension; scalars (a loss) the executor does not round either.
  bool roundsOutputs = false;
  /// The inputs (bit i: input i) that the kernel, called with
  /// KernelContext::lowPrecision, also takes as packed bf16 (a mixed-
  /// precision plan's step buffer as it is stored): its GEMMs read them
  /// without the executor unpacking them first or the GEMM packing an fp32
  /// copy (Device::readsPackedInput). The same values: the same bits.
  uint32_t packedInputs = 0;
  /// The outputs (bit i: output i) that the kernel, called with
  /// KernelContext::lowPrecision and roundsOutputs, also stores packed
  /// bf16 when given a BF16 TensorRef: the executor then gives it the step
  /// buffer of a result as stored, with no fp32 value and no packing pass
  /// (Device::writesPackedOutput). The same values rounded: the same bits.
  uint32_t packedOutputs = 0;
};

/// An output the kernel may store packed (KernelEntry::packedOutputs):
/// its floats where it is fp32, else null; its packed bf16 where it is
/// packed, else null (storeRounded takes both).
inline float *f32Out(const TensorRef &t) {
  return t.dtype == plan::BF16 ? nullptr : t.f32();
}
inline uint16_t *bf16Out(const TensorRef &t) {
  return t.dtype == plan::BF16 ? static_cast<uint16_t *>(t.data) : nullptr;
}
/// An input the kernel may read packed (KernelEntry::packedInputs): its
/// floats where it is fp32, else null; its packed bf16 where it is packed.
inline const float *f32In(const TensorRef &t) {
  return t.dtype == plan::BF16 ? nullptr : t.f32();
}
inline const uint16_t *bf16In(const TensorRef &t) {
  return t.dtype == plan::BF16 ? static_cast<const uint16_t *>(t.data)
                               : nullptr;
}
/// A GEMM's operand: packed bf16 where the executor passed a step buffer as
/// the plan stores it (Device::readsPackedInput, KernelEntry::packedInputs),
/// else fp32.
inline GemmOperand gemmOperand(const TensorRef &t) {
  if (t.dtype == plan::BF16)
    return static_cast<const uint16_t *>(t.data);
  return t.f32();
}
/// An input the kernel may read packed, as the launchers take it.
inline RowIn rowIn(const TensorRef &t) { return RowIn{f32In(t), bf16In(t)}; }

/// hal::Device::packRowBlocks and unpackRowBlocks on the context's stream
/// (the offsets in its workspace).
Status packRowBlocks(const Context &ctx, const RowBlocks &shape,
                     const void *input, const int32_t *counts, void *blocks,
                     int32_t *sent, int32_t *fault);
Status unpackRowBlocks(const Context &ctx, const RowBlocks &shape,
                       const void *blocks, const int32_t *received,
                       void *output, int32_t *fault);

/// Every GPU kernel; the i-th entry's KernelInfo has index i.
const std::vector<KernelEntry> &kernels();
/// KernelInfos of kernels() for a Device's registry (fn is null: devices
/// dispatch on the index).
const std::vector<KernelInfo> &kernelInfos();
/// The KernelInfo of op `name`, or null (a Device's findKernel).
const KernelInfo *findKernelInfo(const std::string &name);
/// The ops' names, in registry order (a Device's kernelNames).
std::vector<std::string> kernelInfoNames();
/// kernels()[info.index].roundsOutputs (a Device's roundsOutputs).
bool kernelRoundsOutputs(const KernelInfo &info);
/// Whether kernels()[info.index].packedInputs has `input` (a Device's
/// readsPackedInput).
bool kernelReadsPackedInput(const KernelInfo &info, int input);
/// Whether kernels()[info.index].packedOutputs has `output` (a Device's
/// writesPackedOutput).
bool kernelWritesPackedOutput(const KernelInfo &info, int output);
/// kernels()[info.index].fn(args, ctx), with `attrs` =
/// decodeKernelAttrs(kernel); checks the operands' storage as the CPU
/// registry's runKernel does.
Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                 const KernelAttrs &attrs, const std::vector<TensorRef> &inputs,
                 const std::vector<TensorRef> &outputs, KernelContext &kctx,
                 const Context &ctx);

/// Device::prepareKernel: kernels()[info.index].prepare(args, ctx) where
/// the kernel has one (the attention kernels: cuDNN's execution plans and
/// the stream's scratch, docs/gpu.md), with operands that have shapes and
/// no data.
Status prepareKernel(const KernelInfo &info, const plan::Kernel &kernel,
                     const KernelAttrs &attrs,
                     const std::vector<TensorRef> &inputs,
                     const std::vector<TensorRef> &outputs, KernelContext &kctx,
                     const Context &ctx);

/// Device::runAdamwCalls: every call checked as runKernel checks it, then
/// updated in one launch per AdamwBatch (the same bits as one launch per
/// call); `failed` is the call an error belongs to.
Status runAdamwCalls(const std::vector<AdamwCall> &calls, KernelContext &kctx,
                     const Context &ctx, size_t &failed);

// The groups, one per *Kernels.cpp, each appending its entries.
void addElementwiseKernels(std::vector<KernelEntry> &out);
void addLayerKernels(std::vector<KernelEntry> &out);
void addLinearKernels(std::vector<KernelEntry> &out);
void addAttentionKernels(std::vector<KernelEntry> &out);
void addMoeKernels(std::vector<KernelEntry> &out);

// The executor's own elementwise work (hal::Device's methods), for both GPU
// backends.

/// A float array in device memory and where its sum of squares goes (a
/// double in device memory).
struct SquaresJob {
  const float *x = nullptr;
  int64_t n = 0;
  double *result = nullptr;
};
/// For each job, the sum of x[i]^2 in double, in a fixed order (per-chunk
/// partials added in chunk order: the same for any launch), into *result;
/// queued on the stream, no host synchronization (hal::SquareSums).
Status sumsOfSquares(const Context &ctx, const std::vector<SquaresJob> &jobs);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_GPUKERNELS_H

// The elementwise and optimizer GPU kernels (gelu, swiglu, add, accumulate,
// zero, adamw) and the executor's elementwise device work.
#include <algorithm>
#include <cstring>

#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/kernels/ElementwiseChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

using detail::KernelArgs;

Status gelu(const KernelArgs &a, const Context &ctx) {
  PIPER_RETURN_IF_ERROR(detail::checkGelu(a));
  return launchGelu(ctx, rowIn(a.inputs[0]), f32Out(a.outputs[0]),
                    a.inputs[0].numel(), a.ctx.lowPrecision,
                    bf16Out(a.outputs[0]));
}

Status geluGrad(const KernelArgs &a, const Context &ctx) {
  PIPER_RETURN_IF_ERROR(detail::checkGeluGrad(a));
  return launchGeluGrad(ctx, rowIn(a.inputs[0]), rowIn(a.inputs[1]),
                        f32Out(a.outputs[0]), a.inputs[0].numel(),
                        a.ctx.lowPrecision, bf16Out(a.outputs[0]));
}

Status swiglu(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(detail::checkSwiglu(a, rows, width));
  return launchSwiglu(ctx, rowIn(a.inputs[0]), f32Out(a.outputs[0]), rows,
                      width, a.ctx.lowPrecision, bf16Out(a.outputs[0]));
}

Status swigluGrad(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(detail::checkSwigluGrad(a, rows, width));
  return launchSwigluGrad(ctx, rowIn(a.inputs[0]), rowIn(a.inputs[1]),
                          f32Out(a.outputs[0]), rows, width, a.ctx.lowPrecision,
                          bf16Out(a.outputs[0]));
}

Status add(const KernelArgs &a, const Context &ctx) {
  PIPER_RETURN_IF_ERROR(detail::checkAdd(a));
  return launchAdd(ctx, rowIn(a.inputs[0]), rowIn(a.inputs[1]),
                   f32Out(a.outputs[0]), a.inputs[0].numel(),
                   a.ctx.lowPrecision, bf16Out(a.outputs[0]));
}

Status accumulate(const KernelArgs &a, const Context &ctx) {
  PIPER_RETURN_IF_ERROR(detail::checkAccumulate(a));
  return launchAdd(ctx, a.outputs[0].f32(), a.inputs[0].f32(),
                   a.outputs[0].f32(), a.inputs[0].numel());
}

Status zero(const KernelArgs &a, const Context &ctx) {
  PIPER_RETURN_IF_ERROR(detail::checkZero(a));
  return zeroAsync(ctx, a.outputs[0].data,
                   static_cast<size_t>(a.outputs[0].numel()) * 4);
}

/// AdamW calls grouped into launches, with their distinct attribute sets
/// (a constant set each per step).
struct AdamwLaunches {
  std::vector<AdamwBatch> batches;
  std::vector<AdamwHyper> hypers;

  /// Adds the checked call `a` (attributes `h`) to the last batch, or to a
  /// new one when that one is full.
  void append(const KernelArgs &a, const AdamwHyper &h) {
    size_t set = 0;
    while (set < hypers.size() && std::memcmp(&hypers[set], &h, sizeof h) != 0)
      ++set;
    if (set == hypers.size())
      hypers.push_back(h);
    if (batches.empty() || batches.back().count == AdamwBatch::kMax) {
      batches.emplace_back();
      batches.back().offset[0] = 0;
    }
    AdamwBatch &b = batches.back();
    const int j = b.count++;
    b.grad[j] = a.inputs[0].f32();
    b.param[j] = a.outputs[0].f32();
    b.m[j] = a.outputs[1].f32();
    b.v[j] = a.outputs[2].f32();
    b.copy[j] = a.ctx.bf16Copy;
    b.copy16[j] = a.ctx.bf16PackedCopy;
    b.constantsOf[j] = static_cast<uint32_t>(set);
    b.offset[j + 1] = b.offset[j] + a.inputs[0].numel();
  }

  /// Writes step `step`'s constant sets to the host block of call site
  /// `site`'s table and queues their copy to the device on the stream, then
  /// queues every batch, reading them there. A stream capturing the step
  /// keeps the write for each replay (ConstantTables::keepForReplay): the
  /// launches' arguments are the same every step, only the table changes.
  Status launch(const Context &ctx, const void *site, int64_t step,
                double lrScale, const float *clipFactor) const {
    if (batches.empty())
      return Status::ok();
    if (!ctx.constants)
      return Status::error("adamw: the kernel context has no constant tables");
    const size_t bytes = hypers.size() * sizeof(AdamwConstants);
    void *host = nullptr, *device = nullptr;
    PIPER_RETURN_IF_ERROR(ctx.constants->get(site, bytes, host, device));
    ConstantRefill write = [host, hypers = hypers](int64_t t, double scale) {
      auto *sets = static_cast<AdamwConstants *>(host);
      for (size_t j = 0; j < hypers.size(); ++j)
        sets[j] = detail::adamwConstants(hypers[j], t, scale);
    };
    write(step, lrScale);
    ctx.constants->keepForReplay(std::move(write));
    PIPER_RETURN_IF_ERROR(copyToDeviceAsync(ctx, device, host, bytes));
    for (const AdamwBatch &b : batches)
      PIPER_RETURN_IF_ERROR(launchAdamwBatch(
          ctx, b, static_cast<const AdamwConstants *>(device), clipFactor));
    return Status::ok();
  }
};

Status adamw(const KernelArgs &a, const Context &ctx) {
  AdamwHyper h;
  PIPER_RETURN_IF_ERROR(detail::checkAdamw(a, h));
  AdamwLaunches launches;
  launches.append(a, h);
  return launches.launch(ctx, &a.kernel, a.ctx.step, a.ctx.lrScale,
                         a.ctx.clipFactor);
}

Status rowBlockOffsets(const Context &ctx, const RowBlocks &shape,
                       int64_t *&offsets) {
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(shape.members + 1) * sizeof(int64_t), scratch));
  offsets = static_cast<int64_t *>(scratch);
  return Status::ok();
}

} // namespace

Status packRowBlocks(const Context &ctx, const RowBlocks &shape,
                     const void *input, const int32_t *counts, void *blocks,
                     int32_t *sent, int32_t *fault) {
  int64_t *offsets = nullptr;
  PIPER_RETURN_IF_ERROR(rowBlockOffsets(ctx, shape, offsets));
  return launchPackRowBlocks(ctx, shape, input, counts, blocks, sent, fault,
                             offsets);
}

Status unpackRowBlocks(const Context &ctx, const RowBlocks &shape,
                       const void *blocks, const int32_t *received,
                       void *output, int32_t *fault) {
  int64_t *offsets = nullptr;
  PIPER_RETURN_IF_ERROR(rowBlockOffsets(ctx, shape, offsets));
  return launchUnpackRowBlocks(ctx, shape, blocks, received, output, fault,
                               offsets);
}

void addElementwiseKernels(std::vector<KernelEntry> &out) {
  out.insert(out.end(),
             {
                 // These round their results in mixed
                 // precision (Device::roundsOutputs), the
                 // activations of an MLP and their gradients
                 // also stored packed where only GEMMs read
                 // them (packedOutputs); they read their
                 // inputs packed (packedInputs): the
                 // projection's output that the activation
                 // and its gradient read (Llama's gate|up)
                 // is then stored packed by its GEMM.
                 {"gelu", gelu, nullptr, true, 0b1, 0b1},
                 {"gelu_grad", geluGrad, nullptr, true, 0b11, 0b1},
                 {"swiglu", swiglu, nullptr, true, 0b1, 0b1},
                 {"swiglu_grad", swigluGrad, nullptr, true, 0b11, 0b1},
                 // add reads and writes packed too: the sums of
                 // gradients (an input read twice) that GEMMs read.
                 {"add", add, nullptr, true, 0b11, 0b1},
                 {"accumulate", accumulate},
                 {"zero", zero},
                 {"adamw", adamw},
             });
}

Status runAdamwCalls(const std::vector<AdamwCall> &calls, KernelContext &kctx,
                     const Context &ctx, size_t &failed) {
  AdamwLaunches launches;
  for (failed = 0; failed < calls.size(); ++failed) {
    const AdamwCall &call = calls[failed];
    kctx.bf16Copy = call.bf16Copy;
    kctx.bf16PackedCopy = call.bf16PackedCopy;
    KernelArgs a{*call.kernel, *call.attrs, call.inputs, call.outputs, kctx};
    PIPER_RETURN_IF_ERROR(detail::checkOperandStorage(a));
    AdamwHyper h;
    PIPER_RETURN_IF_ERROR(detail::checkAdamw(a, h));
    launches.append(a, h);
  }
  failed = calls.size();
  // The table of these calls is named by the first one's kernel.
  return calls.empty() ? Status::ok()
                       : launches.launch(ctx, calls[0].kernel, kctx.step,
                                         kctx.lrScale, kctx.clipFactor);
}

Status sumsOfSquares(const Context &ctx, const std::vector<SquaresJob> &jobs) {
  // Two launches per SquaresBatch::kMax jobs (a clipped step measures every
  // gradient at once). One block of partials for every batch (the stream
  // runs them in order): reserved once, so that no batch's reservation
  // waits for the stream.
  std::vector<SquaresBatch> batches;
  int64_t chunks = 1;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (i % SquaresBatch::kMax == 0) {
      batches.emplace_back();
      batches.back().firstChunk[0] = 0;
    }
    SquaresBatch &b = batches.back();
    const SquaresJob &job = jobs[i];
    const int64_t n = std::max<int64_t>(job.n, 0);
    b.x[b.count] = job.x;
    b.n[b.count] = n;
    b.result[b.count] = job.result;
    b.firstChunk[b.count + 1] =
        b.firstChunk[b.count] + (n + kSquaresChunk - 1) / kSquaresChunk;
    ++b.count;
    chunks = std::max(chunks, b.firstChunk[b.count]);
  }
  if (batches.empty())
    return Status::ok();
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(chunks) * sizeof(double), scratch));
  double *partials = static_cast<double *>(scratch);
  for (const SquaresBatch &b : batches)
    PIPER_RETURN_IF_ERROR(launchSumsOfSquares(ctx, b, partials));
  return Status::ok();
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

// Launchers of the elementwise GPU kernels (ElementwiseLaunch.inl, compiled
// for CUDA by Elementwise.cu and for the host emulation by
// ElementwiseHost.cpp). Each queues its work on ctx.stream.
#ifndef PIPER_RUNTIME_HAL_GPU_ELEMENTWISELAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_ELEMENTWISELAUNCH_H

#include <cstdint>

#include "runtime/hal/RowBlocks.h"
#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

// With `round` (a mixed-precision call, KernelContext::lowPrecision), each
// launcher stores its results rounded to bf16 (fromBf16(toBf16(v)), the
// bits of the executor's rounding pass, which it then skips: Device::
// roundsOutputs). The gelu and swiglu launchers store their result packed
// bf16 instead (rounded to nearest even) where the packed pointer (`y16`,
// `dx16`, `dgateUp16`) is not null: the fp32 one is then unused
// (storeRounded; Device::writesPackedOutput). Their inputs are RowIns:
// fp32, or packed where the step buffer is (Device::readsPackedInput).
Status launchGelu(const Context &ctx, RowIn x, float *y, int64_t n,
                  bool round = false, uint16_t *y16 = nullptr);
/// dx may alias dy.
Status launchGeluGrad(const Context &ctx, RowIn x, RowIn dy, float *dx,
                      int64_t n, bool round = false, uint16_t *dx16 = nullptr);
/// gateUp is [rows, 2 width] ([gate | up]); y is [rows, width].
Status launchSwiglu(const Context &ctx, RowIn gateUp, float *y, int64_t rows,
                    int64_t width, bool round = false, uint16_t *y16 = nullptr);
Status launchSwigluGrad(const Context &ctx, RowIn gateUp, RowIn dy,
                        float *dgateUp, int64_t rows, int64_t width,
                        bool round = false, uint16_t *dgateUp16 = nullptr);
/// y = a + b (y may alias a or b; a and b may be packed, y stored packed
/// into `y16` where it is not null).
Status launchAdd(const Context &ctx, RowIn a, RowIn b, float *y, int64_t n,
                 bool round = false, uint16_t *y16 = nullptr);
/// Up to kMax AdamW updates (arrays of `adamw` calls) that one launch runs.
/// Their per-step constants are not arguments: update j reads
/// constants[constantsOf[j]] of a table in device memory (ConstantTables),
/// so that the launch's arguments are the same every step.
struct AdamwBatch {
  static constexpr int kMax = 32; // ~1.9 KB of arguments
  int count = 0;
  const float *grad[kMax];
  float *param[kMax], *m[kMax], *v[kMax];
  float *copy[kMax];      // null: no bf16 copy (fp32 storage)
  uint16_t *copy16[kMax]; // null: no packed bf16 copy
  /// Update j's elements are [offset[j], offset[j + 1]) of the launch.
  int64_t offset[kMax + 1];
  uint32_t constantsOf[kMax]; // of at most one set per update
};
/// AdamW (adamwElement) over every update of the batch, with the constant
/// sets `constants` (device memory); where an update's `copy` is not null,
/// the updated parameter rounded to bf16 is written there too, and where
/// its `copy16` is, the same packed. Nothing is
/// touched where `clipFactor` (device memory, may be null) is not finite.
Status launchAdamwBatch(const Context &ctx, const AdamwBatch &batch,
                        const AdamwConstants *constants,
                        const float *clipFactor);
Status launchPackBf16(const Context &ctx, uint16_t *dst, const float *src,
                      int64_t n);
/// A column-major matrix of `rows` x `cols` packed to bf16 with another
/// column stride: dst[c * dstLd + r] = bf16(src[c * srcLd + r]) (the GEMMs'
/// operands, re-strided so that every column starts 16-byte aligned).
Status launchPackBf16Columns(const Context &ctx, uint16_t *dst, int64_t dstLd,
                             const float *src, int64_t srcLd, int64_t rows,
                             int64_t cols);
Status launchUnpackBf16(const Context &ctx, float *dst, const uint16_t *src,
                        int64_t n);
/// hal::Device::packRowBlocks and unpackRowBlocks (the blocks of a
/// captured step's all-to-all, RowBlocks.h); `offsets` is scratch of
/// members + 1 int64 (where each member's rows start in the input or the
/// output).
Status launchPackRowBlocks(const Context &ctx, const RowBlocks &shape,
                           const void *input, const int32_t *counts,
                           void *blocks, int32_t *sent, int32_t *fault,
                           int64_t *offsets);
Status launchUnpackRowBlocks(const Context &ctx, const RowBlocks &shape,
                             const void *blocks, const int32_t *received,
                             void *output, int32_t *fault, int64_t *offsets);
Status launchRoundBf16(const Context &ctx, float *x, int64_t n);
/// A mixed-precision output computed in fp32 at `x`: packed (rounded) into
/// `x16` where the output is stored packed, else rounded in place with
/// `round` (x is then the output).
inline Status packOrRound(const Context &ctx, float *x, uint16_t *x16,
                          int64_t n, bool round) {
  if (x16)
    return launchPackBf16(ctx, x16, x, n);
  return round ? launchRoundBf16(ctx, x, n) : Status::ok();
}
/// launchRoundBf16 of the first `cols` elements of each of `rows` rows `ld`
/// apart (a padded matrix's valid columns; the others are not touched).
Status launchRoundBf16Rows(const Context &ctx, float *x, int64_t rows,
                           int64_t cols, int64_t ld);
/// Up to kMax float arrays whose sums of squares two launches take.
struct SquaresBatch {
  static constexpr int kMax = 48; // ~1.6 KB of kernel arguments
  int count = 0;
  const float *x[kMax];
  int64_t n[kMax];
  double *result[kMax];
  /// Array j's chunks are [firstChunk[j], firstChunk[j + 1]) of the
  /// partials (ceil(n[j] / kSquaresChunk) of them).
  int64_t firstChunk[kMax + 1];
};
/// For each array j of the batch: partials[c] = sum of x[i]^2 over each of
/// its chunks c (kSquaresChunk elements), then *result[j] = the sum of its
/// partials in chunk order, all in double in a fixed order (the same bits
/// whichever arrays share the batch); 0 for an empty array. `partials`
/// holds firstChunk[count] doubles.
Status launchSumsOfSquares(const Context &ctx, const SquaresBatch &batch,
                           double *partials);
/// *total = sum over i < count of slots[i] * weights[i], added in order in
/// double (hal::SquareSums::weigh).
Status launchWeighSquares(const Context &ctx, const double *slots,
                          const double *weights, int64_t count, double *total);
/// *norm = sqrt(*total / replicas), *factor = clipFactorOf(*norm, maxNorm)
/// (hal::SquareSums::clip).
Status launchClipFactor(const Context &ctx, const double *total,
                        double replicas, double maxNorm, double *norm,
                        float *factor);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ELEMENTWISELAUNCH_H

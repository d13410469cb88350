// Launchers of the linear and loss GPU kernels (LinearLaunch.inl, compiled
// for CUDA by Linear.cu and for the host emulation by LinearHost.cpp). Each
// queues its work on ctx.stream; the GEMMs themselves go through gemm()
// (GpuApi.h) from the wrappers (LinearKernels.cpp).
#ifndef PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H

#include <cstdint>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LinearMath.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// y[r, j] = b[j] for y [rows, cols] (the bias as a GEMM's initial C).
Status launchBroadcastRows(const Context &ctx, const float *b, float *y,
                           int64_t rows, int64_t cols);
/// y [rows, narrow] = columns [start, start + narrow) of x [rows, wide]
/// (columns); with `grad`, the other way: dx [rows, wide] zero except
/// those columns, from dy [rows, narrow] (columns_grad).
Status launchColumns(const Context &ctx, const float *in, int64_t rows,
                     int64_t wide, int64_t start, int64_t narrow, bool grad,
                     float *out);
/// tp_kv_assemble (docs/tensor-parallel.md §2b): y [rows, query + 2 share
/// piece] from w [rows, query + 2 piece] and pieces [members rows, 2 piece],
/// key/value head `group`.
Status launchKvAssemble(const Context &ctx, const float *w, const float *pieces,
                        int64_t rows, int64_t query, int64_t piece,
                        int64_t share, int64_t group, float *y);
/// tp_kv_assemble_grad: dpieces [members rows, 2 piece] from dy.
Status launchKvAssembleGrad(const Context &ctx, const float *dy, int64_t rows,
                            int64_t query, int64_t piece, int64_t share,
                            int64_t members, int64_t group, float *dpieces);
/// out[j] = the sum over rows of x[r, j] (x [rows, cols]), in double in a
/// fixed order: partials[c * cols + j] sums the chunk c of kColumnChunkRows
/// rows, then the chunks are added in order. `partials` holds
/// columnSumChunks(rows) * cols doubles. With `x16`, x is read packed
/// (bf16) from there instead (the same sums of the same values).
Status launchColumnSums(const Context &ctx, const float *x, int64_t rows,
                        int64_t cols, double *partials, float *out,
                        const uint16_t *x16 = nullptr);
inline int64_t columnSumChunks(int64_t rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}
/// launchCrossEntropy's sizes: the logits' and dlogits' row strides (ld,
/// gradLd) exceed vocab where the compiler padded them.
struct CrossEntropyDims {
  int64_t rows = 0, vocab = 0, ld = 0, gradLd = 0;
};
/// Softmax cross entropy of logits [rows, vocab] (row stride d.ld; dlogits'
/// d.gradLd) against targets[rows], one warp per row: with `loss`, the mean into *loss (each row's into
/// rowLoss[r], double, `rows` of them, then one warp sums them in a fixed
/// order); with `dlogits`, dlogits = rowScale (softmax(logits) -
/// onehot(targets)). Both: the fused classifier, in one pass. With `round`
/// (a mixed-precision call), dlogits is stored rounded to bf16 (roundedIf,
/// Device::roundsOutputs), and with `roundLoss` the loss (a loss of one
/// dimension, which the executor would round; a scalar it does not).
/// `dlogits16` instead of `dlogits`: stored packed, the same values rounded
/// to bf16 (Device::writesPackedOutput: the fused classifier's step
/// buffer as stored). `logits16` instead of `logits`: the logits packed
/// (Device::readsPackedInput: the head's GEMM wrote them so), the same
/// values.
Status launchCrossEntropy(const Context &ctx, const float *logits,
                          const int32_t *targets, const CrossEntropyDims &d,
                          double *rowLoss, float *loss, double rowScale,
                          float *dlogits, bool round = false,
                          bool roundLoss = false,
                          uint16_t *dlogits16 = nullptr,
                          const uint16_t *logits16 = nullptr);
/// Vocabulary parallelism: member `member` of `members` writes its
/// statistics of logits [rows, vocab] (its columns) into stats [rows,
/// 4 members + 1] (vocab_ce_stats), one warp per row.
Status launchVocabCeStats(const Context &ctx, const float *logits,
                          const int32_t *targets, int64_t rows, int64_t vocab,
                          int64_t members, int64_t member, float *stats);
/// The mean loss from the summed statistics (vocab_cross_entropy).
Status launchVocabCrossEntropy(const Context &ctx, const float *stats,
                               int64_t rows, int64_t members, double *rowLoss,
                               float *loss);
/// This member's columns of the logits' gradient
/// (vocab_cross_entropy_grad).
Status launchVocabCrossEntropyGrad(const Context &ctx, const float *stats,
                                   const float *logits,
                                   const int32_t *targets, int64_t rows,
                                   int64_t vocab, int64_t members,
                                   int64_t member, double rowScale,
                                   float *dlogits);

/// *acc = addScaled(*acc, scale, *value) on the stream (loss_accumulate:
/// the microbatch's loss into its stream's accumulator, hal::LossSums, in
/// device memory: the host reads it once, after the step).
Status launchAccumulateLoss(const Context &ctx, const float *value,
                            double scale, double *acc);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H

// Softmax cross-entropy loss and its gradient, and the step-loss accumulator.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LinearChecks.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

// Shared checks of cross_entropy and its gradient (not the targets' range:
// the kernels below check that, the GPU kernels cannot read the targets).
static Status checkLogitsAndTargets(const KernelArgs &a, int64_t &rows,
                                    int64_t &vocab) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, logits, "logits", plan::F32, rows, vocab));
  int64_t count = 0;
  PIPER_RETURN_IF_ERROR(expectTokens(a, targets, "targets", count));
  if (count != rows)
    return a.error("targets has shape " + shapeString(targets.shape) + " (" +
                   std::to_string(count) + " tokens), logits has " +
                   std::to_string(rows) + " rows");
  // The loss is a mean over rows of a softmax over classes; neither may be
  // empty.
  if (rows == 0 || vocab == 0)
    return a.error("logits has shape " + shapeString(logits.shape) +
                   ", expected no empty dimension");
  return Status::ok();
}

Status checkCrossEntropy(const KernelArgs &a, int64_t &rows, int64_t &vocab) {
  PIPER_RETURN_IF_ERROR(checkLogitsAndTargets(a, rows, vocab));
  return expectScalar(a, a.outputs[0], "loss");
}

Status checkCrossEntropyGrad(const KernelArgs &a, int64_t &rows,
                             int64_t &vocab, double &scale) {
  PIPER_RETURN_IF_ERROR(checkLogitsAndTargets(a, rows, vocab));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.outputs[0], "dlogits", plan::F32, {rows, vocab}));
  return readFloat(a, KernelAttr::kScale, 1.0, scale);
}

Status checkLossAccumulate(const KernelArgs &a, double &scale) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 0));
  PIPER_RETURN_IF_ERROR(expectScalar(a, a.inputs[0], "loss"));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kScale, 1.0, scale));
  if (!a.ctx.lossAccumulator)
    return a.error("no loss accumulator in the kernel context");
  return Status::ok();
}

// log(sum(exp(row))), shifted by the row maximum so that it cannot overflow;
// the exponentials are float (written to `scratch`), their sum is double.
static double logSumExp(const float *row, int64_t vocab, float *scratch) {
  float rowMax = maxOf(row, vocab);
  return rowMax + std::log(expShiftedSum(row, rowMax, scratch, vocab));
}

// dlogits = rowScale * (softmax(row) - onehot(target)) of one row.
PIPER_SIMD static void crossEntropyGradRow(const float *__restrict row,
                                           float *__restrict out,
                                           int64_t vocab, double lse,
                                           double rowScale, int32_t target) {
  // The exponent is rounded to float once, from double.
  float scale = static_cast<float>(rowScale);
  for (int64_t j = 0; j < vocab; ++j)
    out[j] = scale * fastExp(static_cast<float>(double(row[j]) - lse));
  out[target] = static_cast<float>(
      rowScale *
      (double(fastExp(static_cast<float>(double(row[target]) - lse))) - 1.0));
}

Status crossEntropyKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0;
  PIPER_RETURN_IF_ERROR(checkCrossEntropy(a, rows, vocab));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1],
                  &loss = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, targets, "targets", vocab));

  // Per-row losses, summed in row order: the same on any number of threads.
  std::vector<double> rowLoss(rows);
  parallelFor(rows, rowGrain(vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(vocab);
    for (int64_t n = begin; n < end; ++n) {
      const float *row = logits.f32() + n * vocab;
      rowLoss[n] =
          logSumExp(row, vocab, scratch.data()) - row[targets.i32()[n]];
    }
  });
  double total = 0;
  for (double l : rowLoss)
    total += l;
  loss.f32()[0] = static_cast<float>(total / rows);
  return Status::ok();
}

Status crossEntropyGradKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0;
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(checkCrossEntropyGrad(a, rows, vocab, scale));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1],
                  &dlogits = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, targets, "targets", vocab));

  double rowScale = scale / rows;
  parallelFor(rows, rowGrain(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float *row = logits.f32() + n * vocab;
      float *out = dlogits.f32() + n * vocab;
      // The output row is the scratch of the sum, then overwritten.
      double lse = logSumExp(row, vocab, out);
      crossEntropyGradRow(row, out, vocab, lse, rowScale, targets.i32()[n]);
    }
  });
  return Status::ok();
}

Status lossAccumulateKernel(const KernelArgs &a) {
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(checkLossAccumulate(a, scale));
  *a.ctx.lossAccumulator += scale * a.inputs[0].f32()[0];
  return Status::ok();
}

} // namespace piper::runtime::detail

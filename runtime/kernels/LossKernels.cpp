// Softmax cross-entropy loss and its gradient, and the step-loss accumulator.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

// Shared checks of cross_entropy and its gradient.
static Status checkCrossEntropy(const KernelArgs &a, const TensorRef &logits,
                                const TensorRef &targets, int64_t &rows,
                                int64_t &vocab) {
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
  return expectTokensBelow(a, targets, "targets", vocab);
}

// log(sum(exp(row))), shifted by the row maximum so that it cannot overflow.
static double logSumExp(const float *row, int64_t vocab) {
  float rowMax = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j)
    sum += std::exp(double(row[j]) - rowMax);
  return rowMax + std::log(sum);
}

Status crossEntropyKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1],
                  &loss = a.outputs[0];
  int64_t rows = 0, vocab = 0;
  PIPER_RETURN_IF_ERROR(checkCrossEntropy(a, logits, targets, rows, vocab));
  PIPER_RETURN_IF_ERROR(expectScalar(a, loss, "loss"));

  double total = 0;
  for (int64_t n = 0; n < rows; ++n) {
    const float *row = logits.f32() + n * vocab;
    total += logSumExp(row, vocab) - row[targets.i32()[n]];
  }
  loss.f32()[0] = static_cast<float>(total / rows);
  return Status::ok();
}

Status crossEntropyGradKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1],
                  &dlogits = a.outputs[0];
  int64_t rows = 0, vocab = 0;
  PIPER_RETURN_IF_ERROR(checkCrossEntropy(a, logits, targets, rows, vocab));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dlogits, "dlogits", plan::F32, {rows, vocab}));
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(readFloat(a, "scale", 1.0, scale));

  double rowScale = scale / rows;
  for (int64_t n = 0; n < rows; ++n) {
    const float *row = logits.f32() + n * vocab;
    float *out = dlogits.f32() + n * vocab;
    double lse = logSumExp(row, vocab);
    int32_t target = targets.i32()[n];
    for (int64_t j = 0; j < vocab; ++j) {
      double p = std::exp(double(row[j]) - lse);
      out[j] = static_cast<float>(rowScale * (p - (j == target ? 1.0 : 0.0)));
    }
  }
  return Status::ok();
}

Status lossAccumulateKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 0));
  PIPER_RETURN_IF_ERROR(expectScalar(a, a.inputs[0], "loss"));
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(readFloat(a, "scale", 1.0, scale));
  if (!a.ctx.lossAccumulator)
    return a.error("no loss accumulator in the kernel context");
  *a.ctx.lossAccumulator += scale * a.inputs[0].f32()[0];
  return Status::ok();
}

} // namespace piper::runtime::detail

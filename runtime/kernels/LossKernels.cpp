// Softmax cross-entropy loss and its gradient, and the step-loss accumulator.
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LinearChecks.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

// Shared checks of cross_entropy and its gradient (not the targets' range:
// the kernels below check that, the GPU kernels cannot read the targets).
// With `ld`, the logits may be padded (valid_cols: their row stride into
// *ld) and in mixed precision packed bf16 (the head's GEMM wrote them so:
// hal::Device::readsPackedInput); without, neither (the vocabulary-parallel
// kernels).
static Status checkLogits(const KernelArgs &a, const TensorRef &logits,
                          const TensorRef &targets, int64_t &rows,
                          int64_t &vocab, int64_t *ld = nullptr) {
  if (ld)
    PIPER_RETURN_IF_ERROR(
        expectPaddedMatrix(a, logits, "logits", rows, vocab, *ld, true));
  else
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

static Status checkLogitsAndTargets(const KernelArgs &a, LogitsDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  return checkLogits(a, a.inputs[0], a.inputs[1], d.rows, d.vocab, &d.ld);
}

// dlogits [rows, vocab], padded as the logits may be (valid_cols); with
// `packable`, in mixed precision also packed bf16 (the fused classifier's,
// written into its step buffer as stored: Device::writesPackedOutput).
static Status checkDlogits(const KernelArgs &a, const TensorRef &dlogits,
                           LogitsDims &d, bool packable = false) {
  PIPER_RETURN_IF_ERROR(expectPaddedRows(a, dlogits, "dlogits", d.rows,
                                         d.vocab, d.gradLd, packable));
  return readFloat(a, KernelAttr::kScale, 1.0, d.scale);
}

Status checkCrossEntropy(const KernelArgs &a, LogitsDims &d) {
  PIPER_RETURN_IF_ERROR(checkLogitsAndTargets(a, d));
  return expectScalar(a, a.outputs[0], "loss");
}

Status checkCrossEntropyGrad(const KernelArgs &a, LogitsDims &d) {
  PIPER_RETURN_IF_ERROR(checkLogitsAndTargets(a, d));
  return checkDlogits(a, a.outputs[0], d, true);
}

Status checkCrossEntropyFused(const KernelArgs &a, LogitsDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 2));
  PIPER_RETURN_IF_ERROR(
      checkLogits(a, a.inputs[0], a.inputs[1], d.rows, d.vocab, &d.ld));
  PIPER_RETURN_IF_ERROR(expectScalar(a, a.outputs[0], "loss"));
  return checkDlogits(a, a.outputs[1], d, true);
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

// dlogits = rowScale * (softmax(row) - onehot(target)) of one row; a
// target outside [0, vocab) (another member's column) has no one-hot term.
PIPER_SIMD static void crossEntropyGradRow(const float *__restrict row,
                                           float *__restrict out,
                                           int64_t vocab, double lse,
                                           double rowScale, int64_t target) {
  // The exponent is rounded to float once, from double.
  float scale = static_cast<float>(rowScale);
  for (int64_t j = 0; j < vocab; ++j)
    out[j] = scale * fastExp(static_cast<float>(double(row[j]) - lse));
  if (target >= 0 && target < vocab)
    out[target] = static_cast<float>(
        rowScale *
        (double(fastExp(static_cast<float>(double(row[target]) - lse))) -
         1.0));
}

// The mean loss of `rows` rows of logits into loss[0] and, when `dlogits`
// is given, their gradient (crossEntropyGradRow, rowScale = scale / rows):
// cross_entropy, cross_entropy_grad and the fused classifier share this
// loop, so the fused kernel's outputs are bit for bit the other two's. The
// per-row losses are summed in row order: the same on any number of threads.
static void crossEntropyRows(const float *logits, const int32_t *targets,
                             const LogitsDims &d, float *loss, float *dlogits,
                             double scale);

// The same into the dlogits operand, which may be packed bf16 (the
// executor's storage of mixed-precision activations): then the fp32
// gradient, its valid columns rounded and packed (the executor's rounding
// and packing of the fp32 output).
static void crossEntropyRows(const float *logits, const int32_t *targets,
                             const LogitsDims &d, float *loss,
                             const TensorRef &dlogits, double scale) {
  if (dlogits.dtype != plan::BF16) {
    crossEntropyRows(logits, targets, d, loss, dlogits.f32(), scale);
    return;
  }
  std::vector<float> grad(static_cast<size_t>(d.rows * d.gradLd));
  crossEntropyRows(logits, targets, d, loss, grad.data(), scale);
  for (int64_t n = 0; n < d.rows; ++n)
    storeRow(dlogits, n, d.gradLd, d.vocab, grad.data() + n * d.gradLd);
}

static void crossEntropyRows(const float *logits, const int32_t *targets,
                             const LogitsDims &d, float *loss, float *dlogits,
                             double scale) {
  const int64_t rows = d.rows, vocab = d.vocab;
  std::vector<double> rowLoss(loss ? rows : 0);
  const double rowScale = scale / rows;
  parallelFor(rows, rowGrain(vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(dlogits ? 0 : vocab);
    for (int64_t n = begin; n < end; ++n) {
      const float *row = logits + n * d.ld;
      // The output row is the scratch of the sum, then overwritten.
      float *out = dlogits ? dlogits + n * d.gradLd : scratch.data();
      double lse = logSumExp(row, vocab, out);
      if (loss)
        rowLoss[n] = lse - row[targets[n]];
      if (dlogits)
        crossEntropyGradRow(row, out, vocab, lse, rowScale, targets[n]);
    }
  });
  if (!loss)
    return;
  double total = 0;
  for (double l : rowLoss)
    total += l;
  loss[0] = static_cast<float>(total / rows);
}

Status crossEntropyKernel(const KernelArgs &a) {
  LogitsDims d;
  PIPER_RETURN_IF_ERROR(checkCrossEntropy(a, d));
  const TensorRef &targets = a.inputs[1];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, targets, "targets", d.vocab));
  std::vector<float> unpacked;
  crossEntropyRows(fp32Data(a.inputs[0], unpacked), targets.i32(), d,
                   a.outputs[0].f32(), nullptr, 1.0);
  return Status::ok();
}

Status crossEntropyGradKernel(const KernelArgs &a) {
  LogitsDims d;
  PIPER_RETURN_IF_ERROR(checkCrossEntropyGrad(a, d));
  const TensorRef &targets = a.inputs[1];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, targets, "targets", d.vocab));
  std::vector<float> unpacked;
  crossEntropyRows(fp32Data(a.inputs[0], unpacked), targets.i32(), d, nullptr,
                   a.outputs[0], d.scale);
  return Status::ok();
}

Status crossEntropyFusedKernel(const KernelArgs &a) {
  LogitsDims d;
  PIPER_RETURN_IF_ERROR(checkCrossEntropyFused(a, d));
  const TensorRef &targets = a.inputs[1];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, targets, "targets", d.vocab));
  std::vector<float> unpacked;
  crossEntropyRows(fp32Data(a.inputs[0], unpacked), targets.i32(), d,
                   a.outputs[0].f32(), a.outputs[1], d.scale);
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Vocabulary-parallel cross entropy (docs/tensor-parallel.md §5c): member m
// of `members` T holds columns [m V, (m + 1) V) of the logits (V = its
// `vocab`). vocab_ce_stats writes each row's local statistics into this
// member's columns of a [rows, 4T + 1] tensor, zeros elsewhere: column m the
// local maximum, columns T + m, 2T + m and 3T + m the sum of exp(l - max)
// over the local columns as three terms whose first two are bf16 values
// (so that the sum survives bf16 storage; the maximum and the target's
// logit are logits, bf16 values themselves in mixed precision), column 4T
// the target's logit where this member holds it. The sum of the members'
// tensors (an all-reduce, exact: every column has one non-zero term) holds
// every member's statistics; vocab_cross_entropy and its gradient read the
// row's log-sum-exp from it.
//===----------------------------------------------------------------------===//

Status checkVocabCeStats(const KernelArgs &a, VocabDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(
      checkLogits(a, a.inputs[0], a.inputs[1], d.rows, d.vocab));
  PIPER_RETURN_IF_ERROR(
      readVocabShard(a, d.vocab, /*required=*/true, d.members, d.first));
  return expectTensor(a, a.outputs[0], "stats", plan::F32,
                      {d.rows, 4 * d.members + 1});
}

// (stats, logits, targets): the logits and targets as cross_entropy's, the
// statistics [rows, 4 members + 1].
static Status checkVocabLossOperands(const KernelArgs &a, VocabDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(
      checkLogits(a, a.inputs[1], a.inputs[2], d.rows, d.vocab));
  PIPER_RETURN_IF_ERROR(
      readVocabShard(a, d.vocab, /*required=*/true, d.members, d.first));
  return expectTensor(a, a.inputs[0], "stats", plan::F32,
                      {d.rows, 4 * d.members + 1});
}

Status checkVocabCrossEntropy(const KernelArgs &a, VocabDims &d) {
  PIPER_RETURN_IF_ERROR(checkVocabLossOperands(a, d));
  return expectScalar(a, a.outputs[0], "loss");
}

Status checkVocabCrossEntropyGrad(const KernelArgs &a, VocabDims &d,
                                  double &scale) {
  PIPER_RETURN_IF_ERROR(checkVocabLossOperands(a, d));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.outputs[0], "dlogits", plan::F32,
                                     {d.rows, d.vocab}));
  return readFloat(a, KernelAttr::kScale, 1.0, scale);
}

// The row's log-sum-exp over the whole vocabulary from the members'
// statistics: M + log(sum_j s_j exp(m_j - M)), M the largest m_j, s_j the
// sum of member j's three terms (in double).
static double statsLogSumExp(const float *stats, int64_t members) {
  float rowMax = stats[0];
  for (int64_t j = 1; j < members; ++j)
    rowMax = std::max(rowMax, stats[j]);
  double sum = 0;
  for (int64_t j = 0; j < members; ++j) {
    double s = double(stats[members + j]) + double(stats[2 * members + j]) +
               double(stats[3 * members + j]);
    if (s != 0)
      sum += s * std::exp(double(stats[j]) - double(rowMax));
  }
  return double(rowMax) + std::log(sum);
}

Status vocabCeStatsKernel(const KernelArgs &a) {
  VocabDims d;
  PIPER_RETURN_IF_ERROR(checkVocabCeStats(a, d));
  const TensorRef &logits = a.inputs[0], &targets = a.inputs[1],
                  &stats = a.outputs[0];
  PIPER_RETURN_IF_ERROR(
      expectTokensBelow(a, targets, "targets", d.vocab * d.members));
  const int64_t width = 4 * d.members + 1, m = d.first / d.vocab;
  parallelFor(d.rows, rowGrain(d.vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(d.vocab);
    for (int64_t n = begin; n < end; ++n) {
      const float *row = logits.f32() + n * d.vocab;
      float *out = stats.f32() + n * width;
      std::fill_n(out, width, 0.0f);
      float rowMax = maxOf(row, d.vocab);
      out[m] = rowMax;
      // s = hi + mid + lo, hi and mid bf16 values, each remainder exact.
      float sum = static_cast<float>(
          expShiftedSum(row, rowMax, scratch.data(), d.vocab));
      float hi = roundToBf16(sum), mid = roundToBf16(sum - hi);
      out[d.members + m] = hi;
      out[2 * d.members + m] = mid;
      out[3 * d.members + m] = (sum - hi) - mid;
      int64_t t = targets.i32()[n] - d.first;
      if (t >= 0 && t < d.vocab)
        out[4 * d.members] = row[t];
    }
  });
  return Status::ok();
}

Status vocabCrossEntropyKernel(const KernelArgs &a) {
  VocabDims d;
  PIPER_RETURN_IF_ERROR(checkVocabCrossEntropy(a, d));
  const TensorRef &stats = a.inputs[0], &targets = a.inputs[2];
  PIPER_RETURN_IF_ERROR(
      expectTokensBelow(a, targets, "targets", d.vocab * d.members));
  const int64_t width = 4 * d.members + 1;
  // Summed in row order, as cross_entropy.
  double total = 0;
  for (int64_t n = 0; n < d.rows; ++n) {
    const float *row = stats.f32() + n * width;
    total += statsLogSumExp(row, d.members) - row[4 * d.members];
  }
  a.outputs[0].f32()[0] = static_cast<float>(total / d.rows);
  return Status::ok();
}

Status vocabCrossEntropyGradKernel(const KernelArgs &a) {
  VocabDims d;
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(checkVocabCrossEntropyGrad(a, d, scale));
  const TensorRef &stats = a.inputs[0], &logits = a.inputs[1],
                  &targets = a.inputs[2], &dlogits = a.outputs[0];
  PIPER_RETURN_IF_ERROR(
      expectTokensBelow(a, targets, "targets", d.vocab * d.members));
  const int64_t width = 4 * d.members + 1;
  const double rowScale = scale / d.rows;
  parallelFor(d.rows, rowGrain(d.vocab), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      double lse = statsLogSumExp(stats.f32() + n * width, d.members);
      crossEntropyGradRow(logits.f32() + n * d.vocab,
                          dlogits.f32() + n * d.vocab, d.vocab, lse, rowScale,
                          targets.i32()[n] - d.first);
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

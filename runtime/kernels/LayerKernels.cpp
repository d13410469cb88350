// Embedding, position embedding, layer norm, RMS norm, linear, GELU, SwiGLU
// and add kernels, forward and backward.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/kernels/ElementwiseChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LayerChecks.h"
#include "runtime/kernels/LinearChecks.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

// Reductions outside BLAS accumulate in double in a fixed order (VecMath.h)
// so that results do not depend on the machine's threads. Hot loops are
// PIPER_SIMD: vectorized, one clone per instruction set.

namespace {

// acc[j] += row[j] (float into double), per column: the order over rows is
// the caller's and each column's sum stays sequential.
PIPER_SIMD void addRowToSums(double *__restrict acc,
                             const float *__restrict row, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    acc[j] += row[j];
}

PIPER_SIMD void sumsToFloat(const double *__restrict sum,
                            float *__restrict out, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    out[j] = static_cast<float>(sum[j]);
}

PIPER_SIMD void addVectors(const float *__restrict a, const float *__restrict b,
                           float *__restrict y, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    y[j] = a[j] + b[j];
}

} // namespace

Status checkEmbedding(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                      int64_t &hidden) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(expectTokens(a, a.inputs[0], "ids", rows));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[1], "table", plan::F32, vocab, hidden));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, hidden});
}

Status embeddingKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0, hidden = 0;
  PIPER_RETURN_IF_ERROR(checkEmbedding(a, rows, vocab, hidden));
  const TensorRef &ids = a.inputs[0], &table = a.inputs[1], &y = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, ids, "ids", vocab));

  for (int64_t n = 0; n < rows; ++n)
    std::copy_n(table.f32() + ids.i32()[n] * hidden, hidden,
                y.f32() + n * hidden);
  return Status::ok();
}

Status checkEmbeddingGrad(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                          int64_t &hidden) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(expectTokens(a, a.inputs[0], "ids", rows));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.outputs[0], "dtable", plan::F32, vocab, hidden));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[1], "dy", plan::F32, {rows, hidden}));
  int64_t vocabAttr = 0;
  PIPER_RETURN_IF_ERROR(readInt(a, "vocab", vocab, vocabAttr));
  if (vocabAttr != vocab)
    return a.error("attribute 'vocab' is " + std::to_string(vocabAttr) +
                   " but dtable has " + std::to_string(vocab) + " rows");
  return Status::ok();
}

Status embeddingGradKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0, hidden = 0;
  PIPER_RETURN_IF_ERROR(checkEmbeddingGrad(a, rows, vocab, hidden));
  const TensorRef &ids = a.inputs[0], &dy = a.inputs[1], &dtable = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, ids, "ids", vocab));

  // Visit the rows grouped by id so each table row is summed once, in token
  // order, without a [V,H] double buffer.
  const int32_t *idData = ids.i32();
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t l, int64_t r) { return idData[l] < idData[r]; });
  std::fill_n(dtable.f32(), dtable.numel(), 0.0f);
  std::vector<double> sum(hidden);
  for (int64_t begin = 0; begin < rows;) {
    int32_t id = idData[order[begin]];
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t end = begin;
    for (; end < rows && idData[order[end]] == id; ++end)
      addRowToSums(sum.data(), dy.f32() + order[end] * hidden, hidden);
    sumsToFloat(sum.data(), dtable.f32() + int64_t(id) * hidden, hidden);
    begin = end;
  }
  return Status::ok();
}

// Shared checks of position_add and its gradient: `x` is [N,H] with N a
// multiple of `seq`, `pos` is [P,H] with P >= seq.
static Status checkPositions(const KernelArgs &a, const TensorRef &x,
                             const char *xName, const TensorRef &pos,
                             const char *posName, int64_t &rows,
                             int64_t &hidden, int64_t &seq) {
  int64_t positions = 0, posHidden = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, xName, plan::F32, rows, hidden));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, pos, posName, plan::F32, positions, posHidden));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "seq", std::nullopt, seq));
  if (posHidden != hidden)
    return a.error(std::string(posName) + " has shape " +
                   shapeString(pos.shape) + ", expected [*," +
                   std::to_string(hidden) + "]");
  if (rows % seq != 0)
    return a.error(std::string(xName) + " has " + std::to_string(rows) +
                   " rows, not a multiple of seq " + std::to_string(seq));
  if (positions < seq)
    return a.error(std::string(posName) + " has " + std::to_string(positions) +
                   " rows, fewer than seq " + std::to_string(seq));
  return Status::ok();
}

Status checkPositionAdd(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                        int64_t &seq) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkPositions(a, a.inputs[0], "x", a.inputs[1], "pos",
                                       rows, hidden, seq));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, hidden});
}

Status positionAddKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0, seq = 0;
  PIPER_RETURN_IF_ERROR(checkPositionAdd(a, rows, hidden, seq));
  const TensorRef &x = a.inputs[0], &pos = a.inputs[1], &y = a.outputs[0];

  for (int64_t n = 0; n < rows; ++n)
    addVectors(x.f32() + n * hidden, pos.f32() + (n % seq) * hidden,
               y.f32() + n * hidden, hidden);
  return Status::ok();
}

Status checkPositionAddGrad(const KernelArgs &a, int64_t &rows,
                            int64_t &hidden, int64_t &seq) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  return checkPositions(a, a.inputs[0], "dy", a.outputs[0], "dpos", rows,
                        hidden, seq);
}

Status positionAddGradKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0, seq = 0;
  PIPER_RETURN_IF_ERROR(checkPositionAddGrad(a, rows, hidden, seq));
  const TensorRef &dy = a.inputs[0], &dpos = a.outputs[0];

  // Positions past seq get no gradient but are part of the parameter.
  std::fill_n(dpos.f32(), dpos.numel(), 0.0f);
  std::vector<double> sum(hidden);
  for (int64_t s = 0; s < seq; ++s) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t n = s; n < rows; n += seq)
      addRowToSums(sum.data(), dy.f32() + n * hidden, hidden);
    sumsToFloat(sum.data(), dpos.f32() + s * hidden, hidden);
  }
  return Status::ok();
}

// Shared checks of layer_norm and its gradient.
static Status checkLayerNormOperands(const KernelArgs &a, const TensorRef &x,
                             const TensorRef &gamma, int64_t &rows,
                             int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "x", plan::F32, rows, hidden));
  PIPER_RETURN_IF_ERROR(expectTensor(a, gamma, "gamma", plan::F32, {hidden}));
  PIPER_RETURN_IF_ERROR(readFloat(a, "eps", 1e-5, eps));
  if (eps < 0)
    return a.error("attribute 'eps' must not be negative");
  return Status::ok();
}

// Mean and 1/sqrt(biased variance + eps) of one row, two-pass in double.
static void rowStats(const float *x, int64_t hidden, double eps, double &mean,
                     double &rstd) {
  mean = hidden ? sumDouble(x, hidden) / hidden : 0.0;
  double var = hidden ? sumSquaredDeviation(x, hidden, mean) / hidden : 0.0;
  rstd = 1.0 / std::sqrt(var + eps);
}

PIPER_SIMD static void layerNormRow(const float *__restrict x,
                                    const float *__restrict gamma,
                                    const float *__restrict beta,
                                    float *__restrict y, int64_t hidden,
                                    double mean, double rstd) {
  for (int64_t j = 0; j < hidden; ++j)
    y[j] = static_cast<float>((x[j] - mean) * rstd * gamma[j] + beta[j]);
}

Status checkLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                      double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(
      checkLayerNormOperands(a, a.inputs[0], a.inputs[1], rows, hidden, eps));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "beta", plan::F32, {hidden}));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, hidden});
}

Status layerNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkLayerNorm(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &beta = a.inputs[2],
                  &y = a.outputs[0];

  parallelFor(rows, rowGrain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float *xr = x.f32() + n * hidden;
      double mean = 0, rstd = 0;
      rowStats(xr, hidden, eps, mean, rstd);
      layerNormRow(xr, gamma.f32(), beta.f32(), y.f32() + n * hidden, hidden,
                   mean, rstd);
    }
  });
  return Status::ok();
}

// Shared checks of layer_norm_grad_weight and rms_norm_grad_weight, which
// take no gamma: x is [N,H], dy is [N,H].
static Status checkNormWeightGrad(const KernelArgs &a, const TensorRef &x,
                                  const TensorRef &dy, double defaultEps,
                                  int64_t &rows, int64_t &hidden,
                                  double &eps) {
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "x", plan::F32, rows, hidden));
  PIPER_RETURN_IF_ERROR(readFloat(a, "eps", defaultEps, eps));
  if (eps < 0)
    return a.error("attribute 'eps' must not be negative");
  PIPER_RETURN_IF_ERROR(expectTensor(a, dy, "dy", plan::F32, {rows, hidden}));
  return Status::ok();
}

// The backward of layer_norm, shared by its two halves layer_norm_grad_input
// (dx) and layer_norm_grad_weight (dgamma, dbeta). `dx` may be null (then
// `gamma` is not read); `dgamma` and `dbeta` are both null or both set.
PIPER_SIMD static void layerNormBackward(const float *x, const float *gamma,
                              const float *dy, int64_t rows, int64_t hidden,
                              double eps, float *dx, float *dgamma,
                              float *dbeta) {
  std::vector<double> gammaSum(dgamma ? hidden : 0, 0.0),
      betaSum(dgamma ? hidden : 0, 0.0);
  std::vector<double> xhat(hidden);
  for (int64_t n = 0; n < rows; ++n) {
    const float *xr = x + n * hidden;
    const float *dyr = dy + n * hidden;
    double mean = 0, rstd = 0;
    rowStats(xr, hidden, eps, mean, rstd);
    for (int64_t j = 0; j < hidden; ++j)
      xhat[j] = (xr[j] - mean) * rstd;
    if (dx) {
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
      float *dxr = dx + n * hidden;
      double gAcc[kLanes] = {}, gxAcc[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= hidden; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          double g = double(dyr[j + l]) * gamma[j + l];
          gAcc[l] += g;
          gxAcc[l] += g * xhat[j + l];
        }
      for (int l = 0; j < hidden; ++j, ++l) {
        double g = double(dyr[j]) * gamma[j];
        gAcc[l] += g;
        gxAcc[l] += g * xhat[j];
      }
      double gMean = 0, gxMean = 0;
      for (int l = 0; l < kLanes; ++l) {
        gMean += gAcc[l];
        gxMean += gxAcc[l];
      }
      gMean /= hidden;
      gxMean /= hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        double g = double(dyr[j]) * gamma[j];
        dxr[j] = static_cast<float>(rstd * (g - gMean - xhat[j] * gxMean));
      }
    }
    if (dgamma)
      for (int64_t j = 0; j < hidden; ++j) {
        gammaSum[j] += dyr[j] * xhat[j];
        betaSum[j] += dyr[j];
      }
  }
  if (dgamma)
    for (int64_t j = 0; j < hidden; ++j) {
      dgamma[j] = static_cast<float>(gammaSum[j]);
      dbeta[j] = static_cast<float>(betaSum[j]);
    }
}

Status checkLayerNormGradInput(const KernelArgs &a, int64_t &rows,
                               int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(
      checkLayerNormOperands(a, a.inputs[0], a.inputs[1], rows, hidden, eps));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "dy", plan::F32, {rows, hidden}));
  return expectTensor(a, a.outputs[0], "dx", plan::F32, {rows, hidden});
}

Status layerNormGradInputKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkLayerNormGradInput(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &dy = a.inputs[2];
  const TensorRef &dx = a.outputs[0];

  // Without dgamma the rows are independent: chunks of rows in parallel.
  parallelFor(rows, rowGrain(3 * hidden), [&](int64_t begin, int64_t end) {
    int64_t at = begin * hidden;
    layerNormBackward(x.f32() + at, gamma.f32(), dy.f32() + at, end - begin,
                      hidden, eps, dx.f32() + at, nullptr, nullptr);
  });
  return Status::ok();
}

Status checkLayerNormGradWeight(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 2));
  PIPER_RETURN_IF_ERROR(checkNormWeightGrad(a, a.inputs[0], a.inputs[1], 1e-5,
                                            rows, hidden, eps));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.outputs[0], "dgamma", plan::F32, {hidden}));
  return expectTensor(a, a.outputs[1], "dbeta", plan::F32, {hidden});
}

Status layerNormGradWeightKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkLayerNormGradWeight(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1];
  const TensorRef &dgamma = a.outputs[0], &dbeta = a.outputs[1];

  layerNormBackward(x.f32(), nullptr, dy.f32(), rows, hidden, eps, nullptr,
                    dgamma.f32(), dbeta.f32());
  return Status::ok();
}

// Shared checks of rms_norm and its gradient.
static Status checkRmsNormOperands(const KernelArgs &a, const TensorRef &x,
                           const TensorRef &gamma, int64_t &rows,
                           int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "x", plan::F32, rows, hidden));
  PIPER_RETURN_IF_ERROR(expectTensor(a, gamma, "gamma", plan::F32, {hidden}));
  PIPER_RETURN_IF_ERROR(readFloat(a, "eps", 1e-6, eps));
  if (eps < 0)
    return a.error("attribute 'eps' must not be negative");
  return Status::ok();
}

// 1/sqrt(mean(x^2) + eps) of one row, in double.
static double rowRrms(const float *x, int64_t hidden, double eps) {
  double sq = dotDouble(x, x, hidden);
  return 1.0 / std::sqrt((hidden ? sq / hidden : 0.0) + eps);
}

PIPER_SIMD static void rmsNormRow(const float *__restrict x,
                                  const float *__restrict gamma,
                                  float *__restrict y, int64_t hidden,
                                  double rrms) {
  for (int64_t j = 0; j < hidden; ++j)
    y[j] = static_cast<float>(x[j] * rrms * gamma[j]);
}

Status checkRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                    double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(
      checkRmsNormOperands(a, a.inputs[0], a.inputs[1], rows, hidden, eps));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, hidden});
}

Status rmsNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkRmsNorm(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &y = a.outputs[0];

  parallelFor(rows, rowGrain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float *xr = x.f32() + n * hidden;
      rmsNormRow(xr, gamma.f32(), y.f32() + n * hidden, hidden,
                 rowRrms(xr, hidden, eps));
    }
  });
  return Status::ok();
}

// The backward of rms_norm, shared by its two halves rms_norm_grad_input
// (dx) and rms_norm_grad_weight (dgamma). `dx` may be null (then `gamma` is
// not read), as may `dgamma`.
PIPER_SIMD static void rmsNormBackward(const float *x, const float *gamma,
                            const float *dy, int64_t rows, int64_t hidden,
                            double eps, float *dx, float *dgamma) {
  std::vector<double> gammaSum(dgamma ? hidden : 0, 0.0);
  for (int64_t n = 0; n < rows; ++n) {
    const float *xr = x + n * hidden;
    const float *dyr = dy + n * hidden;
    double rrms = rowRrms(xr, hidden, eps);
    if (dx) {
      // dx = rrms * (g - xhat * mean(g * xhat)) with g = dy * gamma and
      // xhat = x * rrms.
      float *dxr = dx + n * hidden;
      double acc[kLanes] = {};
      int64_t j = 0;
      for (; j + kLanes <= hidden; j += kLanes)
        for (int l = 0; l < kLanes; ++l)
          acc[l] += double(dyr[j + l]) * gamma[j + l] * (xr[j + l] * rrms);
      for (int l = 0; j < hidden; ++j, ++l)
        acc[l] += double(dyr[j]) * gamma[j] * (xr[j] * rrms);
      double gxMean = 0;
      for (int l = 0; l < kLanes; ++l)
        gxMean += acc[l];
      gxMean /= hidden;
      for (int64_t j = 0; j < hidden; ++j) {
        double g = double(dyr[j]) * gamma[j];
        dxr[j] = static_cast<float>(rrms * (g - xr[j] * rrms * gxMean));
      }
    }
    if (dgamma)
      for (int64_t j = 0; j < hidden; ++j) {
        double xhat = xr[j] * rrms;
        gammaSum[j] += dyr[j] * xhat;
      }
  }
  if (dgamma)
    for (int64_t j = 0; j < hidden; ++j)
      dgamma[j] = static_cast<float>(gammaSum[j]);
}

Status checkRmsNormGradInput(const KernelArgs &a, int64_t &rows,
                             int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(
      checkRmsNormOperands(a, a.inputs[0], a.inputs[1], rows, hidden, eps));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "dy", plan::F32, {rows, hidden}));
  return expectTensor(a, a.outputs[0], "dx", plan::F32, {rows, hidden});
}

Status rmsNormGradInputKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkRmsNormGradInput(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &dy = a.inputs[2];
  const TensorRef &dx = a.outputs[0];

  // Without dgamma the rows are independent: chunks of rows in parallel.
  parallelFor(rows, rowGrain(3 * hidden), [&](int64_t begin, int64_t end) {
    int64_t at = begin * hidden;
    rmsNormBackward(x.f32() + at, gamma.f32(), dy.f32() + at, end - begin,
                    hidden, eps, dx.f32() + at, nullptr);
  });
  return Status::ok();
}

Status checkRmsNormGradWeight(const KernelArgs &a, int64_t &rows,
                              int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkNormWeightGrad(a, a.inputs[0], a.inputs[1], 1e-6,
                                            rows, hidden, eps));
  return expectTensor(a, a.outputs[0], "dgamma", plan::F32, {hidden});
}

Status rmsNormGradWeightKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkRmsNormGradWeight(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1];
  const TensorRef &dgamma = a.outputs[0];

  rmsNormBackward(x.f32(), nullptr, dy.f32(), rows, hidden, eps, nullptr,
                  dgamma.f32());
  return Status::ok();
}

// Reads transpose_w and the [in,out] sizes of the weight: w is [in,out], or
// [out,in] when transposed.
static Status weightDims(const KernelArgs &a, const TensorRef &w,
                         bool &transposeW, int64_t &in, int64_t &out) {
  PIPER_RETURN_IF_ERROR(readTransposeW(a, transposeW));
  int64_t rows = 0, cols = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, w, "w", plan::F32, rows, cols));
  in = transposeW ? cols : rows;
  out = transposeW ? rows : cols;
  return Status::ok();
}

static Status weightMismatch(const KernelArgs &a, const TensorRef &w,
                             bool transposeW, int64_t in) {
  std::string want = transposeW ? "[*," + std::to_string(in) + "]"
                                : "[" + std::to_string(in) + ",*]";
  return a.error("w has shape " + shapeString(w.shape) + ", expected " + want +
                 " (transpose_w=" + (transposeW ? "1" : "0") + ")");
}

Status checkLinear(const KernelArgs &a, LinearDims &d, bool &hasBias) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 3, 1));
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  int64_t wIn = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "x", plan::F32, d.rows, d.in));
  PIPER_RETURN_IF_ERROR(weightDims(a, w, d.transposeW, wIn, d.out));
  if (wIn != d.in)
    return weightMismatch(a, w, d.transposeW, d.in);
  hasBias = a.inputs.size() == 3;
  if (hasBias)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[2], "b", plan::F32, {d.out}));
  PIPER_RETURN_IF_ERROR(expectTensor(a, y, "y", plan::F32, {d.rows, d.out}));
  return expectBlasDims(a, {d.rows, d.in, d.out});
}

Status linearKernel(const KernelArgs &a) {
  LinearDims d;
  bool hasBias = false;
  PIPER_RETURN_IF_ERROR(checkLinear(a, d, hasBias));
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  const int64_t rows = d.rows, in = d.in, out = d.out;
  const bool transposeW = d.transposeW;

  // The bias is the GEMM's initial C, so it costs no extra pass.
  if (hasBias)
    for (int64_t n = 0; n < rows; ++n)
      std::copy_n(a.inputs[2].f32(), out, y.f32() + n * out);
  gemm(false, transposeW, rows, out, in, 1.0f, x.f32(), in, w.f32(),
       transposeW ? in : out, hasBias ? 1.0f : 0.0f, y.f32(), out);
  return Status::ok();
}

Status checkLinearGradInput(const KernelArgs &a, LinearDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dx = a.outputs[0];
  int64_t wOut = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, dy, "dy", plan::F32, d.rows, d.out));
  PIPER_RETURN_IF_ERROR(weightDims(a, w, d.transposeW, d.in, wOut));
  if (wOut != d.out)
    return a.error("w has shape " + shapeString(w.shape) + ", expected " +
                   (d.transposeW ? "[" + std::to_string(d.out) + ",*]"
                                 : "[*," + std::to_string(d.out) + "]") +
                   " (transpose_w=" + (d.transposeW ? "1" : "0") + ")");
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dx, "dx", plan::F32, {d.rows, d.in}));
  return expectBlasDims(a, {d.rows, d.in, d.out});
}

Status linearGradInputKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradInput(a, d));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dx = a.outputs[0];
  const int64_t rows = d.rows, in = d.in, out = d.out;
  const bool transposeW = d.transposeW;

  // dx = dy * w^T for w [in,out]; dx = dy * w for w [out,in].
  gemm(false, !transposeW, rows, in, out, 1.0f, dy.f32(), out, w.f32(),
       transposeW ? in : out, 0.0f, dx.f32(), in);
  return Status::ok();
}

Status checkLinearGradWeight(const KernelArgs &a, LinearDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readTransposeW(a, d.transposeW));
  int64_t dyRows = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "x", plan::F32, d.rows, d.in));
  PIPER_RETURN_IF_ERROR(expectMatrix(a, dy, "dy", plan::F32, dyRows, d.out));
  if (dyRows != d.rows)
    return a.error("dy has shape " + shapeString(dy.shape) + ", expected [" +
                   std::to_string(d.rows) + ",*]");
  std::vector<int64_t> wShape = d.transposeW
                                    ? std::vector<int64_t>{d.out, d.in}
                                    : std::vector<int64_t>{d.in, d.out};
  PIPER_RETURN_IF_ERROR(expectTensor(a, dw, "dw", plan::F32, wShape));
  return expectBlasDims(a, {d.rows, d.in, d.out});
}

Status linearGradWeightKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradWeight(a, d));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  const int64_t rows = d.rows, in = d.in, out = d.out;

  if (d.transposeW)
    gemm(true, false, out, in, rows, 1.0f, dy.f32(), out, x.f32(), in, 0.0f,
         dw.f32(), in);
  else
    gemm(true, false, in, out, rows, 1.0f, x.f32(), in, dy.f32(), out, 0.0f,
         dw.f32(), out);
  return Status::ok();
}

Status checkBiasGrad(const KernelArgs &a, int64_t &rows, int64_t &out) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "dy", plan::F32, rows, out));
  return expectTensor(a, a.outputs[0], "db", plan::F32, {out});
}

Status biasGradKernel(const KernelArgs &a) {
  int64_t rows = 0, out = 0;
  PIPER_RETURN_IF_ERROR(checkBiasGrad(a, rows, out));
  const TensorRef &dy = a.inputs[0], &db = a.outputs[0];

  std::vector<double> sum(out, 0.0);
  for (int64_t n = 0; n < rows; ++n)
    addRowToSums(sum.data(), dy.f32() + n * out, out);
  sumsToFloat(sum.data(), db.f32(), out);
  return Status::ok();
}

// GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// in float like PyTorch's, with a vectorized tanh (absolute error < 1e-7).
constexpr float geluC = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float geluA = 0.044715f;

namespace {

PIPER_SIMD void geluLoop(const float *__restrict x, float *__restrict y,
                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float t = fastTanh(geluC * (v + geluA * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

PIPER_SIMD void geluGradLoop(const float *__restrict x,
                             const float *__restrict dy, float *__restrict dx,
                             int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float t = fastTanh(geluC * (v + geluA * v * v * v));
    float dInner = geluC * (1.0f + 3.0f * geluA * v * v);
    float dGelu = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dInner;
    dx[i] = dGelu * dy[i];
  }
}

PIPER_SIMD void swigluRow(const float *__restrict gate,
                          const float *__restrict up, float *__restrict y,
                          int64_t width) {
  for (int64_t j = 0; j < width; ++j) {
    float g = gate[j];
    y[j] = g * fastSigmoid(g) * up[j];
  }
}

PIPER_SIMD void swigluGradRow(const float *__restrict gate,
                              const float *__restrict up,
                              const float *__restrict dy,
                              float *__restrict dgate, float *__restrict dup,
                              int64_t width) {
  for (int64_t j = 0; j < width; ++j) {
    float g = gate[j], sig = fastSigmoid(g);
    // silu'(g) = sig (1 + g (1 - sig)).
    dgate[j] = dy[j] * up[j] * (sig * (1.0f + g * (1.0f - sig)));
    dup[j] = dy[j] * (g * sig);
  }
}

} // namespace

Status checkGelu(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(expectDType(a, a.inputs[0], "x", plan::F32));
  return expectTensor(a, a.outputs[0], "y", plan::F32, a.inputs[0].shape);
}

Status geluKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkGelu(a));
  const TensorRef &x = a.inputs[0], &y = a.outputs[0];

  parallelFor(x.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    geluLoop(x.f32() + begin, y.f32() + begin, end - begin);
  });
  return Status::ok();
}

Status checkGeluGrad(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &x = a.inputs[0];
  PIPER_RETURN_IF_ERROR(expectDType(a, x, "x", plan::F32));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "dy", plan::F32, x.shape));
  return expectTensor(a, a.outputs[0], "dx", plan::F32, x.shape);
}

Status geluGradKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkGeluGrad(a));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1], &dx = a.outputs[0];

  parallelFor(x.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    geluGradLoop(x.f32() + begin, dy.f32() + begin, dx.f32() + begin,
                 end - begin);
  });
  return Status::ok();
}

// Shared checks of swiglu and its gradient: `gateUp` is [N,2F].
static Status checkGateUp(const KernelArgs &a, const TensorRef &gateUp,
                          int64_t &rows, int64_t &width) {
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, gateUp, "gate_up", plan::F32, rows, cols));
  if (cols % 2 != 0)
    return a.error("gate_up has shape " + shapeString(gateUp.shape) +
                   ", expected an even number of columns [gate | up]");
  width = cols / 2;
  return Status::ok();
}


Status checkSwiglu(const KernelArgs &a, int64_t &rows, int64_t &width) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(checkGateUp(a, a.inputs[0], rows, width));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, width});
}

Status swigluKernel(const KernelArgs &a) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(checkSwiglu(a, rows, width));
  const TensorRef &gateUp = a.inputs[0], &y = a.outputs[0];

  parallelFor(rows, rowGrain(3 * width), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float *gate = gateUp.f32() + n * 2 * width;
      swigluRow(gate, gate + width, y.f32() + n * width, width);
    }
  });
  return Status::ok();
}

Status checkSwigluGrad(const KernelArgs &a, int64_t &rows, int64_t &width) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkGateUp(a, a.inputs[0], rows, width));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[1], "dy", plan::F32, {rows, width}));
  return expectTensor(a, a.outputs[0], "dgate_up", plan::F32,
                      {rows, 2 * width});
}

Status swigluGradKernel(const KernelArgs &a) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(checkSwigluGrad(a, rows, width));
  const TensorRef &gateUp = a.inputs[0], &dy = a.inputs[1],
                  &dgateUp = a.outputs[0];

  parallelFor(rows, rowGrain(5 * width), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float *gate = gateUp.f32() + n * 2 * width;
      float *dgate = dgateUp.f32() + n * 2 * width;
      swigluGradRow(gate, gate + width, dy.f32() + n * width, dgate,
                    dgate + width, width);
    }
  });
  return Status::ok();
}

Status checkAdd(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &l = a.inputs[0];
  PIPER_RETURN_IF_ERROR(expectDType(a, l, "a", plan::F32));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "b", plan::F32, l.shape));
  return expectTensor(a, a.outputs[0], "y", plan::F32, l.shape);
}

Status addKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkAdd(a));
  const TensorRef &l = a.inputs[0], &r = a.inputs[1], &y = a.outputs[0];

  parallelFor(l.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    addVectors(l.f32() + begin, r.f32() + begin, y.f32() + begin, end - begin);
  });
  return Status::ok();
}

} // namespace piper::runtime::detail

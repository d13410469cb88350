// Layer norm and RMS norm kernels, forward and backward. Each backward has
// two halves: *_grad_input (dx; rows are independent, so chunks of rows run
// in parallel) and *_grad_weight (dgamma, and dbeta for layer norm; one
// pass, a fixed order over rows). The two norms share their checks and
// their kernels' shapes; only the row math differs (RMS norm's rows are
// NormRows.h's, shared with qk_norm in QkNormKernels.cpp). The compiler
// fuses the residual stream's add into the norm after it (add_layer_norm,
// add_rms_norm) and into the grad_input before it (*_grad_input_add).
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LayerChecks.h"
#include "runtime/kernels/NormRows.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

// Reductions accumulate in double in a fixed order (VecMath.h), so that
// results do not depend on the machine's threads.

namespace {

constexpr double kLayerNormEps = 1e-5;

// --- shared checks and kernel shapes -----------------------------------------

// The operands of a norm and of its grad_input: x [N,H], gamma [H], and
// eps (default `defaultEps`, >= 0). x may be packed in mixed precision (the
// residual stream, stored as bf16 where its readers all take it so).
Status checkNormOperands(const KernelArgs &a, const TensorRef &x,
                         const TensorRef &gamma, double defaultEps,
                         int64_t &rows, int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, x, "x", packableDType(a, x), rows, hidden));
  PIPER_RETURN_IF_ERROR(expectTensor(a, gamma, "gamma", plan::F32, {hidden}));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kEps, defaultEps, eps));
  if (eps < 0)
    return a.error("attribute 'eps' must not be negative");
  return Status::ok();
}

// A norm's grad_input: (x, gamma, dy) -> dx; with `residual`, its fusion
// with the add after it: (x, gamma, dy, r) -> r + dx.
Status checkNormGradInput(const KernelArgs &a, double defaultEps, bool residual,
                          int64_t &rows, int64_t &hidden, double &eps) {
  const size_t inputs = residual ? 4 : 3;
  PIPER_RETURN_IF_ERROR(expectCounts(a, inputs, inputs, 1));
  PIPER_RETURN_IF_ERROR(checkNormOperands(a, a.inputs[0], a.inputs[1],
                                          defaultEps, rows, hidden, eps));
  // dy may be packed in mixed precision (a GEMM's output stored so:
  // hal::Device::readsPackedInput).
  PIPER_RETURN_IF_ERROR(expectTensor(
      a, a.inputs[2], "dy", packableDType(a, a.inputs[2]), {rows, hidden}));
  // The gradient along the residual stream (r, dx) may be packed too.
  if (residual)
    PIPER_RETURN_IF_ERROR(expectTensor(
        a, a.inputs[3], "r", packableDType(a, a.inputs[3]), {rows, hidden}));
  return expectPackableOutput(a, a.outputs[0], "dx", {rows, hidden});
}

// A norm fused with the add before it, (x, r, gamma[, beta]) -> (s, y):
// `inputs` operands, the norm's x and gamma checked, then r [N,H], and the
// outputs s and y [N,H].
Status checkAddNorm(const KernelArgs &a, size_t inputs, double defaultEps,
                    int64_t &rows, int64_t &hidden, double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, inputs, inputs, 2));
  PIPER_RETURN_IF_ERROR(checkNormOperands(a, a.inputs[0], a.inputs[2],
                                          defaultEps, rows, hidden, eps));
  // r (the branch's output) may be packed in mixed precision.
  PIPER_RETURN_IF_ERROR(expectTensor(
      a, a.inputs[1], "r", packableDType(a, a.inputs[1]), {rows, hidden}));
  PIPER_RETURN_IF_ERROR(
      expectPackableOutput(a, a.outputs[0], "s", {rows, hidden}));
  return expectPackableOutput(a, a.outputs[1], "y", {rows, hidden});
}

// A norm's grad_weight, which takes no gamma: (x [N,H], dy [N,H]) ->
// `outputs` outputs, the first dgamma [H] (the caller checks the others);
// the `accumulate` flag.
Status checkNormGradWeight(const KernelArgs &a, int outputs, double defaultEps,
                           int64_t &rows, int64_t &hidden, double &eps,
                           bool &accumulate) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, outputs));
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, x, "x", packableDType(a, x), rows, hidden));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kEps, defaultEps, eps));
  if (eps < 0)
    return a.error("attribute 'eps' must not be negative");
  PIPER_RETURN_IF_ERROR(readFlag(a, KernelAttr::kAccumulate, accumulate));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dy, "dy", packableDType(a, dy), {rows, hidden}));
  return expectTensor(a, a.outputs[0], "dgamma", plan::F32, {hidden});
}

// A grad_input kernel: checks the call (checkNormGradInput); then, without
// dgamma the rows being independent, runs
// `backward(x, gamma, dy, rows, hidden, eps, dx)` on chunks of rows in
// parallel. With `residual` (the fused *_grad_input_add) each chunk's dx,
// rounded to bf16 in mixed precision as the executor rounds grad_input's
// output, then gets r added: grad_input then add, bit for bit.
template <typename Backward>
Status normGradInput(const KernelArgs &a, double defaultEps, bool residual,
                     const Backward &backward) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(
      checkNormGradInput(a, defaultEps, residual, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &dy = a.inputs[2];
  const TensorRef &dx = a.outputs[0];
  const bool round = a.ctx.lowPrecision;
  std::vector<float> unpacked, unpackedX, unpackedR, packed;
  const float *dyData = fp32Data(dy, unpacked);
  const float *xData = fp32Data(x, unpackedX);
  const float *r = residual ? fp32Data(a.inputs[3], unpackedR) : nullptr;
  float *dxData = outputRow(dx, 0, dx.numel(), packed);
  parallelFor(rows, rowGrain(3 * hidden), [&](int64_t begin, int64_t end) {
    int64_t at = begin * hidden, count = (end - begin) * hidden;
    float *out = dxData + at;
    backward(xData + at, gamma.f32(), dyData + at, end - begin, hidden, eps,
             out);
    if (!r)
      return;
    if (round)
      roundToBf16(out, count);
    for (int64_t i = 0; i < count; ++i)
      out[i] = out[i] + r[at + i]; // add's sum (an exact commutation)
  });
  storeRow(dx, 0, dx.numel(), dx.numel(), dxData);
  return Status::ok();
}

// A norm's weight gradients: computed by `sums(outs)` into the outputs, or
// with `accumulate` into scratch, rounded to bf16 in mixed precision (as the
// executor rounds the unfused kernel's outputs) and added to the outputs
// (the parameters' gradient accumulators): the bits of the norm's kernel
// then `accumulate` kernels.
template <typename Sums>
void storeWeightGrads(const KernelArgs &a, bool accumulate, int64_t hidden,
                      const Sums &sums) {
  const size_t n = a.outputs.size();
  std::vector<float *> outs(n);
  for (size_t o = 0; o < n; ++o)
    outs[o] = a.outputs[o].f32();
  if (!accumulate) {
    sums(outs.data());
    return;
  }
  std::vector<std::vector<float>> scratch(n, std::vector<float>(hidden));
  std::vector<float *> tmp(n);
  for (size_t o = 0; o < n; ++o)
    tmp[o] = scratch[o].data();
  sums(tmp.data());
  for (size_t o = 0; o < n; ++o) {
    if (a.ctx.lowPrecision)
      roundToBf16(tmp[o], hidden);
    for (int64_t j = 0; j < hidden; ++j)
      outs[o][j] += tmp[o][j];
  }
}

// A norm fused with the add before it (checked by the caller): each row's
// s = x + r, rounded to bf16 in mixed precision as the executor rounds
// add's output, then `norm(s row, n)`: add then the norm, bit for bit.
template <typename Norm>
void addThenNorm(const KernelArgs &a, int64_t rows, int64_t hidden,
                 const Norm &norm) {
  std::vector<float> unpacked, unpackedX;
  const float *x = fp32Data(a.inputs[0], unpackedX),
              *r = fp32Data(a.inputs[1], unpacked);
  const TensorRef &s = a.outputs[0];
  const bool round = a.ctx.lowPrecision;
  forEachRow(rows, hidden, [&](int64_t n) {
    std::vector<float> packed;
    float *sr = outputRow(s, n, hidden, packed);
    addVectors(x + n * hidden, r + n * hidden, sr, hidden);
    if (round)
      roundToBf16(sr, hidden);
    norm(sr, n);
    storeRow(s, n, hidden, hidden, sr);
  });
}

// --- layer norm --------------------------------------------------------------

// Mean and 1/sqrt(biased variance + eps) of one row, two-pass in double.
void rowStats(const float *x, int64_t hidden, double eps, double &mean,
              double &rstd) {
  mean = hidden ? sumDouble(x, hidden) / hidden : 0.0;
  double var = hidden ? sumSquaredDeviation(x, hidden, mean) / hidden : 0.0;
  rstd = 1.0 / std::sqrt(var + eps);
}

PIPER_SIMD void layerNormRow(const float *__restrict x,
                             const float *__restrict gamma,
                             const float *__restrict beta, float *__restrict y,
                             int64_t hidden, double mean, double rstd) {
  for (int64_t j = 0; j < hidden; ++j)
    y[j] = static_cast<float>((x[j] - mean) * rstd * gamma[j] + beta[j]);
}

// The backward of layer_norm, shared by its two halves layer_norm_grad_input
// (dx) and layer_norm_grad_weight (dgamma, dbeta). `dx` may be null (then
// `gamma` is not read); `dgamma` and `dbeta` are both null or both set.
PIPER_SIMD void layerNormBackward(const float *x, const float *gamma,
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

} // namespace

// --- RMS norm rows (NormRows.h) ----------------------------------------------

// 1/sqrt(mean(x^2) + eps) of one row, in double.
double rowRrms(const float *x, int64_t hidden, double eps) {
  double sq = dotDouble(x, x, hidden);
  return 1.0 / std::sqrt((hidden ? sq / hidden : 0.0) + eps);
}

PIPER_SIMD void rmsNormRow(const float *__restrict x,
                           const float *__restrict gamma, float *__restrict y,
                           int64_t hidden, double rrms) {
  for (int64_t j = 0; j < hidden; ++j)
    y[j] = static_cast<float>(x[j] * rrms * gamma[j]);
}

// The backward of rms_norm, shared by its two halves rms_norm_grad_input
// (dx) and rms_norm_grad_weight (dgamma). `dx` may be null (then `gamma` is
// not read), as may `dgamma`.
PIPER_SIMD void rmsNormBackward(const float *x, const float *gamma,
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

// --- layer norm kernels ------------------------------------------------------

Status checkLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                      double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(checkNormOperands(a, a.inputs[0], a.inputs[1],
                                          kLayerNormEps, rows, hidden, eps));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "beta", plan::F32, {hidden}));
  return expectPackableOutput(a, a.outputs[0], "y", {rows, hidden});
}

Status layerNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkLayerNorm(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &beta = a.inputs[2],
                  &y = a.outputs[0];

  std::vector<float> unpacked;
  const float *xData = fp32Data(x, unpacked);
  forEachRow(rows, hidden, [&](int64_t n) {
    const float *xr = xData + n * hidden;
    double mean = 0, rstd = 0;
    rowStats(xr, hidden, eps, mean, rstd);
    std::vector<float> packed;
    float *yr = outputRow(y, n, hidden, packed);
    layerNormRow(xr, gamma.f32(), beta.f32(), yr, hidden, mean, rstd);
    storeRow(y, n, hidden, hidden, yr);
  });
  return Status::ok();
}

Status checkAddLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                         double &eps) {
  PIPER_RETURN_IF_ERROR(checkAddNorm(a, 4, kLayerNormEps, rows, hidden, eps));
  return expectTensor(a, a.inputs[3], "beta", plan::F32, {hidden});
}

Status addLayerNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkAddLayerNorm(a, rows, hidden, eps));
  const float *gamma = a.inputs[2].f32(), *beta = a.inputs[3].f32();
  const TensorRef &y = a.outputs[1];
  addThenNorm(a, rows, hidden, [&](const float *s, int64_t n) {
    double mean = 0, rstd = 0;
    rowStats(s, hidden, eps, mean, rstd);
    std::vector<float> packed;
    float *yr = outputRow(y, n, hidden, packed);
    layerNormRow(s, gamma, beta, yr, hidden, mean, rstd);
    storeRow(y, n, hidden, hidden, yr);
  });
  return Status::ok();
}

Status checkLayerNormGradInput(const KernelArgs &a, int64_t &rows,
                               int64_t &hidden, double &eps) {
  return checkNormGradInput(a, kLayerNormEps, false, rows, hidden, eps);
}

Status checkLayerNormGradInputAdd(const KernelArgs &a, int64_t &rows,
                                  int64_t &hidden, double &eps) {
  return checkNormGradInput(a, kLayerNormEps, true, rows, hidden, eps);
}

Status layerNormGradInputKernel(const KernelArgs &a) {
  return normGradInput(a, kLayerNormEps, false, [](auto... args) {
    layerNormBackward(args..., nullptr, nullptr); // dx only
  });
}

Status layerNormGradInputAddKernel(const KernelArgs &a) {
  return normGradInput(a, kLayerNormEps, true, [](auto... args) {
    layerNormBackward(args..., nullptr, nullptr);
  });
}

Status checkLayerNormGradWeight(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps,
                                bool &accumulate) {
  PIPER_RETURN_IF_ERROR(
      checkNormGradWeight(a, 2, kLayerNormEps, rows, hidden, eps, accumulate));
  return expectTensor(a, a.outputs[1], "dbeta", plan::F32, {hidden});
}

Status layerNormGradWeightKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(
      checkLayerNormGradWeight(a, rows, hidden, eps, accumulate));
  std::vector<float> unpacked, unpackedX;
  const float *x = fp32Data(a.inputs[0], unpackedX),
              *dy = fp32Data(a.inputs[1], unpacked);
  storeWeightGrads(a, accumulate, hidden, [&](float *const *out) {
    layerNormBackward(x, nullptr, dy, rows, hidden, eps, nullptr, out[0],
                      out[1]);
  });
  return Status::ok();
}

// --- RMS norm kernels --------------------------------------------------------

Status checkRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                    double &eps) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkNormOperands(a, a.inputs[0], a.inputs[1],
                                          kRmsNormEps, rows, hidden, eps));
  return expectPackableOutput(a, a.outputs[0], "y", {rows, hidden});
}

Status rmsNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkRmsNorm(a, rows, hidden, eps));
  const TensorRef &x = a.inputs[0], &gamma = a.inputs[1], &y = a.outputs[0];

  std::vector<float> unpacked;
  const float *xData = fp32Data(x, unpacked);
  forEachRow(rows, hidden, [&](int64_t n) {
    const float *xr = xData + n * hidden;
    std::vector<float> packed;
    float *yr = outputRow(y, n, hidden, packed);
    rmsNormRow(xr, gamma.f32(), yr, hidden, rowRrms(xr, hidden, eps));
    storeRow(y, n, hidden, hidden, yr);
  });
  return Status::ok();
}

Status checkAddRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                       double &eps) {
  return checkAddNorm(a, 3, kRmsNormEps, rows, hidden, eps);
}

Status addRmsNormKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(checkAddRmsNorm(a, rows, hidden, eps));
  const float *gamma = a.inputs[2].f32();
  const TensorRef &y = a.outputs[1];
  addThenNorm(a, rows, hidden, [&](const float *s, int64_t n) {
    std::vector<float> packed;
    float *yr = outputRow(y, n, hidden, packed);
    rmsNormRow(s, gamma, yr, hidden, rowRrms(s, hidden, eps));
    storeRow(y, n, hidden, hidden, yr);
  });
  return Status::ok();
}

Status checkRmsNormGradInput(const KernelArgs &a, int64_t &rows,
                             int64_t &hidden, double &eps) {
  return checkNormGradInput(a, kRmsNormEps, false, rows, hidden, eps);
}

Status checkRmsNormGradInputAdd(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps) {
  return checkNormGradInput(a, kRmsNormEps, true, rows, hidden, eps);
}

Status rmsNormGradInputKernel(const KernelArgs &a) {
  return normGradInput(a, kRmsNormEps, false, [](auto... args) {
    rmsNormBackward(args..., nullptr); // dx only
  });
}

Status rmsNormGradInputAddKernel(const KernelArgs &a) {
  return normGradInput(a, kRmsNormEps, true,
                       [](auto... args) { rmsNormBackward(args..., nullptr); });
}

Status checkRmsNormGradWeight(const KernelArgs &a, int64_t &rows,
                              int64_t &hidden, double &eps, bool &accumulate) {
  return checkNormGradWeight(a, 1, kRmsNormEps, rows, hidden, eps, accumulate);
}

Status rmsNormGradWeightKernel(const KernelArgs &a) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(
      checkRmsNormGradWeight(a, rows, hidden, eps, accumulate));
  std::vector<float> unpacked, unpackedX;
  const float *x = fp32Data(a.inputs[0], unpackedX),
              *dy = fp32Data(a.inputs[1], unpacked);
  storeWeightGrads(a, accumulate, hidden, [&](float *const *out) {
    rmsNormBackward(x, nullptr, dy, rows, hidden, eps, nullptr, out[0]);
  });
  return Status::ok();
}

} // namespace piper::runtime::detail

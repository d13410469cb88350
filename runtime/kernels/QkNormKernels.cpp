// qk_norm (Qwen3's per-head q/k RMS norm), forward and its split backward:
// RMS norm's rows (NormRows.h) over each q and k head of a row, v copied.
#include <vector>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LayerChecks.h"
#include "runtime/kernels/NormRows.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

namespace {

// heads, kv_heads and eps, and hd from the width `width` of qkv.
Status readQkNormAttrs(const KernelArgs &a, int64_t width, QkNormDims &d) {
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, KernelAttr::kHeads, {}, d.heads));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kKvHeads, d.heads, d.kvHeads));
  if (d.heads % d.kvHeads != 0)
    return a.error("attribute 'heads' (" + std::to_string(d.heads) +
                   ") must be a multiple of 'kv_heads' (" +
                   std::to_string(d.kvHeads) + ")");
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kEps, kRmsNormEps, d.eps));
  if (d.eps < 0)
    return a.error("attribute 'eps' must not be negative");
  if (width % d.headsPerRow() != 0 || width == 0)
    return a.error("qkv has " + std::to_string(width) +
                   " columns, not a positive multiple of heads + 2 kv_heads "
                   "= " +
                   std::to_string(d.headsPerRow()));
  d.hd = width / d.headsPerRow();
  return Status::ok();
}

// qkv [N, W] and the attributes; gamma [2 hd] when `gamma` is given.
Status checkQkNormOperands(const KernelArgs &a, const TensorRef *gamma,
                           QkNormDims &d) {
  int64_t width = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "qkv", plan::F32, d.rows, width));
  PIPER_RETURN_IF_ERROR(readQkNormAttrs(a, width, d));
  if (gamma)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, *gamma, "gamma", plan::F32, {2 * d.hd}));
  return Status::ok();
}

// Which half of gamma normalizes head j of a row: 0 (q's, at gamma), 1
// (k's, at gamma + hd), or -1 for a v head (copied).
inline int64_t qkClass(const QkNormDims &d, int64_t j) {
  return j < d.heads ? 0 : j < d.heads + d.kvHeads ? 1 : -1;
}

} // namespace

Status checkQkNorm(const KernelArgs &a, QkNormDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkQkNormOperands(a, &a.inputs[1], d));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {d.rows, d.width()});
}

Status checkQkNormGradInput(const KernelArgs &a, QkNormDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(checkQkNormOperands(a, &a.inputs[1], d));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "dy", plan::F32, {d.rows, d.width()}));
  return expectTensor(a, a.outputs[0], "dx", plan::F32, {d.rows, d.width()});
}

Status checkQkNormGradWeight(const KernelArgs &a, QkNormDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkQkNormOperands(a, nullptr, d));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[1], "dy", plan::F32, {d.rows, d.width()}));
  return expectTensor(a, a.outputs[0], "dgamma", plan::F32, {2 * d.hd});
}

// Each head of a row is an rms_norm row of hd (the v heads are copied).
Status qkNormKernel(const KernelArgs &a) {
  QkNormDims d;
  PIPER_RETURN_IF_ERROR(checkQkNorm(a, d));
  const float *x = a.inputs[0].f32(), *gamma = a.inputs[1].f32();
  float *y = a.outputs[0].f32();
  const int64_t g = d.headsPerRow();
  forEachRow(d.rows * g, d.hd, [&](int64_t r) {
    const float *xr = x + r * d.hd;
    float *yr = y + r * d.hd;
    int64_t c = qkClass(d, r % g);
    if (c < 0)
      std::copy(xr, xr + d.hd, yr);
    else
      rmsNormRow(xr, gamma + c * d.hd, yr, d.hd, rowRrms(xr, d.hd, d.eps));
  });
  return Status::ok();
}

Status qkNormGradInputKernel(const KernelArgs &a) {
  QkNormDims d;
  PIPER_RETURN_IF_ERROR(checkQkNormGradInput(a, d));
  const float *x = a.inputs[0].f32(), *gamma = a.inputs[1].f32(),
              *dy = a.inputs[2].f32();
  float *dx = a.outputs[0].f32();
  const int64_t g = d.headsPerRow();
  forEachRow(d.rows * g, 3 * d.hd, [&](int64_t r) {
    const int64_t at = r * d.hd;
    int64_t c = qkClass(d, r % g);
    if (c < 0)
      std::copy(dy + at, dy + at + d.hd, dx + at);
    else
      rmsNormBackward(x + at, gamma + c * d.hd, dy + at, 1, d.hd, d.eps,
                      dx + at, nullptr);
  });
  return Status::ok();
}

// dgamma[c hd + t] = the sum of dy * xhat at column t of every class-c
// head, rows in order and heads in order within a row, in double.
Status qkNormGradWeightKernel(const KernelArgs &a) {
  QkNormDims d;
  PIPER_RETURN_IF_ERROR(checkQkNormGradWeight(a, d));
  const float *x = a.inputs[0].f32(), *dy = a.inputs[1].f32();
  std::vector<double> sum(2 * d.hd, 0.0);
  const int64_t g = d.headsPerRow();
  for (int64_t r = 0; r < d.rows * g; ++r) {
    int64_t c = qkClass(d, r % g);
    if (c < 0)
      continue;
    const float *xr = x + r * d.hd, *dyr = dy + r * d.hd;
    double rrms = rowRrms(xr, d.hd, d.eps);
    double *s = sum.data() + c * d.hd;
    for (int64_t t = 0; t < d.hd; ++t)
      s[t] += dyr[t] * (xr[t] * rrms);
  }
  float *dgamma = a.outputs[0].f32();
  for (int64_t t = 0; t < 2 * d.hd; ++t)
    dgamma[t] = static_cast<float>(sum[t]);
  return Status::ok();
}

} // namespace piper::runtime::detail

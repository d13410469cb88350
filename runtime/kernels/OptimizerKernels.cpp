// Kernels on persistent state: gradient accumulation, zeroing and the AdamW
// update, all in place.
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/kernels/ElementwiseChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

namespace {

PIPER_SIMD void accumulateLoop(float *__restrict acc, const float *__restrict g,
                               int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    acc[i] += g[i];
}

// One pass over the four arrays, per element in double, the gradient
// times the clip factor `clip` (a float product; 1 without clipping, which
// is exact); with a bf16 copy (Copy), the updated parameter rounded to bf16
// is written there too.
template <bool Copy>
PIPER_SIMD void adamwLoop(const float *__restrict grad, float *__restrict param,
                          float *__restrict m, float *__restrict v,
                          float *__restrict copy, int64_t n,
                          const AdamwConstants &c, float clip) {
  // The bias corrections are multiplications by their reciprocals (within
  // an ulp of double of the divisions): one division and one square root per
  // element instead of three divisions.
  const double decay = c.decay, beta1 = c.beta1, beta2 = c.beta2, eps = c.eps,
               step = c.lr / c.correction1, inv2 = 1.0 / c.correction2;
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i] * clip;
    double p = param[i];
    p -= decay * p;
    double mi = beta1 * m[i] + (1.0 - beta1) * g;
    double vi = beta2 * v[i] + (1.0 - beta2) * g * g;
    p -= step * mi / (std::sqrt(vi * inv2) + eps);
    param[i] = static_cast<float>(p);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    if constexpr (Copy)
      copy[i] = roundToBf16(static_cast<float>(p));
  }
}

} // namespace

Status checkAccumulate(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(expectDType(a, a.inputs[0], "g", plan::F32));
  return expectTensor(a, a.outputs[0], "acc", plan::F32, a.inputs[0].shape);
}

Status accumulateKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkAccumulate(a));
  const TensorRef &g = a.inputs[0], &acc = a.outputs[0];

  float *accData = acc.f32();
  const float *gData = g.f32();
  parallelFor(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    accumulateLoop(accData + begin, gData + begin, end - begin);
  });
  return Status::ok();
}

Status checkZero(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 0, 0, 1));
  const TensorRef &t = a.outputs[0];
  if (t.dtype != plan::F32 && t.dtype != plan::I32)
    return a.error(std::string("t must be f32 or i32, got ") +
                   dtypeName(t.dtype));
  return Status::ok();
}

Status zeroKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkZero(a));
  const TensorRef &t = a.outputs[0];
  // All-zero bytes are 0 in both f32 and i32.
  char *bytes = static_cast<char *>(t.data);
  parallelFor(t.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    std::memset(bytes + begin * 4, 0, static_cast<size_t>(end - begin) * 4);
  });
  return Status::ok();
}

Status checkAdamw(const KernelArgs &a, AdamwHyper &h) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 3));
  const TensorRef &grad = a.inputs[0], &param = a.outputs[0], &m = a.outputs[1],
                  &v = a.outputs[2];
  PIPER_RETURN_IF_ERROR(expectDType(a, grad, "grad", plan::F32));
  PIPER_RETURN_IF_ERROR(expectTensor(a, param, "param", plan::F32, grad.shape));
  PIPER_RETURN_IF_ERROR(expectTensor(a, m, "m", plan::F32, grad.shape));
  PIPER_RETURN_IF_ERROR(expectTensor(a, v, "v", plan::F32, grad.shape));
  h = AdamwHyper{};
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kLr, std::nullopt, h.lr));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kBeta1, 0.9, h.beta1));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kBeta2, 0.95, h.beta2));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kEps, 1e-8, h.eps));
  PIPER_RETURN_IF_ERROR(
      readFloat(a, KernelAttr::kWeightDecay, 0.0, h.weightDecay));
  // A beta of 1 would make the bias correction divide by zero.
  if (h.beta1 < 0 || h.beta1 >= 1 || h.beta2 < 0 || h.beta2 >= 1)
    return a.error("attributes 'beta1' and 'beta2' must be in [0, 1)");
  if (h.eps < 0)
    return a.error("attribute 'eps' must not be negative");
  if (a.ctx.step < 1)
    return a.error("step must be at least 1, got " +
                   std::to_string(a.ctx.step));

  if (!(a.ctx.lrScale >= 0) || !std::isfinite(a.ctx.lrScale))
    return a.error("learning-rate scale must be finite and non-negative");
  if (a.ctx.bf16Copy && a.ctx.bf16PackedCopy)
    return a.error("a bf16 copy and a packed bf16 copy at once");
  return Status::ok();
}

AdamwConstants adamwConstants(const AdamwHyper &h, int64_t step,
                              double lrScale) {
  AdamwConstants c;
  const double lr = h.lr * lrScale;
  const double t = static_cast<double>(step);
  c.lr = lr;
  c.decay = lr * h.weightDecay;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.correction1 = 1.0 - std::pow(h.beta1, t);
  c.correction2 = 1.0 - std::pow(h.beta2, t);
  return c;
}

Status adamwKernel(const KernelArgs &a) {
  AdamwHyper h;
  PIPER_RETURN_IF_ERROR(checkAdamw(a, h));
  const AdamwConstants c = adamwConstants(h, a.ctx.step, a.ctx.lrScale);
  if (a.ctx.clipFactor && !std::isfinite(*a.ctx.clipFactor))
    return Status::ok(); // a diverged step: nothing is updated
  const TensorRef &grad = a.inputs[0], &param = a.outputs[0], &m = a.outputs[1],
                  &v = a.outputs[2];
  const float *g = grad.f32();
  float *p = param.f32(), *mData = m.f32(), *vData = v.f32();
  float *copy = a.ctx.bf16Copy;
  uint16_t *packed = a.ctx.bf16PackedCopy;
  const float clip = a.ctx.clipFactor ? *a.ctx.clipFactor : 1.0f;
  parallelFor(grad.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    if (copy) {
      adamwLoop<true>(g + begin, p + begin, mData + begin, vData + begin,
                      copy + begin, end - begin, c, clip);
    } else if (packed) {
      // The rounded copy packed: the same bf16 values.
      std::vector<float> rounded(static_cast<size_t>(end - begin));
      adamwLoop<true>(g + begin, p + begin, mData + begin, vData + begin,
                      rounded.data(), end - begin, c, clip);
      packBf16(packed + begin, rounded.data(), end - begin);
    } else
      adamwLoop<false>(g + begin, p + begin, mData + begin, vData + begin,
                       nullptr, end - begin, c, clip);
  });
  return Status::ok();
}

} // namespace piper::runtime::detail

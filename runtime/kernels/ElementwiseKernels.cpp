// Elementwise kernels: GELU (GPT-2's tanh approximation), SwiGLU and add,
// forward and backward. Hot loops are PIPER_SIMD: vectorized, one clone per
// instruction set (VecMath.h).
#include <vector>

#include "runtime/kernels/ElementwiseChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

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
  PIPER_RETURN_IF_ERROR(
      expectDType(a, a.inputs[0], "x", packableDType(a, a.inputs[0])));
  return expectPackableOutput(a, a.outputs[0], "y", a.inputs[0].shape);
}

void geluInto(const float *x, float *y, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    geluLoop(x + begin, y + begin, end - begin);
  });
}

void geluGradInto(const float *x, const float *dy, float *dx, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t begin, int64_t end) {
    geluGradLoop(x + begin, dy + begin, dx + begin, end - begin);
  });
}

Status geluKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkGelu(a));
  const TensorRef &y = a.outputs[0];
  std::vector<float> packed;
  float *out = outputRow(y, 0, y.numel(), packed);
  std::vector<float> unpacked;
  geluInto(fp32Data(a.inputs[0], unpacked), out, y.numel());
  storeRow(y, 0, y.numel(), y.numel(), out);
  return Status::ok();
}

Status checkGeluGrad(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &x = a.inputs[0];
  PIPER_RETURN_IF_ERROR(expectDType(a, x, "x", packableDType(a, x)));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "dy",
                                     packableDType(a, a.inputs[1]), x.shape));
  return expectPackableOutput(a, a.outputs[0], "dx", x.shape);
}

Status geluGradKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkGeluGrad(a));
  const TensorRef &dx = a.outputs[0];
  std::vector<float> packed;
  float *out = outputRow(dx, 0, dx.numel(), packed);
  std::vector<float> unpackedX, unpackedDy;
  geluGradInto(fp32Data(a.inputs[0], unpackedX),
               fp32Data(a.inputs[1], unpackedDy), out, dx.numel());
  storeRow(dx, 0, dx.numel(), dx.numel(), out);
  return Status::ok();
}

// Shared checks of swiglu and its gradient: `gateUp` is [N,2F] (packed
// in mixed precision where the step buffer is).
static Status checkGateUp(const KernelArgs &a, const TensorRef &gateUp,
                          int64_t &rows, int64_t &width) {
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, gateUp, "gate_up", packableDType(a, gateUp), rows, cols));
  if (cols % 2 != 0)
    return a.error("gate_up has shape " + shapeString(gateUp.shape) +
                   ", expected an even number of columns [gate | up]");
  width = cols / 2;
  return Status::ok();
}

Status checkSwiglu(const KernelArgs &a, int64_t &rows, int64_t &width) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(checkGateUp(a, a.inputs[0], rows, width));
  return expectPackableOutput(a, a.outputs[0], "y", {rows, width});
}

Status swigluKernel(const KernelArgs &a) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(checkSwiglu(a, rows, width));
  const TensorRef &y = a.outputs[0];
  std::vector<float> unpacked;
  const float *gateUp = fp32Data(a.inputs[0], unpacked);

  parallelFor(rows, rowGrain(3 * width), [&](int64_t begin, int64_t end) {
    std::vector<float> packed;
    for (int64_t n = begin; n < end; ++n) {
      const float *gate = gateUp + n * 2 * width;
      float *row = outputRow(y, n, width, packed);
      swigluRow(gate, gate + width, row, width);
      storeRow(y, n, width, width, row);
    }
  });
  return Status::ok();
}

Status checkSwigluGrad(const KernelArgs &a, int64_t &rows, int64_t &width) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkGateUp(a, a.inputs[0], rows, width));
  PIPER_RETURN_IF_ERROR(expectTensor(
      a, a.inputs[1], "dy", packableDType(a, a.inputs[1]), {rows, width}));
  return expectPackableOutput(a, a.outputs[0], "dgate_up", {rows, 2 * width});
}

Status swigluGradKernel(const KernelArgs &a) {
  int64_t rows = 0, width = 0;
  PIPER_RETURN_IF_ERROR(checkSwigluGrad(a, rows, width));
  const TensorRef &dgateUp = a.outputs[0];
  std::vector<float> unpackedGateUp, unpackedDy;
  const float *gateUp = fp32Data(a.inputs[0], unpackedGateUp);
  const float *dy = fp32Data(a.inputs[1], unpackedDy);

  parallelFor(rows, rowGrain(5 * width), [&](int64_t begin, int64_t end) {
    std::vector<float> packed;
    for (int64_t n = begin; n < end; ++n) {
      const float *gate = gateUp + n * 2 * width;
      float *dgate = outputRow(dgateUp, n, 2 * width, packed);
      swigluGradRow(gate, gate + width, dy + n * width, dgate, dgate + width,
                    width);
      storeRow(dgateUp, n, 2 * width, 2 * width, dgate);
    }
  });
  return Status::ok();
}

Status checkAdd(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &l = a.inputs[0];
  PIPER_RETURN_IF_ERROR(expectDType(a, l, "a", packableDType(a, l)));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "b",
                                     packableDType(a, a.inputs[1]), l.shape));
  return expectPackableOutput(a, a.outputs[0], "y", l.shape);
}

Status addKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(checkAdd(a));
  const TensorRef &y = a.outputs[0];
  std::vector<float> unpackedL, unpackedR, packed;
  const float *l = fp32Data(a.inputs[0], unpackedL),
              *r = fp32Data(a.inputs[1], unpackedR);
  float *out = outputRow(y, 0, y.numel(), packed);

  parallelFor(y.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    addVectors(l + begin, r + begin, out + begin, end - begin);
  });
  storeRow(y, 0, y.numel(), y.numel(), out);
  return Status::ok();
}

} // namespace piper::runtime::detail

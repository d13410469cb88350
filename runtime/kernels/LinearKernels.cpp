// The linear family's kernels: linear (and linear_gelu), its input and
// weight gradients (linear_grad_input(_gelu), linear_grad_weight(_bias),
// with `accumulate`), bias_add and bias_grad. GEMMs through BLAS (KernelUtil's
// gemm); the column sums accumulate in double in a fixed order (VecMath.h),
// so results do not depend on the machine's threads.
#include <algorithm>
#include <vector>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LinearChecks.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

// Reads transpose_w and the [in,out] sizes of the weight: w is [in,out], or
// [out,in] when transposed.
static Status weightDims(const KernelArgs &a, const TensorRef &w,
                         bool &transposeW, int64_t &in, int64_t &out) {
  PIPER_RETURN_IF_ERROR(readTransposeW(a, transposeW));
  int64_t rows = 0, cols = 0;
  // In mixed precision w may be packed bf16: a GEMM's operand.
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, w, "w", rows, cols));
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

// valid_cols on a kernel whose `name` operand has no padded form (a bias,
// GELU).
static Status refusePadded(const KernelArgs &a, const char *name) {
  return a.error("valid_cols (a padded " + std::string(name) +
                 ") is only for linear, linear_grad_input and "
                 "linear_grad_weight without a bias");
}

// linear's operands, and linear_gelu's (`outputs` 2: h and gelu(h)).
static Status checkLinearOperands(const KernelArgs &a, size_t outputs,
                                  LinearDims &d, bool &hasBias) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 3, outputs));
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  int64_t wIn = 0;
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, x, "x", d.rows, d.in));
  PIPER_RETURN_IF_ERROR(weightDims(a, w, d.transposeW, wIn, d.out));
  if (wIn != d.in)
    return weightMismatch(a, w, d.transposeW, d.in);
  hasBias = a.inputs.size() == 3;
  if (hasBias)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[2], "b", plan::F32, {d.out}));
  const char *yName = outputs == 1 ? "y" : "h";
  if (hasValidCols(a) && (outputs == 2 || hasBias))
    return refusePadded(a, yName);
  // linear's y may be packed in mixed precision (the classifier's logits,
  // read only by the loss kernels: hal::Device::writesPackedOutput).
  PIPER_RETURN_IF_ERROR(
      expectPaddedRows(a, y, yName, d.rows, d.out, d.ld, outputs == 1));
  // gelu(h), which in mixed precision may be packed (an MLP's activation
  // that only GEMMs read: hal::Device::writesPackedOutput).
  if (outputs == 2)
    PIPER_RETURN_IF_ERROR(
        expectPackableOutput(a, a.outputs[1], "y", {d.rows, d.out}));
  return expectBlasDims(a, {d.rows, d.in, d.out, d.ld});
}

Status checkLinear(const KernelArgs &a, LinearDims &d, bool &hasBias) {
  return checkLinearOperands(a, 1, d, hasBias);
}

Status checkLinearGelu(const KernelArgs &a, LinearDims &d, bool &hasBias) {
  return checkLinearOperands(a, 2, d, hasBias);
}

// y = x w (+ b) into a.outputs[0]; a packed y (linear's, in mixed
// precision: hal::Device::writesPackedOutput) gets the fp32 result's
// valid columns rounded and packed.
static void linearInto(const KernelArgs &a, const LinearDims &d, bool hasBias) {
  const TensorRef &x = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  const int64_t rows = d.rows, in = d.in, out = d.out;
  const bool transposeW = d.transposeW;
  std::vector<float> packed;
  float *yData = outputRow(y, 0, rows * d.ld, packed);

  // The bias is the GEMM's initial C, so it costs no extra pass.
  if (hasBias)
    for (int64_t n = 0; n < rows; ++n)
      std::copy_n(a.inputs[2].f32(), out, yData + n * d.ld);
  std::vector<float> unpacked, unpackedW;
  gemm(false, transposeW, rows, out, in, 1.0f, fp32Data(x, unpacked), in,
       fp32Data(w, unpackedW), transposeW ? in : out, hasBias ? 1.0f : 0.0f,
       yData, d.ld);
  for (int64_t n = 0; n < rows; ++n)
    storeRow(y, n, d.ld, out, yData + n * d.ld);
}

Status linearKernel(const KernelArgs &a) {
  LinearDims d;
  bool hasBias = false;
  PIPER_RETURN_IF_ERROR(checkLinear(a, d, hasBias));
  linearInto(a, d, hasBias);
  return Status::ok();
}

// linear's h, rounded to bf16 in mixed precision as the executor would
// round linear's output, then gelu's loop on it: the unfused bits (a packed
// y: those rounded and packed).
Status linearGeluKernel(const KernelArgs &a) {
  LinearDims d;
  bool hasBias = false;
  PIPER_RETURN_IF_ERROR(checkLinearGelu(a, d, hasBias));
  linearInto(a, d, hasBias);
  const int64_t n = d.rows * d.out;
  float *h = a.outputs[0].f32();
  if (a.ctx.lowPrecision)
    roundToBf16(h, n);
  const TensorRef &y = a.outputs[1];
  std::vector<float> packed;
  float *out = outputRow(y, 0, n, packed);
  geluInto(h, out, n);
  storeRow(y, 0, n, n, out);
  return Status::ok();
}

// linear_grad_input's operands, and linear_grad_input_gelu's (`inputs` 3:
// also h [rows, in]).
static Status checkGradInputOperands(const KernelArgs &a, size_t inputs,
                                     LinearDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, inputs, inputs, 1));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dx = a.outputs[0];
  int64_t wOut = 0;
  if (hasValidCols(a) && inputs == 3)
    return refusePadded(a, "dy");
  PIPER_RETURN_IF_ERROR(
      expectPaddedMatrix(a, dy, "dy", d.rows, d.out, d.ld, true));
  PIPER_RETURN_IF_ERROR(weightDims(a, w, d.transposeW, d.in, wOut));
  if (wOut != d.out)
    return a.error("w has shape " + shapeString(w.shape) + ", expected " +
                   (d.transposeW ? "[" + std::to_string(d.out) + ",*]"
                                 : "[*," + std::to_string(d.out) + "]") +
                   " (transpose_w=" + (d.transposeW ? "1" : "0") + ")");
  if (inputs == 3)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[2], "h", plan::F32, {d.rows, d.in}));
  // dx (linear_grad_input's) or dh (linear_grad_input_gelu's) may be
  // packed in mixed precision (a gradient that only packed readers read:
  // hal::Device::writesPackedOutput).
  PIPER_RETURN_IF_ERROR(expectTensor(a, dx, inputs == 2 ? "dx" : "dh",
                                     packableDType(a, dx), {d.rows, d.in}));
  return expectBlasDims(a, {d.rows, d.in, d.out, d.ld});
}

Status checkLinearGradInput(const KernelArgs &a, LinearDims &d) {
  return checkGradInputOperands(a, 2, d);
}

Status checkLinearGradInputGelu(const KernelArgs &a, LinearDims &d) {
  return checkGradInputOperands(a, 3, d);
}

// dx = dy * w^T for w [in,out]; dx = dy * w for w [out,in].
static void gradInputInto(const KernelArgs &a, const LinearDims &d, float *dx) {
  std::vector<float> unpacked, unpackedW;
  gemm(false, !d.transposeW, d.rows, d.in, d.out, 1.0f,
       fp32Data(a.inputs[0], unpacked), d.ld, fp32Data(a.inputs[1], unpackedW),
       d.transposeW ? d.in : d.out, 0.0f, dx, d.in);
}

Status linearGradInputKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradInput(a, d));
  const TensorRef &dx = a.outputs[0];
  std::vector<float> packed;
  float *out = outputRow(dx, 0, dx.numel(), packed);
  gradInputInto(a, d, out);
  storeRow(dx, 0, dx.numel(), dx.numel(), out);
  return Status::ok();
}

// linear_grad_input's product, rounded to bf16 in mixed precision as the
// executor would round it, then gelu_grad's loop: the unfused bits (a
// packed dh stored rounded, as the executor would round it).
Status linearGradInputGeluKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradInputGelu(a, d));
  const TensorRef &dh = a.outputs[0];
  const int64_t n = d.rows * d.in;
  std::vector<float> product(static_cast<size_t>(n)), packed;
  gradInputInto(a, d, product.data());
  if (a.ctx.lowPrecision)
    roundToBf16(product.data(), n);
  float *out = outputRow(dh, 0, n, packed);
  geluGradInto(a.inputs[2].f32(), product.data(), out, n);
  storeRow(dh, 0, n, n, out);
  return Status::ok();
}

namespace {
// (x, dy) -> dw, the operands linear_grad_weight and
// linear_grad_weight_bias share (dy padded only without the bias).
Status checkGradWeightOperands(const KernelArgs &a, bool bias, LinearDims &d) {
  const TensorRef &x = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readTransposeW(a, d.transposeW));
  PIPER_RETURN_IF_ERROR(readFlag(a, KernelAttr::kAccumulate, d.accumulate));
  int64_t dyRows = 0;
  PIPER_RETURN_IF_ERROR(expectGemmMatrix(a, x, "x", d.rows, d.in));
  if (hasValidCols(a) && bias)
    return refusePadded(a, "dy");
  // Packable with a bias too: the column sums read it as it is stored.
  PIPER_RETURN_IF_ERROR(
      expectPaddedMatrix(a, dy, "dy", dyRows, d.out, d.ld, true));
  if (dyRows != d.rows)
    return a.error("dy has shape " + shapeString(dy.shape) + ", expected [" +
                   std::to_string(d.rows) + ",*]");
  std::vector<int64_t> wShape = d.transposeW
                                    ? std::vector<int64_t>{d.out, d.in}
                                    : std::vector<int64_t>{d.in, d.out};
  PIPER_RETURN_IF_ERROR(expectTensor(a, dw, "dw", plan::F32, wShape));
  return expectBlasDims(a, {d.rows, d.in, d.out, d.ld});
}

// dw = x^T dy [in, out], or dy^T x [out, in] when transposed.
void gradWeight(const LinearDims &d, const float *x, const float *dy,
                float *dw) {
  if (d.transposeW)
    gemm(true, false, d.out, d.in, d.rows, 1.0f, dy, d.ld, x, d.in, 0.0f, dw,
         d.in);
  else
    gemm(true, false, d.in, d.out, d.rows, 1.0f, x, d.in, dy, d.ld, 0.0f, dw,
         d.out);
}

// dw into a.outputs[0], or with `accumulate` added to it: dw computed whole
// into scratch, rounded to bf16 in mixed precision, then added element by
// element (the bits of linear_grad_weight then `accumulate`).
void gradWeightInto(const KernelArgs &a, const LinearDims &d) {
  float *out = a.outputs[0].f32();
  std::vector<float> xs, dys;
  const float *x = fp32Data(a.inputs[0], xs), *dy = fp32Data(a.inputs[1], dys);
  if (!d.accumulate) {
    gradWeight(d, x, dy, out);
    return;
  }
  const int64_t n = d.in * d.out;
  std::vector<float> dw(static_cast<size_t>(n));
  gradWeight(d, x, dy, dw.data());
  if (a.ctx.lowPrecision)
    roundToBf16(dw.data(), n);
  for (int64_t i = 0; i < n; ++i)
    out[i] += dw[static_cast<size_t>(i)];
}

// db = the column sums of dy [rows, out], in double, row by row.
void columnSums(const float *dy, int64_t rows, int64_t out, float *db) {
  std::vector<double> sum(out, 0.0);
  for (int64_t n = 0; n < rows; ++n)
    addRowToSums(sum.data(), dy + n * out, out);
  sumsToFloat(sum.data(), db, out);
}
} // namespace

Status checkLinearGradWeight(const KernelArgs &a, LinearDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  return checkGradWeightOperands(a, false, d);
}

Status linearGradWeightKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradWeight(a, d));
  gradWeightInto(a, d);
  return Status::ok();
}

Status checkLinearGradWeightBias(const KernelArgs &a, LinearDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 2));
  PIPER_RETURN_IF_ERROR(checkGradWeightOperands(a, true, d));
  return expectTensor(a, a.outputs[1], "db", plan::F32, {d.out});
}

Status linearGradWeightBiasKernel(const KernelArgs &a) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(checkLinearGradWeightBias(a, d));
  // linear_grad_weight's and bias_grad's own computations: their bits.
  gradWeightInto(a, d);
  std::vector<float> dys;
  columnSums(fp32Data(a.inputs[1], dys), d.rows, d.out, a.outputs[1].f32());
  return Status::ok();
}

Status checkBiasAdd(const KernelArgs &a, int64_t &rows, int64_t &out) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "x", plan::F32, rows, out));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "b", plan::F32, {out}));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, out});
}

Status biasAddKernel(const KernelArgs &a) {
  int64_t rows = 0, out = 0;
  PIPER_RETURN_IF_ERROR(checkBiasAdd(a, rows, out));
  const float *x = a.inputs[0].f32(), *b = a.inputs[1].f32();
  float *y = a.outputs[0].f32();
  for (int64_t n = 0; n < rows; ++n)
    addVectors(x + n * out, b, y + n * out, out);
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
  columnSums(a.inputs[0].f32(), rows, out, a.outputs[0].f32());
  return Status::ok();
}
} // namespace piper::runtime::detail

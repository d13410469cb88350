// The linear and loss GPU kernels: linear and its gradients (GEMMs through
// gemm(), cuBLASLt on CUDA, bf16 tensor cores with ctx.bf16), linear_gelu
// and linear_grad_input_gelu (GELU in the GEMM's epilogue), bias_grad
// (chunked column sums), the softmax cross entropy and its gradient (a warp
// per row), their vocabulary-parallel forms, and loss_accumulate (into its
// stream's accumulator in device memory). Each mirrors its CPU kernel
// (runtime/kernels/LinearKernels.cpp, LossKernels.cpp) and checks its operands
// with the same function.
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/LinearLaunch.h"
#include "runtime/kernels/LinearChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

using detail::KernelArgs;
using detail::LinearDims;

// y = x w (+ b) into output 0, the bias added in the GEMM's epilogue (no
// pass of its own); with `gelu`, asking for GELU there too. A packed y
// (linear's, KernelEntry::packedOutputs) is stored by the GEMM as bf16.
Status forward(const KernelArgs &a, const Context &ctx, const LinearDims &d,
               bool hasBias, GemmGelu *gelu) {
  const TensorRef &y = a.outputs[0];
  return gemm(ctx, false, d.transposeW, d.rows, d.out, d.in, 1.0f,
              gemmOperand(a.inputs[0]), d.in, gemmOperand(a.inputs[1]),
              d.transposeW ? d.in : d.out, 0.0f, f32Out(y), d.ld,
              hasBias ? a.inputs[2].f32() : nullptr, nullptr, gelu, bf16Out(y));
}

// In mixed precision y is stored rounded to bf16 (KernelEntry::
// roundsOutputs): by a pass after the GEMM, or by the GEMM itself where y
// is packed (the classifier's logits, which only the loss kernels read).
Status linear(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  bool hasBias = false;
  PIPER_RETURN_IF_ERROR(detail::checkLinear(a, d, hasBias));
  PIPER_RETURN_IF_ERROR(forward(a, ctx, d, hasBias, nullptr));
  const TensorRef &y = a.outputs[0];
  if (!a.ctx.lowPrecision || y.dtype == plan::BF16)
    return Status::ok();
  return launchRoundBf16Rows(ctx, y.f32(), d.rows, d.out, d.ld);
}

// h = x w (+ b) and y = gelu(h), both rounded to bf16 in mixed precision
// (KernelEntry::roundsOutputs). GELU in the GEMM's epilogue where the
// backend has it and y is fp32 (cuBLASLt: gelu of the fp32 h, then each
// output rounded by a pass); elsewhere (the emulation; a packed y, which
// gelu's loop stores rounded and packed: the MLP's activation that only
// GEMMs read, KernelEntry::packedOutputs) h is rounded first and gelu's
// loop reads it: the CPU kernel's bits.
Status linearGelu(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  bool hasBias = false;
  PIPER_RETURN_IF_ERROR(detail::checkLinearGelu(a, d, hasBias));
  float *h = a.outputs[0].f32(), *y = f32Out(a.outputs[1]);
  uint16_t *y16 = bf16Out(a.outputs[1]);
  const bool round = a.ctx.lowPrecision;
  const int64_t n = d.rows * d.out;
  GemmGelu gelu;
  gelu.out = y;
  PIPER_RETURN_IF_ERROR(forward(a, ctx, d, hasBias, y ? &gelu : nullptr));
  if (round)
    PIPER_RETURN_IF_ERROR(launchRoundBf16(ctx, h, n));
  if (gelu.done)
    return round ? launchRoundBf16(ctx, y, n) : Status::ok();
  return launchGelu(ctx, RowIn{h, nullptr}, y, n, round, y16);
}

// dx = dy * w^T for w [in,out]; dx = dy * w for w [out,in] (with `gelu`,
// asking for its epilogue) into fp32 `dx`, or stored by the GEMM as bf16
// into `dx16` (linear_grad_input's packed dx, KernelEntry::packedOutputs).
Status gradInput(const KernelArgs &a, const Context &ctx, const LinearDims &d,
                 float *dx, uint16_t *dx16, GemmGelu *gelu) {
  return gemm(ctx, false, !d.transposeW, d.rows, d.in, d.out, 1.0f,
              gemmOperand(a.inputs[0]), d.ld, gemmOperand(a.inputs[1]),
              d.transposeW ? d.in : d.out, 0.0f, dx, d.in, nullptr, nullptr,
              gelu, dx16);
}

// In mixed precision dx is stored rounded to bf16 (KernelEntry::
// roundsOutputs): by a pass after the GEMM, or by the GEMM itself where dx
// is packed (a gradient that only packed readers read: attention_grad's
// and the MLP gradients' dy).
Status linearGradInput(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(detail::checkLinearGradInput(a, d));
  const TensorRef &dx = a.outputs[0];
  PIPER_RETURN_IF_ERROR(gradInput(a, ctx, d, f32Out(dx), bf16Out(dx), nullptr));
  if (!a.ctx.lowPrecision || dx.dtype == plan::BF16)
    return Status::ok();
  return launchRoundBf16(ctx, dx.f32(), dx.numel());
}

// dh = (dy w^T) * gelu'(h): DGELU in the GEMM's epilogue where the backend
// has it (the fp32 product multiplied); elsewhere the product lands in dh,
// is rounded in mixed precision and gelu_grad's kernel multiplies it in
// place: the CPU kernel's bits. In mixed precision dh is stored rounded
// (KernelEntry::roundsOutputs): by a pass, or packed (the MLP's gradient
// that only GEMMs and the bias gradient's sums read, KernelEntry::
// packedOutputs: the product goes to scratch, and the epilogue's fp32
// result is packed by a pass, or gelu_grad's loop stores it packed).
Status linearGradInputGelu(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(detail::checkLinearGradInputGelu(a, d));
  const float *h = a.inputs[2].f32();
  const TensorRef &out = a.outputs[0];
  uint16_t *dh16 = bf16Out(out);
  const int64_t n = d.rows * d.in;
  float *dh = f32Out(out);
  if (dh16) {
    void *scratch = nullptr;
    PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
        static_cast<size_t>(n) * sizeof(float), scratch));
    dh = static_cast<float *>(scratch);
  }
  GemmGelu gelu;
  gelu.gradOf = h;
  PIPER_RETURN_IF_ERROR(gradInput(a, ctx, d, dh, nullptr, &gelu));
  const bool round = a.ctx.lowPrecision;
  if (gelu.done)
    return packOrRound(ctx, dh, dh16, n, round);
  if (round)
    PIPER_RETURN_IF_ERROR(launchRoundBf16(ctx, dh, n));
  return launchGeluGrad(ctx, RowIn{h, nullptr}, RowIn{dh, nullptr},
                        dh16 ? nullptr : dh, n, round, dh16);
}

// dw = x^T dy [in,out], or dy^T x [out,in] when transposed, plus beta dw;
// with `db`, the column sums of dy asked of the GEMM's epilogue
// (sums->done: computed).
Status gradWeight(const Context &ctx, const LinearDims &d, GemmOperand x,
                  GemmOperand dy, float beta, float *dw, float *db,
                  GemmSums *sums) {
  if (d.transposeW) {
    // op(A) = dy^T: its rows summed over k are dy's columns.
    if (db)
      sums->a = db;
    return gemm(ctx, true, false, d.out, d.in, d.rows, 1.0f, dy, d.ld, x, d.in,
                beta, dw, d.in, nullptr, db ? sums : nullptr);
  }
  // op(B) = dy: its columns summed over k.
  if (db)
    sums->b = db;
  return gemm(ctx, true, false, d.in, d.out, d.rows, 1.0f, x, d.in, dy, d.ld,
              beta, dw, d.out, nullptr, db ? sums : nullptr);
}

// The weight gradient into output 0 of `a`: overwritten, or with
// `accumulate` added to it. Where the backend adds C in the GEMM's epilogue
// (Context::accumulatesInGemm: cuBLASLt) that is the GEMM with beta = 1, the
// fp32 product added as the `accumulate` kernel adds it (in mixed precision
// without rounding the product to bf16 first: docs/kernels.md); elsewhere
// (the emulation) dw goes to scratch, is rounded in mixed precision, and is
// added: the CPU kernel's bits.
Status gradWeightInto(const KernelArgs &a, const Context &ctx,
                      const LinearDims &d, float *db, GemmSums *sums) {
  const GemmOperand x = gemmOperand(a.inputs[0]), dy = gemmOperand(a.inputs[1]);
  float *out = a.outputs[0].f32();
  if (!d.accumulate || ctx.accumulatesInGemm)
    return gradWeight(ctx, d, x, dy, d.accumulate ? 1.0f : 0.0f, out, db, sums);
  const int64_t n = d.in * d.out;
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(
      ctx.workspace->reserve(static_cast<size_t>(n) * sizeof(float), scratch));
  float *dw = static_cast<float *>(scratch);
  PIPER_RETURN_IF_ERROR(gradWeight(ctx, d, x, dy, 0.0f, dw, db, sums));
  if (a.ctx.lowPrecision)
    PIPER_RETURN_IF_ERROR(launchRoundBf16(ctx, dw, n));
  return launchAdd(ctx, out, dw, out, n);
}

// db = the column sums of dy [rows, out] (chunked, in double; bias_grad),
// dy read packed where it is stored so.
Status columnSums(const Context &ctx, const TensorRef &dy, int64_t rows,
                  int64_t out, float *db) {
  if (out == 0)
    return Status::ok();
  if (rows == 0)
    return zeroAsync(ctx, db, static_cast<size_t>(out) * sizeof(float));
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(columnSumChunks(rows) * out) * sizeof(double),
      scratch));
  return launchColumnSums(ctx, f32In(dy), rows, out,
                          static_cast<double *>(scratch), db, bf16In(dy));
}

Status linearGradWeight(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(detail::checkLinearGradWeight(a, d));
  return gradWeightInto(a, ctx, d, nullptr, nullptr);
}

// Both gradients of a biased linear: db from the weight gradient's GEMM
// where the backend sums in its epilogue (CUDA), else as bias_grad does.
Status linearGradWeightBias(const KernelArgs &a, const Context &ctx) {
  LinearDims d;
  PIPER_RETURN_IF_ERROR(detail::checkLinearGradWeightBias(a, d));
  float *db = a.outputs[1].f32();
  GemmSums sums;
  PIPER_RETURN_IF_ERROR(gradWeightInto(a, ctx, d, db, &sums));
  if (sums.done)
    return Status::ok();
  return columnSums(ctx, a.inputs[1], d.rows, d.out, db);
}

Status biasAdd(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, out = 0;
  PIPER_RETURN_IF_ERROR(detail::checkBiasAdd(a, rows, out));
  // y = b on every row, then y = x + y.
  float *y = a.outputs[0].f32();
  PIPER_RETURN_IF_ERROR(
      launchBroadcastRows(ctx, a.inputs[1].f32(), y, rows, out));
  return launchAdd(ctx, a.inputs[0].f32(), y, y, rows * out,
                   a.ctx.lowPrecision);
}

Status spSplit(const KernelArgs &a, const Context &ctx) {
  int64_t first = 0, rows = 0, cols = 0;
  PIPER_RETURN_IF_ERROR(detail::checkSpSplit(a, first, rows, cols));
  return copyAsync(ctx, a.outputs[0].f32(), a.inputs[0].f32() + first * cols,
                   static_cast<size_t>(rows * cols) * sizeof(float));
}

Status columns(const KernelArgs &a, const Context &ctx) {
  detail::ColumnsDims d;
  PIPER_RETURN_IF_ERROR(detail::checkColumns(a, false, d));
  return launchColumns(ctx, a.inputs[0].f32(), d.rows, d.wide, d.start,
                       d.narrow, false, a.outputs[0].f32());
}

Status columnsGrad(const KernelArgs &a, const Context &ctx) {
  detail::ColumnsDims d;
  PIPER_RETURN_IF_ERROR(detail::checkColumns(a, true, d));
  return launchColumns(ctx, a.inputs[0].f32(), d.rows, d.wide, d.start,
                       d.narrow, true, a.outputs[0].f32());
}

Status tpKvAssemble(const KernelArgs &a, const Context &ctx) {
  detail::KvAssembleDims d;
  PIPER_RETURN_IF_ERROR(detail::checkKvAssemble(a, false, d));
  return launchKvAssemble(ctx, a.inputs[0].f32(), a.inputs[1].f32(), d.rows,
                          d.query, d.piece, d.share, d.group,
                          a.outputs[0].f32());
}

Status tpKvAssembleGrad(const KernelArgs &a, const Context &ctx) {
  detail::KvAssembleDims d;
  PIPER_RETURN_IF_ERROR(detail::checkKvAssemble(a, true, d));
  return launchKvAssembleGrad(ctx, a.inputs[0].f32(), d.rows, d.query, d.piece,
                              d.share, d.members, d.group, a.outputs[0].f32());
}

Status biasGrad(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, out = 0;
  PIPER_RETURN_IF_ERROR(detail::checkBiasGrad(a, rows, out));
  return columnSums(ctx, a.inputs[0], rows, out, a.outputs[0].f32());
}

CrossEntropyDims launchDims(const detail::LogitsDims &d) {
  return {d.rows, d.vocab, d.ld, d.gradLd};
}

// The loss kernels' row scratch: a double per row.
static Status reserveRowLoss(const Context &ctx, int64_t rows,
                             double *&rowLoss) {
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(rows) * sizeof(double), scratch));
  rowLoss = static_cast<double *>(scratch);
  return Status::ok();
}

Status crossEntropy(const KernelArgs &a, const Context &ctx) {
  detail::LogitsDims d;
  PIPER_RETURN_IF_ERROR(detail::checkCrossEntropy(a, d));
  double *rowLoss = nullptr;
  PIPER_RETURN_IF_ERROR(reserveRowLoss(ctx, d.rows, rowLoss));
  const TensorRef &logits = a.inputs[0];
  return launchCrossEntropy(ctx, f32In(logits), a.inputs[1].i32(),
                            launchDims(d), rowLoss, a.outputs[0].f32(), 0.0,
                            nullptr, false, false, nullptr, bf16In(logits));
}

Status crossEntropyGrad(const KernelArgs &a, const Context &ctx) {
  detail::LogitsDims d;
  PIPER_RETURN_IF_ERROR(detail::checkCrossEntropyGrad(a, d));
  const TensorRef &logits = a.inputs[0], &dlogits = a.outputs[0];
  return launchCrossEntropy(ctx, f32In(logits), a.inputs[1].i32(),
                            launchDims(d), nullptr, nullptr, d.scale / d.rows,
                            f32Out(dlogits), a.ctx.lowPrecision, false,
                            bf16Out(dlogits), bf16In(logits));
}

Status crossEntropyFused(const KernelArgs &a, const Context &ctx) {
  detail::LogitsDims d;
  PIPER_RETURN_IF_ERROR(detail::checkCrossEntropyFused(a, d));
  double *rowLoss = nullptr;
  PIPER_RETURN_IF_ERROR(reserveRowLoss(ctx, d.rows, rowLoss));
  // dlogits packed where the executor gives its step buffer as stored
  // (KernelEntry::packedOutputs).
  const TensorRef &logits = a.inputs[0], &dlogits = a.outputs[1];
  return launchCrossEntropy(
      ctx, f32In(logits), a.inputs[1].i32(), launchDims(d), rowLoss,
      a.outputs[0].f32(), d.scale / d.rows, f32Out(dlogits), a.ctx.lowPrecision,
      a.ctx.lowPrecision && !a.outputs[0].shape.empty(), bf16Out(dlogits),
      bf16In(logits));
}

Status vocabCeStats(const KernelArgs &a, const Context &ctx) {
  detail::VocabDims d;
  PIPER_RETURN_IF_ERROR(detail::checkVocabCeStats(a, d));
  return launchVocabCeStats(ctx, a.inputs[0].f32(), a.inputs[1].i32(), d.rows,
                            d.vocab, d.members, d.first / d.vocab,
                            a.outputs[0].f32());
}

Status vocabCrossEntropy(const KernelArgs &a, const Context &ctx) {
  detail::VocabDims d;
  PIPER_RETURN_IF_ERROR(detail::checkVocabCrossEntropy(a, d));
  void *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(d.rows) * sizeof(double), scratch));
  return launchVocabCrossEntropy(ctx, a.inputs[0].f32(), d.rows, d.members,
                                 static_cast<double *>(scratch),
                                 a.outputs[0].f32());
}

Status vocabCrossEntropyGrad(const KernelArgs &a, const Context &ctx) {
  detail::VocabDims d;
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(detail::checkVocabCrossEntropyGrad(a, d, scale));
  return launchVocabCrossEntropyGrad(ctx, a.inputs[0].f32(), a.inputs[1].f32(),
                                     a.inputs[2].i32(), d.rows, d.vocab,
                                     d.members, d.first / d.vocab,
                                     scale / d.rows, a.outputs[0].f32());
}

Status lossAccumulate(const KernelArgs &a, const Context &ctx) {
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(detail::checkLossAccumulate(a, scale));
  return launchAccumulateLoss(ctx, a.inputs[0].f32(), scale,
                              a.ctx.lossAccumulator);
}

} // namespace

void addLinearKernels(std::vector<KernelEntry> &out) {
  out.insert(
      out.end(),
      {
          // The GEMMs read packed bf16 operands as they are
          // (packedInputs: x and w of the forward, dy and w of the
          // input gradient, x and dy of the weight gradient; with a
          // bias dy's column sums read it packed too).
          // linear rounds y itself in mixed precision, and stores it
          // packed where only packed readers read it (the logits).
          {"linear", linear, nullptr, true, 0b11, 0b1},
          // linear_gelu rounds both outputs itself in mixed precision and
          // stores y = gelu(h) packed where only GEMMs read it.
          {"linear_gelu", linearGelu, nullptr, true, 0b11, 0b10},
          {"linear_grad_input", linearGradInput, nullptr, true, 0b11, 0b1},
          // linear_grad_input_gelu rounds dh itself in mixed precision
          // and stores it packed where only GEMMs and the bias
          // gradient's sums read it.
          {"linear_grad_input_gelu", linearGradInputGelu, nullptr, true, 0b11,
           0b1},
          {"linear_grad_weight", linearGradWeight, nullptr, false, 0b11},
          {"bias_add", biasAdd, nullptr, true},
          {"sp_split", spSplit},
          {"columns", columns},
          {"columns_grad", columnsGrad},
          {"tp_kv_assemble", tpKvAssemble},
          {"tp_kv_assemble_grad", tpKvAssembleGrad},
          {"bias_grad", biasGrad},
          {"linear_grad_weight_bias", linearGradWeightBias, nullptr, false,
           0b11},
          // The classifiers read their logits packed where the head's GEMM
          // stored them so (packedInputs).
          {"cross_entropy", crossEntropy, nullptr, false, 0b1},
          // dlogits rounded in mixed precision, or stored packed
          // (packedOutputs).
          {"cross_entropy_grad", crossEntropyGrad, nullptr, true, 0b1, 0b1},
          // and the fused classifier's written packed into its step buffer
          // (packedOutputs).
          {"cross_entropy_fused", crossEntropyFused, nullptr, true, 0b1, 0b10},
          {"vocab_ce_stats", vocabCeStats},
          {"vocab_cross_entropy", vocabCrossEntropy},
          {"vocab_cross_entropy_grad", vocabCrossEntropyGrad},
          {"loss_accumulate", lossAccumulate},
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

// Operand and attribute checks of the linear and loss kernels (linear and
// its gradients, bias_grad, cross_entropy and its gradient,
// loss_accumulate), shared by the CPU kernels and the GPU kernels
// (runtime/hal/gpu): both backends accept and reject exactly the same calls,
// with the same messages. None of them reads tensor data (the GPU's operands
// are device memory): the CPU kernels check the targets against the
// vocabulary themselves (expectTokensBelow).
#ifndef PIPER_RUNTIME_KERNELS_LINEARCHECKS_H
#define PIPER_RUNTIME_KERNELS_LINEARCHECKS_H

#include <cstdint>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

/// The sizes of a linear-family call: x [rows, in], y [rows, out], w
/// [in, out] or, with transpose_w, [out, in].
struct LinearDims {
  int64_t rows = 0, in = 0, out = 0;
  bool transposeW = false;
  /// linear_grad_weight(_bias)'s `accumulate`: dw is added to its output
  /// (a parameter's gradient accumulator) instead of overwriting it.
  bool accumulate = false;
  /// The row stride of y (linear) or dy (linear_grad_input,
  /// linear_grad_weight): `out`, or more where the compiler padded the
  /// vocabulary (the kernel's `valid_cols` is `out`, docs/kernels.md).
  int64_t ld = 0;
};

/// linear: (x, w[, b]) -> y; `hasBias` when b [out] is given. Without b,
/// y may be padded (valid_cols: y [rows, ld], ld >= out).
Status checkLinear(const KernelArgs &a, LinearDims &d, bool &hasBias);
/// linear_gelu: (x, w[, b]) -> (h, y): h as linear's y, y = gelu(h) of
/// h's shape. In mixed precision h is rounded to bf16 before gelu reads it
/// (the bits of linear then gelu; on CUDA the GEMM's epilogue applies gelu
/// to the fp32 h instead: docs/kernels.md).
Status checkLinearGelu(const KernelArgs &a, LinearDims &d, bool &hasBias);
/// linear_grad_input: (dy, w) -> dx [rows, in]; dy may be padded
/// (valid_cols, as linear's y).
Status checkLinearGradInput(const KernelArgs &a, LinearDims &d);
/// linear_grad_input_gelu: (dy, w, h [rows, in]) -> dh [rows, in], dh =
/// gelu_grad(h, dy w^T), the product rounded to bf16 first in mixed
/// precision (the bits of linear_grad_input then gelu_grad; on CUDA the
/// GEMM's epilogue multiplies the fp32 product).
Status checkLinearGradInputGelu(const KernelArgs &a, LinearDims &d);
/// linear_grad_weight: (x, dy) -> dw of w's shape, overwritten, or with
/// the `accumulate` flag added to the output: out += dw, dw computed
/// whole first and, in mixed precision, rounded to bf16 (what the separate
/// `accumulate` kernel would add; the compiler fuses the two, docs/
/// kernels.md). dy may be padded (valid_cols, as linear's y).
Status checkLinearGradWeight(const KernelArgs &a, LinearDims &d);
/// linear_grad_weight_bias: (x, dy) -> (dw of w's shape, db [out]): db
/// overwritten, dw as linear_grad_weight's (`accumulate`).
Status checkLinearGradWeightBias(const KernelArgs &a, LinearDims &d);
/// bias_add: (x [rows, out], b [out]) -> y [rows, out].
Status checkBiasAdd(const KernelArgs &a, int64_t &rows, int64_t &out);
/// sp_split: x [rows, cols] -> y [rows / members, cols], the context's
/// tensor member's rows; `members` (>= 2) divides rows. Gives the member's
/// first row.
Status checkSpSplit(const KernelArgs &a, int64_t &first, int64_t &rows,
                    int64_t &cols);
/// columns: x [rows, wide] -> y [rows, narrow], y[i, j] = x[i, start + j];
/// columns_grad (`grad`): dy [rows, narrow] -> dx [rows, wide], zero outside
/// columns [start, start + narrow).
struct ColumnsDims {
  int64_t rows = 0, narrow = 0, wide = 0, start = 0;
};
Status checkColumns(const KernelArgs &a, bool grad, ColumnsDims &d);
/// Replicated key/value heads (docs/tensor-parallel.md §2b): tp_kv_assemble
/// (w [h, q + 2p], pieces [members h, 2p]) -> y [h, q + 2 share p]; its
/// gradient (`grad`) dy [h, q + 2 share p] -> dpieces [members h, 2p].
/// `group` is the context member's key/value head (member / share).
struct KvAssembleDims {
  int64_t rows = 0, query = 0, piece = 0, share = 0, members = 0, group = 0;
};
Status checkKvAssemble(const KernelArgs &a, bool grad, KvAssembleDims &d);
/// bias_grad: dy [rows, out] -> db [out] (overwritten).
Status checkBiasGrad(const KernelArgs &a, int64_t &rows, int64_t &out);
/// The softmax cross entropy's sizes: logits [rows, ld] and dlogits [rows,
/// gradLd] hold `vocab` valid columns each; ld and gradLd are `vocab` unless
/// the compiler padded the operand (the kernel's `valid_cols` is `vocab`,
/// docs/kernels.md: the other columns are neither read nor written).
struct LogitsDims {
  int64_t rows = 0, vocab = 0, ld = 0, gradLd = 0;
  /// `scale` (attribute, default 1): multiplies the mean's gradient.
  double scale = 1.0;
};
/// cross_entropy: (logits [rows, vocab] f32, targets i32 of rows tokens) ->
/// loss (f32 scalar, the mean over rows). Both dimensions non-empty.
Status checkCrossEntropy(const KernelArgs &a, LogitsDims &d);
/// cross_entropy_grad: (logits, targets) -> dlogits [rows, vocab].
Status checkCrossEntropyGrad(const KernelArgs &a, LogitsDims &d);
/// cross_entropy_fused (the fused classifier): (logits, targets) -> (loss,
/// dlogits), cross_entropy's and cross_entropy_grad's outputs in one pass.
Status checkCrossEntropyFused(const KernelArgs &a, LogitsDims &d);
/// The vocabulary-parallel loss kernels' dimensions: rows, this member's
/// columns (vocab), the group's members and this member's first id.
struct VocabDims {
  int64_t rows = 0, vocab = 0, members = 0, first = 0;
};
/// vocab_ce_stats: (logits [rows, vocab], targets) -> stats [rows,
/// 4 members + 1]; `members` (attribute, >= 2) and the context's member.
Status checkVocabCeStats(const KernelArgs &a, VocabDims &d);
/// vocab_cross_entropy: (stats, logits, targets) -> loss (f32 scalar).
Status checkVocabCrossEntropy(const KernelArgs &a, VocabDims &d);
/// vocab_cross_entropy_grad: (stats, logits, targets) -> dlogits [rows,
/// vocab]; `scale` as cross_entropy_grad's.
Status checkVocabCrossEntropyGrad(const KernelArgs &a, VocabDims &d,
                                  double &scale);
/// loss_accumulate: loss (f32 scalar) -> the context's loss accumulator,
/// which must exist; `scale` (attribute, default 1).
Status checkLossAccumulate(const KernelArgs &a, double &scale);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_LINEARCHECKS_H

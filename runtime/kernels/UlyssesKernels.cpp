// Context parallelism's row and column layouts (UlyssesLayout.h,
// docs/context-parallel.md): Ulysses' around its all-to-alls, and the
// member's rows of a gathered sequence (MoE layers under context
// parallelism). Pure copies, so exact in every precision. The checks are
// shared with the GPU kernels.
#include <algorithm>
#include <string>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LayerChecks.h"

namespace piper::runtime::detail {

namespace {

Status readMembers(const KernelArgs &a, int64_t &cp) {
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kCp, std::nullopt, cp));
  if (cp < 2)
    return a.error("cp must be at least 2, got " + std::to_string(cp));
  return Status::ok();
}

/// Every member is sent rows/cp rows.
void fillCounts(const TensorRef &counts, int64_t cp, int64_t each) {
  std::fill_n(counts.i32(), cp, static_cast<int32_t>(each));
}

} // namespace

Status checkUlyssesColumns(const KernelArgs &a, bool merge, UlyssesColumns &c,
                           int64_t &rows) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, merge ? 1 : 2));
  PIPER_RETURN_IF_ERROR(readMembers(a, c.cp));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kHeads, std::nullopt, c.heads));
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kKvHeads, 0, c.kvHeads));
  if (c.kvHeads < 0 || c.heads % c.cp != 0 || c.kvHeads % c.cp != 0)
    return a.error("heads (" + std::to_string(c.heads) + ") and kv_heads (" +
                   std::to_string(c.kvHeads) +
                   ") must be multiples of cp = " + std::to_string(c.cp));
  const TensorRef &wide = merge ? a.outputs[0] : a.inputs[0];
  const TensorRef &narrow = merge ? a.inputs[0] : a.outputs[0];
  int64_t wideCols = 0, narrowRows = 0, narrowCols = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, wide, merge ? "y" : "x", plan::F32, rows, wideCols));
  PIPER_RETURN_IF_ERROR(expectMatrix(a, narrow, merge ? "x" : "y", plan::F32,
                                     narrowRows, narrowCols));
  int64_t units = c.heads + 2 * c.kvHeads;
  if (wideCols % units != 0)
    return a.error("the wide matrix's " + std::to_string(wideCols) +
                   " columns are not (heads + 2 kv_heads) = " +
                   std::to_string(units) + " heads");
  c.hd = wideCols / units;
  if (narrowRows != c.cp * rows || narrowCols != c.narrow())
    return a.error("the narrow matrix must be [" +
                   std::to_string(c.cp * rows) + ", " +
                   std::to_string(c.narrow()) + "] (cp blocks of the " +
                   std::to_string(rows) + " rows' heads), got [" +
                   std::to_string(narrowRows) + ", " +
                   std::to_string(narrowCols) + "]");
  if (!merge)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.outputs[1], "counts", plan::I32, {c.cp}));
  return Status::ok();
}

Status checkUlyssesRows(const KernelArgs &a, bool zigzag, UlyssesRows &r,
                        int64_t &cols) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, zigzag ? 2 : 1));
  PIPER_RETURN_IF_ERROR(readMembers(a, r.cp));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kSeq, std::nullopt, r.seq));
  if (r.seq % (2 * r.cp) != 0)
    return a.error("seq " + std::to_string(r.seq) +
                   " must be a multiple of 2 cp = " + std::to_string(2 * r.cp));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "x", plan::F32, r.rows, cols));
  if (r.rows % r.seq != 0)
    return a.error("rows " + std::to_string(r.rows) +
                   " are not whole sequences of " + std::to_string(r.seq));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.outputs[0], "y", plan::F32, {r.rows, cols}));
  if (zigzag)
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.outputs[1], "counts", plan::I32, {r.cp}));
  return Status::ok();
}

Status checkCpSplit(const KernelArgs &a, bool grad, UlyssesRows &r,
                    int64_t &cols, int64_t &member) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(readMembers(a, r.cp));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kSeq, std::nullopt, r.seq));
  if (r.seq % (2 * r.cp) != 0)
    return a.error("seq " + std::to_string(r.seq) +
                   " must be a multiple of 2 cp = " + std::to_string(2 * r.cp));
  const TensorRef &whole = grad ? a.outputs[0] : a.inputs[0];
  const TensorRef &part = grad ? a.inputs[0] : a.outputs[0];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, whole, grad ? "dx" : "x", plan::F32, r.rows, cols));
  if (r.rows % r.seq != 0)
    return a.error("rows " + std::to_string(r.rows) +
                   " are not whole sequences of " + std::to_string(r.seq));
  PIPER_RETURN_IF_ERROR(expectTensor(a, part, grad ? "dy" : "y", plan::F32,
                                     {r.rows / r.cp, cols}));
  member = a.ctx.contextMember;
  if (member < 0 || member >= r.cp)
    return a.error("context-parallel member " + std::to_string(member) +
                   " is not one of " + std::to_string(r.cp));
  return Status::ok();
}

Status cpSplitKernel(const KernelArgs &a) {
  UlyssesRows r;
  int64_t cols = 0, member = 0;
  PIPER_RETURN_IF_ERROR(checkCpSplit(a, false, r, cols, member));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  const int64_t n = r.rows / r.cp;
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(x + r.naturalRow(member * n + i) * cols, cols, y + i * cols);
  return Status::ok();
}

Status cpSplitGradKernel(const KernelArgs &a) {
  UlyssesRows r;
  int64_t cols = 0, member = 0;
  PIPER_RETURN_IF_ERROR(checkCpSplit(a, true, r, cols, member));
  const float *dy = a.inputs[0].f32();
  float *dx = a.outputs[0].f32();
  const int64_t n = r.rows / r.cp;
  std::fill_n(dx, r.rows * cols, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(dy + i * cols, cols, dx + r.naturalRow(member * n + i) * cols);
  return Status::ok();
}

Status ulyssesSplitKernel(const KernelArgs &a) {
  UlyssesColumns c;
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(checkUlyssesColumns(a, false, c, rows));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  const int64_t wide = c.wide(), narrow = c.narrow();
  for (int64_t j = 0; j < c.cp; ++j)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < narrow; ++col)
        y[(j * rows + r) * narrow + col] = x[r * wide + c.wideColumn(j, col)];
  fillCounts(a.outputs[1], c.cp, rows);
  return Status::ok();
}

Status ulyssesMergeKernel(const KernelArgs &a) {
  UlyssesColumns c;
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(checkUlyssesColumns(a, true, c, rows));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  const int64_t wide = c.wide(), narrow = c.narrow();
  for (int64_t j = 0; j < c.cp; ++j)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < narrow; ++col)
        y[r * wide + c.wideColumn(j, col)] = x[(j * rows + r) * narrow + col];
  return Status::ok();
}

Status ulyssesNaturalKernel(const KernelArgs &a) {
  UlyssesRows r;
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(checkUlyssesRows(a, false, r, cols));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  for (int64_t i = 0; i < r.rows; ++i)
    std::copy_n(x + i * cols, cols, y + r.naturalRow(i) * cols);
  return Status::ok();
}

Status ulyssesZigzagKernel(const KernelArgs &a) {
  UlyssesRows r;
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(checkUlyssesRows(a, true, r, cols));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  for (int64_t i = 0; i < r.rows; ++i)
    std::copy_n(x + r.naturalRow(i) * cols, cols, y + i * cols);
  fillCounts(a.outputs[1], r.cp, r.rows / r.cp);
  return Status::ok();
}

} // namespace piper::runtime::detail

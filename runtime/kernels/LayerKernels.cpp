// Embedding and position embedding kernels, forward and backward, and the
// tensor-parallel layouts (sp_split, columns, tp_kv_assemble). The linear
// family is LinearKernels.cpp; the norms NormKernels.cpp; GELU, SwiGLU and
// add ElementwiseKernels.cpp.
#include <algorithm>
#include <numeric>
#include <vector>

#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/LayerChecks.h"
#include "runtime/kernels/LinearChecks.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

// Reductions outside BLAS accumulate in double in a fixed order (VecMath.h)
// so that results do not depend on the machine's threads. Hot loops are
// PIPER_SIMD: vectorized, one clone per instruction set.

Status checkEmbedding(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                      int64_t &hidden, int64_t &first, int64_t &members) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(expectTokens(a, a.inputs[0], "ids", rows));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[1], "table", plan::F32, vocab, hidden));
  PIPER_RETURN_IF_ERROR(
      readVocabShard(a, vocab, /*required=*/false, members, first));
  return expectPackableOutput(a, a.outputs[0], "y", {rows, hidden});
}

Status embeddingKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0, hidden = 0, first = 0, members = 1;
  PIPER_RETURN_IF_ERROR(checkEmbedding(a, rows, vocab, hidden, first, members));
  const TensorRef &ids = a.inputs[0], &table = a.inputs[1], &y = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, ids, "ids", vocab * members));

  std::vector<float> packed;
  float *out = outputRow(y, 0, y.numel(), packed);
  for (int64_t n = 0; n < rows; ++n) {
    int64_t id = ids.i32()[n] - first;
    if (id >= 0 && id < vocab)
      std::copy_n(table.f32() + id * hidden, hidden, out + n * hidden);
    else
      std::fill_n(out + n * hidden, hidden, 0.0f);
  }
  storeRow(y, 0, y.numel(), y.numel(), out);
  return Status::ok();
}

Status checkEmbeddingGrad(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                          int64_t &hidden, int64_t &first, int64_t &members,
                          bool &accumulate) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(readFlag(a, KernelAttr::kAccumulate, accumulate));
  PIPER_RETURN_IF_ERROR(expectTokens(a, a.inputs[0], "ids", rows));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.outputs[0], "dtable", plan::F32, vocab, hidden));
  PIPER_RETURN_IF_ERROR(expectTensor(
      a, a.inputs[1], "dy", packableDType(a, a.inputs[1]), {rows, hidden}));
  int64_t vocabAttr = 0;
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kVocab, vocab, vocabAttr));
  if (vocabAttr != vocab)
    return a.error("attribute 'vocab' is " + std::to_string(vocabAttr) +
                   " but dtable has " + std::to_string(vocab) + " rows");
  return readVocabShard(a, vocab, /*required=*/false, members, first);
}

// A weight gradient's rows: stored (row(r, out) writes row r's values), or
// with `accumulate` written to a row of scratch, rounded to bf16 in mixed
// precision (as the executor rounds the unfused kernel's output) and added
// to the output (the parameter's gradient accumulator): the bits of the
// kernel then `accumulate`. Rows `row` skips (returns false) are zeros, so
// with `accumulate` they add +0, as the unfused `accumulate` does.
template <typename Row>
void storeGradRows(const KernelArgs &a, bool accumulate, float *out,
                   int64_t rows, int64_t hidden, const Row &row) {
  if (!accumulate) {
    std::fill_n(out, rows * hidden, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      row(r, out + r * hidden);
    return;
  }
  std::vector<float> tmp(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(tmp.begin(), tmp.end(), 0.0f);
    if (row(r, tmp.data()) && a.ctx.lowPrecision)
      roundToBf16(tmp.data(), hidden);
    float *acc = out + r * hidden;
    for (int64_t j = 0; j < hidden; ++j)
      acc[j] += tmp[j];
  }
}

Status embeddingGradKernel(const KernelArgs &a) {
  int64_t rows = 0, vocab = 0, hidden = 0, first = 0, members = 1;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(
      checkEmbeddingGrad(a, rows, vocab, hidden, first, members, accumulate));
  const TensorRef &ids = a.inputs[0], &dy = a.inputs[1], &dtable = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, ids, "ids", vocab * members));

  // The rows grouped by id (stable: token order within an id), so that
  // each table row is summed once, in token order, without a [V,H] double
  // buffer; bucket[v] is local id v's [begin, end) in `order`.
  const int32_t *idData = ids.i32();
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t l, int64_t r) { return idData[l] < idData[r]; });
  std::vector<std::pair<int64_t, int64_t>> bucket(vocab, {0, 0});
  for (int64_t begin = 0; begin < rows;) {
    const int32_t id = idData[order[begin]];
    int64_t end = begin;
    while (end < rows && idData[order[end]] == id)
      ++end;
    // Another member's id: its rows are that member's.
    if (id >= first && id < first + vocab)
      bucket[int64_t(id) - first] = {begin, end};
    begin = end;
  }
  std::vector<double> sum(hidden);
  std::vector<float> unpacked;
  const float *dyData = fp32Data(dy, unpacked);
  storeGradRows(
      a, accumulate, dtable.f32(), vocab, hidden, [&](int64_t v, float *out) {
        const auto [begin, end] = bucket[v];
        if (begin == end)
          return false;
        std::fill(sum.begin(), sum.end(), 0.0);
        for (int64_t k = begin; k < end; ++k)
          addRowToSums(sum.data(), dyData + order[k] * hidden, hidden);
        sumsToFloat(sum.data(), out, hidden);
        return true;
      });
  return Status::ok();
}

// Shared checks of position_add and its gradient: `x` is [N,H] with N a
// multiple of seq / cp, `pos` is [P,H] with P >= seq.
static Status checkPositions(const KernelArgs &a, const TensorRef &x,
                             const char *xName, const TensorRef &pos,
                             const char *posName, PositionDims &d) {
  int64_t positions = 0, posHidden = 0;
  int64_t &rows = d.rows, &hidden = d.hidden, &seq = d.seq;
  // x (position_add's input, or its gradient's dy) may be packed in mixed
  // precision.
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, x, xName, packableDType(a, x), rows, hidden));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, pos, posName, plan::F32, positions, posHidden));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kSeq, std::nullopt, seq));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, KernelAttr::kCp, 1, d.cp));
  if (posHidden != hidden)
    return a.error(std::string(posName) + " has shape " +
                   shapeString(pos.shape) + ", expected [*," +
                   std::to_string(hidden) + "]");
  if (d.cp > 1 && seq % (2 * d.cp) != 0)
    return a.error("seq " + std::to_string(seq) +
                   " is not a multiple of 2 x cp " + std::to_string(d.cp));
  d.member = a.ctx.contextMember;
  if (d.member < 0 || d.member >= d.cp)
    return a.error("the context member " + std::to_string(d.member) +
                   " is not one of " + std::to_string(d.cp));
  d.local = seq / d.cp;
  if (rows % d.local != 0)
    return a.error(std::string(xName) + " has " + std::to_string(rows) +
                   " rows, not a multiple of seq" +
                   (d.cp > 1 ? " / cp " : " ") + std::to_string(d.local));
  if (positions < seq)
    return a.error(std::string(posName) + " has " + std::to_string(positions) +
                   " rows, fewer than seq " + std::to_string(seq));
  return Status::ok();
}

Status checkPositionAdd(const KernelArgs &a, PositionDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(
      checkPositions(a, a.inputs[0], "x", a.inputs[1], "pos", d));
  return expectPackableOutput(a, a.outputs[0], "y", {d.rows, d.hidden});
}

Status positionAddKernel(const KernelArgs &a) {
  PositionDims d;
  PIPER_RETURN_IF_ERROR(checkPositionAdd(a, d));
  const TensorRef &x = a.inputs[0], &pos = a.inputs[1], &y = a.outputs[0];
  const int64_t hidden = d.hidden;

  std::vector<float> unpacked, packed;
  const float *xData = fp32Data(x, unpacked);
  float *out = outputRow(y, 0, y.numel(), packed);
  for (int64_t n = 0; n < d.rows; ++n)
    addVectors(xData + n * hidden, pos.f32() + d.position(n % d.local) * hidden,
               out + n * hidden, hidden);
  storeRow(y, 0, y.numel(), y.numel(), out);
  return Status::ok();
}

Status checkPositionAddGrad(const KernelArgs &a, PositionDims &d,
                            bool &accumulate) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(readFlag(a, KernelAttr::kAccumulate, accumulate));
  return checkPositions(a, a.inputs[0], "dy", a.outputs[0], "dpos", d);
}

Status positionAddGradKernel(const KernelArgs &a) {
  PositionDims d;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(checkPositionAddGrad(a, d, accumulate));
  const TensorRef &dy = a.inputs[0], &dpos = a.outputs[0];
  const int64_t hidden = d.hidden;

  // Positions no local row has (past seq; other context members') get no
  // gradient but are part of the parameter. localOf[p]: the local row t
  // at position p, or -1.
  std::vector<int64_t> localOf(dpos.shape[0], -1);
  for (int64_t t = 0; t < d.local; ++t)
    localOf[d.position(t)] = t;
  std::vector<double> sum(hidden);
  std::vector<float> unpacked;
  const float *dyData = fp32Data(dy, unpacked);
  storeGradRows(a, accumulate, dpos.f32(), dpos.shape[0], hidden,
                [&](int64_t p, float *out) {
                  const int64_t t = localOf[p];
                  if (t < 0)
                    return false;
                  std::fill(sum.begin(), sum.end(), 0.0);
                  for (int64_t n = t; n < d.rows; n += d.local)
                    addRowToSums(sum.data(), dyData + n * hidden, hidden);
                  sumsToFloat(sum.data(), out, hidden);
                  return true;
                });
  return Status::ok();
}

Status checkSpSplit(const KernelArgs &a, int64_t &first, int64_t &rows,
                    int64_t &cols) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  int64_t members = 0, whole = 0;
  PIPER_RETURN_IF_ERROR(
      readInt(a, KernelAttr::kMembers, std::nullopt, members));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "x", plan::F32, whole, cols));
  if (members < 2 || whole % members != 0)
    return a.error("members " + std::to_string(members) +
                   " must be at least 2 and divide the " +
                   std::to_string(whole) + " rows");
  if (a.ctx.tensorMember < 0 || a.ctx.tensorMember >= members)
    return a.error("tensor-parallel member " +
                   std::to_string(a.ctx.tensorMember) + " is not one of " +
                   std::to_string(members));
  rows = whole / members;
  first = a.ctx.tensorMember * rows;
  return expectTensor(a, a.outputs[0], "y", plan::F32, {rows, cols});
}

Status spSplitKernel(const KernelArgs &a) {
  int64_t first = 0, rows = 0, cols = 0;
  PIPER_RETURN_IF_ERROR(checkSpSplit(a, first, rows, cols));
  std::copy_n(a.inputs[0].f32() + first * cols, rows * cols,
              a.outputs[0].f32());
  return Status::ok();
}

Status checkColumns(const KernelArgs &a, bool grad, ColumnsDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kStart, std::nullopt, d.start));
  const TensorRef &narrow = grad ? a.inputs[0] : a.outputs[0];
  const TensorRef &wide = grad ? a.outputs[0] : a.inputs[0];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, wide, grad ? "dx" : "x", plan::F32, d.rows, d.wide));
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, narrow, grad ? "dy" : "y", plan::F32, rows, d.narrow));
  if (rows != d.rows)
    return a.error("the narrow and the wide matrix must have the same rows, "
                   "got " +
                   std::to_string(rows) + " and " + std::to_string(d.rows));
  if (d.start < 0 || d.start + d.narrow > d.wide)
    return a.error("columns [" + std::to_string(d.start) + ", " +
                   std::to_string(d.start + d.narrow) +
                   ") are not columns of a matrix of " +
                   std::to_string(d.wide));
  return Status::ok();
}

Status columnsKernel(const KernelArgs &a) {
  ColumnsDims d;
  PIPER_RETURN_IF_ERROR(checkColumns(a, false, d));
  const float *x = a.inputs[0].f32();
  float *y = a.outputs[0].f32();
  for (int64_t i = 0; i < d.rows; ++i)
    std::copy_n(x + i * d.wide + d.start, d.narrow, y + i * d.narrow);
  return Status::ok();
}

Status columnsGradKernel(const KernelArgs &a) {
  ColumnsDims d;
  PIPER_RETURN_IF_ERROR(checkColumns(a, true, d));
  const float *dy = a.inputs[0].f32();
  float *dx = a.outputs[0].f32();
  std::fill_n(dx, d.rows * d.wide, 0.0f);
  for (int64_t i = 0; i < d.rows; ++i)
    std::copy_n(dy + i * d.narrow, d.narrow, dx + i * d.wide + d.start);
  return Status::ok();
}

Status checkKvAssemble(const KernelArgs &a, bool grad, KvAssembleDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, grad ? 1 : 2, grad ? 1 : 2, 1));
  PIPER_RETURN_IF_ERROR(
      readInt(a, KernelAttr::kMembers, std::nullopt, d.members));
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kQuery, std::nullopt, d.query));
  const TensorRef &assembled = grad ? a.inputs[0] : a.outputs[0];
  const TensorRef &pieces = grad ? a.outputs[0] : a.inputs[1];
  int64_t cols = 0, pieceRows = 0, pieceCols = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, assembled, grad ? "dy" : "y", plan::F32, d.rows, cols));
  PIPER_RETURN_IF_ERROR(expectMatrix(a, pieces, grad ? "dpieces" : "pieces",
                                     plan::F32, pieceRows, pieceCols));
  if (d.members < 2)
    return a.error("members " + std::to_string(d.members) +
                   " must be at least 2");
  if (d.query < 0 || pieceCols <= 0 || pieceCols % 2 != 0 ||
      pieceRows != d.members * d.rows)
    return a.error("the pieces must be [members * rows, 2p] = [" +
                   std::to_string(d.members * d.rows) +
                   ", an even number], got [" + std::to_string(pieceRows) +
                   ", " + std::to_string(pieceCols) + "], with query " +
                   std::to_string(d.query));
  d.piece = pieceCols / 2;
  int64_t kv = cols - d.query;
  d.share = kv > 0 && kv % pieceCols == 0 ? kv / pieceCols : 0;
  if (d.share <= 0 || d.members % d.share != 0)
    return a.error("the assembled weight's " + std::to_string(kv) +
                   " key/value columns must be r times the pieces' " +
                   std::to_string(pieceCols) + ", r dividing the " +
                   std::to_string(d.members) + " members");
  if (a.ctx.tensorMember < 0 || a.ctx.tensorMember >= d.members)
    return a.error("tensor-parallel member " +
                   std::to_string(a.ctx.tensorMember) + " is not one of " +
                   std::to_string(d.members));
  d.group = a.ctx.tensorMember / d.share;
  if (!grad)
    PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[0], "w", plan::F32,
                                       {d.rows, d.query + pieceCols}));
  return Status::ok();
}

Status tpKvAssembleKernel(const KernelArgs &a) {
  KvAssembleDims d;
  PIPER_RETURN_IF_ERROR(checkKvAssemble(a, false, d));
  const float *w = a.inputs[0].f32(), *pieces = a.inputs[1].f32();
  float *y = a.outputs[0].f32();
  const int64_t p = d.piece, hd = d.share * p, cols = d.query + 2 * hd;
  for (int64_t i = 0; i < d.rows; ++i) {
    std::copy_n(w + i * (d.query + 2 * p), d.query, y + i * cols);
    // Head g's k (kv = 0) and v (kv = 1) columns: piece s from member
    // g * share + s.
    for (int64_t kv = 0; kv < 2; ++kv)
      for (int64_t s = 0; s < d.share; ++s)
        std::copy_n(pieces + ((d.group * d.share + s) * d.rows + i) * 2 * p +
                        kv * p,
                    p, y + i * cols + d.query + kv * hd + s * p);
  }
  return Status::ok();
}

Status tpKvAssembleGradKernel(const KernelArgs &a) {
  KvAssembleDims d;
  PIPER_RETURN_IF_ERROR(checkKvAssemble(a, true, d));
  const float *dy = a.inputs[0].f32();
  float *dpieces = a.outputs[0].f32();
  const int64_t p = d.piece, hd = d.share * p, cols = d.query + 2 * hd;
  std::fill_n(dpieces, d.members * d.rows * 2 * p, 0.0f);
  for (int64_t s = 0; s < d.share; ++s)
    for (int64_t i = 0; i < d.rows; ++i)
      for (int64_t kv = 0; kv < 2; ++kv)
        std::copy_n(dy + i * cols + d.query + kv * hd + s * p, p,
                    dpieces + ((d.group * d.share + s) * d.rows + i) * 2 * p +
                        kv * p);
  return Status::ok();
}

} // namespace piper::runtime::detail

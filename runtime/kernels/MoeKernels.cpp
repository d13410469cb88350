// Mixture-of-experts kernels, forward and backward: the top-k softmax router,
// dispatch of tokens into per-expert capacity slots, the weighted combine of
// expert outputs, the batched per-expert linear and the Switch Transformer
// load-balancing loss.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::detail {

// Reductions accumulate in double in a fixed order, as in LayerKernels.cpp;
// the only GEMMs are the per-expert cblas_sgemm calls of expert_linear.

namespace {

// ---------------------------------------------------------------------------
// Softmax and the router.

// p = softmax(row), shifted by the row maximum, in double.
void softmaxRow(const float *row, int64_t experts, std::vector<double> &p) {
  p.resize(experts);
  float rowMax = *std::max_element(row, row + experts);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e)
    sum += (p[e] = std::exp(double(row[e]) - rowMax));
  for (int64_t e = 0; e < experts; ++e)
    p[e] /= sum;
}

// Reads top_k (required, 1..E) and norm_topk (0 or 1, default 1).
Status readRouterAttrs(const KernelArgs &a, int64_t experts, int64_t &topK,
                       bool &normTopK) {
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "top_k", std::nullopt, topK));
  if (topK > experts)
    return a.error("attribute 'top_k' " + std::to_string(topK) +
                   " exceeds the number of experts " + std::to_string(experts));
  int64_t flag = 1;
  PIPER_RETURN_IF_ERROR(readInt(a, "norm_topk", 1, flag));
  if (flag != 0 && flag != 1)
    return a.error("attribute 'norm_topk' must be 0 or 1, got " +
                   std::to_string(flag));
  normTopK = flag == 1;
  return Status::ok();
}

// Checks that `t` is an i32 [rows, cols] tensor.
Status expectIndices(const KernelArgs &a, const TensorRef &t, int64_t rows,
                     int64_t cols) {
  return expectTensor(a, t, "indices", plan::I32, {rows, cols});
}

} // namespace

Status checkMoeRouter(const KernelArgs &a, int64_t &rows, int64_t &experts,
                      int64_t &topK, bool &normTopK) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 2));
  const TensorRef &logits = a.inputs[0], &indices = a.outputs[0],
                  &weights = a.outputs[1];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, logits, "logits", plan::F32, rows, experts));
  PIPER_RETURN_IF_ERROR(readRouterAttrs(a, experts, topK, normTopK));
  PIPER_RETURN_IF_ERROR(expectIndices(a, indices, rows, topK));
  return expectTensor(a, weights, "weights", plan::F32, {rows, topK});
}

Status moeRouterKernel(const KernelArgs &a) {
  int64_t rows = 0, experts = 0, topK = 0;
  bool normTopK = true;
  PIPER_RETURN_IF_ERROR(checkMoeRouter(a, rows, experts, topK, normTopK));
  const TensorRef &logits = a.inputs[0], &indices = a.outputs[0],
                  &weights = a.outputs[1];

  std::vector<double> p;
  std::vector<int32_t> top(topK);
  for (int64_t n = 0; n < rows; ++n) {
    softmaxRow(logits.f32() + n * experts, experts, p);
    // Insertion into a sorted list of at most k experts, visited in index
    // order: a later expert passes an earlier one only with a strictly larger
    // p, so ties go to the lower index. Needs no strict weak order, so a NaN
    // logit cannot break it; the first k experts always fill the list.
    int64_t size = 0;
    for (int64_t e = 0; e < experts; ++e) {
      int64_t pos = size;
      while (pos > 0 && p[e] > p[top[pos - 1]])
        --pos;
      if (pos >= topK)
        continue;
      for (int64_t i = std::min(size, topK - 1); i > pos; --i)
        top[i] = top[i - 1];
      top[pos] = static_cast<int32_t>(e);
      size = std::min(size + 1, topK);
    }
    double sum = 0;
    for (int64_t j = 0; j < topK; ++j)
      sum += p[top[j]];
    double norm = normTopK ? sum : 1.0;
    for (int64_t j = 0; j < topK; ++j) {
      indices.i32()[n * topK + j] = top[j];
      weights.f32()[n * topK + j] = static_cast<float>(p[top[j]] / norm);
    }
  }
  return Status::ok();
}

Status checkMoeRouterGrad(const KernelArgs &a, int64_t &rows,
                          int64_t &experts, int64_t &topK, bool &normTopK) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  const TensorRef &logits = a.inputs[0], &indices = a.inputs[1],
                  &dweights = a.inputs[2], &dlogits = a.outputs[0];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, logits, "logits", plan::F32, rows, experts));
  PIPER_RETURN_IF_ERROR(readRouterAttrs(a, experts, topK, normTopK));
  PIPER_RETURN_IF_ERROR(expectIndices(a, indices, rows, topK));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dweights, "dweights", plan::F32, {rows, topK}));
  return expectTensor(a, dlogits, "dlogits", plan::F32, {rows, experts});
}

Status moeRouterGradKernel(const KernelArgs &a) {
  int64_t rows = 0, experts = 0, topK = 0;
  bool normTopK = true;
  PIPER_RETURN_IF_ERROR(checkMoeRouterGrad(a, rows, experts, topK, normTopK));
  const TensorRef &logits = a.inputs[0], &indices = a.inputs[1],
                  &dweights = a.inputs[2], &dlogits = a.outputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, indices, "indices", experts));

  std::vector<double> p, grad(rows ? experts : 0), w(topK);
  for (int64_t n = 0; n < rows; ++n) {
    const float *row = logits.f32() + n * experts;
    const int32_t *idx = indices.i32() + n * topK;
    const float *dw = dweights.f32() + n * topK;
    std::fill(grad.begin(), grad.end(), 0.0);
    if (normTopK) {
      // w_j = p[i_j] / sum_j' p[i_j'] is the softmax of the selected logits
      // alone (computed so, shifted by their maximum, it cannot divide by 0):
      // dlogits[i_j] += w_j (dw_j - sum_j' dw_j' w_j'); others get nothing.
      float selMax = row[idx[0]];
      for (int64_t j = 1; j < topK; ++j)
        selMax = std::max(selMax, row[idx[j]]);
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < topK; ++j)
        sum += (w[j] = std::exp(double(row[idx[j]]) - selMax));
      for (int64_t j = 0; j < topK; ++j)
        dot += dw[j] * (w[j] /= sum);
      for (int64_t j = 0; j < topK; ++j)
        grad[idx[j]] += w[j] * (dw[j] - dot);
    } else {
      // w_j = p[i_j]: dlogits[e] = p[e] (g[e] - sum_j p[i_j] dw_j) with
      // g[e] = sum_{j: i_j = e} dw_j.
      softmaxRow(row, experts, p);
      double dot = 0;
      for (int64_t j = 0; j < topK; ++j) {
        grad[idx[j]] += dw[j];
        dot += p[idx[j]] * dw[j];
      }
      for (int64_t e = 0; e < experts; ++e)
        grad[e] = p[e] * (grad[e] - dot);
    }
    float *out = dlogits.f32() + n * experts;
    for (int64_t e = 0; e < experts; ++e)
      out[e] = static_cast<float>(grad[e]);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Capacity slots: dispatch, combine and their gradients.

namespace {

// Reads `experts` and `capacity` and the shape of `indices` ([N,k] i32).
Status readRouting(const KernelArgs &a, const TensorRef &indices,
                   MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, indices, "indices", plan::I32, r.rows, r.topK));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "experts", std::nullopt, r.experts));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, "capacity", std::nullopt, r.capacity));
  if (__builtin_mul_overflow(r.experts, r.capacity, &r.slots))
    return a.error("attributes 'experts' * 'capacity' overflow");
  return Status::ok();
}

// Checks that `buf` is [E*C, cols] f32 and returns cols.
Status expectSlotBuffer(const KernelArgs &a, const TensorRef &buf,
                        const char *name, const MoeRouting &r, int64_t &cols) {
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, buf, name, plan::F32, rows, cols));
  if (rows != r.slots)
    return a.error(std::string(name) + " has shape " + shapeString(buf.shape) +
                   ", expected [" + std::to_string(r.slots) +
                   ",*] (experts " + std::to_string(r.experts) +
                   " * capacity " + std::to_string(r.capacity) + ")");
  return Status::ok();
}

/// The one slot assignment of dispatch, combine and their gradients. Walks
/// (n, j) in row-major order; assignment (n, j) takes the next free slot of
/// expert e = indices[n,j] if e has fewer than C assignments, else it is
/// dropped. Checks that every index lies in [0, E). slot[n * k + j]: the
/// buffer row e * C + s of assignment (n, j), or -1 when it was dropped.
/// (The GPU kernels compute the same slots: MoeLaunch.inl.)
Status assignSlots(const KernelArgs &a, const TensorRef &indices,
                   const MoeRouting &r, std::vector<int64_t> &slot) {
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, indices, "indices", r.experts));
  // Grouping the assignments by expert with a stable sort keeps row-major
  // order within each expert and needs no E-sized table (E may be huge when
  // the buffers are empty).
  const int32_t *ids = indices.i32();
  int64_t count = indices.numel();
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t l, int64_t rr) { return ids[l] < ids[rr]; });
  slot.assign(count, -1);
  for (int64_t begin = 0; begin < count;) {
    int32_t e = ids[order[begin]];
    int64_t end = begin;
    for (; end < count && ids[order[end]] == e; ++end)
      if (end - begin < r.capacity)
        slot[order[end]] = int64_t(e) * r.capacity + (end - begin);
    begin = end;
  }
  return Status::ok();
}

} // namespace

Status checkMoeDispatch(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &x = a.inputs[0], &indices = a.inputs[1], &buf = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readRouting(a, indices, r));
  PIPER_RETURN_IF_ERROR(expectSlotBuffer(a, buf, "buf", r, r.hidden));
  return expectTensor(a, x, "x", plan::F32, {r.rows, r.hidden});
}

Status moeDispatchKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeDispatch(a, r));
  const TensorRef &x = a.inputs[0], &indices = a.inputs[1], &buf = a.outputs[0];
  const int64_t hidden = r.hidden;
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  std::fill_n(buf.f32(), buf.numel(), 0.0f);
  for (int64_t n = 0; n < r.rows; ++n)
    for (int64_t j = 0; j < r.topK; ++j)
      if (int64_t s = slot[n * r.topK + j]; s >= 0)
        std::copy_n(x.f32() + n * hidden, hidden, buf.f32() + s * hidden);
  return Status::ok();
}

Status checkMoeDispatchGrad(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &indices = a.inputs[0], &dbuf = a.inputs[1],
                  &dx = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readRouting(a, indices, r));
  PIPER_RETURN_IF_ERROR(expectSlotBuffer(a, dbuf, "dbuf", r, r.hidden));
  return expectTensor(a, dx, "dx", plan::F32, {r.rows, r.hidden});
}

Status moeDispatchGradKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeDispatchGrad(a, r));
  const TensorRef &indices = a.inputs[0], &dbuf = a.inputs[1],
                  &dx = a.outputs[0];
  const int64_t hidden = r.hidden;
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  std::vector<double> sum(hidden);
  for (int64_t n = 0; n < r.rows; ++n) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t j = 0; j < r.topK; ++j)
      if (int64_t s = slot[n * r.topK + j]; s >= 0) {
        const float *row = dbuf.f32() + s * hidden;
        for (int64_t h = 0; h < hidden; ++h)
          sum[h] += row[h];
      }
    float *out = dx.f32() + n * hidden;
    for (int64_t h = 0; h < hidden; ++h)
      out[h] = static_cast<float>(sum[h]);
  }
  return Status::ok();
}

namespace {

// Shared checks of moe_combine and its gradient: ebuf [E*C,H], indices [N,k],
// weights [N,k].
Status checkCombineOperands(const KernelArgs &a, MoeRouting &r) {
  const TensorRef &ebuf = a.inputs[0], &indices = a.inputs[1],
                  &weights = a.inputs[2];
  PIPER_RETURN_IF_ERROR(readRouting(a, indices, r));
  PIPER_RETURN_IF_ERROR(expectSlotBuffer(a, ebuf, "ebuf", r, r.hidden));
  return expectTensor(a, weights, "weights", plan::F32, {r.rows, r.topK});
}

} // namespace

Status checkMoeCombine(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 3, 3, 1));
  PIPER_RETURN_IF_ERROR(checkCombineOperands(a, r));
  return expectTensor(a, a.outputs[0], "y", plan::F32, {r.rows, r.hidden});
}

Status moeCombineKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeCombine(a, r));
  const TensorRef &ebuf = a.inputs[0], &indices = a.inputs[1],
                  &weights = a.inputs[2], &y = a.outputs[0];
  const int64_t hidden = r.hidden;
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  std::vector<double> sum(hidden);
  for (int64_t n = 0; n < r.rows; ++n) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t j = 0; j < r.topK; ++j)
      if (int64_t s = slot[n * r.topK + j]; s >= 0) {
        double w = weights.f32()[n * r.topK + j];
        const float *row = ebuf.f32() + s * hidden;
        for (int64_t h = 0; h < hidden; ++h)
          sum[h] += w * row[h];
      }
    float *out = y.f32() + n * hidden;
    for (int64_t h = 0; h < hidden; ++h)
      out[h] = static_cast<float>(sum[h]);
  }
  return Status::ok();
}

Status checkMoeCombineGrad(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 4, 4, 2));
  const TensorRef &ebuf = a.inputs[0], &dy = a.inputs[3],
                  &debuf = a.outputs[0], &dweights = a.outputs[1];
  PIPER_RETURN_IF_ERROR(checkCombineOperands(a, r));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dy, "dy", plan::F32, {r.rows, r.hidden}));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, debuf, "debuf", plan::F32, ebuf.shape));
  return expectTensor(a, dweights, "dweights", plan::F32, {r.rows, r.topK});
}

Status moeCombineGradKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeCombineGrad(a, r));
  const TensorRef &ebuf = a.inputs[0], &indices = a.inputs[1],
                  &weights = a.inputs[2], &dy = a.inputs[3],
                  &debuf = a.outputs[0], &dweights = a.outputs[1];
  const int64_t hidden = r.hidden;
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  // Every slot holds at most one assignment, so debuf needs no accumulation.
  std::fill_n(debuf.f32(), debuf.numel(), 0.0f);
  for (int64_t n = 0; n < r.rows; ++n) {
    const float *dyr = dy.f32() + n * hidden;
    for (int64_t j = 0; j < r.topK; ++j) {
      int64_t s = slot[n * r.topK + j];
      float &dw = dweights.f32()[n * r.topK + j];
      if (s < 0) {
        dw = 0.0f;
        continue;
      }
      double w = weights.f32()[n * r.topK + j], dot = 0;
      const float *row = ebuf.f32() + s * hidden;
      float *out = debuf.f32() + s * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        dot += double(row[h]) * dyr[h];
        out[h] = static_cast<float>(w * dyr[h]);
      }
      dw = static_cast<float>(dot);
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Per-expert linear.

namespace {

// Checks that `w` is an f32 [E, K, M] tensor and returns its dimensions.
Status expectExpertWeight(const KernelArgs &a, const TensorRef &w,
                          const char *name, int64_t &experts, int64_t &in,
                          int64_t &out) {
  PIPER_RETURN_IF_ERROR(expectDType(a, w, name, plan::F32));
  if (w.shape.size() != 3)
    return a.error(std::string(name) + " has shape " + shapeString(w.shape) +
                   ", expected rank 3 [experts,in,out]");
  experts = w.shape[0];
  in = w.shape[1];
  out = w.shape[2];
  return Status::ok();
}

// Reads `experts` (required when `required`, else defaulting to the
// weight's), checks it against the weight's first dimension and `rows`
// (E*C) against it, and returns C.
Status expertCapacity(const KernelArgs &a, bool required, int64_t wExperts,
                      const char *wName, const TensorRef &rowsOf,
                      const char *rowsName, int64_t rows, int64_t &capacity) {
  int64_t experts = 0;
  PIPER_RETURN_IF_ERROR(readPositiveInt(
      a, "experts", required ? std::nullopt : std::optional<int64_t>(wExperts),
      experts));
  if (experts != wExperts)
    return a.error("attribute 'experts' is " + std::to_string(experts) +
                   " but " + wName + " has " + std::to_string(wExperts) +
                   " experts");
  if (rows % experts != 0)
    return a.error(std::string(rowsName) + " has shape " +
                   shapeString(rowsOf.shape) + ", rows not a multiple of " +
                   "experts " + std::to_string(experts));
  capacity = rows / experts;
  return Status::ok();
}

} // namespace

Status checkExpertLinear(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &buf = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  int64_t rows = 0, wIn = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, buf, "buf", plan::F32, rows, s.in));
  PIPER_RETURN_IF_ERROR(expectExpertWeight(a, w, "w", s.experts, wIn, s.out));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, true, s.experts, "w", buf, "buf", rows, s.capacity));
  if (wIn != s.in)
    return a.error("w has shape " + shapeString(w.shape) + ", expected [" +
                   std::to_string(s.experts) + "," + std::to_string(s.in) +
                   ",*]");
  PIPER_RETURN_IF_ERROR(expectTensor(a, y, "y", plan::F32, {rows, s.out}));
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinear(a, s));
  const TensorRef &buf = a.inputs[0], &w = a.inputs[1], &y = a.outputs[0];
  const int64_t capacity = s.capacity, in = s.in, out = s.out;

  if (y.numel() == 0)
    return Status::ok();
  for (int64_t e = 0; e < s.experts; ++e)
    gemm(false, false, capacity, out, in, 1.0f, buf.f32() + e * capacity * in,
         in, w.f32() + e * in * out, out, 0.0f, y.f32() + e * capacity * out,
         out);
  return Status::ok();
}

Status checkExpertLinearGradInput(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dbuf = a.outputs[0];
  int64_t rows = 0, wOut = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, dy, "dy", plan::F32, rows, s.out));
  PIPER_RETURN_IF_ERROR(expectExpertWeight(a, w, "w", s.experts, s.in, wOut));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, false, s.experts, "w", dy, "dy", rows, s.capacity));
  if (wOut != s.out)
    return a.error("w has shape " + shapeString(w.shape) + ", expected [" +
                   std::to_string(s.experts) + ",*," + std::to_string(s.out) +
                   "]");
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dbuf, "dbuf", plan::F32, {rows, s.in}));
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearGradInputKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinearGradInput(a, s));
  const TensorRef &dy = a.inputs[0], &w = a.inputs[1], &dbuf = a.outputs[0];
  const int64_t capacity = s.capacity, in = s.in, out = s.out;

  if (dbuf.numel() == 0)
    return Status::ok();
  // dbuf_e = dy_e * w_e^T.
  for (int64_t e = 0; e < s.experts; ++e)
    gemm(false, true, capacity, in, out, 1.0f, dy.f32() + e * capacity * out,
         out, w.f32() + e * in * out, out, 0.0f,
         dbuf.f32() + e * capacity * in, in);
  return Status::ok();
}

Status checkExpertLinearGradWeight(const KernelArgs &a, ExpertLinearShape &s) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &buf = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  int64_t rows = 0, dyRows = 0, wIn = 0, wOut = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, buf, "buf", plan::F32, rows, s.in));
  PIPER_RETURN_IF_ERROR(expectMatrix(a, dy, "dy", plan::F32, dyRows, s.out));
  if (dyRows != rows)
    return a.error("dy has shape " + shapeString(dy.shape) + ", expected [" +
                   std::to_string(rows) + ",*]");
  PIPER_RETURN_IF_ERROR(
      expectExpertWeight(a, dw, "dw", s.experts, wIn, wOut));
  PIPER_RETURN_IF_ERROR(
      expertCapacity(a, false, s.experts, "dw", buf, "buf", rows, s.capacity));
  if (wIn != s.in || wOut != s.out)
    return a.error("dw has shape " + shapeString(dw.shape) + ", expected [" +
                   std::to_string(s.experts) + "," + std::to_string(s.in) +
                   "," + std::to_string(s.out) + "]");
  return expectBlasDims(a, {s.capacity, s.in, s.out});
}

Status expertLinearGradWeightKernel(const KernelArgs &a) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(checkExpertLinearGradWeight(a, s));
  const TensorRef &buf = a.inputs[0], &dy = a.inputs[1], &dw = a.outputs[0];
  const int64_t capacity = s.capacity, in = s.in, out = s.out;

  if (dw.numel() == 0)
    return Status::ok();
  // dw_e = buf_e^T * dy_e; zero when C = 0 (gemm fills it).
  for (int64_t e = 0; e < s.experts; ++e)
    gemm(true, false, in, out, capacity, 1.0f, buf.f32() + e * capacity * in,
         in, dy.f32() + e * capacity * out, out, 0.0f,
         dw.f32() + e * in * out, out);
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Load-balancing loss.

namespace {

// Shared checks of moe_aux_loss and its gradient (logits [N,E], indices
// [N,k]).
Status checkAuxLossOperands(const KernelArgs &a, int64_t &rows,
                            int64_t &experts, int64_t &topK) {
  const TensorRef &logits = a.inputs[0], &indices = a.inputs[1];
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, logits, "logits", plan::F32, rows, experts));
  int64_t expertsAttr = 0;
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, "experts", std::nullopt, expertsAttr));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "top_k", std::nullopt, topK));
  if (expertsAttr != experts)
    return a.error("attribute 'experts' is " + std::to_string(expertsAttr) +
                   " but logits has " + std::to_string(experts) + " columns");
  if (topK > experts)
    return a.error("attribute 'top_k' " + std::to_string(topK) +
                   " exceeds the number of experts " + std::to_string(experts));
  PIPER_RETURN_IF_ERROR(expectIndices(a, indices, rows, topK));
  // P_e is a mean over tokens; it is undefined without any.
  if (rows == 0)
    return a.error("logits has shape " + shapeString(logits.shape) +
                   ", expected at least one row");
  return Status::ok();
}

// f[e] = (number of (n, j) with indices[n,j] == e) / (N k), counted before
// any capacity dropping. Checks that every index lies in [0, E).
Status routedFractions(const KernelArgs &a, const TensorRef &indices,
                       int64_t rows, int64_t experts, int64_t topK,
                       std::vector<double> &fraction) {
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, indices, "indices", experts));
  fraction.assign(experts, 0.0);
  for (int64_t i = 0, e = indices.numel(); i < e; ++i)
    fraction[indices.i32()[i]] += 1.0;
  for (double &f : fraction)
    f /= double(rows) * double(topK);
  return Status::ok();
}

} // namespace

Status checkMoeAuxLoss(const KernelArgs &a, int64_t &rows, int64_t &experts,
                       int64_t &topK) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkAuxLossOperands(a, rows, experts, topK));
  return expectScalar(a, a.outputs[0], "loss");
}

Status moeAuxLossKernel(const KernelArgs &a) {
  int64_t rows = 0, experts = 0, topK = 0;
  PIPER_RETURN_IF_ERROR(checkMoeAuxLoss(a, rows, experts, topK));
  const TensorRef &logits = a.inputs[0], &indices = a.inputs[1],
                  &loss = a.outputs[0];
  std::vector<double> fraction;
  PIPER_RETURN_IF_ERROR(
      routedFractions(a, indices, rows, experts, topK, fraction));

  // sum_e f_e P_e = (1/N) sum_n sum_e f_e p[n,e].
  std::vector<double> p;
  double total = 0;
  for (int64_t n = 0; n < rows; ++n) {
    softmaxRow(logits.f32() + n * experts, experts, p);
    for (int64_t e = 0; e < experts; ++e)
      total += fraction[e] * p[e];
  }
  loss.f32()[0] = static_cast<float>(double(experts) * total / double(rows));
  return Status::ok();
}

Status checkMoeAuxLossGrad(const KernelArgs &a, int64_t &rows,
                           int64_t &experts, int64_t &topK, double &scale) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(checkAuxLossOperands(a, rows, experts, topK));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.outputs[0], "dlogits", plan::F32, {rows, experts}));
  scale = 1.0;
  return readFloat(a, "scale", 1.0, scale);
}

Status moeAuxLossGradKernel(const KernelArgs &a) {
  int64_t rows = 0, experts = 0, topK = 0;
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(checkMoeAuxLossGrad(a, rows, experts, topK, scale));
  const TensorRef &logits = a.inputs[0], &indices = a.inputs[1],
                  &dlogits = a.outputs[0];
  std::vector<double> fraction;
  PIPER_RETURN_IF_ERROR(
      routedFractions(a, indices, rows, experts, topK, fraction));

  // d/dlogits[n,e] of E/N sum_e' f_e' p[n,e'] = E/N p[n,e] (f_e - <f, p[n]>).
  double rowScale = scale * double(experts) / double(rows);
  std::vector<double> p;
  for (int64_t n = 0; n < rows; ++n) {
    softmaxRow(logits.f32() + n * experts, experts, p);
    double dot = 0;
    for (int64_t e = 0; e < experts; ++e)
      dot += fraction[e] * p[e];
    float *out = dlogits.f32() + n * experts;
    for (int64_t e = 0; e < experts; ++e)
      out[e] = static_cast<float>(rowScale * p[e] * (fraction[e] - dot));
  }
  return Status::ok();
}

} // namespace piper::runtime::detail

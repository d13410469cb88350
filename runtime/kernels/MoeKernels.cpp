// Mixture-of-experts routing kernels, forward and backward: the top-k softmax
// router and the Switch Transformer load-balancing loss. Dispatch into
// capacity slots and the combine are MoeSlotKernels.cpp; the per-expert
// linear MoeExpertKernels.cpp; expert parallelism MoeEpKernels.cpp.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::detail {

// Reductions accumulate in double in a fixed order, as in the other kernels.

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
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kTopK, std::nullopt, topK));
  if (topK > experts)
    return a.error("attribute 'top_k' " + std::to_string(topK) +
                   " exceeds the number of experts " + std::to_string(experts));
  int64_t flag = 1;
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kNormTopk, 1, flag));
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
      readPositiveInt(a, KernelAttr::kExperts, std::nullopt, expertsAttr));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kTopK, std::nullopt, topK));
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
  return readFloat(a, KernelAttr::kScale, 1.0, scale);
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

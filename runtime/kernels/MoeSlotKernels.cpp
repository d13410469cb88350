// Mixture-of-experts capacity slots, forward and backward: dispatch of
// tokens into per-expert capacity slots and the weighted combine of expert
// outputs (MoeKernels.cpp routes; MoeExpertKernels.cpp computes).
#include <algorithm>
#include <numeric>
#include <vector>

#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::detail {

namespace {

// Reads `experts` and `capacity` and the shape of `indices` ([N,k] i32).
Status readRouting(const KernelArgs &a, const TensorRef &indices,
                   MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, indices, "indices", plan::I32, r.rows, r.topK));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kExperts, std::nullopt, r.experts));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kCapacity, std::nullopt, r.capacity));
  if (__builtin_mul_overflow(r.experts, r.capacity, &r.slots))
    return a.error("attributes 'experts' * 'capacity' overflow");
  return Status::ok();
}

// Checks that `buf` is [E*C, cols] f32 (or, in mixed precision, packed
// bf16: packableDType, expectPackableOutput) and returns cols.
Status expectSlotBuffer(const KernelArgs &a, const TensorRef &buf,
                        const char *name, const MoeRouting &r, int64_t &cols) {
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, buf, name, packableDType(a, buf), rows, cols));
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

/// Row n of `out` [N,H] (f32, or packed bf16: storeRow): the sum, in
/// double, over n's kept assignments (n, j) of buf's slot row times
/// weights[n,j] (1 when `weights` is null): combine, and dispatch's gradient.
void sumSlotRows(const MoeRouting &r, const std::vector<int64_t> &slot,
                 const float *buf, const float *weights, const TensorRef &out) {
  const int64_t hidden = r.hidden;
  std::vector<double> sum(hidden);
  std::vector<float> packed;
  for (int64_t n = 0; n < r.rows; ++n) {
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t j = 0; j < r.topK; ++j)
      if (int64_t s = slot[n * r.topK + j]; s >= 0) {
        double w = weights ? double(weights[n * r.topK + j]) : 1.0;
        const float *row = buf + s * hidden;
        for (int64_t h = 0; h < hidden; ++h)
          sum[h] += w * row[h];
      }
    float *outRow = outputRow(out, n, hidden, packed);
    for (int64_t h = 0; h < hidden; ++h)
      outRow[h] = static_cast<float>(sum[h]);
    storeRow(out, n, hidden, hidden, outRow);
  }
}

} // namespace

Status checkMoeDispatch(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &x = a.inputs[0], &indices = a.inputs[1], &buf = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readRouting(a, indices, r));
  PIPER_RETURN_IF_ERROR(expectSlotBuffer(a, buf, "buf", r, r.hidden));
  return expectTensor(a, x, "x", packableDType(a, x), {r.rows, r.hidden});
}

Status moeDispatchKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeDispatch(a, r));
  const TensorRef &x = a.inputs[0], &indices = a.inputs[1], &buf = a.outputs[0];
  const int64_t hidden = r.hidden;
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  // buf's floats, or scratch packed into it at the end (outputRow).
  std::vector<float> unpacked, packed;
  const float *xs = fp32Data(x, unpacked);
  float *out = outputRow(buf, 0, buf.numel(), packed);
  std::fill_n(out, buf.numel(), 0.0f);
  for (int64_t n = 0; n < r.rows; ++n)
    for (int64_t j = 0; j < r.topK; ++j)
      if (int64_t s = slot[n * r.topK + j]; s >= 0)
        std::copy_n(xs + n * hidden, hidden, out + s * hidden);
  storeRow(buf, 0, buf.numel(), buf.numel(), out);
  return Status::ok();
}

Status checkMoeDispatchGrad(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &indices = a.inputs[0], &dbuf = a.inputs[1],
                  &dx = a.outputs[0];
  PIPER_RETURN_IF_ERROR(readRouting(a, indices, r));
  PIPER_RETURN_IF_ERROR(expectSlotBuffer(a, dbuf, "dbuf", r, r.hidden));
  return expectPackableOutput(a, dx, "dx", {r.rows, r.hidden});
}

Status moeDispatchGradKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeDispatchGrad(a, r));
  const TensorRef &indices = a.inputs[0], &dbuf = a.inputs[1],
                  &dx = a.outputs[0];
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  std::vector<float> unpacked;
  sumSlotRows(r, slot, fp32Data(dbuf, unpacked), nullptr, dx);
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
  return expectPackableOutput(a, a.outputs[0], "y", {r.rows, r.hidden});
}

Status moeCombineKernel(const KernelArgs &a) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(checkMoeCombine(a, r));
  const TensorRef &ebuf = a.inputs[0], &indices = a.inputs[1],
                  &weights = a.inputs[2], &y = a.outputs[0];
  std::vector<int64_t> slot;
  PIPER_RETURN_IF_ERROR(assignSlots(a, indices, r, slot));

  std::vector<float> unpacked;
  sumSlotRows(r, slot, fp32Data(ebuf, unpacked), weights.f32(), y);
  return Status::ok();
}

Status checkMoeCombineGrad(const KernelArgs &a, MoeRouting &r) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 4, 4, 2));
  const TensorRef &ebuf = a.inputs[0], &dy = a.inputs[3],
                  &debuf = a.outputs[0], &dweights = a.outputs[1];
  PIPER_RETURN_IF_ERROR(checkCombineOperands(a, r));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dy, "dy", packableDType(a, dy), {r.rows, r.hidden}));
  PIPER_RETURN_IF_ERROR(expectPackableOutput(a, debuf, "debuf", ebuf.shape));
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

  std::vector<float> unpackedE, unpackedDy, packed;
  const float *ebufs = fp32Data(ebuf, unpackedE),
              *dys = fp32Data(dy, unpackedDy);
  // debuf's floats, or scratch packed into it at the end (outputRow).
  float *dbuf = outputRow(debuf, 0, debuf.numel(), packed);
  // Every slot holds at most one assignment, so debuf needs no accumulation.
  std::fill_n(dbuf, debuf.numel(), 0.0f);
  for (int64_t n = 0; n < r.rows; ++n) {
    const float *dyr = dys + n * hidden;
    for (int64_t j = 0; j < r.topK; ++j) {
      int64_t s = slot[n * r.topK + j];
      float &dw = dweights.f32()[n * r.topK + j];
      if (s < 0) {
        dw = 0.0f;
        continue;
      }
      double w = weights.f32()[n * r.topK + j], dot = 0;
      const float *row = ebufs + s * hidden;
      float *out = dbuf + s * hidden;
      for (int64_t h = 0; h < hidden; ++h) {
        dot += double(row[h]) * dyr[h];
        out[h] = static_cast<float>(w * dyr[h]);
      }
      dw = static_cast<float>(dot);
    }
  }
  storeRow(debuf, 0, debuf.numel(), debuf.numel(), dbuf);
  return Status::ok();
}

} // namespace piper::runtime::detail

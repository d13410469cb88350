// Expert parallelism: the layout changes around the two all-to-alls of an
// MoE layer whose E experts are split over G members (L = E / G each, member
// j holding experts j*L .. j*L+L-1). A member's slot buffer [E*C, H] (from
// moe_dispatch: expert e's used slots first in rows e*C..) is packed so that
// each member's experts' used rows are consecutive (moe_ep_pack), sent with
// the router's real row counts, and the rows a member receives from every
// source are laid out as its L experts' slots of capacity G*C
// (moe_ep_gather). moe_ep_scatter and moe_ep_unpack are their inverses, for
// the way back; each is the gradient of its inverse. docs/kernels.md.
#include <algorithm>

#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::detail {

namespace {

Status readEpShape(const KernelArgs &a, EpShape &s, bool needMembers) {
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kExperts, std::nullopt, s.experts));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kCapacity, std::nullopt, s.capacity));
  if (needMembers)
    PIPER_RETURN_IF_ERROR(
        readPositiveInt(a, KernelAttr::kMembers, std::nullopt, s.members));
  if (s.experts % s.members != 0)
    return a.error("attribute 'members' " + std::to_string(s.members) +
                   " does not divide 'experts' " + std::to_string(s.experts));
  s.local = s.experts / s.members;
  if (__builtin_mul_overflow(s.experts, s.capacity, &s.rows))
    return a.error("attributes 'experts' * 'capacity' overflow");
  return Status::ok();
}

/// Reads the per-expert row counts ([E,1] i32, shape already checked),
/// checking each in [0, C].
Status readExpertCounts(const KernelArgs &a, const TensorRef &t,
                        const EpShape &s, std::vector<int64_t> &out) {
  out.resize(s.experts);
  for (int64_t e = 0; e < s.experts; ++e) {
    int64_t c = t.i32()[e];
    if (c < 0 || c > s.capacity)
      return a.error("expert_counts[" + std::to_string(e) + "] is " +
                     std::to_string(c) + ", outside [0, capacity " +
                     std::to_string(s.capacity) + "]");
    out[e] = c;
  }
  return Status::ok();
}

/// Two [E*C, H] f32 buffers; returns H.
Status expectRows(const KernelArgs &a, const TensorRef &x, const TensorRef &y,
                  const EpShape &s, int64_t &hidden) {
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, x, "input", plan::F32, rows, hidden));
  if (rows != s.rows)
    return a.error("input has shape " + shapeString(x.shape) + ", expected [" +
                   std::to_string(s.rows) + ",*] (experts * capacity)");
  return expectTensor(a, y, "output", plan::F32, {s.rows, hidden});
}

/// Copies `count` rows of `hidden` floats.
void copyRows(const float *from, float *to, int64_t count, int64_t hidden) {
  std::copy_n(from, count * hidden, to);
}

} // namespace

Status checkMoeEpCounts(const KernelArgs &a, EpShape &s, int64_t &rows,
                        int64_t &topK) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 3));
  PIPER_RETURN_IF_ERROR(readEpShape(a, s, /*needMembers=*/true));
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, a.inputs[0], "indices", plan::I32, rows, topK));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.outputs[0], "send_counts", plan::I32, {s.members}));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.outputs[1], "expert_counts",
                                     plan::I32, {s.experts, 1}));
  return expectTensor(a, a.outputs[2], "expert_send_counts", plan::I32,
                      {s.members});
}

Status moeEpCountsKernel(const KernelArgs &a) {
  EpShape s;
  int64_t rows = 0, topK = 0;
  PIPER_RETURN_IF_ERROR(checkMoeEpCounts(a, s, rows, topK));
  const TensorRef &indices = a.inputs[0];
  PIPER_RETURN_IF_ERROR(expectTokensBelow(a, indices, "indices", s.experts));
  const TensorRef &send = a.outputs[0], &experts = a.outputs[1],
                  &expertSend = a.outputs[2];
  // moe_dispatch's rule: an expert keeps its first C assignments.
  std::vector<int64_t> used(s.experts, 0);
  for (int64_t i = 0; i < indices.numel(); ++i)
    used[indices.i32()[i]] += 1;
  for (int64_t j = 0; j < s.members; ++j) {
    int64_t total = 0;
    for (int64_t e = j * s.local; e < (j + 1) * s.local; ++e) {
      used[e] = std::min(used[e], s.capacity);
      experts.i32()[e] = static_cast<int32_t>(used[e]);
      total += used[e];
    }
    send.i32()[j] = static_cast<int32_t>(total);
    expertSend.i32()[j] = static_cast<int32_t>(s.local);
  }
  return Status::ok();
}

Status checkMoeEpPack(const KernelArgs &a, EpShape &s, int64_t &hidden) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(readEpShape(a, s, /*needMembers=*/false));
  PIPER_RETURN_IF_ERROR(expectRows(a, a.inputs[0], a.outputs[0], s, hidden));
  return expectTensor(a, a.inputs[1], "expert_counts", plan::I32,
                      {s.experts, 1});
}

// moe_ep_pack: slots -> packed (reverse = 0); moe_ep_unpack: the inverse.
static Status packRows(const KernelArgs &a, bool unpack) {
  EpShape s;
  int64_t hidden = 0;
  PIPER_RETURN_IF_ERROR(checkMoeEpPack(a, s, hidden));
  std::vector<int64_t> counts;
  PIPER_RETURN_IF_ERROR(readExpertCounts(a, a.inputs[1], s, counts));
  const float *in = a.inputs[0].f32();
  float *out = a.outputs[0].f32();
  std::fill_n(out, a.outputs[0].numel(), 0.0f);
  int64_t packed = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    const int64_t slot = e * s.capacity;
    if (unpack)
      copyRows(in + packed * hidden, out + slot * hidden, counts[e], hidden);
    else
      copyRows(in + slot * hidden, out + packed * hidden, counts[e], hidden);
    packed += counts[e];
  }
  return Status::ok();
}

Status moeEpPackKernel(const KernelArgs &a) { return packRows(a, false); }
Status moeEpUnpackKernel(const KernelArgs &a) { return packRows(a, true); }

// moe_ep_gather: rows received from each source (source-major, each
// source's rows grouped by this member's L experts) -> L experts' slots of
// capacity G*C, sources in order within each; moe_ep_scatter: the inverse.
Status checkMoeEpGather(const KernelArgs &a, EpShape &s, int64_t &hidden) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(readEpShape(a, s, /*needMembers=*/true));
  PIPER_RETURN_IF_ERROR(expectRows(a, a.inputs[0], a.outputs[0], s, hidden));
  return expectTensor(a, a.inputs[1], "expert_counts", plan::I32,
                      {s.experts, 1});
}

static Status gatherRows(const KernelArgs &a, bool scatter) {
  EpShape s;
  int64_t hidden = 0;
  PIPER_RETURN_IF_ERROR(checkMoeEpGather(a, s, hidden));
  // The received counts: [G*L, 1], source-major (source s, local expert l).
  std::vector<int64_t> counts;
  PIPER_RETURN_IF_ERROR(readExpertCounts(a, a.inputs[1], s, counts));
  const float *in = a.inputs[0].f32();
  float *out = a.outputs[0].f32();
  std::fill_n(out, a.outputs[0].numel(), 0.0f);
  const int64_t slotCapacity = s.members * s.capacity;
  std::vector<int64_t> filled(s.local, 0);
  int64_t received = 0;
  for (int64_t src = 0; src < s.members; ++src)
    for (int64_t l = 0; l < s.local; ++l) {
      int64_t n = counts[src * s.local + l];
      int64_t slot = l * slotCapacity + filled[l];
      if (scatter)
        copyRows(in + slot * hidden, out + received * hidden, n, hidden);
      else
        copyRows(in + received * hidden, out + slot * hidden, n, hidden);
      filled[l] += n;
      received += n;
    }
  return Status::ok();
}

Status moeEpGatherKernel(const KernelArgs &a) { return gatherRows(a, false); }
Status moeEpScatterKernel(const KernelArgs &a) { return gatherRows(a, true); }

} // namespace piper::runtime::detail

// The moe GPU kernels: the top-k router, capacity slots (dispatch, combine),
// the per-expert linear, the load-balancing loss and the expert-parallel
// layout changes, forward and backward. Each checks its operands with the
// CPU kernel's check (runtime/kernels/MoeChecks.h), then queues launchers
// (MoeLaunch.h); nothing reads tensor data on the host, so nothing waits for
// the device. Scratch (the slot of every assignment, per-expert counters)
// comes from the stream's workspace.
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/MoeLaunch.h"
#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

using detail::EpShape;
using detail::ExpertLinearShape;
using detail::KernelArgs;
using detail::MoeRouting;

size_t aligned(size_t bytes) { return (bytes + 255) & ~size_t(255); }

/// Carves one workspace reservation into arrays: add() every array, then
/// reserve(), then take() them in the same order.
class Scratch {
public:
  template <class T> void add(int64_t count) {
    total += aligned(static_cast<size_t>(count) * sizeof(T));
  }
  Status reserve(const Context &ctx) {
    void *p = nullptr;
    PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(total == 0 ? 256 : total, p));
    next = static_cast<char *>(p);
    return Status::ok();
  }
  template <class T> T *take(int64_t count) {
    T *p = reinterpret_cast<T *>(next);
    next += aligned(static_cast<size_t>(count) * sizeof(T));
    return p;
  }

private:
  size_t total = 0;
  char *next = nullptr;
};

Status zero(const Context &ctx, const TensorRef &t) {
  size_t bytes =
      static_cast<size_t>(t.numel()) * (t.dtype == plan::BF16 ? 2 : 4);
  return bytes ? zeroAsync(ctx, t.data, bytes) : Status::ok();
}

/// Per-expert counts of `count` assignments `ids` into `table` (E x chunks,
/// from `scratch`), turned into per-chunk offsets; totals[e] when not null.
Status countAssignments(const Context &ctx, const int32_t *ids, int64_t count,
                        int64_t experts, int64_t *table, int64_t *totals) {
  const int64_t chunks = moeSlotChunks(count);
  if (chunks > 0)
    PIPER_RETURN_IF_ERROR(zeroAsync(
        ctx, table, static_cast<size_t>(experts * chunks) * sizeof(int64_t)));
  PIPER_RETURN_IF_ERROR(launchMoeChunkCounts(ctx, ids, count, experts, table));
  return launchMoeChunkOffsets(ctx, table, count, experts, totals);
}

/// The slot of every assignment (n, j) (count = N k > 0), as the CPU
/// kernels' assignSlots: in the workspace, valid until the next reserve.
Status assignSlots(const Context &ctx, const TensorRef &indices,
                   const MoeRouting &r, const int64_t *&slot) {
  const int64_t count = r.rows * r.topK;
  Scratch scratch;
  scratch.add<int64_t>(r.experts * moeSlotChunks(count));
  scratch.add<int64_t>(count);
  PIPER_RETURN_IF_ERROR(scratch.reserve(ctx));
  int64_t *table = scratch.take<int64_t>(r.experts * moeSlotChunks(count));
  int64_t *slots = scratch.take<int64_t>(count);
  PIPER_RETURN_IF_ERROR(countAssignments(ctx, indices.i32(), count, r.experts,
                                         table, nullptr));
  PIPER_RETURN_IF_ERROR(launchMoeAssignSlots(
      ctx, indices.i32(), count, r.experts, r.capacity, table, slots));
  slot = slots;
  return Status::ok();
}

// ---------------------------------------------------------------------------
// The router.

Status moeRouter(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, experts = 0, topK = 0;
  bool normTopK = true;
  PIPER_RETURN_IF_ERROR(
      detail::checkMoeRouter(a, rows, experts, topK, normTopK));
  return launchMoeRouter(ctx, a.inputs[0].f32(), a.outputs[0].i32(),
                         a.outputs[1].f32(), rows, experts, topK, normTopK);
}

Status moeRouterGrad(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, experts = 0, topK = 0;
  bool normTopK = true;
  PIPER_RETURN_IF_ERROR(
      detail::checkMoeRouterGrad(a, rows, experts, topK, normTopK));
  return launchMoeRouterGrad(ctx, a.inputs[0].f32(), a.inputs[1].i32(),
                             a.inputs[2].f32(), a.outputs[0].f32(), rows,
                             experts, topK, normTopK);
}

// ---------------------------------------------------------------------------
// Capacity slots. With H = 0 nothing moves (E may then be huge: no
// E-sized scratch is taken).

Status moeDispatch(const KernelArgs &a, const Context &ctx) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(detail::checkMoeDispatch(a, r));
  PIPER_RETURN_IF_ERROR(zero(ctx, a.outputs[0]));
  if (r.hidden == 0 || r.rows * r.topK == 0)
    return Status::ok();
  const int64_t *slot = nullptr;
  PIPER_RETURN_IF_ERROR(assignSlots(ctx, a.inputs[1], r, slot));
  return launchMoeDispatch(ctx, rowIn(a.inputs[0]), slot, f32Out(a.outputs[0]),
                           bf16Out(a.outputs[0]), r.rows, r.topK, r.hidden,
                           a.ctx.lowPrecision);
}

Status moeDispatchGrad(const KernelArgs &a, const Context &ctx) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(detail::checkMoeDispatchGrad(a, r));
  if (r.hidden == 0 || r.rows * r.topK == 0)
    return zero(ctx, a.outputs[0]);
  const int64_t *slot = nullptr;
  PIPER_RETURN_IF_ERROR(assignSlots(ctx, a.inputs[0], r, slot));
  return launchMoeDispatchGrad(ctx, rowIn(a.inputs[1]), slot,
                               f32Out(a.outputs[0]), bf16Out(a.outputs[0]),
                               r.rows, r.topK, r.hidden, a.ctx.lowPrecision);
}

Status moeCombine(const KernelArgs &a, const Context &ctx) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(detail::checkMoeCombine(a, r));
  if (r.hidden == 0 || r.rows * r.topK == 0)
    return zero(ctx, a.outputs[0]);
  const int64_t *slot = nullptr;
  PIPER_RETURN_IF_ERROR(assignSlots(ctx, a.inputs[1], r, slot));
  return launchMoeCombine(ctx, rowIn(a.inputs[0]), slot, a.inputs[2].f32(),
                          f32Out(a.outputs[0]), bf16Out(a.outputs[0]), r.rows,
                          r.topK, r.hidden, a.ctx.lowPrecision);
}

Status moeCombineGrad(const KernelArgs &a, const Context &ctx) {
  MoeRouting r;
  PIPER_RETURN_IF_ERROR(detail::checkMoeCombineGrad(a, r));
  PIPER_RETURN_IF_ERROR(zero(ctx, a.outputs[0]));
  // Without columns every dot product is empty: dweights is 0.
  if (r.hidden == 0 || r.rows * r.topK == 0)
    return zero(ctx, a.outputs[1]);
  const int64_t *slot = nullptr;
  PIPER_RETURN_IF_ERROR(assignSlots(ctx, a.inputs[1], r, slot));
  return launchMoeCombineGrad(ctx, rowIn(a.inputs[0]), slot, a.inputs[2].f32(),
                              rowIn(a.inputs[3]), f32Out(a.outputs[0]),
                              bf16Out(a.outputs[0]), a.outputs[1].f32(), r.rows,
                              r.topK, r.hidden, a.ctx.lowPrecision);
}

// ---------------------------------------------------------------------------
// The per-expert linear. Every expert has exactly C rows (the slot buffer is
// capacity-padded, a static shape; unused slots are zero rows), so the
// product is E GEMMs of static sizes queued from a host loop, with nothing
// read back: no host synchronization. (A data-dependent row count per
// expert would need the counts on the host; the padded rows cost C - used
// rows of each GEMM instead.) The GEMMs read their operands packed where
// they are stored so (KernelEntry::packedInputs: the slot buffers, the
// weights' bf16 copies, the gradients), and in mixed precision the
// activations and their gradients are stored rounded (roundsOutputs): by
// the GEMMs as bf16 where packed (packedOutputs), else by a pass.

/// Output 0 of `a` = the E GEMMs C_e = op(A_e) op(B_e) (m x n x k, the
/// e-th of E equal blocks of inputs 0 and 1 and output 0, rows of lda, ldb
/// and ldc elements), rounded in mixed precision when `rounds`.
Status expertGemms(const KernelArgs &a, const Context &ctx, int64_t experts,
                   bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                   int64_t lda, int64_t ldb, int64_t ldc, bool rounds) {
  const TensorRef &out = a.outputs[0];
  if (out.numel() == 0)
    return Status::ok();
  const GemmOperand lhs = gemmOperand(a.inputs[0]),
                    rhs = gemmOperand(a.inputs[1]);
  const int64_t lhsBlock = a.inputs[0].numel() / experts,
                rhsBlock = a.inputs[1].numel() / experts,
                outBlock = out.numel() / experts;
  float *c = f32Out(out);
  uint16_t *c16 = bf16Out(out);
  for (int64_t e = 0; e < experts; ++e)
    PIPER_RETURN_IF_ERROR(gemm(
        ctx, transA, transB, m, n, k, 1.0f, lhs.at(e * lhsBlock), lda,
        rhs.at(e * rhsBlock), ldb, 0.0f, c ? c + e * outBlock : nullptr, ldc,
        nullptr, nullptr, nullptr, c16 ? c16 + e * outBlock : nullptr));
  if (!rounds || !a.ctx.lowPrecision || c16)
    return Status::ok();
  return launchRoundBf16(ctx, c, out.numel());
}

Status expertLinear(const KernelArgs &a, const Context &ctx) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(detail::checkExpertLinear(a, s));
  // y_e = buf_e w_e.
  return expertGemms(a, ctx, s.experts, false, false, s.capacity, s.out, s.in,
                     s.in, s.out, s.out, true);
}

Status expertLinearGradInput(const KernelArgs &a, const Context &ctx) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(detail::checkExpertLinearGradInput(a, s));
  // dbuf_e = dy_e w_e^T.
  return expertGemms(a, ctx, s.experts, false, true, s.capacity, s.in, s.out,
                     s.out, s.out, s.in, true);
}

Status expertLinearGradWeight(const KernelArgs &a, const Context &ctx) {
  ExpertLinearShape s;
  PIPER_RETURN_IF_ERROR(detail::checkExpertLinearGradWeight(a, s));
  // dw_e = buf_e^T dy_e; zero when C = 0 (gemm zeroes it). A parameter
  // gradient: the executor rounds it as it does linear_grad_weight's.
  return expertGemms(a, ctx, s.experts, true, false, s.in, s.out, s.capacity,
                     s.in, s.out, s.out, false);
}

// ---------------------------------------------------------------------------
// The load-balancing loss.

/// The routed fraction of every expert (N >= 1, k >= 1), in `scratch`
/// after `extra` doubles that the caller takes next.
Status routedFractions(const Context &ctx, const TensorRef &indices,
                       int64_t rows, int64_t experts, int64_t topK,
                       int64_t extra, const double *&fraction,
                       double *&extraOut) {
  const int64_t count = rows * topK, chunks = moeSlotChunks(count);
  Scratch scratch;
  scratch.add<int64_t>(experts * chunks);
  scratch.add<int64_t>(experts);
  scratch.add<double>(experts);
  scratch.add<double>(extra);
  PIPER_RETURN_IF_ERROR(scratch.reserve(ctx));
  int64_t *table = scratch.take<int64_t>(experts * chunks);
  int64_t *totals = scratch.take<int64_t>(experts);
  double *f = scratch.take<double>(experts);
  extraOut = scratch.take<double>(extra);
  PIPER_RETURN_IF_ERROR(
      countAssignments(ctx, indices.i32(), count, experts, table, totals));
  PIPER_RETURN_IF_ERROR(
      launchMoeFractions(ctx, totals, f, experts, rows, topK));
  fraction = f;
  return Status::ok();
}

Status moeAuxLoss(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, experts = 0, topK = 0;
  PIPER_RETURN_IF_ERROR(detail::checkMoeAuxLoss(a, rows, experts, topK));
  const double *fraction = nullptr;
  double *rowDots = nullptr;
  PIPER_RETURN_IF_ERROR(routedFractions(ctx, a.inputs[1], rows, experts, topK,
                                        rows, fraction, rowDots));
  return launchMoeAuxLoss(ctx, a.inputs[0].f32(), fraction, rowDots,
                          a.outputs[0].f32(), rows, experts);
}

Status moeAuxLossGrad(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, experts = 0, topK = 0;
  double scale = 1.0;
  PIPER_RETURN_IF_ERROR(
      detail::checkMoeAuxLossGrad(a, rows, experts, topK, scale));
  const double *fraction = nullptr;
  double *unused = nullptr;
  PIPER_RETURN_IF_ERROR(routedFractions(ctx, a.inputs[1], rows, experts, topK,
                                        0, fraction, unused));
  return launchMoeAuxLossGrad(ctx, a.inputs[0].f32(), fraction,
                              a.outputs[0].f32(), rows, experts, scale);
}

// ---------------------------------------------------------------------------
// Expert parallelism. The counts stay on the device: the executor copies
// moe_ep_counts' outputs to the host itself.

Status moeEpCounts(const KernelArgs &a, const Context &ctx) {
  EpShape s;
  int64_t rows = 0, topK = 0;
  PIPER_RETURN_IF_ERROR(detail::checkMoeEpCounts(a, s, rows, topK));
  const int64_t count = rows * topK, chunks = moeSlotChunks(count);
  Scratch scratch;
  scratch.add<int64_t>(s.experts * chunks);
  scratch.add<int64_t>(s.experts);
  PIPER_RETURN_IF_ERROR(scratch.reserve(ctx));
  int64_t *table = scratch.take<int64_t>(s.experts * chunks);
  int64_t *totals = scratch.take<int64_t>(s.experts);
  PIPER_RETURN_IF_ERROR(countAssignments(ctx, a.inputs[0].i32(), count,
                                         s.experts, table, totals));
  return launchMoeEpCounts(ctx, totals, a.outputs[0].i32(),
                           a.outputs[1].i32(), a.outputs[2].i32(), s.members,
                           s.local, s.capacity);
}

// moe_ep_pack moves expert e's first counts[e] slot rows to the packed
// position (the counts' prefix sum); moe_ep_unpack moves them back.
Status packRows(const KernelArgs &a, const Context &ctx, bool unpack) {
  EpShape s;
  int64_t hidden = 0;
  PIPER_RETURN_IF_ERROR(detail::checkMoeEpPack(a, s, hidden));
  PIPER_RETURN_IF_ERROR(zero(ctx, a.outputs[0]));
  if (hidden == 0)
    return Status::ok();
  Scratch scratch;
  scratch.add<int64_t>(s.experts);
  PIPER_RETURN_IF_ERROR(scratch.reserve(ctx));
  int64_t *packed = scratch.take<int64_t>(s.experts);
  const int32_t *counts = a.inputs[1].i32();
  PIPER_RETURN_IF_ERROR(
      launchMoeEpRunStarts(ctx, counts, s.experts, s.capacity, packed));
  return launchMoeEpMoveRows(ctx, a.inputs[0].f32(), a.outputs[0].f32(),
                             counts, unpack ? packed : nullptr,
                             unpack ? nullptr : packed, s.experts, s.capacity,
                             hidden);
}

// moe_ep_gather moves the rows received from source src for local expert l
// (at their running position) to l's slots after those of the sources
// before; moe_ep_scatter moves them back.
Status gatherRows(const KernelArgs &a, const Context &ctx, bool scatter) {
  EpShape s;
  int64_t hidden = 0;
  PIPER_RETURN_IF_ERROR(detail::checkMoeEpGather(a, s, hidden));
  PIPER_RETURN_IF_ERROR(zero(ctx, a.outputs[0]));
  if (hidden == 0)
    return Status::ok();
  Scratch scratch;
  scratch.add<int64_t>(s.experts);
  scratch.add<int64_t>(s.experts);
  PIPER_RETURN_IF_ERROR(scratch.reserve(ctx));
  int64_t *received = scratch.take<int64_t>(s.experts);
  int64_t *slots = scratch.take<int64_t>(s.experts);
  const int32_t *counts = a.inputs[1].i32();
  PIPER_RETURN_IF_ERROR(
      launchMoeEpRunStarts(ctx, counts, s.experts, s.capacity, received));
  PIPER_RETURN_IF_ERROR(launchMoeEpSlotStarts(ctx, counts, s.members, s.local,
                                              s.capacity, slots));
  return launchMoeEpMoveRows(ctx, a.inputs[0].f32(), a.outputs[0].f32(),
                             counts, scatter ? slots : received,
                             scatter ? received : slots, s.experts,
                             s.capacity, hidden);
}

Status moeEpPack(const KernelArgs &a, const Context &ctx) {
  return packRows(a, ctx, false);
}
Status moeEpUnpack(const KernelArgs &a, const Context &ctx) {
  return packRows(a, ctx, true);
}
Status moeEpGather(const KernelArgs &a, const Context &ctx) {
  return gatherRows(a, ctx, false);
}
Status moeEpScatter(const KernelArgs &a, const Context &ctx) {
  return gatherRows(a, ctx, true);
}

} // namespace

void addMoeKernels(std::vector<KernelEntry> &out) {
  out.insert(
      out.end(),
      {
          {"moe_router", moeRouter},
          {"moe_router_grad", moeRouterGrad},
          // The slot buffers, the expert GEMMs' operands and the combined
          // output read packed and (rounding every output in mixed
          // precision) stored packed where the executor keeps them so.
          {"moe_dispatch", moeDispatch, nullptr, true, 0b1, 0b1},
          {"moe_dispatch_grad", moeDispatchGrad, nullptr, true, 0b10, 0b1},
          {"moe_combine", moeCombine, nullptr, true, 0b1, 0b1},
          {"moe_combine_grad", moeCombineGrad, nullptr, true, 0b1001, 0b1},
          {"expert_linear", expertLinear, nullptr, true, 0b11, 0b1},
          {"expert_linear_grad_input", expertLinearGradInput, nullptr, true,
           0b11, 0b1},
          {"expert_linear_grad_weight", expertLinearGradWeight, nullptr, false,
           0b11},
          {"moe_aux_loss", moeAuxLoss},
          {"moe_aux_loss_grad", moeAuxLossGrad},
          {"moe_ep_counts", moeEpCounts},
          {"moe_ep_pack", moeEpPack},
          {"moe_ep_unpack", moeEpUnpack},
          {"moe_ep_gather", moeEpGather},
          {"moe_ep_scatter", moeEpScatter},
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

// The attention GPU kernels (attention, attention_grad, and ring
// attention's attention_block(_grad)): causal
// grouped-query attention with rotary embeddings, flash-attention style
// (AttentionLaunch.inl), checked by the CPU kernel's own checks.
#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/hal/gpu/AttentionLaunch.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/kernels/AttentionChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

using detail::AttentionDims;
using detail::KernelArgs;

// The launchers' shape of a checked call; heads wider than kMaxHeadDim are
// beyond the registers the kernels hold them in.
Status attentionShape(const KernelArgs &a, const AttentionDims &d,
                      AttentionShape &s) {
  if (d.headDim > kMaxHeadDim)
    return a.error("head dim " + std::to_string(d.headDim) +
                   " exceeds the GPU kernels' limit of " +
                   std::to_string(kMaxHeadDim));
  s.batch = d.batch;
  s.seq = d.seq;
  s.heads = d.heads;
  s.kvHeads = d.kvHeads;
  s.headDim = d.headDim;
  s.qCols = d.qCols;
  s.kvCols = d.kvCols;
  s.cols = d.cols;
  s.ropeTheta = d.ropeTheta;
  s.rope = d.rope;
  // As the CPU kernel rounds it.
  s.scale = static_cast<float>(1.0 / std::sqrt(double(d.headDim)));
  return Status::ok();
}

// Scratch for the call from the stream's workspace (none needed: null);
// in a bf16 call also an fp32 qkv (`qkv32`), which a packed qkv is
// unpacked into for the SIMT kernels, and an fp32 y (`y32`): the forward's,
// which they write where the executor gives y packed, or the backward's dy,
// which a packed dy is unpacked into; and the backward's fp32 dqkv
// (`dqkv32`), which they write where the executor gives dqkv packed.
Status attentionScratchFor(const Context &ctx, const AttentionShape &s,
                           bool grad, char *&scratch, float *&qkv32,
                           float *&y32, float *&dqkv32) {
  scratch = nullptr;
  qkv32 = y32 = dqkv32 = nullptr;
  const size_t bytes = attentionAlign(attentionScratch(s, grad).bytes);
  const size_t qkvBytes =
      ctx.bf16 ? attentionAlign(size_t(s.rows() * s.cols) * sizeof(float)) : 0;
  const size_t yBytes =
      ctx.bf16 ? attentionAlign(size_t(s.rows() * s.qCols) * sizeof(float)) : 0;
  const size_t dqkvBytes = grad ? qkvBytes : 0;
  const size_t total = bytes + qkvBytes + yBytes + dqkvBytes;
  if (total == 0)
    return Status::ok();
  void *p = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(total, p));
  char *at = static_cast<char *>(p);
  scratch = bytes ? at : nullptr;
  if (qkvBytes)
    qkv32 = reinterpret_cast<float *>(at + bytes);
  if (yBytes)
    y32 = reinterpret_cast<float *>(at + bytes + qkvBytes);
  if (dqkvBytes)
    dqkv32 = reinterpret_cast<float *>(at + bytes + qkvBytes + yBytes);
  return Status::ok();
}

// The fused path (GpuApi.h, Context::fused): the backend's fused attention
// for s, or null where the SIMT kernels run (--attention simt, fp32 plans,
// a backend without one, or a shape it refuses under --attention auto).
Status fusedFor(const Context &ctx, const AttentionShape &s,
                const FusedAttention *&fused) {
  fused = nullptr;
  if (ctx.attention == AttentionMode::Simt)
    return Status::ok();
  if (!ctx.bf16) {
    if (ctx.attention == AttentionMode::Cudnn)
      return Status::error(
          "--attention cudnn: cuDNN's fused attention runs bf16 plans only "
          "(compile with piperc compile --dtype bf16, or use --attention "
          "auto: fp32 plans run the SIMT kernels)");
    return Status::ok();
  }
  FusedAttentionShape shape;
  shape.batch = s.batch;
  shape.seq = s.seq;
  shape.heads = s.heads;
  shape.kvHeads = s.kvHeads;
  shape.headDim = s.headDim;
  shape.scale = s.scale;
  if (!ctx.fused) {
    if (ctx.attention == AttentionMode::Cudnn)
      return Status::error("--attention cudnn: this device has no fused "
                           "attention");
    return Status::ok();
  }
  return ctx.fused->get(ctx, shape, fused);
}

// One workspace block for a fused call: the rotary table, bf16 qkv and y,
// the statistics, (backward) bf16 dy and dqkv, then the fused kernels' own
// workspace, each 256-byte aligned.
struct FusedScratch {
  char *table = nullptr;
  uint16_t *qkv16 = nullptr, *y16 = nullptr, *dy16 = nullptr, *dqkv16 = nullptr;
  float *stats = nullptr;
  void *workspace = nullptr;
};

Status reserveFused(const Context &ctx, const AttentionShape &s,
                    const FusedAttention &fused, bool grad, FusedScratch &f) {
  const size_t qkvBytes = attentionAlign(size_t(s.rows() * s.cols) * 2);
  const size_t yBytes = attentionAlign(size_t(s.rows() * s.qCols) * 2);
  const size_t statsBytes =
      attentionAlign(size_t(s.batch * s.heads * s.seq) * sizeof(float));
  const size_t table = attentionRopeTableBytes(s);
  size_t total = table + qkvBytes + yBytes + statsBytes +
                 (grad ? yBytes + qkvBytes : 0) +
                 attentionAlign(fused.workspaceBytes());
  void *p = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(total, p));
  char *at = static_cast<char *>(p);
  auto take = [&](size_t bytes) {
    char *here = at;
    at += bytes;
    return here;
  };
  f.table = take(table);
  f.qkv16 = reinterpret_cast<uint16_t *>(take(qkvBytes));
  f.y16 = reinterpret_cast<uint16_t *>(take(yBytes));
  f.stats = reinterpret_cast<float *>(take(statsBytes));
  if (grad) {
    f.dy16 = reinterpret_cast<uint16_t *>(take(yBytes));
    f.dqkv16 = reinterpret_cast<uint16_t *>(take(qkvBytes));
  }
  f.workspace = take(attentionAlign(fused.workspaceBytes()));
  return Status::ok();
}

// One call of attention or attention_grad set up: its shape, the fused
// attention (null: the SIMT kernels) and its scratch reserved on the
// stream's workspace. `empty`: a batch of 0, nothing to launch.
struct AttentionCall {
  AttentionShape s;
  const FusedAttention *fused = nullptr;
  FusedScratch f;          // the fused path's
  char *scratch = nullptr; // the SIMT kernels' (null: none needed)
  float *qkv32 = nullptr;  // theirs: an fp32 qkv in a bf16 call
  float *y32 = nullptr;    // theirs: an fp32 y (or dy) in a bf16 call
  float *dqkv32 = nullptr; // theirs: an fp32 dqkv in a bf16 backward
  bool empty = false;
};

Status setUpAttention(const KernelArgs &a, const Context &ctx, bool grad,
                      AttentionCall &c) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(grad ? detail::checkAttentionGrad(a, d)
                             : detail::checkAttention(a, d));
  c.empty = d.batch == 0;
  if (c.empty)
    return Status::ok();
  PIPER_RETURN_IF_ERROR(attentionShape(a, d, c.s));
  PIPER_RETURN_IF_ERROR(fusedFor(ctx, c.s, c.fused));
  if (c.fused)
    return reserveFused(ctx, c.s, *c.fused, grad, c.f);
  return attentionScratchFor(ctx, c.s, grad, c.scratch, c.qkv32, c.y32,
                             c.dqkv32);
}

// q, k rotated and packed to bf16 for the fused kernels into f.qkv16 (from
// qkv fp32 or packed), leaving the rotary table in f.table; or, without
// rotary embeddings, a packed qkv as it is.
Status fusedOperand(const Context &ctx, const AttentionCall &c,
                    const TensorRef &qkv, const uint16_t *&qkv16) {
  qkv16 = c.f.qkv16;
  if (bf16In(qkv) && !c.s.rotary()) {
    qkv16 = bf16In(qkv);
    return Status::ok();
  }
  return launchAttentionPackBf16(ctx, c.s, f32In(qkv), c.f.qkv16, c.f.table,
                                 bf16In(qkv));
}

// The SIMT kernels' fp32 operand: t's floats, or a packed t unpacked into
// `scratch` (the call's qkv32 or y32).
Status simtOperand(const Context &ctx, const TensorRef &t, float *scratch,
                   const float *&out) {
  out = f32In(t);
  if (out)
    return Status::ok();
  if (!scratch)
    return Status::error("attention: a packed operand in an fp32 call");
  PIPER_RETURN_IF_ERROR(launchUnpackBf16(ctx, scratch, bf16In(t), t.numel()));
  out = scratch;
  return Status::ok();
}

// y = attention(qkv) by the fused kernels: q, k rotated and packed to bf16,
// the fused forward (straight into a packed y16, else into scratch and y
// up-cast from there: exactly, the fused kernels write bf16) and the
// statistics stored as the op's lse.
Status fusedForward(const Context &ctx, const AttentionCall &c,
                    const TensorRef &qkv, float *y, uint16_t *y16, float *lse) {
  const AttentionShape &s = c.s;
  const FusedScratch &f = c.f;
  const uint16_t *qkv16 = nullptr;
  PIPER_RETURN_IF_ERROR(fusedOperand(ctx, c, qkv, qkv16));
  PIPER_RETURN_IF_ERROR(
      c.fused->forward(ctx, qkv16, y16 ? y16 : f.y16, f.stats, f.workspace));
  PIPER_RETURN_IF_ERROR(launchStatsToLse(ctx, s, f.stats, lse));
  if (y16)
    return Status::ok();
  return launchUnpackBf16(ctx, y, f.y16, s.rows() * s.qCols);
}

// dqkv by the fused kernels from the forward's y and lse (saved by the
// compiler: no forward runs again): q, k, v, y and dy packed to bf16 (y
// exactly: the fused forward wrote it in bf16; a packed y16 is read as it
// is), the statistics from lse, the fused backward; dq and dk are rotated
// back while they are up-cast (and with `round` rounded to bf16), or
// rounded and packed into a packed dqkv16. Without rotary embeddings the
// fused backward writes a packed dqkv16 itself (no pass).
Status fusedBackward(const Context &ctx, const AttentionCall &c,
                     const TensorRef &qkv, const TensorRef &y, const float *lse,
                     const TensorRef &dy, float *dqkv, uint16_t *dqkv16,
                     bool round) {
  const AttentionShape &s = c.s;
  const FusedScratch &f = c.f;
  const uint16_t *qkv16 = nullptr;
  PIPER_RETURN_IF_ERROR(fusedOperand(ctx, c, qkv, qkv16));
  const uint16_t *y16 = bf16In(y);
  if (!y16) {
    PIPER_RETURN_IF_ERROR(
        launchPackBf16(ctx, f.y16, y.f32(), s.rows() * s.qCols));
    y16 = f.y16;
  }
  PIPER_RETURN_IF_ERROR(launchLseToStats(ctx, s, lse, f.stats));
  // dy packed unless it is already (linear_grad_input's packed dx).
  const uint16_t *dy16 = bf16In(dy);
  if (!dy16) {
    PIPER_RETURN_IF_ERROR(
        launchPackBf16(ctx, f.dy16, dy.f32(), s.rows() * s.qCols));
    dy16 = f.dy16;
  }
  if (dqkv16 && !s.rotary())
    return c.fused->backward(ctx, qkv16, y16, dy16, f.stats, dqkv16,
                             f.workspace);
  PIPER_RETURN_IF_ERROR(
      c.fused->backward(ctx, qkv16, y16, dy16, f.stats, f.dqkv16, f.workspace));
  return launchAttentionUnpackGradBf16(ctx, s, f.dqkv16, dqkv, f.table, round,
                                       dqkv16);
}

// In mixed precision y and lse are stored rounded to bf16
// (KernelEntry::roundsOutputs): the fused path's y is bf16 already (its
// up-cast is exact), the SIMT kernels' is rounded by a pass, or packed
// from their fp32 y where y is packed (an activation that only GEMMs and
// attention_grad read, KernelEntry::packedOutputs); lse (a bf16 value and
// its exact rest per head, AttentionChecks.h) by a pass.
Status attention(const KernelArgs &a, const Context &ctx) {
  AttentionCall c;
  PIPER_RETURN_IF_ERROR(setUpAttention(a, ctx, false, c));
  if (c.empty)
    return Status::ok();
  const TensorRef &qkvRef = a.inputs[0];
  float *y = f32Out(a.outputs[0]), *lse = a.outputs[1].f32();
  uint16_t *y16 = bf16Out(a.outputs[0]);
  const bool round = a.ctx.lowPrecision;
  const int64_t n = c.s.rows() * c.s.qCols;
  if (c.fused) {
    PIPER_RETURN_IF_ERROR(fusedForward(ctx, c, qkvRef, y, y16, lse));
  } else {
    if (y16 && !c.y32)
      return Status::error("attention: a packed y in an fp32 call");
    const float *qkv = nullptr;
    PIPER_RETURN_IF_ERROR(simtOperand(ctx, qkvRef, c.qkv32, qkv));
    float *out = y16 ? c.y32 : y;
    PIPER_RETURN_IF_ERROR(launchAttention(ctx, c.s, qkv, out, lse, c.scratch));
    PIPER_RETURN_IF_ERROR(packOrRound(ctx, out, y16, n, round));
  }
  if (!round)
    return Status::ok();
  return launchRoundBf16(ctx, lse, a.outputs[1].numel());
}

// In mixed precision dqkv is stored rounded to bf16 (KernelEntry::
// roundsOutputs): by the fused path's up-cast, or a pass after the SIMT
// kernels; or packed where the executor gives it so (the QKV projection's
// gradient, read only by its GEMMs and bias sums: KernelEntry::
// packedOutputs).
Status attentionGrad(const KernelArgs &a, const Context &ctx) {
  AttentionCall c;
  PIPER_RETURN_IF_ERROR(setUpAttention(a, ctx, true, c));
  if (c.empty)
    return Status::ok();
  const TensorRef &out = a.outputs[0];
  float *dqkv = f32Out(out);
  uint16_t *dqkv16 = bf16Out(out);
  const bool round = a.ctx.lowPrecision;
  // y may be packed (KernelEntry::packedInputs): the fused backward reads it
  // as it is; the SIMT kernels do not read it.
  if (c.fused)
    return fusedBackward(ctx, c, a.inputs[0], a.inputs[1], a.inputs[2].f32(),
                         a.inputs[3], dqkv, dqkv16, round);
  // The SIMT kernels recompute the softmax from q|k|v, as the CPU's.
  if (dqkv16 && !c.dqkv32)
    return Status::error("attention_grad: a packed dqkv in an fp32 call");
  const float *qkv = nullptr, *dy = nullptr;
  PIPER_RETURN_IF_ERROR(simtOperand(ctx, a.inputs[0], c.qkv32, qkv));
  PIPER_RETURN_IF_ERROR(simtOperand(ctx, a.inputs[3], c.y32, dy));
  float *into = dqkv16 ? c.dqkv32 : dqkv;
  PIPER_RETURN_IF_ERROR(
      launchAttentionGrad(ctx, c.s, qkv, dy, into, c.scratch));
  return packOrRound(ctx, into, dqkv16, out.numel(), round);
}

// Preparing a plan's attention (prepareKernel, at plan load): the fused
// attention of the shape (cuDNN builds its execution plans; under
// --attention auto a refusal is said here, under --attention cudnn it is
// the error) and the scratch reserved, so that no step builds or grows
// either.
template <bool Grad>
Status prepareAttention(const KernelArgs &a, const Context &ctx) {
  AttentionCall c;
  return setUpAttention(a, ctx, Grad, c);
}

// The ring step's shape: the base shape over the member's rows.
Status ringShape(const KernelArgs &a, const detail::AttentionBlockDims &d,
                 RingShape &s) {
  AttentionDims local = d;
  local.seq = d.local;
  PIPER_RETURN_IF_ERROR(attentionShape(a, local, s));
  s.globalSeq = d.seq;
  s.cp = d.cp;
  s.member = d.member;
  s.owner = d.owner;
  return Status::ok();
}

Status reserveScratch(const Context &ctx, size_t bytes, char *&scratch) {
  scratch = nullptr;
  if (bytes == 0)
    return Status::ok();
  void *p = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(bytes, p));
  scratch = static_cast<char *>(p);
  return Status::ok();
}

// A ring step's shape and scratch (`empty`: a batch of 0).
Status setUpRingStep(const KernelArgs &a, const Context &ctx, bool grad,
                     RingShape &s, char *&scratch, bool &empty) {
  detail::AttentionBlockDims d;
  PIPER_RETURN_IF_ERROR(grad ? detail::checkAttentionBlockGrad(a, d)
                             : detail::checkAttentionBlock(a, d));
  scratch = nullptr;
  empty = d.batch == 0;
  if (empty)
    return Status::ok();
  PIPER_RETURN_IF_ERROR(ringShape(a, d, s));
  return reserveScratch(ctx, ringScratch(s, grad).bytes, scratch);
}

Status attentionBlock(const KernelArgs &a, const Context &ctx) {
  RingShape s;
  char *scratch = nullptr;
  bool empty = false;
  PIPER_RETURN_IF_ERROR(setUpRingStep(a, ctx, false, s, scratch, empty));
  if (empty)
    return Status::ok();
  bool combine = a.inputs.size() == 4;
  return launchAttentionBlock(ctx, s, a.inputs[0].f32(), a.inputs[1].f32(),
                              combine ? a.inputs[2].f32() : nullptr,
                              combine ? a.inputs[3].f32() : nullptr,
                              a.outputs[0].f32(), a.outputs[1].f32(), scratch);
}

Status attentionBlockGrad(const KernelArgs &a, const Context &ctx) {
  RingShape s;
  char *scratch = nullptr;
  bool empty = false;
  PIPER_RETURN_IF_ERROR(setUpRingStep(a, ctx, true, s, scratch, empty));
  if (empty)
    return Status::ok();
  bool add = a.inputs.size() == 7;
  return launchAttentionBlockGrad(
      ctx, s, a.inputs[0].f32(), a.inputs[1].f32(), a.inputs[2].f32(),
      a.inputs[3].f32(), a.inputs[4].f32(), add ? a.inputs[5].f32() : nullptr,
      add ? a.inputs[6].f32() : nullptr, a.outputs[0].f32(), a.outputs[1].f32(),
      scratch);
}

// A ring step's scratch reserved at plan load.
template <bool Grad>
Status prepareRingStep(const KernelArgs &a, const Context &ctx) {
  RingShape s;
  char *scratch = nullptr;
  bool empty = false;
  return setUpRingStep(a, ctx, Grad, s, scratch, empty);
}

} // namespace

void addAttentionKernels(std::vector<KernelEntry> &out) {
  out.insert(
      out.end(),
      {
          // y and lse rounded in mixed precision, y stored packed where
          // only GEMMs and attention_grad read it, which takes it so.
          {"attention", attention, prepareAttention<false>, true, 0b1, 0b1},
          // attention_grad reads qkv, y and dy packed, rounds dqkv itself
          // and stores it packed where only GEMMs (and bias sums) read it.
          {"attention_grad", attentionGrad, prepareAttention<true>, true,
           0b1011, 0b1},
          {"attention_block", attentionBlock, prepareRingStep<false>},
          {"attention_block_grad", attentionBlockGrad, prepareRingStep<true>},
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

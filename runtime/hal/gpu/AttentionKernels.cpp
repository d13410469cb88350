// The attention GPU kernels (attention, attention_grad, and ring
// attention's attention_block(_grad)): causal
// grouped-query attention with rotary embeddings, flash-attention style
// (AttentionLaunch.inl), checked by the CPU kernel's own checks.
#include <cmath>
#include <string>

#include "runtime/hal/gpu/AttentionLaunch.h"
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

// Scratch for the call from the stream's workspace (none needed: null).
Status attentionScratchFor(const Context &ctx, const AttentionShape &s,
                           bool grad, char *&scratch) {
  scratch = nullptr;
  size_t bytes = attentionScratch(s, grad).bytes;
  if (bytes == 0)
    return Status::ok();
  void *p = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(bytes, p));
  scratch = static_cast<char *>(p);
  return Status::ok();
}

Status attention(const KernelArgs &a, const Context &ctx) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(detail::checkAttention(a, d));
  if (d.batch == 0)
    return Status::ok();
  AttentionShape s;
  PIPER_RETURN_IF_ERROR(attentionShape(a, d, s));
  char *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(attentionScratchFor(ctx, s, false, scratch));
  return launchAttention(ctx, s, a.inputs[0].f32(), a.outputs[0].f32(),
                         scratch);
}

Status attentionGrad(const KernelArgs &a, const Context &ctx) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(detail::checkAttentionGrad(a, d));
  if (d.batch == 0)
    return Status::ok();
  AttentionShape s;
  PIPER_RETURN_IF_ERROR(attentionShape(a, d, s));
  char *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(attentionScratchFor(ctx, s, true, scratch));
  return launchAttentionGrad(ctx, s, a.inputs[0].f32(), a.inputs[1].f32(),
                             a.outputs[0].f32(), scratch);
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

Status attentionBlock(const KernelArgs &a, const Context &ctx) {
  detail::AttentionBlockDims d;
  PIPER_RETURN_IF_ERROR(detail::checkAttentionBlock(a, d));
  if (d.batch == 0)
    return Status::ok();
  RingShape s;
  PIPER_RETURN_IF_ERROR(ringShape(a, d, s));
  char *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(
      reserveScratch(ctx, ringScratch(s, false).bytes, scratch));
  bool combine = a.inputs.size() == 4;
  return launchAttentionBlock(ctx, s, a.inputs[0].f32(), a.inputs[1].f32(),
                              combine ? a.inputs[2].f32() : nullptr,
                              combine ? a.inputs[3].f32() : nullptr,
                              a.outputs[0].f32(), a.outputs[1].f32(), scratch);
}

Status attentionBlockGrad(const KernelArgs &a, const Context &ctx) {
  detail::AttentionBlockDims d;
  PIPER_RETURN_IF_ERROR(detail::checkAttentionBlockGrad(a, d));
  if (d.batch == 0)
    return Status::ok();
  RingShape s;
  PIPER_RETURN_IF_ERROR(ringShape(a, d, s));
  char *scratch = nullptr;
  PIPER_RETURN_IF_ERROR(
      reserveScratch(ctx, ringScratch(s, true).bytes, scratch));
  bool add = a.inputs.size() == 7;
  return launchAttentionBlockGrad(
      ctx, s, a.inputs[0].f32(), a.inputs[1].f32(), a.inputs[2].f32(),
      a.inputs[3].f32(), a.inputs[4].f32(), add ? a.inputs[5].f32() : nullptr,
      add ? a.inputs[6].f32() : nullptr, a.outputs[0].f32(), a.outputs[1].f32(),
      scratch);
}

} // namespace

void addAttentionKernels(std::vector<KernelEntry> &out) {
  out.insert(out.end(), {
                            {"attention", attention},
                            {"attention_grad", attentionGrad},
                            {"attention_block", attentionBlock},
                            {"attention_block_grad", attentionBlockGrad},
                        });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

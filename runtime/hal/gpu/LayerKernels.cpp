// The layer GPU kernels: embedding, position embedding, layer norm and RMS
// norm, forward and backward (also fused with the residual stream's add). Each
// checks its operands with the CPU kernel's check
// (runtime/kernels/LayerChecks.h) and queues its launchers (LayerLaunch.inl).
// The ids are device memory: unlike the CPU kernels, the embedding kernels do
// not check them against the vocabulary (token files are checked at load); the
// bodies skip an out-of-range id.
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/LayerLaunch.h"
#include "runtime/kernels/LayerChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

using detail::KernelArgs;

// `count` elements of T from the context's workspace (at least one, so an
// empty request still gets a valid block).
template <class T> Status scratch(const Context &ctx, int64_t count, T *&ptr) {
  void *p = nullptr;
  PIPER_RETURN_IF_ERROR(ctx.workspace->reserve(
      static_cast<size_t>(count > 0 ? count : 1) * sizeof(T), p));
  ptr = static_cast<T *>(p);
  return Status::ok();
}

Status embedding(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, vocab = 0, hidden = 0, first = 0, members = 1;
  PIPER_RETURN_IF_ERROR(
      detail::checkEmbedding(a, rows, vocab, hidden, first, members));
  const TensorRef &y = a.outputs[0];
  return launchEmbedding(ctx, a.inputs[0].i32(), a.inputs[1].f32(), f32Out(y),
                         rows, vocab, hidden, first, a.ctx.lowPrecision,
                         bf16Out(y));
}

Status embeddingGrad(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, vocab = 0, hidden = 0, first = 0, members = 1;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(detail::checkEmbeddingGrad(a, rows, vocab, hidden,
                                                   first, members, accumulate));
  int32_t *work = nullptr;
  PIPER_RETURN_IF_ERROR(
      scratch(ctx, embeddingGradScratchWords(rows, vocab), work));
  const TensorRef &dy = a.inputs[1];
  return launchEmbeddingGrad(
      ctx, a.inputs[0].i32(), f32In(dy), a.outputs[0].f32(), rows, vocab,
      hidden, first, work, bf16In(dy), {a.ctx.lowPrecision, accumulate});
}

/// The position map of the checked dimensions.
static PositionMap positionMap(const detail::PositionDims &d) {
  return PositionMap{d.seq, d.local, d.cp, d.member};
}

Status positionAdd(const KernelArgs &a, const Context &ctx) {
  detail::PositionDims d;
  PIPER_RETURN_IF_ERROR(detail::checkPositionAdd(a, d));
  const TensorRef &x = a.inputs[0], &y = a.outputs[0];
  return launchPositionAdd(ctx, f32In(x), a.inputs[1].f32(), f32Out(y), d.rows,
                           d.hidden, positionMap(d), a.ctx.lowPrecision,
                           bf16In(x), bf16Out(y));
}

Status positionAddGrad(const KernelArgs &a, const Context &ctx) {
  detail::PositionDims d;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(detail::checkPositionAddGrad(a, d, accumulate));
  double *partials = nullptr;
  PIPER_RETURN_IF_ERROR(
      scratch(ctx, columnChunks(d.rows / d.local).chunks * d.local * d.hidden,
              partials));
  const TensorRef &dy = a.inputs[0];
  return launchPositionAddGrad(ctx, f32In(dy), a.outputs[0].f32(), d.rows,
                               d.hidden, positionMap(d), a.outputs[0].shape[0],
                               partials, bf16In(dy),
                               {a.ctx.lowPrecision, accumulate});
}

// The residual add of add_layer_norm and add_rms_norm: r (input 1, fp32 or
// packed) and the sum s (output 0).
ResidualSum residualOf(const KernelArgs &a) {
  const TensorRef &r = a.inputs[1], &s = a.outputs[0];
  return {f32In(r), f32Out(s), bf16In(r), bf16Out(s)};
}

// The packed operands of a norm's backward: x (input 0), dy (input
// `dyAt`), and for grad_input the residual it adds (input 3 of
// *_grad_input_add) and dx (output 0).
NormPacked packedOf(const KernelArgs &a, size_t dyAt, bool gradInput) {
  NormPacked p;
  p.x = bf16In(a.inputs[0]);
  p.dy = bf16In(a.inputs[dyAt]);
  if (gradInput) {
    if (a.inputs.size() > 3)
      p.residual = bf16In(a.inputs[3]);
    p.dx = bf16Out(a.outputs[0]);
  }
  return p;
}

Status layerNorm(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkLayerNorm(a, rows, hidden, eps));
  const TensorRef &y = a.outputs[0];
  const TensorRef &x = a.inputs[0];
  return launchLayerNorm(ctx, f32In(x), a.inputs[1].f32(), a.inputs[2].f32(),
                         f32Out(y), rows, hidden, eps, a.ctx.lowPrecision, {},
                         bf16Out(y), bf16In(x));
}

Status addLayerNorm(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkAddLayerNorm(a, rows, hidden, eps));
  const TensorRef &y = a.outputs[1];
  const TensorRef &x = a.inputs[0];
  return launchLayerNorm(ctx, f32In(x), a.inputs[2].f32(), a.inputs[3].f32(),
                         f32Out(y), rows, hidden, eps, a.ctx.lowPrecision,
                         residualOf(a), bf16Out(y), bf16In(x));
}

Status layerNormGradInput(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkLayerNormGradInput(a, rows, hidden, eps));
  const TensorRef &dy = a.inputs[2];
  return launchLayerNormGradInput(ctx, f32In(a.inputs[0]), a.inputs[1].f32(),
                                  f32In(dy), f32Out(a.outputs[0]), rows, hidden,
                                  eps, a.ctx.lowPrecision, nullptr,
                                  packedOf(a, 2, true));
}

Status layerNormGradInputAdd(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(
      detail::checkLayerNormGradInputAdd(a, rows, hidden, eps));
  const TensorRef &dy = a.inputs[2];
  return launchLayerNormGradInput(ctx, f32In(a.inputs[0]), a.inputs[1].f32(),
                                  f32In(dy), f32Out(a.outputs[0]), rows, hidden,
                                  eps, a.ctx.lowPrecision, f32In(a.inputs[3]),
                                  packedOf(a, 2, true));
}

Status layerNormGradWeight(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(
      detail::checkLayerNormGradWeight(a, rows, hidden, eps, accumulate));
  double *work = nullptr;
  PIPER_RETURN_IF_ERROR(
      scratch(ctx, 2 * rows + 2 * columnChunks(rows).chunks * hidden, work));
  const TensorRef &dy = a.inputs[1];
  return launchLayerNormGradWeight(
      ctx, f32In(a.inputs[0]), f32In(dy), a.outputs[0].f32(),
      a.outputs[1].f32(), rows, hidden, eps, work,
      {a.ctx.lowPrecision, accumulate}, packedOf(a, 1, false));
}

Status rmsNorm(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkRmsNorm(a, rows, hidden, eps));
  const TensorRef &y = a.outputs[0];
  const TensorRef &x = a.inputs[0];
  return launchRmsNorm(ctx, f32In(x), a.inputs[1].f32(), f32Out(y), rows,
                       hidden, eps, a.ctx.lowPrecision, {}, bf16Out(y),
                       bf16In(x));
}

Status addRmsNorm(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkAddRmsNorm(a, rows, hidden, eps));
  const TensorRef &y = a.outputs[1];
  const TensorRef &x = a.inputs[0];
  return launchRmsNorm(ctx, f32In(x), a.inputs[2].f32(), f32Out(y), rows,
                       hidden, eps, a.ctx.lowPrecision, residualOf(a),
                       bf16Out(y), bf16In(x));
}

Status rmsNormGradInput(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkRmsNormGradInput(a, rows, hidden, eps));
  const TensorRef &dy = a.inputs[2];
  return launchRmsNormGradInput(ctx, f32In(a.inputs[0]), a.inputs[1].f32(),
                                f32In(dy), f32Out(a.outputs[0]), rows, hidden,
                                eps, a.ctx.lowPrecision, nullptr,
                                packedOf(a, 2, true));
}

Status rmsNormGradInputAdd(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  PIPER_RETURN_IF_ERROR(detail::checkRmsNormGradInputAdd(a, rows, hidden, eps));
  const TensorRef &dy = a.inputs[2];
  return launchRmsNormGradInput(ctx, f32In(a.inputs[0]), a.inputs[1].f32(),
                                f32In(dy), f32Out(a.outputs[0]), rows, hidden,
                                eps, a.ctx.lowPrecision, f32In(a.inputs[3]),
                                packedOf(a, 2, true));
}

Status rmsNormGradWeight(const KernelArgs &a, const Context &ctx) {
  int64_t rows = 0, hidden = 0;
  double eps = 0;
  bool accumulate = false;
  PIPER_RETURN_IF_ERROR(
      detail::checkRmsNormGradWeight(a, rows, hidden, eps, accumulate));
  double *work = nullptr;
  PIPER_RETURN_IF_ERROR(
      scratch(ctx, rows + columnChunks(rows).chunks * hidden, work));
  const TensorRef &dy = a.inputs[1];
  return launchRmsNormGradWeight(
      ctx, f32In(a.inputs[0]), f32In(dy), a.outputs[0].f32(), rows, hidden, eps,
      work, {a.ctx.lowPrecision, accumulate}, packedOf(a, 1, false));
}

Status qkNorm(const KernelArgs &a, const Context &ctx) {
  detail::QkNormDims d;
  PIPER_RETURN_IF_ERROR(detail::checkQkNorm(a, d));
  return launchQkNorm(ctx, a.inputs[0].f32(), a.inputs[1].f32(),
                      a.outputs[0].f32(), d.rows, d.heads, d.kvHeads, d.hd,
                      d.eps);
}

Status qkNormGradInput(const KernelArgs &a, const Context &ctx) {
  detail::QkNormDims d;
  PIPER_RETURN_IF_ERROR(detail::checkQkNormGradInput(a, d));
  return launchQkNormGradInput(ctx, a.inputs[0].f32(), a.inputs[1].f32(),
                               a.inputs[2].f32(), a.outputs[0].f32(), d.rows,
                               d.heads, d.kvHeads, d.hd, d.eps);
}

Status qkNormGradWeight(const KernelArgs &a, const Context &ctx) {
  detail::QkNormDims d;
  PIPER_RETURN_IF_ERROR(detail::checkQkNormGradWeight(a, d));
  double *work = nullptr;
  PIPER_RETURN_IF_ERROR(scratch(
      ctx, d.rows * d.headsPerRow() + columnChunks(d.rows).chunks * 2 * d.hd,
      work));
  return launchQkNormGradWeight(ctx, a.inputs[0].f32(), a.inputs[1].f32(),
                                a.outputs[0].f32(), d.rows, d.heads, d.kvHeads,
                                d.hd, d.eps, work);
}

Status ulyssesColumns(const KernelArgs &a, const Context &ctx, bool merge) {
  UlyssesColumns c;
  int64_t rows = 0;
  PIPER_RETURN_IF_ERROR(detail::checkUlyssesColumns(a, merge, c, rows));
  return launchUlyssesColumns(ctx, a.inputs[0].f32(), c, rows, merge,
                              a.outputs[0].f32(),
                              merge ? nullptr : a.outputs[1].i32());
}

Status ulyssesRows(const KernelArgs &a, const Context &ctx, bool zigzag) {
  UlyssesRows r;
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(detail::checkUlyssesRows(a, zigzag, r, cols));
  return launchUlyssesRows(ctx, a.inputs[0].f32(), r, cols, zigzag,
                           a.outputs[0].f32(),
                           zigzag ? a.outputs[1].i32() : nullptr);
}

Status cpSplitRows(const KernelArgs &a, const Context &ctx, bool grad) {
  UlyssesRows r;
  int64_t cols = 0, member = 0;
  PIPER_RETURN_IF_ERROR(detail::checkCpSplit(a, grad, r, cols, member));
  return launchCpSplit(ctx, a.inputs[0].f32(), r, cols, member, grad,
                       a.outputs[0].f32());
}

Status cpSplit(const KernelArgs &a, const Context &ctx) {
  return cpSplitRows(a, ctx, false);
}
Status cpSplitGrad(const KernelArgs &a, const Context &ctx) {
  return cpSplitRows(a, ctx, true);
}

Status ulyssesSplit(const KernelArgs &a, const Context &ctx) {
  return ulyssesColumns(a, ctx, false);
}
Status ulyssesMerge(const KernelArgs &a, const Context &ctx) {
  return ulyssesColumns(a, ctx, true);
}
Status ulyssesNatural(const KernelArgs &a, const Context &ctx) {
  return ulyssesRows(a, ctx, false);
}
Status ulyssesZigzag(const KernelArgs &a, const Context &ctx) {
  return ulyssesRows(a, ctx, true);
}

} // namespace

void addLayerKernels(std::vector<KernelEntry> &out) {
  out.insert(
      out.end(),
      {
          // The embeddings round their outputs themselves in mixed precision
          // and store them packed where every reader takes them so (the
          // residual stream's start); their backward reads dy packed and
          // rounds its gradient itself (added to the accumulator with
          // `accumulate`).
          {"embedding", embedding, nullptr, true, 0, 0b1},
          {"embedding_grad", embeddingGrad, nullptr, true, 0b10},
          // Round their results in mixed precision
          // (Device::roundsOutputs).
          {"position_add", positionAdd, nullptr, true, 0b1, 0b1},
          {"position_add_grad", positionAddGrad, nullptr, true, 0b1},
          {"layer_norm", layerNorm, nullptr, true, 0b1, 0b1},
          {"layer_norm_grad_input", layerNormGradInput, nullptr, true, 0b101,
           0b1},
          {"layer_norm_grad_weight", layerNormGradWeight, nullptr, true, 0b11},
          {"rms_norm", rmsNorm, nullptr, true, 0b1, 0b1},
          {"rms_norm_grad_input", rmsNormGradInput, nullptr, true, 0b101, 0b1},
          {"rms_norm_grad_weight", rmsNormGradWeight, nullptr, true, 0b11},
          // The residual stream's add fused into the norms.
          {"add_layer_norm", addLayerNorm, nullptr, true, 0b11, 0b11},
          {"add_rms_norm", addRmsNorm, nullptr, true, 0b11, 0b11},
          {"layer_norm_grad_input_add", layerNormGradInputAdd, nullptr, true,
           0b1101, 0b1},
          {"rms_norm_grad_input_add", rmsNormGradInputAdd, nullptr, true,
           0b1101, 0b1},
          {"qk_norm", qkNorm},
          {"qk_norm_grad_input", qkNormGradInput},
          {"qk_norm_grad_weight", qkNormGradWeight},
          {"cp_ulysses_split", ulyssesSplit},
          {"cp_ulysses_merge", ulyssesMerge},
          {"cp_ulysses_natural", ulyssesNatural},
          {"cp_ulysses_zigzag", ulyssesZigzag},
          {"cp_split", cpSplit},
          {"cp_split_grad", cpSplitGrad},
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

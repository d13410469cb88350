// Launchers of the layer GPU kernels (LayerLaunch.inl, compiled for CUDA by
// Layer.cu and for the host emulation by LayerHost.cpp). Each queues its
// work on ctx.stream; matrices are row-major [rows, hidden].
#ifndef PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H

#include <cstdint>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/LayerMath.h"
#include "runtime/hal/gpu/Simt.h"
#include "runtime/kernels/UlyssesLayout.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// y[n] = table[ids[n] - first]; a row whose id is outside [first, first +
/// vocab) gets zeros (`first` is a vocabulary-parallel member's first id).
/// With `round` y is stored rounded to bf16; with `y16` instead of y,
/// packed (rounded).
Status launchEmbedding(const Context &ctx, const int32_t *ids,
                       const float *table, float *y, int64_t rows,
                       int64_t vocab, int64_t hidden, int64_t first,
                       bool round = false, uint16_t *y16 = nullptr);
/// How a weight gradient is stored: rounded to bf16 (`round`, a
/// mixed-precision call), and added to what the output holds
/// (`accumulate`: the output is the parameter's gradient accumulator; the
/// compiler fuses the `accumulate` kernel after the gradient's, docs/
/// kernels.md): the bits of the kernel, the executor's rounding, then
/// `accumulate`. Elements without a gradient add +0 then.
struct SumsOut {
  bool round = false;
  bool accumulate = false;
};
/// dtable[v] = the sum of dy[n] over the rows n with ids[n] - first == v,
/// in token order in double (as the CPU kernel: the same result), ids
/// outside [first, first + vocab) skipped; stored as `to` says.
/// `scratch` holds embeddingGradScratchWords(rows, vocab) int32.
/// `dy16` instead of dy: dy packed (the same values).
Status launchEmbeddingGrad(const Context &ctx, const int32_t *ids,
                           const float *dy, float *dtable, int64_t rows,
                           int64_t vocab, int64_t hidden, int64_t first,
                           int32_t *scratch, const uint16_t *dy16 = nullptr,
                           SumsOut to = {});
/// y[n] = x[n] + pos[map.position(n % map.local)].
/// With `round` (here and below: a mixed-precision call), the results are
/// stored rounded to bf16 (roundedIf, Device::roundsOutputs).
/// `x16` instead of x: x packed; `y16` instead of y: y stored packed.
Status launchPositionAdd(const Context &ctx, const float *x, const float *pos,
                         float *y, int64_t rows, int64_t hidden,
                         PositionMap map, bool round = false,
                         const uint16_t *x16 = nullptr,
                         uint16_t *y16 = nullptr);
/// dpos[map.position(t)] = the sum of dy[n] over n % map.local == t, zeros
/// for every other of the `positions` rows; stored as `to` says.
/// `partials` holds columnChunks(rows / map.local).chunks x map.local x
/// hidden doubles.
Status launchPositionAddGrad(const Context &ctx, const float *dy, float *dpos,
                             int64_t rows, int64_t hidden, PositionMap map,
                             int64_t positions, double *partials,
                             const uint16_t *dy16 = nullptr, SumsOut to = {});
/// The residual stream's add fused into a norm (add_layer_norm,
/// add_rms_norm): with `r` set, the norm's input is s = x + r (rounded
/// with `round`, as add's output), which is also stored to `sum` [rows,
/// hidden]; each lane reads back only the elements it wrote.
struct ResidualSum {
  const float *r = nullptr;
  float *sum = nullptr;
  /// r packed (bf16) instead of `r`: the same values (Device::
  /// readsPackedInput).
  const uint16_t *r16 = nullptr;
  /// The sum stored packed (bf16, rounded) instead of into `sum`
  /// (Device::writesPackedOutput; mixed precision, where it is rounded).
  uint16_t *sum16 = nullptr;
};
/// A norm backward's operands given packed (bf16) instead of fp32: each
/// non-null pointer replaces its fp32 one (Device::readsPackedInput and
/// writesPackedOutput, in mixed precision): x (the saved residual stream),
/// dy, the residual added by *_grad_input_add, and dx, stored rounded.
struct NormPacked {
  const uint16_t *x = nullptr, *dy = nullptr, *residual = nullptr;
  uint16_t *dx = nullptr;
};
/// Layer norm of each row (a warp per row). With `y16` instead of `y`, y
/// is stored packed bf16, the same values rounded (Device::
/// writesPackedOutput).
Status launchLayerNorm(const Context &ctx, const float *x, const float *gamma,
                       const float *beta, float *y, int64_t rows,
                       int64_t hidden, double eps, bool round = false,
                       ResidualSum residual = {}, uint16_t *y16 = nullptr,
                       const uint16_t *x16 = nullptr);
/// dx of layer norm; with `residual` set (layer_norm_grad_input_add),
/// residual + dx, dx rounded with `round` first (as grad_input's output
/// before add).
Status launchLayerNormGradInput(const Context &ctx, const float *x,
                                const float *gamma, const float *dy, float *dx,
                                int64_t rows, int64_t hidden, double eps,
                                bool round = false,
                                const float *residual = nullptr,
                                NormPacked packed = {});
/// dgamma = column sums of dy * xhat, dbeta = column sums of dy. `scratch`
/// holds 2 rows + 2 columnChunks(rows).chunks x hidden doubles.
Status launchLayerNormGradWeight(const Context &ctx, const float *x,
                                 const float *dy, float *dgamma, float *dbeta,
                                 int64_t rows, int64_t hidden, double eps,
                                 double *scratch, SumsOut to = {},
                                 NormPacked packed = {});
/// RMS norm of each row; `y16` as launchLayerNorm's.
Status launchRmsNorm(const Context &ctx, const float *x, const float *gamma,
                     float *y, int64_t rows, int64_t hidden, double eps,
                     bool round = false, ResidualSum residual = {},
                     uint16_t *y16 = nullptr, const uint16_t *x16 = nullptr);
Status launchRmsNormGradInput(const Context &ctx, const float *x,
                              const float *gamma, const float *dy, float *dx,
                              int64_t rows, int64_t hidden, double eps,
                              bool round = false,
                              const float *residual = nullptr,
                              NormPacked packed = {});
/// dgamma = column sums of dy * x * rrms. `scratch` holds rows +
/// columnChunks(rows).chunks x hidden doubles.
Status launchRmsNormGradWeight(const Context &ctx, const float *x,
                               const float *dy, float *dgamma, int64_t rows,
                               int64_t hidden, double eps, double *scratch,
                               SumsOut to = {}, NormPacked packed = {});
/// qk_norm (runtime/kernels/LayerChecks.h's QkNormDims): rms_norm of each
/// q head with gamma[0, hd) and each k head with gamma[hd, 2 hd), v copied
/// (a warp per head of a row).
Status launchQkNorm(const Context &ctx, const float *x, const float *gamma,
                    float *y, int64_t rows, int64_t heads, int64_t kvHeads,
                    int64_t hd, double eps);
/// dx of qk_norm (dy copied into v's columns).
Status launchQkNormGradInput(const Context &ctx, const float *x,
                             const float *gamma, const float *dy, float *dx,
                             int64_t rows, int64_t heads, int64_t kvHeads,
                             int64_t hd, double eps);
/// dgamma [2 hd] of qk_norm. `scratch` holds rows (heads + 2 kvHeads) +
/// columnChunks(rows).chunks x 2 hd doubles.
Status launchQkNormGradWeight(const Context &ctx, const float *x,
                              const float *dy, float *dgamma, int64_t rows,
                              int64_t heads, int64_t kvHeads, int64_t hd,
                              double eps, double *scratch);
/// Ulysses context parallelism (runtime/kernels/UlyssesLayout.h): the split
/// (x [rows, wide] -> y [cp rows, narrow], counts[cp] = rows) or, with
/// `merge`, the other way (x [cp rows, narrow] -> y [rows, wide]).
Status launchUlyssesColumns(const Context &ctx, const float *x,
                            UlyssesColumns c, int64_t rows, bool merge,
                            float *y, int32_t *counts);
/// Member order to natural (x, y [r.rows, cols]) or, with `zigzag`, the
/// other way and counts[cp] = r.rows / cp.
Status launchUlyssesRows(const Context &ctx, const float *x, UlyssesRows r,
                         int64_t cols, bool zigzag, float *y, int32_t *counts);
/// cp_split: y [r.rows / cp, cols] = member `member`'s rows of x [r.rows,
/// cols] (sequence order); with `grad`, the other way, zeros elsewhere.
Status launchCpSplit(const Context &ctx, const float *x, UlyssesRows r,
                     int64_t cols, int64_t member, bool grad, float *y);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H

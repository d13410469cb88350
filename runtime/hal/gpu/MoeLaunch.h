// Launchers of the moe GPU kernels (MoeLaunch.inl, compiled for CUDA by
// Moe.cu and for the host emulation by MoeHost.cpp). Each queues its work on
// ctx.stream. Indices out of [0, E) are skipped and expert counts are
// clamped to [0, C], so no call reads or writes outside its operands (the
// CPU kernels reject such data; the GPU wrappers cannot read it).
#ifndef PIPER_RUNTIME_HAL_GPU_MOELAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_MOELAUNCH_H

#include <cstdint>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/MoeMath.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

// The router: logits [N,E], indices and weights [N,k].
Status launchMoeRouter(const Context &ctx, const float *logits,
                       int32_t *indices, float *weights, int64_t rows,
                       int64_t experts, int64_t topK, bool normTopK);
Status launchMoeRouterGrad(const Context &ctx, const float *logits,
                           const int32_t *indices, const float *dweights,
                           float *dlogits, int64_t rows, int64_t experts,
                           int64_t topK, bool normTopK);

// Routed assignments per expert. `table` is E x moeSlotChunks(count)
// int64 (row e: expert e's chunks), zeroed by the caller.

/// table[e][c] = the assignments of chunk c (kMoeSlotChunk entries of ids)
/// that go to expert e.
Status launchMoeChunkCounts(const Context &ctx, const int32_t *ids,
                            int64_t count, int64_t experts, int64_t *table);
/// Turns each row of table into its exclusive prefix sums; totals[e] (when
/// not null) = the row's sum, the assignments of expert e.
Status launchMoeChunkOffsets(const Context &ctx, int64_t *table,
                             int64_t count, int64_t experts, int64_t *totals);
/// slot[i] = e * C + s, where assignment i (of expert e = ids[i]) is the
/// s-th of e in order, when s < C; else (or for an index outside [0, E))
/// -1. `table` holds the offsets of launchMoeChunkOffsets; it is consumed.
Status launchMoeAssignSlots(const Context &ctx, const int32_t *ids,
                            int64_t count, int64_t experts, int64_t capacity,
                            int64_t *table, int64_t *slot);

// Moving rows between tokens [N,H] and slots [E*C,H] through slot [N*k].

// The row operands (RowIn) are fp32 or packed bf16 (Device::
// readsPackedInput); with `round` (a mixed-precision call) the outputs are
// stored rounded to bf16 (Device::roundsOutputs), packed where the packed
// pointer (`buf16`, `y16`, `debuf16`) is not null (storeRounded).

/// buf[slot[n,j]] = x[n] for every kept (n, j); buf is zeroed by the caller.
Status launchMoeDispatch(const Context &ctx, RowIn x, const int64_t *slot,
                         float *buf, uint16_t *buf16, int64_t rows,
                         int64_t topK, int64_t hidden, bool round);
/// dx[n] = sum over kept j, in order, of dbuf[slot[n,j]] (in double).
Status launchMoeDispatchGrad(const Context &ctx, RowIn dbuf,
                             const int64_t *slot, float *dx, uint16_t *dx16,
                             int64_t rows, int64_t topK, int64_t hidden,
                             bool round);
/// y[n] = sum over kept j, in order, of weights[n,j] ebuf[slot[n,j]].
Status launchMoeCombine(const Context &ctx, RowIn ebuf, const int64_t *slot,
                        const float *weights, float *y, uint16_t *y16,
                        int64_t rows, int64_t topK, int64_t hidden, bool round);
/// debuf[slot[n,j]] = weights[n,j] dy[n] (debuf zeroed by the caller);
/// dweights[n,j] = <ebuf[slot[n,j]], dy[n]>, 0 when dropped.
Status launchMoeCombineGrad(const Context &ctx, RowIn ebuf, const int64_t *slot,
                            const float *weights, RowIn dy, float *debuf,
                            uint16_t *debuf16, float *dweights, int64_t rows,
                            int64_t topK, int64_t hidden, bool round);

// The load-balancing loss; totals from launchMoeChunkOffsets.

/// fraction[e] = totals[e] / (N k).
Status launchMoeFractions(const Context &ctx, const int64_t *totals,
                          double *fraction, int64_t experts, int64_t rows,
                          int64_t topK);
/// *loss = E / N sum_n sum_e f_e p[n,e]; rowDots holds N doubles.
Status launchMoeAuxLoss(const Context &ctx, const float *logits,
                        const double *fraction, double *rowDots, float *loss,
                        int64_t rows, int64_t experts);
Status launchMoeAuxLossGrad(const Context &ctx, const float *logits,
                            const double *fraction, float *dlogits,
                            int64_t rows, int64_t experts, double scale);

// Expert parallelism.

/// expert_counts[e] = min(totals[e], C); send_counts[j] = their sum over
/// member j's L experts; expert_send_counts[j] = L.
Status launchMoeEpCounts(const Context &ctx, const int64_t *totals,
                         int32_t *sendCounts, int32_t *expertCounts,
                         int32_t *expertSendCounts, int64_t members,
                         int64_t local, int64_t capacity);
/// base[i] = the sum of the clamped counts[0..i) (entries of at most C rows).
Status launchMoeEpRunStarts(const Context &ctx, const int32_t *counts,
                            int64_t entries, int64_t capacity, int64_t *base);
/// base[src * L + l] = l * G * C + the clamped counts of (src' < src, l):
/// where source src's rows of local expert l start among l's G * C slots.
Status launchMoeEpSlotStarts(const Context &ctx, const int32_t *counts,
                             int64_t members, int64_t local, int64_t capacity,
                             int64_t *base);
/// For each entry i of `entries` and t < min(max(counts[i], 0), C): row
/// toBase[i] + t of `to` = row fromBase[i] + t of `from` (a null base: i *
/// C). `to` is zeroed by the caller.
Status launchMoeEpMoveRows(const Context &ctx, const float *from, float *to,
                           const int32_t *counts, const int64_t *fromBase,
                           const int64_t *toBase, int64_t entries,
                           int64_t capacity, int64_t hidden);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_MOELAUNCH_H

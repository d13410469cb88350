// Operand and attribute checks of the layer kernels (embedding, position
// embedding, layer norm, RMS norm, forward and backward), shared by the CPU
// kernels and the GPU kernels (runtime/hal/gpu): both backends accept and
// reject exactly the same calls, with the same messages. None reads tensor
// data (on a GPU the operands are device memory): the CPU embedding kernels
// also check the ids against the vocabulary (expectTokensBelow), the GPU
// kernels skip an out-of-range id instead.
#ifndef PIPER_RUNTIME_KERNELS_LAYERCHECKS_H
#define PIPER_RUNTIME_KERNELS_LAYERCHECKS_H

#include <cstdint>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

/// embedding: (ids i32 [N] or [B,S], table [V,H]) -> y [N,H]. With
/// attribute `members` T (vocabulary parallelism), the table holds ids
/// [first, first + V) of T V, `first` the context's member times V (else
/// 0), and other ids give zero rows.
Status checkEmbedding(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                      int64_t &hidden, int64_t &first, int64_t &members);
/// embedding_grad: (ids, dy [N,H]) -> dtable [V,H]; attribute vocab = V,
/// and `members` as embedding's (other members' ids are skipped).
Status checkEmbeddingGrad(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                          int64_t &hidden, int64_t &first, int64_t &members);
/// position_add: (x [N,H], pos [P,H]) -> y [N,H]; attribute seq, N a
/// multiple of seq, P >= seq. Row n adds pos row n % seq.
Status checkPositionAdd(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                        int64_t &seq);
/// position_add_grad: dy [N,H] -> dpos [P,H] (rows past seq get zeros).
Status checkPositionAddGrad(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                            int64_t &seq);
/// layer_norm: (x [N,H], gamma [H], beta [H]) -> y [N,H]; attribute eps
/// (default 1e-5, >= 0).
Status checkLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                      double &eps);
/// layer_norm_grad_input: (x, gamma, dy) -> dx.
Status checkLayerNormGradInput(const KernelArgs &a, int64_t &rows,
                               int64_t &hidden, double &eps);
/// layer_norm_grad_weight: (x, dy) -> (dgamma [H], dbeta [H]).
Status checkLayerNormGradWeight(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps);
/// rms_norm: (x [N,H], gamma [H]) -> y [N,H]; attribute eps (default 1e-6,
/// >= 0).
Status checkRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                    double &eps);
/// rms_norm_grad_input: (x, gamma, dy) -> dx.
Status checkRmsNormGradInput(const KernelArgs &a, int64_t &rows,
                             int64_t &hidden, double &eps);
/// rms_norm_grad_weight: (x, dy) -> dgamma [H].
Status checkRmsNormGradWeight(const KernelArgs &a, int64_t &rows,
                              int64_t &hidden, double &eps);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_LAYERCHECKS_H

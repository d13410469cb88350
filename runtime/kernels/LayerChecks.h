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

#include "proto/PlanShards.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/UlyssesLayout.h"

namespace piper::runtime::detail {

/// embedding: (ids i32 [N] or [B,S], table [V,H]) -> y [N,H]. With
/// attribute `members` T (vocabulary parallelism), the table holds ids
/// [first, first + V) of T V, `first` the context's member times V (else
/// 0), and other ids give zero rows.
Status checkEmbedding(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                      int64_t &hidden, int64_t &first, int64_t &members);
/// embedding_grad: (ids, dy [N,H]) -> dtable [V,H]; attribute vocab = V,
/// and `members` as embedding's (other members' ids are skipped). With the
/// `accumulate` flag dtable is added to the output (the table's gradient
/// accumulator; the compiler fuses the `accumulate` after it, docs/
/// kernels.md).
Status checkEmbeddingGrad(const KernelArgs &a, int64_t &rows, int64_t &vocab,
                          int64_t &hidden, int64_t &first, int64_t &members,
                          bool &accumulate);
/// The rows of position_add(_grad): N rows of H, sequences of `seq`
/// tokens; under context parallelism (attribute cp, default 1) each
/// sequence's local = seq / cp rows are member `member`'s chunks m and
/// 2 cp - 1 - m (docs/context-parallel.md).
struct PositionDims {
  int64_t rows = 0, hidden = 0, seq = 0, local = 0, cp = 1, member = 0;
  /// The global position of local row t of a sequence (t < local).
  int64_t position(int64_t t) const {
    return plan::contextPosition(seq, cp, member, t);
  }
};
/// position_add: (x [N,H], pos [P,H]) -> y [N,H]; attributes seq (and cp:
/// seq a multiple of 2 cp), N a multiple of seq / cp, P >= seq. Row n adds
/// pos row position(n % (seq / cp)).
Status checkPositionAdd(const KernelArgs &a, PositionDims &d);
/// position_add_grad: dy [N,H] -> dpos [P,H] (rows of positions no local
/// row has get zeros); `accumulate` as embedding_grad's.
Status checkPositionAddGrad(const KernelArgs &a, PositionDims &d,
                            bool &accumulate);
/// layer_norm: (x [N,H], gamma [H], beta [H]) -> y [N,H]; attribute eps
/// (default 1e-5, >= 0).
Status checkLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                      double &eps);
/// add_layer_norm: (x, r, gamma, beta) -> (s = x + r, layer_norm(s)), all
/// [N,H] but gamma and beta [H]; eps as layer_norm's.
Status checkAddLayerNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                         double &eps);
/// layer_norm_grad_input: (x, gamma, dy) -> dx.
Status checkLayerNormGradInput(const KernelArgs &a, int64_t &rows,
                               int64_t &hidden, double &eps);
/// layer_norm_grad_input_add: (x, gamma, dy, r [N,H]) -> r + dx.
Status checkLayerNormGradInputAdd(const KernelArgs &a, int64_t &rows,
                                  int64_t &hidden, double &eps);
/// layer_norm_grad_weight: (x, dy) -> (dgamma [H], dbeta [H]); with the
/// `accumulate` flag both are added to the outputs (the parameters'
/// gradient accumulators), rounded to bf16 first in mixed precision.
Status checkLayerNormGradWeight(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps, bool &accumulate);
/// rms_norm: (x [N,H], gamma [H]) -> y [N,H]; attribute eps (default 1e-6,
/// >= 0).
Status checkRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                    double &eps);
/// add_rms_norm: (x, r, gamma) -> (s = x + r, rms_norm(s)).
Status checkAddRmsNorm(const KernelArgs &a, int64_t &rows, int64_t &hidden,
                       double &eps);
/// rms_norm_grad_input: (x, gamma, dy) -> dx.
Status checkRmsNormGradInput(const KernelArgs &a, int64_t &rows,
                             int64_t &hidden, double &eps);
/// rms_norm_grad_input_add: (x, gamma, dy, r [N,H]) -> r + dx.
Status checkRmsNormGradInputAdd(const KernelArgs &a, int64_t &rows,
                                int64_t &hidden, double &eps);
/// rms_norm_grad_weight: (x, dy) -> dgamma [H]; `accumulate` as
/// layer_norm_grad_weight's.
Status checkRmsNormGradWeight(const KernelArgs &a, int64_t &rows,
                              int64_t &hidden, double &eps, bool &accumulate);

/// The shape of qk_norm (Qwen3's per-head q/k RMS norm): `rows` rows of
/// (heads + 2 kvHeads) heads of hd, q's heads, then k's, then v's.
struct QkNormDims {
  int64_t rows = 0, heads = 0, kvHeads = 0, hd = 0;
  double eps = 0;
  int64_t headsPerRow() const { return heads + 2 * kvHeads; }
  int64_t width() const { return headsPerRow() * hd; }
};
/// qk_norm: (qkv [N, (heads + 2 kv_heads) hd], gamma [2 hd]) -> y, qkv's
/// shape; attributes heads (>= 1), kv_heads (default heads; divides heads)
/// and eps (default 1e-6, >= 0). gamma is the q norm's weight, then the k
/// norm's.
Status checkQkNorm(const KernelArgs &a, QkNormDims &d);
/// qk_norm_grad_input: (qkv, gamma, dy) -> dqkv.
Status checkQkNormGradInput(const KernelArgs &a, QkNormDims &d);
/// qk_norm_grad_weight: (qkv, dy) -> dgamma [2 hd] (hd from qkv's width).
Status checkQkNormGradWeight(const KernelArgs &a, QkNormDims &d);

/// Ulysses context parallelism's column layouts (UlyssesLayout.h):
/// cp_ulysses_split: x [n, W] -> (y [cp n, W / cp], send counts i32 [cp],
/// each n); cp_ulysses_merge (`merge`): x [cp n, W / cp] -> y [n, W].
/// Attributes cp (>= 2), heads and kv_heads (default 0), both multiples of
/// cp; W a multiple of heads + 2 kv_heads. Sets `rows` = n.
Status checkUlyssesColumns(const KernelArgs &a, bool merge, UlyssesColumns &c,
                           int64_t &rows);
/// cp_ulysses_natural: x [R, C] member order -> y [R, C] natural order;
/// cp_ulysses_zigzag (`zigzag`): the other way, and send counts i32 [cp]
/// (each R / cp). Attributes cp (>= 2) and seq (a multiple of 2 cp); R a
/// multiple of seq.
Status checkUlyssesRows(const KernelArgs &a, bool zigzag, UlyssesRows &r,
                        int64_t &cols);
/// cp_split: x [R, C] (whole sequences in sequence order) -> y [R / cp,
/// C], the context member's rows (chunks m and 2 cp - 1 - m of each
/// sequence); cp_split_grad (`grad`): the other way, zeros in the other
/// members' rows. Attributes cp (>= 2) and seq (a multiple of 2 cp);
/// `member` = the context's member, in [0, cp).
Status checkCpSplit(const KernelArgs &a, bool grad, UlyssesRows &r,
                    int64_t &cols, int64_t &member);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_LAYERCHECKS_H

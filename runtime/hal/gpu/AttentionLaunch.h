// Launchers of the attention GPU kernels (AttentionLaunch.inl, compiled for
// CUDA by Attention.cu and for the host emulation by AttentionHost.cpp).
// Each queues its work on ctx.stream.
#ifndef PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H

#include <cstdint>
#include <initializer_list>

#include "runtime/hal/gpu/AttentionMath.h"
#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// y = causal softmax(scale q k^T) v per (sequence, query head), q and k
/// rotated when s.rotary(), and lse [rows, 2 heads] each row's log-sum-exp
/// of its scaled scores (storeRingLse's pair per head). qkv is [rows,
/// cols], y [rows, qCols]; `scratch` holds attentionScratch(s,
/// false).bytes (device memory).
Status launchAttention(const Context &ctx, const AttentionShape &s,
                       const float *qkv, float *y, float *lse, char *scratch);
/// dqkv = the gradient of attention's y (dy, [rows, qCols]) with respect to
/// qkv, every element written; `scratch` holds attentionScratch(s,
/// true).bytes.
Status launchAttentionGrad(const Context &ctx, const AttentionShape &s,
                           const float *qkv, const float *dy, float *dqkv,
                           char *scratch);

/// The fused path (cuDNN's flash attention, GpuApi.h FusedAttention) reads
/// q, k and v as bf16 in qkv's own layout ([rows, cols], q | k | v), q and k
/// rotated when s.rotary(): qkv16 = bf16(rotate(qkv)), rounded to nearest
/// even after the rotation (v is bf16-valued already in bf16 plans: exact).
/// `table` holds attentionRopeTableBytes(s) (device memory; unused without
/// rotary embeddings), and is left holding the rotary table for
/// launchAttentionUnpackGradBf16. `qkvIn16` instead of `qkv`: qkv packed
/// (a step buffer as stored: the same values).
Status launchAttentionPackBf16(const Context &ctx, const AttentionShape &s,
                               const float *qkv, uint16_t *qkv16, char *table,
                               const uint16_t *qkvIn16 = nullptr);
/// dqkv (fp32, [rows, cols]) from the fused backward's bf16 dqkv16: dq and
/// dk rotated back (the rotation's transpose, in double, as the SIMT
/// kernel), dv up-cast; every element written. `table` as left by
/// launchAttentionPackBf16 with the same shape. With `round`, dq and dk
/// are stored rounded to bf16 (dv is bf16-valued); with `dqkvOut16`
/// instead of dqkv, dqkv is stored packed (rounded to nearest even).
Status launchAttentionUnpackGradBf16(const Context &ctx,
                                     const AttentionShape &s,
                                     const uint16_t *dqkv16, float *dqkv,
                                     const char *table, bool round = false,
                                     uint16_t *dqkvOut16 = nullptr);
/// The fused kernels' statistics ([batch, heads, seq] fp32) as the
/// attention op's lse ([rows, 2 heads], storeRingLse's pairs), and back
/// (exact both ways while lse keeps its pairs: hi + lo is the value).
Status launchStatsToLse(const Context &ctx, const AttentionShape &s,
                        const float *stats, float *lse);
Status launchLseToStats(const Context &ctx, const AttentionShape &s,
                        const float *lse, float *stats);
/// Bytes of the rotary table (cos, sin: [seq, hd/2] doubles each) of the
/// fused path; 0 without rotary embeddings.
size_t attentionRopeTableBytes(const AttentionShape &s);

/// One step of ring attention (context parallelism): o, lse of the
/// member's queries over the owner's key/value shard kv ([rows, 2 kvCols]),
/// combined with oIn, lseIn (null at step 0); `scratch` holds
/// ringScratch(s, false).bytes.
Status launchAttentionBlock(const Context &ctx, const RingShape &s,
                            const float *qkv, const float *kv, const float *oIn,
                            const float *lseIn, float *o, float *lse,
                            char *scratch);
/// The step's backward: dq [rows, qCols] and the owner's dkv
/// [rows, 2 kvCols] from the forward's final y and lse, plus dqIn, dkvIn
/// (both null at step 0); `scratch` holds ringScratch(s, true).bytes.
Status launchAttentionBlockGrad(const Context &ctx, const RingShape &s,
                                const float *qkv, const float *kv,
                                const float *y, const float *lse,
                                const float *dy, const float *dqIn,
                                const float *dkvIn, float *dq, float *dkv,
                                char *scratch);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ATTENTIONLAUNCH_H
